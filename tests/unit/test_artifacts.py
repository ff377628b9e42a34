"""Artifact keys and the store's completion semantics (docs/methods.md §13: a directory without its marker does not exist)."""

import json
from pathlib import Path

import pytest

from flows.config import load_config
from flows.registry import STAGES, downstream
from infra.artifacts import CHECKSUMS, CORRUPT_PREFIX, ArtifactStore, artifact_key, checksum_mismatches, code_version

ROOT = Path(__file__).resolve().parents[2]


def _key(stage_name: str, cfg) -> str:
    stage = next(s for s in STAGES if s.name == stage_name)
    return artifact_key(stage.name, stage.key_config(cfg), {"x": "k"}, "v1")


def test_same_inputs_same_key_and_any_part_changes_it():
    base = artifact_key("corpus", {"a": 1, "b": [1, 2]}, {"sources": "abc"}, "v1")
    assert base == artifact_key("corpus", {"b": [1, 2], "a": 1}, {"sources": "abc"}, "v1")  # key order irrelevant
    assert base != artifact_key("corpus", {"a": 2, "b": [1, 2]}, {"sources": "abc"}, "v1")
    assert base != artifact_key("corpus", {"a": 1, "b": [1, 2]}, {"sources": "abd"}, "v1")
    assert base != artifact_key("corpus", {"a": 1, "b": [1, 2]}, {"sources": "abc"}, "v2")
    assert base != artifact_key("tokenizer", {"a": 1, "b": [1, 2]}, {"sources": "abc"}, "v1")


def test_cosmetic_fields_keep_the_key_and_result_fields_change_it():
    cfg = load_config(ROOT / "configs/smoke.toml")
    cosmetic = cfg.model_copy(update={"main": cfg.main.model_copy(update={"log_every": 99, "checkpoint_every": 3}),
                                      "torch_threads": 1})
    assert _key("main", cfg) == _key("main", cosmetic)
    longer = cfg.model_copy(update={"main": cfg.main.model_copy(
        update={"budget": cfg.main.budget.model_copy(update={"steps": 17})})})
    assert _key("main", cfg) != _key("main", longer)
    # a CPT change leaves every upstream stage's own config untouched
    replay = cfg.model_copy(update={"cpt": cfg.cpt.model_copy(update={"replay_fractions": [0.5]})})
    for stage in ("sources", "corpus", "tokenizer", "mixture", "sweep", "main"):
        assert _key(stage, cfg) == _key(stage, replay)
    assert _key("cpt", cfg) != _key("cpt", replay)


def test_main_budget_and_epoch_limit_leave_mixture_and_sweep_keys_alone():
    """Epochs per source (w·D/U) are reported by the main stage, so D never keys the proxy stages."""
    cfg = load_config(ROOT / "configs/smoke.toml")
    budget = cfg.main.budget.model_copy(update={"steps": cfg.main.budget.steps * 10, "batch_size": 3})
    bigger = cfg.model_copy(update={"main": cfg.main.model_copy(update={"budget": budget})})
    looser = cfg.model_copy(update={"mixture": cfg.mixture.model_copy(update={"max_epochs": 40.0})})
    for stage in ("mixture", "sweep"):
        assert _key(stage, cfg) == _key(stage, bigger) == _key(stage, looser)
    assert _key("main", cfg) != _key("main", bigger)
    assert _key("main", cfg) == _key("main", looser)


def test_downstream_closure_follows_the_graph():
    assert downstream({"cpt"}) == {"cpt", "gate", "export"}
    assert downstream({"mixture"}) == {"mixture", "sweep", "ladder", "main", "branches", "cpt", "gate", "export"}
    assert downstream(set()) == set()


