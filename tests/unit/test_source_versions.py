"""A Debian source whose candidate version moved since the experiment's last run (an unrelated ``apt-get update``)
is named before the recomputation it causes, with both versions and how to pin the old one
(``flows.versions``). The apt lists are stood in for by a resolver giving one version, as in test_sources_deb."""

import json
import tomllib
from pathlib import Path

from flows.config import parse_config
from flows.registry import get_stage
from flows.versions import moved_notices, read_record, record_path, write_record
from infra.runs import RunsLayout
from tasks.sources import deb
from tasks.sources.deb import DebRelease

ROOT = Path(__file__).resolve().parents[2]
OLD, NEW = "3.11.2-6+deb12u8", "3.11.2-6+deb12u9"


def _config(**python_doc):
    """The smoke config with its domain source, python_doc, fetched from Debian (paths made absolute)."""
    raw = tomllib.loads((ROOT / "configs/smoke.toml").read_text())
    for src in raw["sources"].values():
        src["include"] = [str(ROOT / p) for p in src["include"]]
    raw["gate"]["cloze_items"] = [str(ROOT / p) for p in raw["gate"]["cloze_items"]]
    raw["sources"]["python_doc"] = {"kind": "deb", "package": "python3.11-doc", "role": "domain", "format": "html",
                                    "language": "en", "include": ["usr/share/doc/python3.11/html/**/*.html"],
                                    **python_doc}
    return parse_config(raw)


def _resolving_to(monkeypatch, version: str, sha: str | None = None) -> None:
    def resolve(wanted, *, update_lists=False):
        return {(p, v): DebRelease(p, v or version, "all", sha or (v or version).encode().hex().ljust(64, "0")[:64])
                for p, v in wanted}
    monkeypatch.setattr(deb, "resolve_debs", resolve)


def test_a_moved_version_is_named_once_with_both_versions_and_the_pin_that_keeps_the_old_one(tmp_path, monkeypatch):
    cfg, layout = _config(), RunsLayout(tmp_path / "runs")
    sources = get_stage("sources")
    _resolving_to(monkeypatch, OLD)
    first = sources.key_config(cfg)
    assert moved_notices(cfg, first, layout, artifact_exists=False) == []  # no earlier run: nothing to compare
    write_record(cfg, first, layout)  # the first run's sources artifact was made from deb12u8
    assert read_record(layout, "smoke")["python_doc"]["version"] == OLD
    assert moved_notices(cfg, first, layout, artifact_exists=True) == []  # the same release: silent

    _resolving_to(monkeypatch, NEW)  # apt-get update moved the candidate
    second = sources.key_config(cfg)
    assert moved_notices(cfg, second, layout, artifact_exists=False) == [
        f"sources: python_doc moved from {OLD} to {NEW} since the last run; sources and every stage after it are "
        f"recomputed (pin it with version = \"{OLD}\" in [sources.python_doc] to keep the old one)"]
    # The pin the notice names is a valid config, and it resolves to the old release (the old key) again.
    pinned = _config(version=OLD)
    assert sources.key_config(pinned) == first
    assert moved_notices(pinned, sources.key_config(pinned), layout, artifact_exists=True) == []
    # An artifact of the new release made earlier is reused: the notice says so instead.
    assert "the sources artifact of the new release exists and is reused" in moved_notices(
        cfg, second, layout, artifact_exists=True)[0]

    write_record(cfg, second, layout)  # the second run used deb12u9: the notice is not repeated on the third
    assert moved_notices(cfg, second, layout, artifact_exists=True) == []
    assert json.loads(record_path(layout, "smoke").read_text())["sources"]["python_doc"]["version"] == NEW


def test_a_rebuilt_deb_of_the_same_version_is_named_and_a_damaged_record_is_no_notice(tmp_path, monkeypatch):
    cfg, layout = _config(), RunsLayout(tmp_path / "runs")
    sources = get_stage("sources")
    _resolving_to(monkeypatch, OLD, sha="a" * 64)
    write_record(cfg, sources.key_config(cfg), layout)
    _resolving_to(monkeypatch, OLD, sha="b" * 64)
    (line,) = moved_notices(cfg, sources.key_config(cfg), layout, artifact_exists=False)
    assert line.startswith(f"sources: python_doc's python3.11-doc {OLD} is another .deb since the last run "
                           "(SHA256 aaaaaaaaaaaa… → bbbbbbbbbbbb…")
    record_path(layout, "smoke").write_text("{not json")
    assert moved_notices(cfg, sources.key_config(cfg), layout, artifact_exists=False) == []


def test_every_shipped_config_with_sources_says_how_to_pin_a_version():
    for path in sorted((ROOT / "configs").glob("*.toml")):
        text = path.read_text()
        if "[sources." in text:
            assert "version = " in text and "pin" in text, f"{path.name} does not say how to pin a version"
