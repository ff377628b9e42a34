"""The continued-pretraining stage's face: key (grid, packing, seed, the cloze files' bytes), run, publish."""

from __future__ import annotations

import hashlib
from typing import Any

from infra.stage import PublishContext, Published, ReportContext, Stage, StageContext, SummaryContext


def key_cloze_files(cfg: Any) -> dict[str, list[str]]:
    from evals.cloze import cloze_files

    return {"cloze_items": [hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in cloze_files(cfg.gate.cloze_paths)]}


def run_cpt(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from evals.cloze import cloze_files, load_cloze_sets
    from tasks.cpt.stage import run

    return run(ctx, cfg.cpt, general=cfg.general_sources, cloze_items=load_cloze_sets(cloze_files(cfg.gate.cloze_paths)),
               packing=cfg.packing)


def publish(ctx: PublishContext) -> Published:
    from tasks.cpt.publish import publish

    return publish(ctx)


def summary(ctx: SummaryContext) -> list[Any]:
    from tasks.cpt.views import summary as lines

    return lines(ctx)


def report(ctx: ReportContext) -> list[Any]:
    from tasks.cpt.views import report as blocks

    return blocks(ctx)


STAGE = Stage(name="cpt", inputs=("tokenizer", "mixture", "main"), code="tasks.cpt.definition", run=run_cpt,
              sections=("cpt", "packing"), seeded=True, key_extra=key_cloze_files, publish=publish,
              step_unit="optimiser steps (metrics prefixed by candidate)",
              summary=summary, report=report)
