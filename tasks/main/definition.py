"""The main run's face: key (model, budget, optimiser and stability settings, packing, seed), run, expectations,
publish, figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infra.stage import Stage, StageContext, lazy


def run_main(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.main.stage import run

    return run(ctx, cfg.main, sources=cfg.general_sources + cfg.domain_sources, max_epochs=cfg.mixture.max_epochs,
               packing=cfg.packing, samples=cfg.samples)


def check_heldout(out: Path, cfg: Any) -> None:
    import pandas as pd

    from infra.expectations import check_heldout as expect

    expect(pd.read_parquet(out / "heldout.parquet"))


STAGE = Stage(name="main", inputs=("tokenizer", "mixture", "sweep"), code="tasks.main", run=run_main,
              sections=("main", "packing"), seeded=True, validate=check_heldout, publish=lazy("tasks.main.publish:publish"), figures=lazy("tasks.main.plots:main_figures"),
              wants_history=True, step_unit="optimiser steps",
              summary=lazy("tasks.main.views:summary"), report=lazy("tasks.main.views:report"))
