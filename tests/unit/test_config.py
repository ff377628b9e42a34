"""Experiment configs are rejected at load time with the field named; the shipped configs load."""

from pathlib import Path

import pytest

from flows.config import load_config, parse_config
from infra.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _raw() -> dict:
    import tomllib
    return tomllib.loads((ROOT / "configs/smoke.toml").read_text())


@pytest.mark.parametrize("name", ["demo.toml", "smoke.toml"])
def test_shipped_configs_load(name):
    cfg = load_config(ROOT / "configs" / name)
    assert cfg.domain_sources == ["python_doc"]
    assert set(cfg.general_sources) == {"handbook_en", "handbook_zh", "fortunes_en", "fortunes_zh"}


def test_unknown_key_is_rejected_with_its_path():
    raw = _raw()
    raw["main"]["budget"]["stepz"] = 3
    with pytest.raises(ConfigError, match=r"main\.budget\.stepz"):
        parse_config(raw)


def test_wrong_type_is_rejected():
    raw = _raw()
    raw["main"]["budget"]["steps"] = "many"
    with pytest.raises(ConfigError, match=r"main\.budget\.steps"):
        parse_config(raw)


def test_warmup_longer_than_run_is_rejected():
    raw = _raw()
    raw["cpt"]["budget"]["warmup_steps"] = 100
    with pytest.raises(ConfigError, match="warmup_steps"):
        parse_config(raw)


def test_cpt_domain_must_be_a_domain_source():
    raw = _raw()
    raw["cpt"]["domain_sources"] = ["handbook_en"]
    with pytest.raises(ConfigError, match="role = 'domain'"):
        parse_config(raw)


def test_replay_fraction_out_of_range():
    raw = _raw()
    raw["cpt"]["replay_fractions"] = [1.5]
    with pytest.raises(ConfigError, match="replay fraction"):
        parse_config(raw)


def test_mixture_weights_must_name_general_sources():
    raw = _raw()
    raw["mixture"]["candidates"].append({"name": "bad", "weights": {"python_doc": 1.0}})
    with pytest.raises(ConfigError, match="python_doc"):
        parse_config(raw)


def test_jaccard_threshold_out_of_range_is_rejected():
    raw = _raw()
    raw["corpus"]["near_dedup"] = {"jaccard_threshold": 1.5}
    with pytest.raises(ConfigError, match="jaccard_threshold"):
        parse_config(raw)


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [unclosed")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_preflight_rejects_bad_refresh_missing_cloze_and_unmatched_local_source(tmp_path):
    from flows.preflight import preflight
    from infra.errors import SourceError

    cfg = load_config(ROOT / "configs/smoke.toml")
    with pytest.raises(ConfigError, match="unknown stage"):
        preflight(cfg, ["nonsense"])
    no_cloze = cfg.model_copy(update={"gate": cfg.gate.model_copy(update={"cloze_items": str(tmp_path / "x.jsonl")})})
    with pytest.raises(ConfigError, match="cloze_items"):
        preflight(no_cloze)
    src = cfg.sources["handbook_en"].model_copy(update={"include": [str(tmp_path / "*.html")]})
    with pytest.raises(SourceError, match="no file matches"):
        preflight(cfg.model_copy(update={"sources": {**cfg.sources, "handbook_en": src}}))


def test_heads_not_dividing_width_fail_at_load_with_path_and_fix():
    raw = _raw()
    raw["main"]["model"].update(d_model=32, n_heads=3)
    with pytest.raises(ConfigError, match=r"main\.model\.n_heads: .*3 does not divide d_model = 32; use one of"):
        parse_config(raw)


def test_kv_heads_not_dividing_heads_fail_at_load_with_path_and_fix():
    raw = _raw()
    raw["proxy"]["model"].update(d_model=32, n_heads=4, n_kv_heads=3)
    with pytest.raises(ConfigError, match=r"proxy\.model\.n_kv_heads: .*use one of \[1, 2, 4\]"):
        parse_config(raw)


def test_odd_head_dim_fails_at_load():
    raw = _raw()
    raw["main"]["model"].update(d_model=24, n_heads=8, n_kv_heads=8)
    with pytest.raises(ConfigError, match=r"main\.model\.n_heads: .*head_dim .* = 3 is odd"):
        parse_config(raw)


def test_removed_mixture_main_tokens_says_where_d_comes_from():
    raw = _raw()
    raw["mixture"]["main_tokens"] = 1_000_000
    with pytest.raises(ConfigError, match=r"mixture\.main_tokens .*\[main\]"):
        parse_config(raw)


@pytest.mark.parametrize("section, change, message", [
    ("mixture", {"generate": {"kind": "grid", "count": 3, "step": 0.3}}, "1/step must be an integer"),
    ("mixture", {"candidates": [{"name": "natural", "alpha": 1.0}], "propose": True}, "at least 2"),
    ("mixture", {"candidates": [{"name": "natural", "alpha": 0.3}, {"name": "b", "alpha": 1.0}]}, "must have alpha = 1"),
    ("sweep", {"widths": [34]}, r"sweep\.widths: 34 must be a multiple of 2 × proxy n_heads"),
    ("sweep", {"forecast_windows": [1.0]}, "fit the very point it forecasts"),
    ("sweep", {"forecast_windows": []}, "at least one share"),
    ("cpt", {"replay_weights": {"python_doc": 1.0}}, "are not general sources"),
    ("cpt", {"replay_fractions": [0.1, 0.1]}, "repeats a value"),
    ("cpt", {"base_checkpoint": "no/such/dir"}, "is not a directory"),
    ("gate", {"cloze_items": []}, "at least one cloze item file"),
    ("main", {"distributed": {"launch": "accelerate", "processes": 2, "accelerate_config": "no/such.yaml"}},
     "not found"),
    ("main", {"distributed": {"launch": "inprocess", "processes": 2}}, "needs launch"),
])
def test_proxy_cpt_gate_and_layout_values_are_rejected_at_load(section, change, message):
    raw = _raw()
    raw[section] = {**raw[section], **change}
    if section == "main":
        raw["main"]["async_checkpoints"] = False
    with pytest.raises(ConfigError, match=message):
        parse_config(raw)
