"""``[corpus.execution]`` and ``[tokenizer.execution]``: the old ``task_runner`` key says what to write instead, the
ray engine needs its package, and no execution setting is part of a cache key."""

import sys
import tomllib
from pathlib import Path

import pytest

from flows.config import parse_config
from flows.keys import chain_keys
from infra.errors import ConfigError
from infra.execution import ExecutionConfig

ROOT = Path(__file__).resolve().parents[2]


def _smoke(**sections) -> dict:
    raw = tomllib.loads((ROOT / "configs/smoke.toml").read_text())
    for name, execution in sections.items():
        raw[name]["execution"] = execution
    return raw


@pytest.mark.parametrize("section", ["corpus", "tokenizer"])
@pytest.mark.parametrize("old, says", [
    ("dask", r'task_runner = "dask" is no longer supported: write engine = "ray".*or engine = "processes"'),
    ("ray", r'task_runner = "ray" is now engine = "ray"'),
    ("processes", r'task_runner was renamed engine: write engine = "processes"'),
])
def test_old_task_runner_gets_a_one_line_error_naming_the_new_key(section, old, says):
    with pytest.raises(ConfigError, match=rf"{section}\.execution: {says}") as caught:
        parse_config(_smoke(**{section: {"task_runner": old, "workers": 2}}))
    assert "\n" not in str(caught.value)


def test_ray_engine_without_the_ray_package_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # how Python marks a module that cannot be imported
    with pytest.raises(ConfigError, match=r"corpus\.execution\.engine: .*needs the ray package.*pip install 'ray=="):
        parse_config(_smoke(corpus={"engine": "ray"}))


def test_all_cpus_is_for_ray_only_and_address_must_be_given():
    assert ExecutionConfig(engine="ray", workers=0).workers == 0
    with pytest.raises(ConfigError, match=r'workers = 0 \(all the cluster\'s CPUs\) is for engine = "ray"'):
        ExecutionConfig(engine="processes", workers=0)
    with pytest.raises(ConfigError, match="address is empty"):
        ExecutionConfig(engine="ray", address=" ")


def test_execution_settings_change_no_cache_key(monkeypatch):
    monkeypatch.chdir(ROOT)
    base = {name: k.key for name, k in chain_keys(parse_config(_smoke()), until="tokenizer").items()}
    moved = _smoke(corpus={"engine": "ray", "workers": 0, "address": "127.0.0.2:6379", "shard_docs": 7},
                   tokenizer={"engine": "threads", "workers": 3, "part_docs": 5})
    assert {name: k.key for name, k in chain_keys(parse_config(moved), until="tokenizer").items()} == base


def test_a_malformed_address_is_refused_at_load_and_an_unused_one_warns():
    from infra.errors import ConfigError, ConfigWarning
    from infra.execution import ExecutionConfig

    with pytest.raises(ConfigError, match='address = "nonsense" is not'):
        ExecutionConfig(engine="processes", address="nonsense")
    for ok in ("auto", "local", "10.0.0.1:6379", "head-node.example:6379", "[::1]:6379", "ray://10.0.0.1:10001"):
        assert ExecutionConfig(address=ok).address == ok
    with pytest.warns(ConfigWarning, match='used only by engine = "ray"'):
        ExecutionConfig(engine="processes", address="10.0.0.1:6379")
