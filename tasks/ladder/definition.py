"""The scaling-ladder stage's face: key (the ladder, the main run's shape, budget and LR rule, packing, seed; only
when enabled), run, expectations, publish, summary and report."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from infra.stage import Stage, StageContext, lazy


def key_ladder(cfg: Any) -> dict[str, Any]:
    """``{"ladder": False}`` when disabled (an empty artifact that no other setting re-keys); else the ladder, what
    of ``[main]`` the rungs and the forecast's target read, the batch source, packing, seed and general sources."""
    from infra.section import key_dump

    ladder = cfg.ladder
    if not ladder.enabled:
        return {"ladder": False}
    main = cfg.main
    return {"ladder": key_dump(ladder),
            "main": {"model": key_dump(main.model), "budget": key_dump(main.budget), "peak_lr": main.peak_lr,
                     "stability": key_dump(main.stability),
                     **({"min_lr_ratio": main.min_lr_ratio} if getattr(main, "min_lr_ratio", 0.1) != 0.1 else {})},
            "proxy_batch_size": cfg.proxy.budget.batch_size if ladder.batch == "proxy" else None,
            "packing": key_dump(cfg.packing), "seed": cfg.seed, "general_sources": sorted(cfg.general_sources)}


def run_ladder(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.ladder.stage import run

    return run(ctx, cfg.ladder, cfg.main, cfg.proxy, general=cfg.general_sources, packing=cfg.packing)


def check_ladder(out: Path, cfg: Any) -> None:
    """An enabled ladder has one row per rung of the grid, a finite forecast inside its interval, a decision record
    of kind ``forecast`` and the rule's assessment (verdict and reasons).

    Raises:
        DataError: naming what is missing or wrong.
    """
    from infra.errors import DataError

    if not json.loads((out / "ladder.json").read_text()).get("enabled"):
        return
    import pandas as pd

    points = pd.read_parquet(out / "points.parquet")
    if len(points) != len(cfg.ladder.grid()):
        raise DataError(f"ladder: {len(points)} rungs in points.parquet, the grid has {len(cfg.ladder.grid())}")
    forecast = json.loads((out / "forecast.json").read_text())
    p = forecast["prediction"]
    if not all(isinstance(p[k], (int, float)) and math.isfinite(p[k]) for k in ("predicted", "low", "high")) \
            or not p["low"] <= p["predicted"] <= p["high"]:
        raise DataError(f"ladder: the forecast {p['predicted']} [{p['low']}, {p['high']}] is not a finite value "
                        "inside its interval")
    if forecast.get("decision", {}).get("kind") != "forecast" or not forecast.get("forecast_hash"):
        raise DataError("ladder: forecast.json lacks its decision record or forecast_hash")
    if forecast.get("assessment", {}).get("verdict") != forecast["decision"].get("verdict"):
        raise DataError("ladder: forecast.json's assessment and its decision record disagree on the verdict")


STAGE = Stage(name="ladder", inputs=("tokenizer", "mixture", "sweep"), code="tasks.ladder", run=run_ladder,
              key_extra=key_ladder, validate=check_ladder, publish=lazy("tasks.ladder.publish:publish"),
              step_unit="rung index (widths outer, budgets inner)",
              summary=lazy("tasks.ladder.views:summary"), report=lazy("tasks.ladder.views:report"))