def test_code_version_changes_with_the_source(tmp_path, monkeypatch):
    package = tmp_path / "fakestage"
    package.mkdir()
    (package / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = code_version("fakestage")
    (package / "__init__.py").write_text("X = 2\n")
    import importlib, sys
    sys.modules.pop("fakestage", None)
    importlib.invalidate_caches()
    assert code_version("fakestage") != before


def test_store_ignores_unfinished_and_commits_atomically(tmp_path):
    store = ArtifactStore(tmp_path)
    assert store.get("corpus", "k1") is None
    tmp = store.begin("corpus", "k1")
    (tmp / "kept.parquet").write_text("x")
    assert store.get("corpus", "k1") is None  # still a temporary directory
    (tmp_path / "corpus" / "k1").mkdir()  # a torn earlier attempt with no marker
    assert store.get("corpus", "k1") is None
    artifact = store.commit("corpus", "k1", tmp, {"summary": {"n": 1}})
    again = store.get("corpus", "k1")
    assert again is not None and again.meta["summary"] == {"n": 1}
    assert (artifact.path / "kept.parquet").read_text() == "x"
    assert not tmp.exists()


def test_failed_commit_leaves_no_marker(tmp_path, monkeypatch):
    store = ArtifactStore(tmp_path)
    tmp = store.begin("corpus", "k2")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("infra.atomic.fsync_tree", disk_full)  # where a full disk surfaces on commit
    with pytest.raises(OSError, match="stage corpus ran out of space"):  # DiskFullError, an OSError too
        store.commit("corpus", "k2", tmp, {})
    assert store.get("corpus", "k2") is None
    assert not tmp.exists()


def test_a_full_disk_gives_a_clear_error_and_no_marker(tmp_path):
    """ENOSPC (written for real to /dev/full) while a stage writes its artifact: DiskFullError naming the stage and
    the fix; a generic error on a disk with room is left alone."""
    from infra.artifacts import MARKER, disk_full_error
    from infra.errors import DiskFullError

    store = ArtifactStore(tmp_path / "artifacts")
    tmp = store.begin("tokenizer", "k1")
    try:
        with open("/dev/full", "w") as handle:
            handle.write("x" * 4096)
            handle.flush()
    except OSError as err:
        full = disk_full_error(err, tmp, "tokenizer")
    assert isinstance(full, DiskFullError)
    assert "stage tokenizer ran out of space" in str(full) and "run the same command again" in str(full)
    assert disk_full_error(RuntimeError("unexpected pos 576 vs 534"), tmp, "tokenizer") is None
    assert disk_full_error(ValueError("bad value"), tmp, "tokenizer") is None
    store.abort(tmp)
    assert not list((tmp_path / "artifacts").rglob(MARKER))


def test_a_torch_save_on_a_full_tmpfs_reads_as_disk_full(tmp_path):
    """torch.save reports ENOSPC as "unexpected pos": the free space left tells it apart (needs mount rights)."""
    import subprocess

    import torch

    from infra.artifacts import disk_full_error
    from infra.errors import DiskFullError

    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        tmp = mount / ".tmp-k1-0000"
        tmp.mkdir()
        with pytest.raises(Exception) as caught:
            torch.save({"w": torch.zeros(100_000)}, tmp / "optimizer.pt")
        assert "space" not in str(caught.value).lower()  # torch's wording: nothing to match on
        assert isinstance(disk_full_error(caught.value, tmp, "main"), DiskFullError)
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)  # torch may still hold the torn file open


def test_prefect_tracebacks_of_expected_errors_are_dropped_and_others_kept():
    """The CLI prints a PretrainError once, as `error: ...`; Prefect's traceback record of it is dropped, while an
    unexpected exception keeps its traceback."""
    import logging

    from flows.cli import _ExpectedFailures
    from infra.errors import DiskFullError

    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    logger = logging.getLogger("test.prefect.task_runs")
    logger.addFilter(_ExpectedFailures())
    logger.addHandler(handler)
    for err in (DiskFullError("stage main ran out of space"), RuntimeError("a bug")):
        try:
            raise err
        except Exception:
            logger.error("Task run failed with exception: %r", err, exc_info=True)
    logger.error("Finished in state Failed()")
    assert [r.getMessage() for r in seen] == ["Task run failed with exception: RuntimeError('a bug')",
                                              "Finished in state Failed()"]


def _committed(tmp_path: Path) -> tuple[ArtifactStore, Path]:
    store = ArtifactStore(tmp_path / "artifacts")
    tmp = store.begin("corpus", "k1")
    (tmp / "kept").mkdir()
    for i in range(4):
        (tmp / "kept" / f"part-{i:05d}.parquet").write_bytes(bytes(range(256)) * (i + 1))
    (tmp / "manifest.json").write_text("{}")
    return store, store.commit("corpus", "k1", tmp, {"summary": {}}).path


def test_an_intact_artifact_verifies_and_records_every_output(tmp_path):
    store, path = _committed(tmp_path)
    recorded = json.loads((path / CHECKSUMS).read_text())
    assert sorted(recorded) == ["kept/part-00000.parquet", "kept/part-00001.parquet", "kept/part-00002.parquet",
                                "kept/part-00003.parquet", "manifest.json"]
    assert recorded["kept/part-00002.parquet"][0] == 768
    artifact, why = store.verify("corpus", "k1")
    assert artifact is not None and artifact.path == path and why is None
    assert store.verify("corpus", "absent") == (None, None)


@pytest.mark.parametrize("damage, said", [
    (lambda p: p.write_bytes(p.read_bytes()[:-1] + b"\x00"), "content differs from its checksum (same size)"),
    (lambda p: p.write_bytes(p.read_bytes()[:100]), "100 bytes, committed with 512"),
    (lambda p: p.unlink(), "missing"),
])
def test_a_damaged_part_moves_the_artifact_aside_and_it_is_never_handed_out(tmp_path, damage, said):
    store, path = _committed(tmp_path)
    damage(path / "kept" / "part-00001.parquet")
    artifact, why = store.verify("corpus", "k1")
    assert artifact is None and f"kept/part-00001.parquet: {said}" in why
    assert not path.exists() and store.get("corpus", "k1") is None  # the next run computes it afresh
    aside = [p for p in (tmp_path / "artifacts" / "corpus").iterdir() if p.name.startswith(CORRUPT_PREFIX)]
    assert len(aside) == 1 and str(aside[0]) in why
    assert (aside[0] / "kept" / "part-00000.parquet").exists()  # kept for inspection until gc


def test_an_artifact_committed_before_checksums_is_reused_unchecked(tmp_path):
    store, path = _committed(tmp_path)
    (path / CHECKSUMS).unlink()
    (path / "kept" / "part-00003.parquet").write_bytes(b"changed")
    assert checksum_mismatches(path) == []
    assert store.verify("corpus", "k1")[0] is not None
