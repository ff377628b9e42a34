"""The mixture stage's face: key (mixture, proxy, packing, seed), run, publish, figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infra.stage import PublishContext, Published, ReportContext, Stage, StageContext, SummaryContext


def run_mixture(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.mixture.stage import run

    return run(ctx, cfg.mixture, cfg.proxy, general=cfg.general_sources, packing=cfg.packing)


def publish(ctx: PublishContext) -> Published:
    from tasks.mixture.publish import publish

    return publish(ctx)


def figures(artifact: Path, out: Path, history: Any = None) -> list[Path]:
    from tasks.mixture.plots import mixture_figures

    return mixture_figures(artifact, out)


def summary(ctx: SummaryContext) -> list[Any]:
    from tasks.mixture.views import summary as lines

    return lines(ctx)


def report(ctx: ReportContext) -> list[Any]:
    from tasks.mixture.views import report as blocks

    return blocks(ctx)


STAGE = Stage(name="mixture", inputs=("tokenizer",), code="tasks.mixture.definition", run=run_mixture,
              sections=("mixture", "proxy", "packing"), seeded=True, publish=publish, figures=figures,
              step_unit="candidate index",
              summary=summary, report=report)
