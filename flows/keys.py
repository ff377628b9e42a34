"""The chain of artifact keys of an experiment, computed once from the config alone (every stage's key hashes its
config, its input keys and its code), for the run, ``pretrain status``, the audit and the report alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flows.registry import STAGES
from infra.artifacts import PROJECT_PACKAGES, artifact_key, code_version_closure
from infra.stage import Stage


@dataclass(frozen=True)
class StageKey:
    """One stage's key and what it was computed from (``config`` as hashed, input keys, code version)."""

    stage: str
    key: str
    config: dict[str, Any]
    input_keys: dict[str, str]
    code_version: str


def stage_key(stage: Stage, cfg: Any, upstream: dict[str, str]) -> StageKey:
    """The key of ``stage`` under ``cfg`` given its inputs' keys (``upstream``: stage → key)."""
    config = stage.key_config(cfg)
    inputs = {name: upstream[name] for name in stage.inputs}
    top = stage.code.partition(".")[0]  # a stage from outside the project (a plugin) is keyed by its own code too
    version = code_version_closure(stage.code, packages=PROJECT_PACKAGES + ((top,) if top not in PROJECT_PACKAGES else ()))
    return StageKey(stage.name, artifact_key(stage.name, config, inputs, version), config, inputs, version)


def chain_keys(cfg: Any, until: str | None = None) -> dict[str, StageKey]:
    """Every registered stage's key in order, up to and including ``until`` (None: all).

    Raises:
        ConfigError, SourceError: as the stages' key functions (e.g. a Debian pin the package lists lack).
    """
    keys: dict[str, StageKey] = {}
    for stage in STAGES:
        keys[stage.name] = stage_key(stage, cfg, {name: k.key for name, k in keys.items()})
        if stage.name == until:
            break
    return keys
