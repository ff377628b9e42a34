"""Gate stage: apply the predeclared gate to the CPT candidates with paired statistics (docs/methods.md §11).

The loss intervals resample held-out documents, all windows of a document together (Cameron, Gelbach & Miller
2008; docs/methods.md §14), from the document ids the CPT stage stores per window; the window-level interval stays
in the table for comparison.

Outputs: ``decisions.parquet`` (the decision table: per candidate the general loss rise, the domain loss
reduction and cloze accuracy with confidence intervals — under the summed, per-token and per-byte scorings when the
CPT artifact's ``cloze.parquet`` carries them (``evals.cloze``), and the scoring each cloze criterion uses —, the
documents and windows behind each loss interval, each
criterion pass/fail/undetermined, the overall decision and which one is kept) and ``decision.json`` (gate hash,
kept candidate, kept checkpoint path, and under ``"decision"`` the gate's ``evals.decision.DecisionRecord``); with
harness criteria, ``harness_items.parquet`` (``tasks.gate.harness``).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from evals.decision import DecisionRecord
from evals.gate import (HARNESS_METRICS, LOSS_METRICS, SELECTIONS, CandidateEval, GateConfig, GateDecision,
                        HeldoutArrays, decide, gate_hash)
from infra.errors import DataError
from infra.stage import StageContext
from tasks.readers import load_candidates


CLOZE_FILE = "cloze.parquet"


def load_cloze_results(cpt_dir: Path) -> pd.DataFrame | None:
    """The CPT artifact's per-item cloze rows (``cloze.parquet``: one row per checkpoint and item, ``evals.cloze``
    columns), checked by the ``cloze_results`` suite when there are any (decontamination may leave none); None
    when the artifact has no such file.

    Raises:
        DataError: the rows fail the suite (``infra.expectations.check_cloze``).
    """
    path = Path(cpt_dir) / CLOZE_FILE
    if not path.is_file():
        return None
    from infra.expectations import check_cloze

    frame = pd.read_parquet(path)
    if len(frame):
        check_cloze(frame)
    return frame


def _normalised_cloze(cloze: pd.DataFrame | None, name: str, cloze_correct: np.ndarray) -> dict[str, np.ndarray]:
    """``per_token`` / ``per_byte`` → bool (M,) per item for checkpoint ``name`` from the cloze rows; empty when the
    rows carry no normalised scorings (written before they existed) or none of this checkpoint.

    Raises:
        DataError: the checkpoint's rows are not the items of its ``evals/<name>.npz`` (count or sum correctness).
    """
    from evals.cloze import NORMALISED_SCORINGS, correct_column

    columns = [correct_column(s) for s in NORMALISED_SCORINGS]
    if cloze is None or "checkpoint" not in cloze.columns or not set(columns) <= set(cloze.columns):
        return {}
    rows = cloze[cloze["checkpoint"] == name]
    if rows.empty:
        return {}
    if len(rows) != cloze_correct.size or not np.array_equal(rows["correct"].to_numpy(bool), cloze_correct):
        raise DataError(f"{name}: the {len(rows)} rows of {CLOZE_FILE} are not the {cloze_correct.size} cloze items "
                        f"of evals/{name}.npz; refresh the cpt stage")
    return {s: rows[correct_column(s)].to_numpy(bool) for s in NORMALISED_SCORINGS}


def load_eval(cpt_dir: Path, name: str, params: dict, harness_correct: dict | None = None,
              cloze: pd.DataFrame | None = None) -> CandidateEval:
    """The paired arrays one model was scored on (same windows and items as every other model); ``harness_correct``
    the per-document arrays of the gate's harness criteria (``tasks.gate.harness``); ``cloze`` the artifact's cloze
    rows (``load_cloze_results``), whose per-token and per-byte correctness of this checkpoint's items go into
    ``cloze_normalised`` (none given, or rows without them: the sum only). The windows' document ids
    (``<role>_window_docs``) are read when the file has them; older files have none (each window its own cluster).
    Files of a context extension (``[cpt] kind = "context_extension"``, docs/methods.md §15) also hold the long
    windows (``long_window_nats``, ``_tokens``, ``_docs``) and the passkey prompts (``retrieval_correct``,
    ``retrieval_length``), read into ``long``, ``retrieval_correct`` and ``retrieval_length``."""
    data = np.load(cpt_dir / "evals" / f"{name}.npz", allow_pickle=False)

    def heldout(role: str) -> HeldoutArrays:
        docs = data[f"{role}_window_docs"] if f"{role}_window_docs" in data.files else None
        return HeldoutArrays(data[f"{role}_window_nats"], data[f"{role}_window_tokens"], docs)

    retrieval = {}
    if "retrieval_correct" in data.files:
        retrieval = {"retrieval_correct": data["retrieval_correct"].astype(bool),
                     "retrieval_length": data["retrieval_length"].astype(np.int64)}
    cloze_correct = data["cloze_correct"].astype(bool)
    return CandidateEval(
        name=name,
        general=heldout("general"),
        domain=heldout("domain"),
        cloze_correct=cloze_correct,
        params=params,
        harness_correct=dict(harness_correct or {}),
        long=heldout("long") if "long_window_nats" in data.files else None,
        cloze_normalised=_normalised_cloze(cloze, name, cloze_correct),
        **retrieval,
    )


def plot_decision(table, cfg: GateConfig, path: Path) -> None:
    """Write ``decision_figure`` to ``path`` (PNG)."""
    from infra.figures import save_figure

    save_figure(decision_figure(table, cfg), path, layout=False)


def decision_figure(table, cfg: GateConfig):
    """The CPT replay grid's figure (docs/methods.md §11): domain loss reduction (x) against general loss rise (y) per
    candidate, with the intervals as error bars, the gate's thresholds as lines, the verdict as colour, and each
    candidate's name placed clear of the other names and points (``infra.figures.label_points``)."""
    from infra.figures import label_points  # first: it selects the Agg backend before pyplot loads
    import matplotlib.pyplot as plt

    colours = {"pass": "tab:green", "fail": "tab:red", "undetermined": "tab:orange"}
    fig, ax = plt.subplots(figsize=(6.5, 4.5), dpi=100)
    def bar(row, metric):  # an unbounded side (fewer than 2 documents) is drawn without its bar
        low, high = row[metric] - row[f"{metric}_ci_low"], row[f"{metric}_ci_high"] - row[metric]
        return [[low if np.isfinite(low) else 0.0], [high if np.isfinite(high) else 0.0]]

    # A context extension's gain is on the long windows; domain adaptation's on the domain sources.
    x_metric = "long_loss_reduction_nats" if "long_loss_reduction_nats" in table.columns else "domain_loss_reduction_nats"
    points, labels = [], []
    for row in table.to_dict("records"):
        x, y = row[x_metric], row["general_loss_rise_nats"]
        xerr, yerr = bar(row, x_metric), bar(row, "general_loss_rise_nats")
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="o", color=colours.get(row["decision"], "grey"), capsize=3)
        points.append((x, y))
        labels.append(row["candidate"] + (" (kept)" if row.get("kept") else ""))
    for c in cfg.criteria:
        if c.metric == x_metric:
            ax.axvline(c.threshold, color="grey", linestyle="--", linewidth=1)
        elif c.metric == "general_loss_rise_nats":
            ax.axhline(c.threshold, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel(("long-window" if x_metric.startswith("long") else "domain")
                  + " loss reduction (nats/token, base − candidate)")
    ax.set_ylabel("general loss rise (nats/token, candidate − base)")
    ax.set_title("CPT candidates and the gate (green pass, red fail, orange undetermined)", fontsize=9)
    fig.tight_layout()
    label_points(ax, points, labels)
    return fig


def gate_rule(cfg: GateConfig) -> str:
    """The gate's rule in words: its criteria, the selection among passing candidates and the fallback."""
    criteria = "; ".join(f"{c.name}: {c.column} {c.op} {c.threshold:g} with the {c.confidence:.0%} interval wholly "
                         "on that side" for c in cfg.criteria)
    select = {"max_domain_loss_reduction": "the largest domain loss reduction",
              "min_general_loss_rise": "the smallest general loss rise",
              "max_long_loss_reduction": "the largest long-window loss reduction"}[cfg.select]
    return (f"every criterion passes ({criteria}; loss intervals resample held-out documents); among passing "
            f"candidates keep the one with {select}; none passes: keep the base")


def _resolve(decision: GateDecision, undetermined, prefer: str) -> str:
    """The largest finite ``needed_<criterion>`` over the undetermined candidates' undetermined criteria, in
    documents (loss criteria) or items; on a tie, candidate ``prefer``'s."""
    found = [(row[f"needed_{c.name}"], c, row) for row in undetermined.to_dict("records") for c in decision.criteria
             if row[f"status_{c.name}"] == "undetermined" and not math.isnan(row[f"needed_{c.name}"])]
    if not found:
        return "more held-out documents and items"
    finite = [f for f in found if math.isfinite(f[0])]
    needed, c, row = max(finite or found, key=lambda f: (f[0], f[2]["candidate"] == prefer))
    unit = "held-out documents" if c.metric in LOSS_METRICS else "items"
    if not math.isfinite(needed):
        return f"{c.name} of {row['candidate']} sits on its threshold: no finite number of {unit} settles it"
    if c.metric not in LOSS_METRICS:
        return f"about {needed:,.0f} {unit} for {c.name} of {row['candidate']}"
    docs = row[c.column + "_docs"]
    if row.get(f"reason_{c.name}"):  # below the minimum the coverage study sets (evals.stats.MIN_UNITS)
        return (f"at least {needed:,.0f} {unit} for {c.name} of {row['candidate']}, {docs} now (the fewest at "
                "which its interval's coverage holds, docs/methods.md §16)")
    return f"about {needed:,.0f} {unit} for {c.name} of {row['candidate']}, {docs} now"


def decision_record(cfg: GateConfig, decision: GateDecision, declared: DecisionRecord, *,
                    evidence: dict[str, Any]) -> DecisionRecord:
    """The gate's decision record (``evals.decision``, docs/methods.md §14).

    ``decided`` when a candidate passes (it is kept) or when every candidate fails (the base is kept);
    ``undetermined`` when none passes but some are undetermined: the base is kept as the fallback, and ``resolve``
    gives the largest number of documents (loss criteria) or items that a criterion of an undetermined candidate
    needs. The estimate and interval are the gate's selected metric (``evals.gate.SELECTIONS``: domain loss reduction,
    general loss rise or long-window loss reduction, nats/token, document-level interval) of the kept candidate, or
    of the best undetermined one by that metric; NaN when every candidate fails.
    """
    table = decision.table
    metric, largest = SELECTIONS[cfg.select]
    confidence = next((c.confidence for c in cfg.criteria if c.metric == metric), 0.95)
    undetermined = table[table["decision"] == "undetermined"]
    if decision.kept != "base":
        shown, verdict, fallback, resolve = table[table["candidate"] == decision.kept].iloc[0], "decided", "", ""
    elif len(undetermined):
        key = undetermined[metric]
        shown = undetermined.loc[key.idxmax() if largest else key.idxmin()]
        verdict, fallback = "undetermined", "keep the base"
        resolve = _resolve(decision, undetermined, shown["candidate"])
    else:
        shown, verdict, fallback, resolve = None, "decided", "", ""
    values = (math.nan,) * 3 if shown is None else (shown[metric], shown[f"{metric}_ci_low"],
                                                      shown[f"{metric}_ci_high"])
    estimate, low, high = (float(v) for v in values)
    # The units behind the shown candidate's verdict: its criterion resting on the fewest (documents or items).
    counts = [(int(shown[f"units_{c.name}"]), "documents" if c.metric in LOSS_METRICS else "items")
              for c in decision.criteria if shown is not None and f"units_{c.name}" in shown]
    n_units, units = min(counts) if counts else (0, "")
    return declared.settle(choice=decision.kept, verdict=verdict, estimate=estimate, low=low, high=high,
                           unit="nats/token", confidence=confidence, fallback=fallback, resolve=resolve,
                           evidence=evidence, n_units=n_units, units=units)


def gate_declaration(ctx: StageContext, gate: str) -> dict[str, Any] | None:
    """The first declaration of gate hash ``gate`` for ``ctx.experiment`` in DuckDB ``gates`` (the pipeline writes
    it before its first stage, ``flows.gates``): ``declared_at`` (naive UTC), ``declared_after_evidence`` (NULL of
    rows written before the column existed: False) and ``evidence_before``; None when the warehouse has none (a
    stage run outside the pipeline)."""
    from infra.warehouse import Warehouse

    warehouse = Warehouse(ctx.layout.duckdb)
    if not warehouse.has_table("gates"):
        return None
    rows = warehouse.query("SELECT * FROM gates WHERE experiment = ? AND gate_hash = ? ORDER BY declared_at LIMIT 1",
                           [ctx.experiment, gate])
    if rows.empty:
        return None
    row = rows.iloc[0].to_dict()
    late, text = row.get("declared_after_evidence"), row.get("evidence_before")
    return {"declared_at": row["declared_at"], "declared_after_evidence": bool(late) if pd.notna(late) else False,
            "evidence_before": str(text) if text is not None and pd.notna(text) else ""}


def declared_record(ctx: StageContext, cfg: GateConfig) -> tuple[DecisionRecord, str]:
    """The gate's decision record as declared, and what evidence preceded that declaration ("" when none).

    ``declared_at`` is the first declaration of this exact gate hash for the experiment (``gate_declaration``), so
    a rerun hours later still cites the time the rule was fixed, and ``declared_after_evidence`` is that
    declaration's mark; without one on record, the record is declared now, before this stage reads any evidence.
    """
    found = gate_declaration(ctx, gate_hash(cfg))
    when = None
    if found is not None:
        stamp = pd.Timestamp(found["declared_at"])  # gates stores naive UTC
        stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
        when = stamp.replace(microsecond=0, nanosecond=0).isoformat()
    declared = DecisionRecord.declare("gate", rule=gate_rule(cfg), rule_config=cfg.model_dump(mode="json"),
                                      declared_at=when)
    if found is None or not found["declared_after_evidence"]:
        return declared, ""
    return replace(declared, declared_after_evidence=True), found["evidence_before"]


def run(ctx: StageContext, cfg: GateConfig) -> dict[str, Any]:
    """Decide; the kept checkpoint is the best passing candidate, else the base (the main run).

    The decision record's ``declared_at`` and ``declared_after_evidence`` come from the experiment's first
    declaration of this gate hash (``declared_record``).
    """
    declared, evidence_before = declared_record(ctx, cfg)
    cpt_dir = ctx.inputs["cpt"]
    described = load_candidates(cpt_dir)
    # "base" is the checkpoint CPT started from: the main run's, or an external one ([cpt] base_checkpoint).
    base_path = Path(described["base"].get("checkpoint") or ctx.inputs["main"] / "checkpoint")
    harness = {}
    harness_criteria = [c for c in cfg.criteria if c.metric in HARNESS_METRICS]
    if harness_criteria:
        from tasks.gate.harness import experiment_tokenizer, score_harness

        checkpoints = {name: base_path if name == "base" else cpt_dir / "candidates" / name for name in described}
        harness = score_harness(checkpoints, harness_criteria, experiment_tokenizer(cpt_dir, ctx.layout.artifacts),
                                ctx.out, seed=ctx.seed)
    cloze = load_cloze_results(cpt_dir)
    base = load_eval(cpt_dir, "base", {}, harness.get("base"), cloze)
    # recipe, construction: context extension; recovery_steps: domain adaptation with a recovery phase
    shown = ("recipe", "construction", "replay_fraction", "peak_lr", "recovery_steps")
    candidates = [load_eval(cpt_dir, name, {k: v for k, v in params.items() if k in shown}, harness.get(name),
                            cloze) for name, params in described.items() if name != "base"]
    decision = decide(cfg, base, candidates, seed=ctx.seed)
    decision.table.to_parquet(ctx.out / "decisions.parquet", index=False)
    kept_path = base_path if decision.kept == "base" else cpt_dir / "candidates" / decision.kept
    evidence = {"table": "gate_decisions", "gate_hash": gate_hash(cfg), "artifact_key": ctx.key}
    if evidence_before:  # what existed before the gate was declared (DuckDB gates.evidence_before)
        evidence["evidence_before_declaration"] = evidence_before
    settled = decision_record(cfg, decision, declared, evidence=evidence)
    record = {"gate_hash": gate_hash(cfg), "kept": decision.kept, "kept_checkpoint": str(kept_path),
              "candidates_dir": str(cpt_dir / "candidates"), "base_checkpoint": str(base_path),
              "summary": decision.summary(), "decision": settled.as_dict()}
    (ctx.out / "decision.json").write_text(json.dumps(record, indent=2))
    plot_decision(decision.table, cfg, ctx.out / "gate_scatter.png")
    return {"kept": decision.kept, "gate_hash": record["gate_hash"]}
