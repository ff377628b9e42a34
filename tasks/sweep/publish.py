"""What a sweep artifact puts into DuckDB and MLflow: the trials, the decisions (peak LR per width, the width
exponent), the chosen LR (per width), the forecast errors."""

from __future__ import annotations

import json
import math

import pandas as pd

from evals.decision import DecisionRecord, decisions_frame
from infra.stage import PublishContext, Published


def publish(ctx: PublishContext) -> Published:
    path = ctx.artifact.path
    best = json.loads((path / "best.json").read_text())
    out = Published(tables={"sweep_trials": pd.read_parquet(path / "trials.parquet")}, files=["best.json"],
                    params={"choice.best_lr": best["best_lr"], "choice.study_name": best["study_name"]})
    # The chosen LR against width: one metric point per width (step = d_model).
    out.series = [("best_lr_by_width", row["best_lr"], int(row["d_model"])) for row in best.get("widths", [])]
    forecasts = best.get("forecast")
    if isinstance(forecasts, list):
        out.metrics = {f"forecast_error_nats.window_{f['window']:g}": f["error"] for f in forecasts}
    records = sweep_decisions(best)
    if records:
        out.tables["decisions"] = decisions_frame([r for _, r in records])
    base = best["widths"][0]["d_model"] if best.get("widths") else None
    for width, record in records:
        # The proxy width's peak LR (and the exponent) under the plain kind; other widths' under their d_model.
        name = record.kind if width in (None, base) else f"{record.kind}.d{width}"
        out.tags[f"decision.{name}.verdict"] = record.verdict
        out.tags[f"decision.{name}.choice"] = record.choice
        out.metrics.update({f"decision.{name}.{k}": v for k, v in
                            (("estimate", record.estimate), ("low", record.low), ("high", record.high))
                            if math.isfinite(v)})
    return out


def sweep_decisions(best: dict) -> list[tuple[int | None, DecisionRecord]]:
    """The settled decision records of a ``best.json``: (d_model, ``peak_lr``) per width, then (None,
    ``lr_width_exponent``) when several widths were swept; empty for an artifact written before records existed."""
    found = [(int(w["d_model"]), DecisionRecord.from_dict(w["decision"]))
             for w in best.get("widths", []) if isinstance(w.get("decision"), dict)]
    drift = best.get("lr_drift") or {}
    if isinstance(drift.get("decision"), dict):
        found.append((None, DecisionRecord.from_dict(drift["decision"])))
    return found
