"""Recording the scaling ladder's forecast before the main run starts, and checking it after (docs/methods.md §5).

The ``forecasts`` table is an append-only record (experiment, forecast_hash, declared_at, ladder_artifact_key,
main_artifact_key, predicted, low, high, forecast_json, declared_after_evidence, evidence_before): a forecast is
added once, when its (experiment, forecast_hash) is not there yet, and is never updated or replaced; a changed
forecast (another law, target or interval) is a new row beside the old one. ``forecast_checks`` adds one row per (experiment, forecast_hash, main
artifact): the measured held-out loss, the error, whether the interval covered it, and whether the forecast was on
record before that main artifact was made and before any main-run evidence of the experiment (``prospective``).

A forecast first recorded when a main-run artifact of the experiment already existed (``main_evidence``) is marked
``declared_after_evidence``, with what existed in ``evidence_before``: it is no forecast made blind, and none of its
checks is prospective.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Callable, Mapping

import pandas as pd

from flows.gates import NAMED_ARTIFACTS, Reader, flag
from flows.publish import PublishTarget
from infra.artifacts import Artifact, ArtifactStore
from infra.warehouse import Warehouse
from tasks.ladder.fit import forecast_check, token_weighted_loss

FORECAST_FILE = "forecast.json"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def _read(ladder: Artifact) -> dict[str, Any] | None:
    path = ladder.path / FORECAST_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _append_once(warehouse: Warehouse, table: str, row: dict[str, Any], match: Mapping[str, Any],
                 fill: Callable[[Reader], Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Append ``row`` unless a row with the ``match`` values exists; returns the row on record (the earlier one when
    it existed). Check and insert share one connection, which DuckDB gives one writer at a time; ``fill`` (queries
    on that connection → values) completes ``row`` in place just before it is inserted, so what it reads is what
    existed when the row went on record."""
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
        if fill is not None:
            row.update(fill(Reader.of(con)))
            con.register("frame", pd.DataFrame([row]))
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM frame")
    return row


def main_evidence(read: Reader, experiment: str, main: Artifact | None = None) -> str:
    """What main-run evidence of ``experiment`` exists, in words; "" when none.

    Sources: ``stage_runs`` rows of the main stage for the experiment (an append-only log with the time each main
    artifact was published for it; the artifact store is shared by experiments), and ``main``, the artifact the
    forecast is for, when it is already committed (its ``committed_at``, Unix seconds).

    Args:
        read: queries on the warehouse (``flows.gates.Reader``).
        experiment: the config's ``name``.
        main: the forecast main artifact when it exists already, else None.
    """
    parts = []
    if main is not None:
        made = dt.datetime.fromtimestamp(float(main.meta.get("committed_at", 0.0)), dt.timezone.utc)
        parts.append(f"main artifact {main.key[:12]} committed {made:%Y-%m-%d %H:%M:%S} UTC")
    columns = read.columns("stage_runs")
    if {"experiment", "stage", "artifact_key"} <= columns:
        since = "min(recorded_at)" if "recorded_at" in columns else "NULL"
        rows = read(f"SELECT artifact_key, {since} AS first_at FROM stage_runs WHERE experiment = ? AND "
                    "stage = 'main' GROUP BY artifact_key ORDER BY first_at NULLS LAST, artifact_key", [experiment])
        if main is not None:  # named above already
            rows = rows[rows["artifact_key"] != main.key]
        for r in rows.head(NAMED_ARTIFACTS).to_dict("records"):
            when = "" if pd.isna(r["first_at"]) else f" {pd.Timestamp(r['first_at']):%Y-%m-%d %H:%M:%S} UTC"
            parts.append(f"main artifact {r['artifact_key'][:12]} published for '{experiment}'{when}")
        if len(rows) > NAMED_ARTIFACTS:
            parts.append(f"{len(rows) - NAMED_ARTIFACTS} more main artifact(s)")
    return "; ".join(parts)


