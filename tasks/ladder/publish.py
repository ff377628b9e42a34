"""What a ladder artifact puts into DuckDB (``ladder_points``, ``decisions``) and MLflow: the fitted constants with
their intervals, the goodness of fit, the backtest, the rule's checks, the compute-optimal allocation, the forecast
and its decision record."""

from __future__ import annotations

import json
import math

import pandas as pd

from evals.decision import decisions_frame
from infra.stage import PublishContext, Published
from tasks.ladder.forecast import decision_of


def publish(ctx: PublishContext) -> Published:
    path = ctx.artifact.path
    if not json.loads((path / "ladder.json").read_text()).get("enabled"):
        return Published(tags={"ladder": "not enabled"})
    forecast = json.loads((path / "forecast.json").read_text())
    record = decision_of(forecast)
    law, prediction, optimum = forecast["law"], forecast["prediction"], forecast["optimum"]
    metrics = {f"law.{name}": law[name] for name in ("E", "A", "alpha", "B", "beta")}
    for name, (low, high) in law["intervals"].items():
        metrics |= {f"law.{name}.low": low, f"law.{name}.high": high}
    metrics |= {"forecast.predicted": prediction["predicted"], "forecast.low": prediction["low"],
                "forecast.high": prediction["high"], "optimum.n_opt": optimum["n_opt"],
                "optimum.d_opt": optimum["d_opt"], "fit.objective": forecast["fit"]["objective"],
                "fit.max_abs_heldout_relative_error": forecast["max_abs_heldout_relative_error"],
                "decision.forecast.estimate": record.estimate, "decision.forecast.low": record.low,
                "decision.forecast.high": record.high}
    backtest = forecast.get("backtest") or {}
    metrics |= {f"backtest.{name}": backtest.get(name) for name in ("predicted", "low", "high", "measured",
                                                                     "relative_error", "extrapolation")}
    metrics["checks.extrapolation"] = forecast.get("checks", {}).get("extrapolation")
    for name, spread in forecast.get("checks", {}).get("spreads", {}).items():
        metrics[f"checks.spread.{name}"] = spread
    for g in forecast["goodness"]:
        metrics[f"heldout.d{g['width']}.s{g['steps']}.relative_error"] = g["relative_error"]
    return Published(
        tables={"ladder_points": pd.read_parquet(path / "points.parquet"), "decisions": decisions_frame([record])},
        metrics={k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(v)},
        params={"law.form": law["form"], "forecast_hash": forecast["forecast_hash"],
                "target.n_params": forecast["target"]["n_params"], "target.tokens": forecast["target"]["tokens"]},
        tags={"decision.forecast.verdict": record.verdict, "forecast_hash": forecast["forecast_hash"],
              "law.form": law["form"],
              "forecast.failed_rules": ",".join(sorted({r["rule"] for r in
                                                        forecast.get("assessment", {}).get("reasons", [])})) or "none"},
        files=["forecast.json", "points.parquet"],
    )
