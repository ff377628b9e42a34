"""Recording the gate before any CPT step, and refusing a changed gate once results exist (docs/methods.md §11).

The ``gates`` table is append-only: one row per declaration (experiment, gate_hash, declared_at, gate_json,
mlflow_parent_run_id, declared_after_evidence, evidence_before), never updated. A gate is hashed and timestamped the
first time it is declared for an experiment; the pipeline does that before its first stage, so a gate first seen by
a run is on record before any CPT candidate of that run trains. A run whose config's gate differs from the
experiment's latest declaration stops when decisions already exist under the old gate; ``pretrain gate declare
CONFIG`` adds the new declaration explicitly and keeps the old record.

A gate first declared when CPT evidence of the experiment already exists (``cpt_evidence``) is recorded as
``declared_after_evidence`` with what existed in ``evidence_before``: its decision is no predeclaration. Declaring
an earlier gate again appends a row that carries the mark of that gate's first declaration, since the rule itself
was fixed then.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Callable

import pandas as pd

from evals.gate import gate_hash
from flows.config import ExperimentConfig
from infra.errors import GateError
from infra.tracking import Tracker
from infra.warehouse import Warehouse

GATE_COLUMNS = ("experiment", "gate_hash", "declared_at", "gate_json", "mlflow_parent_run_id",
                "declared_after_evidence", "evidence_before")
# How many cpt artifacts ``evidence_before`` names before it only counts the rest.
NAMED_ARTIFACTS = 3


class Reader:
    """Read-only queries on the warehouse, or on an open connection (so a check and its insert share one writer).

    Args:
        run: ``(sql, params) -> DataFrame``; ``Warehouse.query`` or a connection's ``execute(...).df()``.
    """

    def __init__(self, run: Callable[[str, list], pd.DataFrame]):
        self.run = run

    @classmethod
    def of(cls, source: Warehouse | Any) -> "Reader":
        if isinstance(source, Warehouse):
            return cls(lambda sql, params: source.query(sql, params))
        return cls(lambda sql, params: source.execute(sql, params).df())

    def __call__(self, sql: str, params: list | None = None) -> pd.DataFrame:
        return self.run(sql, params or [])

    def columns(self, table: str) -> set[str]:
        """The columns of ``table`` (empty when it does not exist)."""
        rows = self("SELECT column_name FROM information_schema.columns WHERE table_name = ?", [table])
        return set(rows["column_name"]) if len(rows) else set()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def flag(value: Any) -> bool:
    """A ``declared_after_evidence`` value as a bool: NULL (rows written before the column existed) is False."""
    return bool(value) if value is not None and not pd.isna(value) else False


def _declaration(row: pd.Series | dict) -> dict[str, Any]:
    """A ``gates`` row as a dict, NULLs of the newer columns read as False / ""."""
    data = dict(row)
    data["declared_after_evidence"] = flag(data.get("declared_after_evidence"))
    text = data.get("evidence_before")
    data["evidence_before"] = "" if text is None or pd.isna(text) else str(text)
    return data


def _short(value: Any) -> str:
    return f"{pd.Timestamp(value):%Y-%m-%d %H:%M:%S} UTC" if value is not None and not pd.isna(value) else "?"


def cpt_evidence(read: Reader, experiment: str) -> str:
    """What CPT evidence of ``experiment`` the warehouse holds, in words; "" when none.

    The anchor is ``stage_runs`` (stage ``cpt``): an append-only log, one row per pipeline run that published a CPT
    artifact (trained or reused) for this experiment, with its time; rows of the artifact-keyed tables are rewritten
    by whichever experiment publishes an artifact last and carry neither experiment nor time, and the artifact store
    is shared by experiments and emptied by ``pretrain gc``. The candidates are counted from those artifacts'
    ``heldout_loss`` rows (stage ``cpt``, checkpoints other than ``base``), and the gate in force when each artifact
    was first published is named. ``gate_decisions`` rows of the experiment are evidence too.

    Args:
        read: queries on the warehouse (``Reader``).
        experiment: the config's ``name``.
    """
    parts = []
    stage_runs = read.columns("stage_runs")
    if {"experiment", "stage", "artifact_key"} <= stage_runs:
        since = "min(recorded_at)" if "recorded_at" in stage_runs else "NULL"
        runs = read(f"SELECT artifact_key, {since} AS first_at FROM stage_runs WHERE experiment = ? AND "
                    "stage = 'cpt' GROUP BY artifact_key ORDER BY first_at NULLS LAST, artifact_key", [experiment])
        scored = set()
        heldout = read.columns("heldout_loss")
        if len(runs) and {"checkpoint", "stage", "artifact_key"} <= heldout:
            keys = list(runs["artifact_key"])
            marks = ", ".join("?" * len(keys))
            found = read(f"SELECT DISTINCT artifact_key, checkpoint FROM heldout_loss WHERE stage = 'cpt' AND "
                         f"checkpoint <> 'base' AND artifact_key IN ({marks})", keys)
            scored = set(zip(found["artifact_key"], found["checkpoint"]))
        named = []
        for row in runs.head(NAMED_ARTIFACTS).to_dict("records"):
            n = sum(1 for key, _ in scored if key == row["artifact_key"])
            what = f"{n} CPT candidate{'s' * (n != 1)} scored" if n else "CPT results"
            gate = _gate_at(read, experiment, row["first_at"])
            named.append(f"{what} in cpt artifact {row['artifact_key'][:12]} (published {_short(row['first_at'])}"
                         + (f", gate {gate[:12]} in force)" if gate else ")"))
        if len(runs) > NAMED_ARTIFACTS:
            named.append(f"{len(runs) - NAMED_ARTIFACTS} more cpt artifact(s)")
        parts += named
    if {"experiment", "gate_hash", "candidate"} <= read.columns("gate_decisions"):
        rows = read("SELECT gate_hash, count(DISTINCT candidate) AS n FROM gate_decisions WHERE experiment = ? "
                    "GROUP BY gate_hash ORDER BY gate_hash", [experiment])
        parts += [f"gate decisions on {int(r['n'])} candidate(s) under gate {str(r['gate_hash'])[:12]}"
                  for r in rows.to_dict("records")]
    return "; ".join(parts)


def _gate_at(read: Reader, experiment: str, when: Any) -> str:
    """The experiment's gate in force at ``when`` (its latest declaration not after it); "" when none or unknown."""
    if when is None or pd.isna(when) or "declared_at" not in read.columns("gates"):
        return ""
    rows = read("SELECT gate_hash FROM gates WHERE experiment = ? AND declared_at <= ? ORDER BY declared_at DESC "
                "LIMIT 1", [experiment, pd.Timestamp(when).to_pydatetime()])
    return "" if rows.empty else str(rows["gate_hash"].iloc[0])


