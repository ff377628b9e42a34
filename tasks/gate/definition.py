"""The gate stage's face: key (the declared gate, seed), run, publish."""

from __future__ import annotations

from typing import Any

from infra.stage import PublishContext, Published, ReportContext, Stage, StageContext, SummaryContext


def run_gate(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.gate.stage import run

    return run(ctx, cfg.gate)


def publish(ctx: PublishContext) -> Published:
    from tasks.gate.publish import publish

    return publish(ctx)


def summary(ctx: SummaryContext) -> list[Any]:
    from tasks.gate.views import summary as lines

    return lines(ctx)


def report(ctx: ReportContext) -> list[Any]:
    from tasks.gate.views import report as blocks

    return blocks(ctx)


STAGE = Stage(name="gate", inputs=("main", "cpt"), code="tasks.gate.definition", run=run_gate, sections=("gate",),
              seeded=True, publish=publish,
              summary=summary, report=report)
