"""`pretrain status`: keys from the config alone, cache state, and the differences from the nearest artifact."""

from pathlib import Path

from flows.config import load_config
from flows.status import stage_statuses
from infra.artifacts import ArtifactStore
from infra.runs import RunsLayout

ROOT = Path(__file__).resolve().parents[2]


def _store_like(layout: RunsLayout, stage: str, key: str, meta: dict) -> None:
    store = ArtifactStore(layout.artifacts)
    store.commit(stage, key, store.begin(stage, key), meta)


def test_status_reads_without_creating_and_explains_the_differences(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the config's relative paths (local sources, cloze files)
    cfg = load_config(ROOT / "configs/smoke.toml")
    layout = RunsLayout(tmp_path / "runs")
    first = stage_statuses(cfg, layout)
    assert [s.stage for s in first][:4] == ["sources", "quality_model", "corpus", "tokenizer"]
    assert all(not s.cached and s.reasons == ["no artifact of this stage exists yet"] for s in first)
    assert not layout.root.exists()  # reading the status creates nothing
    assert [s.key for s in stage_statuses(cfg, layout)] == [s.key for s in first]  # deterministic

    # A stored sources artifact with exactly the wanted key and meta is a cache hit.
    sources = first[0]
    from flows.registry import get_stage
    import json
    from infra.artifacts import canonical_json, code_version_closure

    stage = get_stage("sources")
    meta = {"config": json.loads(canonical_json(stage.key_config(cfg))), "input_keys": {},
            "code_version": code_version_closure(stage.code)}
    _store_like(layout, "sources", sources.key, meta)
    # A corpus artifact made under another threshold and an older sources key is the nearest, with its reasons.
    corpus = get_stage("corpus")
    old = json.loads(canonical_json(corpus.key_config(cfg)))
    old["corpus"]["gopher"]["min_words"] = 1
    _store_like(layout, "corpus", "0123456789abcdef",
                {"config": old, "input_keys": {"sources": "feedfacefeedface"},
                 "code_version": code_version_closure(corpus.code)})
    second = {s.stage: s for s in stage_statuses(cfg, layout)}
    assert second["sources"].cached and not second["corpus"].cached
    assert second["corpus"].nearest == "0123456789abcdef"
    reasons = second["corpus"].reasons
    wanted = cfg.corpus.gopher.min_words
    assert f"config corpus.gopher.min_words: 1 → {wanted}" in reasons
    assert any(r.startswith("input sources: feedfacefeedface → ") for r in reasons)
    assert not any(r.startswith("code version") for r in reasons)


def test_dry_run_and_status_commands_leave_no_runs_folder(tmp_path):
    import subprocess
    import sys

    runs = tmp_path / "never-made"
    for args in (["run", "configs/smoke.toml", "--dry-run"], ["status", "configs/smoke.toml", "--explain"]):
        done = subprocess.run([sys.executable, "-m", "flows.cli", *args, "--runs-dir", str(runs)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    assert "would run" in done.stdout and "no artifact of this stage exists yet" in done.stdout
    assert not runs.exists()



def test_an_empty_runs_dir_is_refused_not_taken_as_the_current_folder(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.chdir(tmp_path)
    for empty in ("", " "):
        done = CliRunner().invoke(app, ["status", str(ROOT / "configs" / "smoke.toml"), "--runs-dir", empty])
        assert done.exit_code == 2 and "is empty" in done.output
    assert list(tmp_path.iterdir()) == []