def latest_gate(warehouse: Warehouse, experiment: str) -> pd.Series | None:
    """The experiment's latest ``gates`` row (the declaration in force), or None."""
    if not warehouse.has_table("gates"):
        return None
    rows = warehouse.query("SELECT * FROM gates WHERE experiment = ? ORDER BY declared_at DESC LIMIT 1", [experiment])
    return None if rows.empty else rows.iloc[0]


def first_declaration(warehouse: Warehouse, experiment: str, gate: str) -> dict[str, Any] | None:
    """The first ``gates`` row of (experiment, gate hash): when that exact gate was fixed and whether evidence
    existed then (``declared_after_evidence``, ``evidence_before``; NULL of older rows read False / ""), or None."""
    if not warehouse.has_table("gates"):
        return None
    rows = warehouse.query("SELECT * FROM gates WHERE experiment = ? AND gate_hash = ? ORDER BY declared_at LIMIT 1",
                           [experiment, gate])
    return None if rows.empty else _declaration(rows.iloc[0])


def has_decisions(warehouse: Warehouse, experiment: str, gate: str) -> bool:
    if not warehouse.has_table("gate_decisions"):
        return False
    rows = warehouse.query("SELECT count(*) AS n FROM gate_decisions WHERE experiment = ? AND gate_hash = ?",
                           [experiment, gate])
    return int(rows["n"].iloc[0]) > 0


