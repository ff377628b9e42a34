"""What a rerun would do, and why: every stage's artifact key computed from the config alone, whether a complete
artifact exists for it, and — when not — how it differs from the nearest artifact already in the store.

Keys depend only on config fields (with what the sources resolve to: Debian releases from the local apt package
lists, local files' bytes), input keys and code (``infra.artifacts.artifact_key``), never on outputs, so the whole
chain's keys are known before anything runs, and nothing is downloaded to know them. "Nearest" is the stored
artifact of the same stage with the fewest differing items (config leaves, input keys, code version); its
differences are the explanation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from flows.config import ExperimentConfig
from flows.keys import chain_keys
from infra.artifacts import ArtifactStore, canonical_json
from infra.runs import RunsLayout

MAX_SHOWN = 12  # differing fields listed per stage; the count says how many more


@dataclass
class StageStatus:
    """One stage: its key, whether a complete artifact exists, otherwise why not (``reasons``) and, when a running
    run holds its compute lease now, that run's record (``computing_by``: pid, host, since; ``infra.leases``)."""

    stage: str
    key: str
    cached: bool
    path: str
    nearest: str | None = None
    reasons: list[str] = field(default_factory=list)
    computing_by: dict[str, Any] | None = None


def _leaves(value: Any, prefix: str = "") -> dict[str, str]:
    """Flatten a JSON-like value into {dotted path: canonical JSON of the leaf}."""
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: canonical_json(value)}


def _release_changes(old: dict, new: dict) -> tuple[list[str], set[str]]:
    """``sources: PACKAGE OLD → NEW (source names)`` for each Debian package whose resolved release differs (the
    archive moved, or the pin changed), and the config leaves those lines stand for."""
    old_sources, new_sources = old.get("sources"), new.get("sources")
    if not isinstance(old_sources, dict) or not isinstance(new_sources, dict):
        return [], set()
    changes: dict[tuple[str, str, str], list[str]] = {}
    covered: set[str] = set()
    for name, src in new_sources.items():
        was = old_sources.get(name)
        if not isinstance(src, dict) or "resolved" not in src or not isinstance(was, dict):
            continue
        a, b = was.get("resolved") or {}, src["resolved"]
        if a == b:
            continue
        covered.update(f"sources.{name}.resolved.{field}" for field in set(a) | set(b))
        if a.get("version") != b.get("version"):
            before, after = a.get("version", "(not recorded)"), b["version"]
        elif a.get("architecture") != b.get("architecture"):
            before, after = f"{a['version']} {a['architecture']}", f"{b['version']} {b['architecture']}"
        else:  # the same version rebuilt: only the file's checksum tells them apart
            before = f"{a.get('version')} (sha256 {str(a.get('sha256'))[:12]})"
            after = f"{b['version']} (sha256 {b['sha256'][:12]})"
        changes.setdefault((str(src.get("package")), before, after), []).append(name)
    lines = [f"sources: {package} {before} → {after} (source {', '.join(names)})"
             for (package, before, after), names in sorted(changes.items())]
    return lines, covered


def _differences(old: dict, new: dict) -> list[str]:
    """Human lines for every differing item between a stored artifact's meta and the wanted one."""
    lines, covered = _release_changes(old.get("config", {}), new["config"])
    old_cfg, new_cfg = _leaves(old.get("config", {})), _leaves(new["config"])
    for path in sorted(set(old_cfg) | set(new_cfg)):
        if old_cfg.get(path) != new_cfg.get(path) and path not in covered:
            lines.append(f"config {path}: {old_cfg.get(path, '(absent)')} → {new_cfg.get(path, '(absent)')}")
    for name in sorted(set(old.get("input_keys", {})) | set(new["input_keys"])):
        a, b = old.get("input_keys", {}).get(name), new["input_keys"].get(name)
        if a != b:
            lines.append(f"input {name}: {a} → {b} (the upstream artifact changed)")
    if old.get("code_version") != new["code_version"]:
        lines.append(f"code version: {old.get('code_version')} → {new['code_version']} (a file of the stage's "
                     "modules changed)")
    return lines


def stage_statuses(cfg: ExperimentConfig, layout: RunsLayout) -> list[StageStatus]:
    """Every stage in order with its key and cache state; uncached stages carry the differences from the nearest
    stored artifact (or say there is none) and the run computing them now, if any. Reads the store and the
    leases' holder records only; creates nothing."""
    store = ArtifactStore(layout.artifacts)
    out = []
    for name, stage_key in chain_keys(cfg).items():
        # The key hashes the config as the pipeline does (integer dict keys sort as numbers there); the JSON form,
        # as stored in meta.json, is only for listing differences.
        wanted = {"config": json.loads(canonical_json(stage_key.config)), "input_keys": stage_key.input_keys,
                  "code_version": stage_key.code_version}
        key = stage_key.key
        status = StageStatus(name, key, store.get(name, key) is not None, str(store.path(name, key)))
        if not status.cached:
            status.computing_by = store.lease_holder(name, key)
            candidates = []
            folder = layout.artifacts / name
            for path in sorted(folder.iterdir()) if folder.is_dir() else []:
                artifact = store.get(name, path.name)
                if artifact is not None:
                    candidates.append((len(_differences(artifact.meta, wanted)), path.name, artifact.meta))
            if candidates:
                _, status.nearest, meta = min(candidates)
                diffs = _differences(meta, wanted)
                status.reasons = diffs[:MAX_SHOWN] + ([f"... and {len(diffs) - MAX_SHOWN} more"]
                                                      if len(diffs) > MAX_SHOWN else [])
            else:
                status.reasons = ["no artifact of this stage exists yet"]
        out.append(status)
    return out
