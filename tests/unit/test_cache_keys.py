"""Cache keys: results-changing fields change them, cosmetic ones do not, code changes do, and nothing that cannot
be hashed deterministically is ever silently part of one."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from flows.config import parse_config
from flows.status import stage_statuses
from infra.artifacts import artifact_key, canonical_json, code_version
from infra.errors import ConfigError
from infra.runs import RunsLayout

ROOT = Path(__file__).resolve().parents[2]


def _keys(tmp_path, edit=lambda raw: None) -> dict[str, str]:
    raw = tomllib.loads((ROOT / "configs/smoke.toml").read_text())
    edit(raw)
    return {s.stage: s.key for s in stage_statuses(parse_config(raw), RunsLayout(tmp_path / "runs"))}


@pytest.fixture
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_threshold_changes_its_stage_and_everything_after(tmp_path, at_root):
    base = _keys(tmp_path)
    changed = _keys(tmp_path, lambda raw: raw["corpus"].setdefault("gopher", {}).update(min_words=7))
    # The quality model's source examples pass through the corpus rules, so it is retrained too.
    assert [s for s in base if base[s] != changed[s]] == ["quality_model", "corpus", "tokenizer", "mixture",
                                                          "quality_ablation", "sweep", "ladder", "main", "branches", "cpt",
                                                          "gate", "export"]


def test_the_ablation_switch_keys_only_the_ablation_and_proxy_settings_key_it_only_when_on(tmp_path, at_root):
    base = _keys(tmp_path)
    off = _keys(tmp_path, lambda raw: raw["corpus"]["quality_model"].update(ablate=False))
    assert [s for s in base if base[s] != off[s]] == ["quality_ablation"]  # the corpus is the same either way

    def proxy_lr(raw):
        raw["proxy"]["peak_lr"] = 1e-3
    assert _keys(tmp_path, proxy_lr)["quality_ablation"] != base["quality_ablation"]
    both = _keys(tmp_path, lambda raw: (raw["corpus"]["quality_model"].update(ablate=False), proxy_lr(raw)))
    assert both["quality_ablation"] == off["quality_ablation"]  # not requested: an empty artifact, not re-keyed


def test_log_interval_and_layout_change_no_key(tmp_path, at_root):
    base = _keys(tmp_path)

    def cosmetic(raw):
        raw["main"]["log_every"] = 7
        raw["main"]["keep_checkpoints"] = 9
        raw["main"].setdefault("stability", {})["instrument_every"] = 3
    assert _keys(tmp_path, cosmetic) == base


def test_a_helper_change_changes_the_code_version(tmp_path, monkeypatch):
    package = tmp_path / "helperpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("def scale(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = code_version("helperpkg")
    (package / "helpers.py").write_text("def scale(x):\n    return 3 * x\n")
    assert code_version("helperpkg") != before
    assert artifact_key("s", {}, {}, before) != artifact_key("s", {}, {}, code_version("helperpkg"))


def test_the_same_config_gives_the_same_keys_in_two_fresh_processes(tmp_path):
    script = ("import json, sys; from flows.config import load_config; from flows.status import stage_statuses; "
              "from infra.runs import RunsLayout; cfg = load_config('configs/smoke.toml'); "
              f"print(json.dumps({{s.stage: s.key for s in stage_statuses(cfg, RunsLayout(__import__('pathlib').Path(r'{tmp_path}')))}}))")
    outputs = [subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}) for seed in ("1", "2")]
    assert all(o.returncode == 0 for o in outputs), outputs[0].stderr[-2000:]
    assert json.loads(outputs[0].stdout) == json.loads(outputs[1].stdout)


def test_a_component_without_a_deterministic_form_fails_the_key():
    assert canonical_json({"path": Path("a/b"), "set": {3, 1}}) == '{"path":"a/b","set":[1,3]}'
    with pytest.raises(ConfigError, match="no deterministic JSON form"):
        artifact_key("main", {"callback": object()}, {}, "v1")
    with pytest.raises(ConfigError, match="function"):
        canonical_json({"fn": lambda x: x})
