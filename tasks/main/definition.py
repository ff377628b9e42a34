"""The main run's face: key (model, budget, optimiser and stability settings, packing, seed), run, expectations,
publish, figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infra.stage import PublishContext, Published, ReportContext, Stage, StageContext, SummaryContext


def run_main(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.main.stage import run

    return run(ctx, cfg.main, sources=cfg.general_sources + cfg.domain_sources, max_epochs=cfg.mixture.max_epochs,
               packing=cfg.packing)


def check_heldout(out: Path, cfg: Any) -> None:
    import pandas as pd

    from infra.expectations import check_heldout as expect

    expect(pd.read_parquet(out / "heldout.parquet"))


def publish(ctx: PublishContext) -> Published:
    from tasks.main.publish import publish

    return publish(ctx)


def figures(artifact: Path, out: Path, history: Any = None) -> list[Path]:
    from tasks.main.plots import main_figures

    return main_figures(artifact, out, history)


def summary(ctx: SummaryContext) -> list[Any]:
    from tasks.main.views import summary as lines

    return lines(ctx)


def report(ctx: ReportContext) -> list[Any]:
    from tasks.main.views import report as blocks

    return blocks(ctx)


STAGE = Stage(name="main", inputs=("tokenizer", "mixture", "sweep"), code="tasks.main.definition", run=run_main,
              sections=("main", "packing"), seeded=True, validate=check_heldout, publish=publish, figures=figures,
              wants_history=True, step_unit="optimiser steps",
              summary=summary, report=report)