def record_forecast(warehouse: Warehouse, experiment: str, ladder: Artifact, main_key: str,
                    main: Artifact | None = None) -> tuple[dict, bool] | None:
    """Put the ladder artifact's forecast on record unless (experiment, forecast_hash) already is.

    A forecast new to the experiment is marked ``declared_after_evidence`` when ``main_evidence`` finds any
    (``evidence_before`` says what): ``main`` is the artifact of ``main_key`` when it exists already.

    Returns:
        (the row on record, whether it was added now), or None when the ladder has no forecast (disabled). An
        earlier row without the mark reads ``declared_after_evidence`` False.
    """
    forecast = _read(ladder)
    if forecast is None:
        return None
    p = forecast["prediction"]
    row = {"experiment": experiment, "forecast_hash": forecast["forecast_hash"], "declared_at": _now(),
           "ladder_artifact_key": ladder.key, "main_artifact_key": main_key, "predicted": float(p["predicted"]),
           "low": float(p["low"]), "high": float(p["high"]), "verdict": forecast["decision"]["verdict"],
           "forecast_json": json.dumps(forecast, sort_keys=True, default=str), "declared_after_evidence": False,
           "evidence_before": ""}

    def evidence(read: Reader) -> dict[str, Any]:
        text = main_evidence(read, experiment, main)
        return {"declared_after_evidence": bool(text), "evidence_before": text}

    kept = _append_once(warehouse, "forecasts", row, {"experiment": experiment,
                                                      "forecast_hash": forecast["forecast_hash"]}, evidence)
    if kept is row:
        return kept, True
    text = kept.get("evidence_before")
    return {**kept, "declared_after_evidence": flag(kept.get("declared_after_evidence")),
            "evidence_before": "" if text is None or pd.isna(text) else str(text)}, False


def forecast_on_record(warehouse: Warehouse, experiment: str, forecast_hash: str) -> dict[str, Any] | None:
    """The ``forecasts`` row of (experiment, forecast_hash), or None."""
    if not warehouse.has_table("forecasts"):
        return None
    rows = warehouse.query("SELECT * FROM forecasts WHERE experiment = ? AND forecast_hash = ?",
                           [experiment, forecast_hash])
    return None if rows.empty else rows.iloc[0].to_dict()


def prospective(declared: Mapping[str, Any] | None, main: Artifact) -> bool:
    """Whether the forecast row ``declared`` was on record before ``main`` was made (its ``committed_at``) and was
    not itself recorded after main-run evidence of the experiment (``declared_after_evidence``; NULL: False)."""
    if declared is None or flag(declared.get("declared_after_evidence")):
        return False
    made_at = dt.datetime.fromtimestamp(float(main.meta.get("committed_at", 0.0)), dt.timezone.utc).replace(tzinfo=None)
    return bool(pd.Timestamp(declared["declared_at"]) <= made_at)


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
    row = {"experiment": experiment, "forecast_hash": forecast["forecast_hash"], "main_artifact_key": main.key,
           "ladder_artifact_key": ladder.key, "predicted": check["predicted"], "low": check["low"],
           "high": check["high"], "actual": actual, "error": check["error"],
           "relative_error": check["relative_error"], "covered": check["covered"],
           "prospective": prospective(declared, main),
           "checked_at": _now()}
    return _append_once(warehouse, "forecast_checks", row, {"experiment": experiment,
                                                            "forecast_hash": forecast["forecast_hash"],
                                                            "main_artifact_key": main.key})


def after_stage(name: str, upstream: Mapping[str, Artifact], main_key: str | None, target: PublishTarget,
                store: ArtifactStore | None = None) -> None:
    """The pipeline's hook after each stage: after ``ladder`` (when the run goes on to ``main``, whose key is
    ``main_key``) the forecast is put on record before the main run starts; after ``main`` it is checked. Both tag
    and log the pipeline's parent MLflow run: ``forecast_declared_after_evidence`` (``true``/``false``) and, when
    true, ``forecast_evidence_before``.

    Args:
        store: the run's artifact store, where an existing main artifact of ``main_key`` is looked up; None: the
            store the ladder artifact lies in (``<root>/<stage>/<key>``).
    """
    tracker, parent = target.tracker, target.parent_run_id
    if name == "ladder" and main_key is not None:
        ladder = upstream["ladder"]
        # A main artifact already committed under that key is evidence the forecast comes after.
        existing = (store or ArtifactStore(ladder.path.parents[1])).get("main", main_key)
        recorded = record_forecast(target.warehouse, target.experiment, ladder, main_key, existing)
        if recorded is not None:
            row, added = recorded
            late = flag(row.get("declared_after_evidence"))
            tags = {"forecast_hash": row["forecast_hash"], "forecast_declared_at": str(row["declared_at"]),
                    "forecast_verdict": row["verdict"], "forecast_recorded_now": str(added).lower(),
                    "forecast_declared_after_evidence": str(late).lower()}
            if late:
                tags["forecast_evidence_before"] = str(row.get("evidence_before", ""))[:4000]  # MLflow caps tags
                if added:
                    print(f"warning: the ladder's forecast {row['forecast_hash'][:12]} of '{target.experiment}' is "
                          f"recorded after main-run evidence existed ({row['evidence_before']}); its checks are not "
                          "prospective")
            tracker.set_tags(parent, tags)
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
