"""Recording the scaling ladder's forecast before the main run starts, and checking it after (docs/methods.md §5).

The ``forecasts`` table is an append-only record (experiment, forecast_hash, declared_at, ladder_artifact_key,
main_artifact_key, predicted, low, high, forecast_json): a forecast is added once, when its (experiment,
forecast_hash) is not there yet, and is never updated or replaced; a changed forecast (another law, target or
interval) is a new row beside the old one. ``forecast_checks`` adds one row per (experiment, forecast_hash, main
artifact): the measured held-out loss, the error, whether the interval covered it, and whether the forecast was on
record before that main artifact was made (``prospective``).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Mapping

import pandas as pd

from flows.publish import PublishTarget
from infra.artifacts import Artifact
from infra.warehouse import Warehouse
from tasks.ladder.fit import forecast_check, token_weighted_loss

FORECAST_FILE = "forecast.json"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def _read(ladder: Artifact) -> dict[str, Any] | None:
    path = ladder.path / FORECAST_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _append_once(warehouse: Warehouse, table: str, row: dict[str, Any], match: Mapping[str, Any]) -> dict[str, Any]:
    """Append ``row`` unless a row with the ``match`` values exists; returns the row on record (the earlier one when
    it existed). Check and insert share one connection, which DuckDB gives one writer at a time."""
    frame = pd.DataFrame([row])
    conditions = " AND ".join(f'"{c}" = ?' for c in match)
    with warehouse.connect() as con:
        con.register("frame", frame)
        con.execute(f"CREATE TABLE IF NOT EXISTS {table} AS SELECT * FROM frame LIMIT 0")
        have = {r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()}
        for column, dtype, *_ in con.execute("DESCRIBE SELECT * FROM frame").fetchall():
            if column not in have:  # a newer version records more; earlier rows read NULL there
                con.execute(f'ALTER TABLE {table} ADD COLUMN "{column}" {dtype}')
        found = con.execute(f"SELECT * FROM {table} WHERE {conditions} ORDER BY 1 LIMIT 1", list(match.values())).df()
        if len(found):
            return found.iloc[0].to_dict()
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM frame")
    return row


def record_forecast(warehouse: Warehouse, experiment: str, ladder: Artifact, main_key: str) -> tuple[dict, bool] | None:
    """Put the ladder artifact's forecast on record unless (experiment, forecast_hash) already is.

    Returns:
        (the row on record, whether it was added now), or None when the ladder has no forecast (disabled).
    """
    forecast = _read(ladder)
    if forecast is None:
        return None
    p = forecast["prediction"]
    row = {"experiment": experiment, "forecast_hash": forecast["forecast_hash"], "declared_at": _now(),
           "ladder_artifact_key": ladder.key, "main_artifact_key": main_key, "predicted": float(p["predicted"]),
           "low": float(p["low"]), "high": float(p["high"]), "verdict": forecast["decision"]["verdict"],
           "forecast_json": json.dumps(forecast, sort_keys=True, default=str)}
    kept = _append_once(warehouse, "forecasts", row, {"experiment": experiment,
                                                      "forecast_hash": forecast["forecast_hash"]})
    return kept, kept is row


def forecast_on_record(warehouse: Warehouse, experiment: str, forecast_hash: str) -> dict[str, Any] | None:
    """The ``forecasts`` row of (experiment, forecast_hash), or None."""
    if not warehouse.has_table("forecasts"):
        return None
    rows = warehouse.query("SELECT * FROM forecasts WHERE experiment = ? AND forecast_hash = ?",
                           [experiment, forecast_hash])
    return None if rows.empty else rows.iloc[0].to_dict()


def check_forecast(warehouse: Warehouse, experiment: str, ladder: Artifact, main: Artifact) -> dict | None:
    """The forecast against the main artifact's ``heldout.parquet`` (token-weighted over the general sources the
    forecast names), appended to ``forecast_checks`` once per (experiment, forecast_hash, main key).

    Returns:
        The check row on record, or None when the ladder has no forecast.
    Raises:
        DataError: the main artifact has no held-out tokens of those sources.
    """
    forecast = _read(ladder)
    if forecast is None:
        return None
    p = forecast["prediction"]
    actual = token_weighted_loss(pd.read_parquet(main.path / "heldout.parquet"),
                                 forecast["target"]["general_sources"])
    check = forecast_check(float(p["predicted"]), float(p["low"]), float(p["high"]), actual)
    declared = forecast_on_record(warehouse, experiment, forecast["forecast_hash"])
    made_at = dt.datetime.fromtimestamp(float(main.meta.get("committed_at", 0.0)), dt.timezone.utc).replace(tzinfo=None)
    row = {"experiment": experiment, "forecast_hash": forecast["forecast_hash"], "main_artifact_key": main.key,
           "ladder_artifact_key": ladder.key, "predicted": check["predicted"], "low": check["low"],
           "high": check["high"], "actual": actual, "error": check["error"],
           "relative_error": check["relative_error"], "covered": check["covered"],
           "prospective": bool(declared is not None and pd.Timestamp(declared["declared_at"]) <= made_at),
           "checked_at": _now()}
    return _append_once(warehouse, "forecast_checks", row, {"experiment": experiment,
                                                            "forecast_hash": forecast["forecast_hash"],
                                                            "main_artifact_key": main.key})


def after_stage(name: str, upstream: Mapping[str, Artifact], main_key: str | None, target: PublishTarget) -> None:
    """The pipeline's hook after each stage: after ``ladder`` (when the run goes on to ``main``, whose key is
    ``main_key``) the forecast is put on record before the main run starts; after ``main`` it is checked. Both tag
    and log the pipeline's parent MLflow run."""
    tracker, parent = target.tracker, target.parent_run_id
    if name == "ladder" and main_key is not None:
        recorded = record_forecast(target.warehouse, target.experiment, upstream["ladder"], main_key)
        if recorded is not None:
            row, added = recorded
            tracker.set_tags(parent, {"forecast_hash": row["forecast_hash"], "forecast_declared_at":
                                      str(row["declared_at"]), "forecast_verdict": row["verdict"],
                                      "forecast_recorded_now": str(added).lower()})
            tracker.log_metrics(parent, {"forecast.predicted": row["predicted"], "forecast.low": row["low"],
                                         "forecast.high": row["high"]}, step=0)
    elif name == "main" and "ladder" in upstream:
        check = check_forecast(target.warehouse, target.experiment, upstream["ladder"], upstream["main"])
        if check is not None:
            tracker.log_metrics(parent, {"forecast.actual": check["actual"], "forecast.error": check["error"],
                                         "forecast.relative_error": check["relative_error"],
                                         "forecast.covered": float(check["covered"])}, step=0)
            tracker.set_tags(parent, {"forecast_covered": str(bool(check["covered"])).lower(),
                                      "forecast_prospective": str(bool(check["prospective"])).lower()})
