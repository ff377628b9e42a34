"""What a rerun would do, and why: every stage's artifact key computed from the config alone, whether a complete
artifact exists for it, and — when not — how it differs from the nearest artifact already in the store.

Keys depend only on config fields, input keys and code (``infra.artifacts.artifact_key``), never on outputs, so
the whole chain's keys are known before anything runs. "Nearest" is the stored artifact of the same stage with the
fewest differing items (config leaves, input keys, code version); its differences are the explanation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from flows.config import ExperimentConfig
from flows.graph import STAGES
from infra.artifacts import ArtifactStore, artifact_key, canonical_json, code_version
from infra.runs import RunsLayout

MAX_SHOWN = 12  # differing fields listed per stage; the count says how many more


@dataclass
class StageStatus:
    """One stage: its key, whether a complete artifact exists, and otherwise why not (``reasons``)."""

    stage: str
    key: str
    cached: bool
    path: str
    nearest: str | None = None
    reasons: list[str] = field(default_factory=list)


def _leaves(value: Any, prefix: str = "") -> dict[str, str]:
    """Flatten a JSON-like value into {dotted path: canonical JSON of the leaf}."""
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: canonical_json(value)}


def _differences(old: dict, new: dict) -> list[str]:
    """Human lines for every differing item between a stored artifact's meta and the wanted one."""
    lines = []
    old_cfg, new_cfg = _leaves(old.get("config", {})), _leaves(new["config"])
    for path in sorted(set(old_cfg) | set(new_cfg)):
        if old_cfg.get(path) != new_cfg.get(path):
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
    stored artifact (or say there is none). Reads the store only; creates nothing."""
    store = ArtifactStore(layout.artifacts)
    keys: dict[str, str] = {}
    out = []
    for stage in STAGES:
        raw = stage.key_config(cfg)
        # The key hashes the config exactly as the pipeline does (integer dict keys sort as numbers there); the JSON
        # form, as stored in meta.json, is only for listing differences.
        wanted = {"config": json.loads(canonical_json(raw)), "input_keys": {n: keys[n] for n in stage.inputs},
                  "code_version": code_version(*stage.modules)}
        key = artifact_key(stage.name, raw, wanted["input_keys"], wanted["code_version"])
        keys[stage.name] = key
        status = StageStatus(stage.name, key, store.get(stage.name, key) is not None, str(store.path(stage.name, key)))
        if not status.cached:
            candidates = []
            folder = layout.artifacts / stage.name
            for path in sorted(folder.iterdir()) if folder.is_dir() else []:
                artifact = store.get(stage.name, path.name)
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
