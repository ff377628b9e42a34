"""The LR sweep stage's face: key (sweep, proxy, packing, seed), run, publish."""

from __future__ import annotations

from typing import Any

from infra.stage import Stage, StageContext, lazy


def run_sweep(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.sweep.stage import run

    return run(ctx, cfg.sweep, cfg.proxy, general=cfg.general_sources, packing=cfg.packing)


STAGE = Stage(name="sweep", inputs=("tokenizer", "mixture"), code="tasks.sweep", run=run_sweep,
              sections=("sweep", "proxy", "packing"), seeded=True, publish=lazy("tasks.sweep.publish:publish"),
              figures=lazy("tasks.sweep.plots:sweep_figures"),
              step_unit="optimiser steps (per trial run)",
              summary=lazy("tasks.sweep.views:summary"), report=lazy("tasks.sweep.views:report"))
