"""Checks that need no Prefect, MLflow or training: run before anything starts, so a bad run fails in seconds.

Covers what config validation cannot see on its own: ``--refresh`` stage names, the cloze file the gate
reads, local sources whose include patterns match no file, Debian sources the apt package lists cannot resolve
(an unknown package, a pinned version the archive no longer has), decontamination files that match nothing, and a
gate edited after decisions were made.
"""

from __future__ import annotations

import glob
from typing import Iterable

from flows.config import ExperimentConfig
from evals.cloze import cloze_files
from flows.registry import check_stage_options
from infra.threads import thread_policy
from flows.gates import check_gate
from infra.errors import ConfigError
from infra.warehouse import Warehouse
from tasks.sources.deb import resolve_debs
from tasks.sources.read import match_files


def preflight(cfg: ExperimentConfig, refresh: Iterable[str] = (), warehouse: Warehouse | None = None, *,
              until: str | None = None) -> None:
    """Raise ``ConfigError``/``SourceError``/``GateError`` naming the problem; return silently when the run can start."""
    check_stage_options(refresh, until)
    cloze_files(cfg.gate.cloze_paths)
    thread_policy(cfg.torch_threads)  # an exported OMP_NUM_THREADS/OMP_WAIT_POLICY that OpenMP cannot use
    for name, source in cfg.sources.items():
        if source.kind == "local":
            match_files(source.include, None, name)  # raises SourceError naming the source and its patterns
    # The sources key needs every Debian release resolved; on a machine without package lists this fetches them.
    resolve_debs(((s.package, s.version) for s in cfg.sources.values() if s.kind == "deb"), update_lists=True)
    for pattern in cfg.corpus.decontamination.eval_files:  # else the corpus stage fails after reading every source
        if not glob.glob(pattern, recursive=True):
            raise ConfigError(f"corpus.decontamination.eval_files: {pattern!r} matches no file (relative paths are "
                              "read from the working directory); fix the pattern or remove it")
    if warehouse is not None:
        check_gate(cfg, warehouse)
