"""Which Debian release each source of an experiment resolved to on its last run, and a notice when that moved.

An unpinned Debian source resolves to the apt lists' candidate version when a run starts, and that release is in
the sources key (``tasks.sources.definition.key_sources``). When an ``apt-get update`` moves the candidate, the next
run is a new chain of keys: correct, but it recomputes everything without saying why. So the release each source
used is recorded per experiment, in ``<runs>/cache/sources/versions/<experiment>.json``, once the sources stage
has its artifact; the next run compares the releases it resolved with that record and names every source that
moved before any stage runs. A pinned source (``version = "..."`` in ``[sources.<name>]``) is never reported: its
version is the user's choice.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping

from infra.atomic import atomic_write_text
from infra.runs import RunsLayout, ensure_folder


def record_path(layout: RunsLayout, experiment: str) -> Path:
    """``<runs>/cache/sources/versions/<experiment>.json``."""
    return layout.source_cache / "versions" / f"{experiment}.json"


def resolved_releases(key_config: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Source name → {package, version, architecture, sha256} of every Debian source in the sources stage's key
    config (``Stage.key_config``: ``{"sources": {name: {..., "package", "resolved": {...}}}}``)."""
    return {name: {"package": src.get("package"), **src["resolved"]}
            for name, src in key_config.get("sources", {}).items() if "resolved" in src}


def read_record(layout: RunsLayout, experiment: str) -> dict[str, dict[str, str]]:
    """The releases the experiment's last run used, by source; empty when none was recorded or the file is not
    readable (a notice is never worth a failed run)."""
    try:
        return dict(json.loads(record_path(layout, experiment).read_text())["sources"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def moved_notices(cfg: Any, key_config: Mapping[str, Any], layout: RunsLayout, *, artifact_exists: bool) -> list[str]:
    """One line per unpinned Debian source whose resolved release differs from the one the experiment's last run
    used (same package): the old and new version, what is recomputed (nothing at the sources stage when
    ``artifact_exists``, an artifact of the new release being there already) and how to keep the old one."""
    before = read_record(layout, cfg.name)
    lines = []
    for name, now in resolved_releases(key_config).items():
        old = before.get(name)
        source = cfg.sources.get(name)
        if old is None or source is None or source.version is not None or old.get("package") != now["package"]:
            continue
        if old.get("version") == now["version"]:
            if old.get("sha256") and now.get("sha256") and old["sha256"] != now["sha256"]:
                what = (f"sources: {name}'s {now['package']} {now['version']} is another .deb since the last run "
                        f"(SHA256 {old['sha256'][:12]}… → {now['sha256'][:12]}…, the archive rebuilt it)")
            else:
                continue
        else:
            what = f"sources: {name} moved from {old['version']} to {now['version']} since the last run"
        if artifact_exists:
            effect = "the sources artifact of the new release exists and is reused"
        else:
            effect = "sources and every stage after it are recomputed"
        lines.append(f"{what}; {effect} (pin it with version = \"{old['version']}\" in [sources.{name}] to keep the "
                     "old one)")
    return lines


def write_record(cfg: Any, key_config: Mapping[str, Any], layout: RunsLayout) -> None:
    """Record the releases this run's sources artifact was made from (nothing when the config has no Debian
    source). A file that cannot be written is left as it is: the record only feeds a notice."""
    releases = resolved_releases(key_config)
    if not releases:
        return
    path = record_path(layout, cfg.name)
    try:
        ensure_folder(path.parent)
        atomic_write_text(path, json.dumps({"experiment": cfg.name, "recorded_at": time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sources": releases}, indent=2, sort_keys=True))
    except Exception:
        pass
