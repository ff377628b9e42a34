"""What a sweep artifact puts into DuckDB and MLflow: the trials, the best LR (per width), the forecast errors."""

from __future__ import annotations

import json

import pandas as pd

from infra.stage import PublishContext, Published


def publish(ctx: PublishContext) -> Published:
    path = ctx.artifact.path
    best = json.loads((path / "best.json").read_text())
    out = Published(tables={"sweep_trials": pd.read_parquet(path / "trials.parquet")}, files=["best.json"],
                    params={"choice.best_lr": best["best_lr"], "choice.study_name": best["study_name"]})
    # Best LR against width: one metric point per width (step = d_model).
    out.series = [("best_lr_by_width", row["best_lr"], int(row["d_model"])) for row in best.get("widths", [])]
    forecasts = best.get("forecast")
    if isinstance(forecasts, list):
        out.metrics = {f"forecast_error_nats.window_{f['window']:g}": f["error"] for f in forecasts}
    return out
