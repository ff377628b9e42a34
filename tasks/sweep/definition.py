"""The LR sweep stage's face: key (sweep, proxy, packing, seed), run, publish."""

from __future__ import annotations

from typing import Any

from infra.stage import PublishContext, Published, ReportContext, Stage, StageContext, SummaryContext


def run_sweep(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.sweep.stage import run

    return run(ctx, cfg.sweep, cfg.proxy, general=cfg.general_sources, packing=cfg.packing)


def publish(ctx: PublishContext) -> Published:
    from tasks.sweep.publish import publish

    return publish(ctx)


def summary(ctx: SummaryContext) -> list[Any]:
    from tasks.sweep.views import summary as lines

    return lines(ctx)


def report(ctx: ReportContext) -> list[Any]:
    from tasks.sweep.views import report as blocks

    return blocks(ctx)


STAGE = Stage(name="sweep", inputs=("tokenizer", "mixture"), code="tasks.sweep.definition", run=run_sweep,
              sections=("sweep", "proxy", "packing"), seeded=True, publish=publish,
              step_unit="optimiser steps (per trial run)",
              summary=summary, report=report)