def declare_gate(cfg: ExperimentConfig, warehouse: Warehouse, run_id: str = "") -> tuple[dict, bool]:
    """Declare the config's gate unless it already is the experiment's latest declaration.

    Declaring the latest gate again adds no row; declaring an earlier gate after another one appends it anew,
    since the latest declaration is the one in force. A gate hash new to the experiment is marked
    ``declared_after_evidence`` when ``cpt_evidence`` finds any (``evidence_before`` says what); a gate declared
    before carries its first declaration's mark. The check and the insert share one connection, which DuckDB
    gives to one writer at a time, so concurrent runs add one row.

    Args:
        cfg: the experiment config (its ``name`` and ``[gate]``).
        warehouse: the DuckDB warehouse.
        run_id: the pipeline's MLflow parent run ("" for ``pretrain gate declare``).

    Returns:
        (the declaration in force, as a ``gates`` row; whether a row was added now).
    """
    current = gate_hash(cfg.gate)
    row = {"experiment": cfg.name, "gate_hash": current, "declared_at": _now(),
           "gate_json": cfg.gate.model_dump_json(), "mlflow_parent_run_id": run_id, "declared_after_evidence": False,
           "evidence_before": ""}
    with warehouse.connect() as con:
        read = Reader.of(con)
        _ensure_columns(con, "gates", pd.DataFrame([row]))
        latest = read("SELECT * FROM gates WHERE experiment = ? ORDER BY declared_at DESC LIMIT 1", [cfg.name])
        if len(latest) and latest["gate_hash"].iloc[0] == current:
            return _declaration(latest.iloc[0]), False
        first = read("SELECT * FROM gates WHERE experiment = ? AND gate_hash = ? ORDER BY declared_at LIMIT 1",
                     [cfg.name, current])
        if len(first):  # the rule was fixed at its first declaration: that one says whether evidence came first
            earlier = _declaration(first.iloc[0])
            row.update(declared_after_evidence=earlier["declared_after_evidence"],
                       evidence_before=earlier["evidence_before"])
        else:
            evidence = cpt_evidence(read, cfg.name)
            row.update(declared_after_evidence=bool(evidence), evidence_before=evidence)
        con.register("frame", pd.DataFrame([row]))
        con.execute("INSERT INTO gates BY NAME SELECT * FROM frame")
    return row, True


def _ensure_columns(con, table: str, frame: pd.DataFrame) -> None:
    """Create ``table`` from ``frame``'s columns, or add the ones an earlier version lacked (earlier rows NULL)."""
    con.register("frame", frame)
    con.execute(f"CREATE TABLE IF NOT EXISTS {table} AS SELECT * FROM frame LIMIT 0")
    have = {r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()}
    for column, dtype, *_ in con.execute("DESCRIBE SELECT * FROM frame").fetchall():
        if column not in have:
            con.execute(f'ALTER TABLE {table} ADD COLUMN "{column}" {dtype}')


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
            f"new one explicitly with `pretrain gate declare CONFIG` (the old record and its decisions are kept; "
            f"the new declaration is marked as made after evidence)."
        )
    return latest


def record_gate(cfg: ExperimentConfig, warehouse: Warehouse, tracker: Tracker, parent_run_id: str) -> dict:
    """Ensure the config's gate is the experiment's declared gate before any CPT step; tag the parent run.

    Tags: ``gate_hash``, ``gate_declared_at`` (the first declaration of that hash, UTC),
    ``gate_declared_after_evidence`` (``true``/``false``) and, when true, ``gate_evidence_before``.

    Returns:
        The first declaration of the config's gate for the experiment (a ``gates`` row), which its decision cites.
    Raises:
        GateError: the gate differs from the declared one and decisions were already made under the old one.
    """
    check_gate(cfg, warehouse)
    record, added = declare_gate(cfg, warehouse, parent_run_id)
    first = first_declaration(warehouse, cfg.name, record["gate_hash"]) or record
    late = first["declared_after_evidence"]
    tags = {"gate_hash": first["gate_hash"], "gate_declared_at": str(first["declared_at"]),
            "gate_declared_after_evidence": str(late).lower()}
    if late:
        tags["gate_evidence_before"] = first["evidence_before"][:4000]  # MLflow caps tag values
        if added:
            print(f"warning: gate {first['gate_hash'][:12]} of '{cfg.name}' is declared after evidence existed "
                  f"({first['evidence_before']}); its decision is marked as no predeclaration")
    tracker.set_tags(parent_run_id, tags)
    tracker.log_params(parent_run_id, {"gate": cfg.gate.model_dump()})
    return first


def declarations(warehouse: Warehouse, experiment: str) -> pd.DataFrame:
    """Every gate declaration of ``experiment`` (and of no other), newest first (empty frame when none);
    ``declared_after_evidence`` NULL of earlier rows reads False, ``evidence_before`` ""."""
    if not warehouse.has_table("gates"):
        return pd.DataFrame(columns=list(GATE_COLUMNS))
    rows = warehouse.query("SELECT * FROM gates WHERE experiment = ? ORDER BY declared_at DESC", [experiment])
    if rows.empty:
        return rows
    return pd.DataFrame([_declaration(r) for _, r in rows.iterrows()]).reset_index(drop=True)


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
                             "artifact_key IN (SELECT DISTINCT artifact_key FROM gate_decisions WHERE experiment = ? "
                             "AND gate_hash = ?) AND recorded_at IS NOT NULL ORDER BY recorded_at DESC LIMIT 1",
                             [experiment, experiment, gate])
    if latest.empty:
        return rows
    return rows[rows["artifact_key"] == latest["artifact_key"].iloc[0]].reset_index(drop=True)
