"""Config and command-line errors name the bad value once and suggest the closest valid name."""

import re
from pathlib import Path

import pytest

from flows.config import load_config
from flows.preflight import preflight
from infra.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_a_misspelt_stage_gets_a_did_you_mean():
    cfg = load_config(ROOT / "configs/smoke.toml")
    with pytest.raises(ConfigError, match="--until 'tokeniser': unknown stage; did you mean 'tokenizer'\\?"):
        preflight(cfg, until="tokeniser")
    with pytest.raises(ConfigError, match="did you mean 'mixture'\\?"):
        preflight(cfg, ["mixtrue"])


def test_a_sections_own_check_names_its_field_once(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    text = (ROOT / "configs/smoke.toml").read_text()
    mixture = text.index("[mixture]")
    bad = text[:mixture] + re.sub(r"\nseeds = \d+", "\nseeds = 0", text[mixture:], count=1)
    (tmp_path / "bad.toml").write_text(bad)
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "bad.toml")
    assert "invalid config: mixture.seeds = 0: must be ≥ 1" in str(err.value)
    assert str(err.value).count("mixture") == 1
