"""The mixture stage's face: key (mixture, proxy, packing, seed), run, publish, figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infra.stage import Stage, StageContext, lazy


def run_mixture(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.mixture.stage import run

    return run(ctx, cfg.mixture, cfg.proxy, general=cfg.general_sources, packing=cfg.packing)


STAGE = Stage(name="mixture", inputs=("tokenizer",), code="tasks.mixture", run=run_mixture,
              sections=("mixture", "proxy", "packing"), seeded=True, publish=lazy("tasks.mixture.publish:publish"), figures=lazy("tasks.mixture.plots:mixture_figures"),
              step_unit="candidate index",
              summary=lazy("tasks.mixture.views:summary"), report=lazy("tasks.mixture.views:report"))
