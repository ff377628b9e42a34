"""What a gate artifact puts into DuckDB and MLflow: the decision table (each row with the corpus ``manifest_hash``
the compared models were trained and scored on), each candidate's verdict, the parent
run's headline (the kept model's held-out figures), and the model registry: the candidates not kept as versions of
``<experiment>-cpt-candidates``. The kept model is registered by the export stage (``tasks/export/publish.py``), as
the Hugging Face folder behind the alias ``kept`` of ``<experiment>-base``. The gate's decision record
(``evals.decision``, docs/methods.md §14) goes to the ``decisions`` table, the tag ``decision.gate.verdict`` and the
metrics ``decision.gate.estimate``/``low``/``high`` (domain loss reduction, nats/token). Whether the gate was declared
after CPT evidence existed (docs/methods.md §11) is the record's ``declared_after_evidence``: a column of the
``decisions`` and ``gate_decisions`` rows (False for artifacts written before records carried it) and the stage
run's tag ``decision.gate.declared_after_evidence``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from evals.decision import DecisionRecord, decisions_frame
from infra.stage import PublishContext, Published, Registration
from tasks.readers import recorded_manifest_hash


def publish(ctx: PublishContext) -> Published:
    path, key, experiment = ctx.artifact.path, ctx.artifact.key, ctx.cfg.name
    decision = json.loads((path / "decision.json").read_text())
    record = decision.get("decision") if isinstance(decision.get("decision"), dict) else {}
    table = pd.read_parquet(path / "decisions.parquet").assign(
        experiment=experiment, gate_hash=decision["gate_hash"],
        declared_after_evidence=bool(record.get("declared_after_evidence", False)),
        manifest_hash=gate_manifest_hash(ctx.inputs.get("main"), ctx.inputs.get("cpt"))).astype({"manifest_hash": "string"})
    # harness_items.parquet exists only when the gate names a harness criterion (tasks.gate.harness).
    files = ["decisions.parquet", "decision.json", "gate_scatter.png", "harness_items.parquet"]
    out = Published(tables={"gate_decisions": table}, files=files,
                    parent_tags={"gate_kept": decision["kept"], "gate_hash": decision["gate_hash"]})
    _headline(out, decision, table, ctx.inputs.get("cpt"))
    rows = table.to_dict("records")
    failing = {row["candidate"]: [c.removeprefix("status_") for c in table.columns
                                  if c.startswith("status_") and row[c] != "pass"] for row in rows}
    out.tags = {f"verdict.{row['candidate']}": row["decision"] + (
        f" ({', '.join(failing[row['candidate']])})" if failing[row["candidate"]] else "") for row in rows}
    if isinstance(decision.get("decision"), dict):  # gate artifacts written before decision records have none
        _decision_record(out, DecisionRecord.from_dict(decision["decision"]))
    cpt_dir = Path(decision["candidates_dir"]) if decision.get("candidates_dir") else None
    if cpt_dir is not None and ctx.remote_tracker:
        # A server registers uploaded copies only; the rejected candidates' verdicts stay as tags of this run
        # and their checkpoints in the artifact store, rather than uploading every candidate of the grid.
        out.tags["candidates_registry"] = f"not registered on a tracking server; checkpoints in {cpt_dir}"
    elif cpt_dir is not None:
        for row in rows:
            if row["candidate"] == decision["kept"]:
                continue
            verdict = "rejected" if row["decision"] == "fail" else row["decision"]
            out.registrations.append(Registration(
                f"{experiment}-cpt-candidates", str(cpt_dir / row["candidate"]),
                identity={"gate_artifact_key": key, "candidate": row["candidate"]},
                tags={"verdict": verdict, "failing_criteria": ", ".join(failing[row["candidate"]]),
                      "gate_hash": decision["gate_hash"]}))
    return out



def _headline(out: Published, decision: dict, table: pd.DataFrame, cpt) -> None:
    """The parent run's headline: the kept model's held-out loss and bits per byte per source (from the gate's
    input CPT artifact), and the verdict, so the MLflow experiment table compares runs without opening them."""
    kept = decision["kept"]
    passed = int((table["decision"] == "pass").sum())
    out.parent_tags["gate_verdict"] = f"kept {kept}" if kept != "base" else "no candidate passed; the base is kept"
    out.parent_metrics = {"gate.candidates": float(len(table)), "gate.candidates_passed": float(passed),
                          "gate.kept_is_base": float(kept == "base")}
    if cpt is not None and (cpt.path / "heldout.parquet").exists():
        heldout = pd.read_parquet(cpt.path / "heldout.parquet")
        for row in heldout[heldout["checkpoint"] == kept].drop_duplicates("source", keep="last").to_dict("records"):
            out.parent_metrics[f"kept.heldout_loss_nats.{row['source']}"] = row["loss_nats"]
            out.parent_metrics[f"kept.heldout_bits_per_byte.{row['source']}"] = row["bits_per_byte"]


def _decision_record(out: Published, record: DecisionRecord) -> None:
    """The record's ``decisions`` row, its verdict as tags of the stage and parent runs, and its finite figures as
    metrics of the stage run."""
    out.tables["decisions"] = decisions_frame([record])
    out.tags[f"decision.{record.kind}.verdict"] = record.verdict
    out.tags[f"decision.{record.kind}.declared_after_evidence"] = str(record.declared_after_evidence).lower()
    out.parent_tags[f"decision.{record.kind}.verdict"] = record.verdict
    out.metrics.update({f"decision.{record.kind}.{name}": value for name, value in
                        (("estimate", record.estimate), ("low", record.low), ("high", record.high))
                        if math.isfinite(value)})


def gate_manifest_hash(main, cpt) -> str | None:
    """The corpus manifest hash recorded in the main checkpoint (the base the CPT candidates continue from), else
    in the first CPT candidate's checkpoint; None when neither records one."""
    directories = [main.path / "checkpoint"] if main is not None else []
    directories += sorted(p.parent for p in (cpt.path / "candidates").glob("*/state.json")) if cpt is not None else []
    return recorded_manifest_hash(checkpoints=directories)
