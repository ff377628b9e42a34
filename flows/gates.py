"""Recording the gate before any CPT step, and refusing a changed gate once results exist (docs/methods.md §11).

The ``gates`` table keeps every declaration (experiment, gate_hash, declared_at, gate_json). A run whose
config's gate differs from the experiment's latest declaration stops when decisions already exist under the
old gate; ``pretrain gate declare CONFIG`` adds the new declaration explicitly and keeps the old record.
"""

from __future__ import annotations

import datetime as dt

import pandas as pd

from evals.gate import gate_hash
from flows.config import ExperimentConfig
from infra.errors import GateError
from infra.tracking import Tracker
from infra.warehouse import Warehouse


def latest_gate(warehouse: Warehouse, experiment: str) -> pd.Series | None:
    if not warehouse.has_table("gates"):
        return None
    rows = warehouse.query("SELECT * FROM gates WHERE experiment = ? ORDER BY declared_at DESC LIMIT 1", [experiment])
    return None if rows.empty else rows.iloc[0]


def has_decisions(warehouse: Warehouse, experiment: str, gate: str) -> bool:
    if not warehouse.has_table("gate_decisions"):
        return False
    rows = warehouse.query("SELECT count(*) AS n FROM gate_decisions WHERE experiment = ? AND gate_hash = ?",
                           [experiment, gate])
    return int(rows["n"].iloc[0]) > 0


def declare_gate(cfg: ExperimentConfig, warehouse: Warehouse, run_id: str = "") -> tuple[dict, bool]:
    """Declare the config's gate unless it already is the experiment's latest declaration.

    Declaring the latest gate again adds no row; declaring an earlier gate after another one appends it anew,
    since the latest declaration is the one in force.

    Returns:
        (the declaration in force, whether a row was added now).
    """
    latest = latest_gate(warehouse, cfg.name)
    if latest is not None and latest["gate_hash"] == gate_hash(cfg.gate):
        return latest.to_dict(), False
    row = {"experiment": cfg.name, "gate_hash": gate_hash(cfg.gate),
           "declared_at": dt.datetime.now(dt.timezone.utc).replace(tzinfo=None),
           "gate_json": cfg.gate.model_dump_json(), "mlflow_parent_run_id": run_id}
    warehouse.append("gates", pd.DataFrame([row]))
    return row, True


def check_gate(cfg: ExperimentConfig, warehouse: Warehouse) -> pd.Series | None:
    """The experiment's latest declaration, after checking the config's gate may run against it.

    Raises:
        GateError: the gate differs from the declared one and decisions were already made under the old one.
    """
    latest = latest_gate(warehouse, cfg.name)
    current = gate_hash(cfg.gate)
    if latest is not None and latest["gate_hash"] != current and has_decisions(warehouse, cfg.name, latest["gate_hash"]):
        raise GateError(
            f"the [gate] of '{cfg.name}' changed after results were seen (declared {latest['gate_hash'][:12]} "
            f"at {latest['declared_at']}, config has {current[:12]}). Restore the declared gate, or declare the "
            f"new one explicitly with `pretrain gate declare CONFIG` (the old record and its decisions are kept)."
        )
    return latest


def record_gate(cfg: ExperimentConfig, warehouse: Warehouse, tracker: Tracker, parent_run_id: str) -> dict:
    """Ensure the config's gate is the experiment's declared gate before any CPT step; tag the parent run.

    Raises:
        GateError: the gate differs from the declared one and decisions were already made under the old one.
    """
    check_gate(cfg, warehouse)
    record, _ = declare_gate(cfg, warehouse, parent_run_id)
    tracker.set_tags(parent_run_id, {"gate_hash": record["gate_hash"], "gate_declared_at": record["declared_at"]})
    tracker.log_params(parent_run_id, {"gate": cfg.gate.model_dump()})
    return record


def declarations(warehouse: Warehouse, experiment: str) -> pd.DataFrame:
    """Every gate declaration of ``experiment``, newest first (empty frame when none)."""
    if not warehouse.has_table("gates"):
        return pd.DataFrame(columns=["experiment", "gate_hash", "declared_at", "gate_json"])
    return warehouse.query("SELECT * FROM gates WHERE experiment = ? ORDER BY declared_at DESC", [experiment])


def decision_rows(warehouse: Warehouse, experiment: str, gate: str | None) -> pd.DataFrame:
    """The decision table of the gate artifact published last for ``experiment`` under ``gate`` (empty when none).

    Several gate artifacts can exist under one gate (each CPT rerun makes one); the latest published is the one a
    user acts on, so only its rows are returned (its ``artifact_key`` is a column).
    """
    if gate is None or not warehouse.has_table("gate_decisions"):
        return pd.DataFrame()
    rows = warehouse.query("SELECT * FROM gate_decisions WHERE experiment = ? AND gate_hash = ? ORDER BY candidate",
                           [experiment, gate])
    if rows.empty or not warehouse.has_table("stage_runs"):
        return rows
    columns = set(warehouse.query("SELECT * FROM stage_runs LIMIT 0").columns)
    if "recorded_at" not in columns:
        return rows
    latest = warehouse.query("SELECT artifact_key FROM stage_runs WHERE experiment = ? AND stage = 'gate' AND "
                             "artifact_key IN (SELECT DISTINCT artifact_key FROM gate_decisions WHERE gate_hash = ?) "
                             "AND recorded_at IS NOT NULL ORDER BY recorded_at DESC LIMIT 1", [experiment, gate])
    if latest.empty:
        return rows
    return rows[rows["artifact_key"] == latest["artifact_key"].iloc[0]].reset_index(drop=True)
