"""The continued-pretraining stage's face: key (grid, packing, seed, the cloze files' bytes, the base's weights),
run, publish."""

from __future__ import annotations

import hashlib
from typing import Any

from infra.stage import Stage, StageContext, lazy
from tasks.cpt.digest import base_digest


def key_extra(cfg: Any) -> dict[str, Any]:
    """The cloze files' bytes, and the content of ``[cpt] base_checkpoint`` when one is given (its path alone is in
    the section): the stage's outputs depend on both."""
    from evals.cloze import cloze_files

    extra: dict[str, Any] = {"cloze_items": [hashlib.sha256(p.read_bytes()).hexdigest()[:16]
                                             for p in cloze_files(cfg.gate.cloze_paths)]}
    if cfg.cpt.base_checkpoint and not cfg.cpt.base_checkpoint.startswith("main@"):  # main@<name>: the main key
        from tasks.train.milestones import resolve_named

        extra["base_weights"] = base_digest(resolve_named(cfg.cpt.base_checkpoint))
    return extra


def run_cpt(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from evals.cloze import cloze_files, load_cloze_sets

    if cfg.cpt.kind == "context_extension":
        from evals.gate import RETRIEVAL_METRICS
        from tasks.cpt.context import run as run_context

        lengths = tuple(c.length for c in cfg.gate.criteria if c.metric in RETRIEVAL_METRICS and c.length)
        return run_context(ctx, cfg.cpt, general=cfg.general_sources,
                           cloze_items=load_cloze_sets(cloze_files(cfg.gate.cloze_paths)), packing=cfg.packing,
                           samples=cfg.samples, required_lengths=lengths)
    from tasks.cpt.stage import run

    return run(ctx, cfg.cpt, general=cfg.general_sources, cloze_items=load_cloze_sets(cloze_files(cfg.gate.cloze_paths)),
               packing=cfg.packing, samples=cfg.samples)


STAGE = Stage(name="cpt", inputs=("tokenizer", "mixture", "main"), code="tasks.cpt", run=run_cpt,
              sections=("cpt", "packing"), seeded=True, key_extra=key_extra, publish=lazy("tasks.cpt.publish:publish"),
              step_unit="optimiser steps (metrics prefixed by candidate)",
              summary=lazy("tasks.cpt.views:summary"), report=lazy("tasks.cpt.views:report"))
