"""What the console summary, ``pretrain report`` and ``pretrain gate show`` show of the gate: the decision, its
table with intervals, and what would resolve undetermined criteria; in the summary also the decision record's line
and, per candidate, the held-out documents and windows behind each loss interval and whether the window-level
interval (correlated windows counted as independent, docs/methods.md §14) would have given another verdict."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pandas as pd
from rich.markup import escape

from evals.decision import DecisionRecord
from infra.report_blocks import Block, Figure, Heading, TableBlock, Text, rich_table
from infra.stage import ReportContext, SummaryContext


def undetermined_lines(table: pd.DataFrame) -> list[str]:
    """For each undetermined criterion of each candidate in the gate's decision table, how many items or held-out
    documents would resolve it (documents for a loss criterion, the units its interval resamples; "items/windows"
    for tables written before loss intervals resampled documents)."""
    lines = []
    for row in table.to_dict("records"):
        for column in (c for c in table.columns if c.startswith("status_")):
            name = column.removeprefix("status_")
            needed = row.get(f"needed_{name}")
            if row[column] == "undetermined" and needed is not None and needed == needed:
                units = ("held-out documents" if f"window_status_{name}" in row
                         else "items" if "domain_loss_reduction_nats_docs" in row else "items/windows")
                if units == "held-out documents" and needed == 2:  # fewer than 2 documents (evals.gate)
                    lines.append(f"{row['candidate']}: {name} is undetermined; it rests on fewer than 2 held-out "
                                 "documents, and at least 2 are needed for any interval")
                    continue
                resolve = (f"no finite number of {units} would" if needed == float("inf")
                           else f"about {needed:,.0f} {units} would")
                lines.append(f"{row['candidate']}: {name} is undetermined; {resolve} resolve it")
    return lines


LOSS_COLUMNS = {"general_loss_rise_nats": "general rise", "domain_loss_reduction_nats": "domain reduction",
                "long_loss_reduction_nats": "long-window reduction"}


def cluster_lines(table: pd.DataFrame) -> list[str]:
    """Per candidate and loss metric: the documents and windows behind the interval, the document-level interval
    beside the window-level one, and for each loss criterion on it whether the window-level interval would have
    given another status. Empty for tables written before loss intervals resampled documents."""
    lines = []
    for row in table.to_dict("records"):
        parts = []
        for metric, label in LOSS_COLUMNS.items():
            if f"{metric}_docs" not in row or row.get(metric) != row.get(metric):
                continue
            unit = "documents" if row[f"{metric}_cluster_unit"] == "document" else "clusters (no document ids)"
            part = (f"{label} [{row[f'{metric}_ci_low']:+.3f}, {row[f'{metric}_ci_high']:+.3f}] over "
                    f"{row[f'{metric}_docs']} {unit} / {row[f'{metric}_windows']} windows; by window "
                    f"[{row[f'{metric}_window_ci_low']:+.3f}, {row[f'{metric}_window_ci_high']:+.3f}]")
            parts.append(part)
        names = [c.removeprefix("window_status_") for c in table.columns if c.startswith("window_status_")]
        changed = [f"{name} would be {row['window_status_' + name]} by window (is {row['status_' + name]})"
                   for name in names if row["window_status_" + name] != row["status_" + name]]
        if parts:
            verdict = "; ".join(changed) if changed else "the window-level interval gives the same verdicts"
            lines.append(f"{row['candidate']}: " + "; ".join(parts) + f" — {verdict}")
    return lines


def declarations_frame(gates: pd.DataFrame) -> pd.DataFrame:
    """The ``gates`` rows of one experiment (newest first) as shown: short hash, declaration time, whether it is in
    force (the first row) and whether it was declared after evidence, with what existed then (rows written before
    the mark existed: no)."""
    late = gates["declared_after_evidence"] if "declared_after_evidence" in gates else pd.Series(False, gates.index)
    text = gates["evidence_before"] if "evidence_before" in gates else pd.Series("", gates.index)
    marks = ["yes: " + str(t) if (v is not None and not pd.isna(v) and bool(v)) else "no"
             for v, t in zip(late, text.fillna(""))]
    return pd.DataFrame({"gate_hash": gates["gate_hash"].str[:12], "declared_at": gates["declared_at"].astype(str),
                         "in force": ["yes"] + ["no"] * (len(gates) - 1), "declared after evidence": marks})


def gate_tables(gates: pd.DataFrame, decisions: pd.DataFrame, gate_cfg) -> list:
    """Rich renderables for ``pretrain gate show``: one experiment's declarations (newest first, the first is in
    force, each marked when declared after evidence), the decision table in the form of the CPT replay grid
    (docs/methods.md §11) with each metric's confidence interval and the decision, then each criterion's verdict
    per candidate, one row each (so no candidate or criterion name is cut however many there are). The tables fit
    the console they are printed on without cutting a cell (``infra.report_blocks.FrameTable``)."""
    out = []
    if gates.empty:
        return ["no gate declared yet for this experiment: `pretrain run` or `pretrain gate declare` records it"]
    out.append(rich_table("Gate declarations", declarations_frame(gates)))
    out.append("criteria in the config: " + "; ".join(criteria_lines(gate_cfg)))
    if decisions.empty:
        out.append("no decisions recorded under the gate in force yet")
        return out
    key = decisions["artifact_key"].iloc[0] if "artifact_key" in decisions else "?"
    frame = decision_frame(decisions)
    criteria = [c.removeprefix("status_") for c in decisions.columns if c.startswith("status_")]
    out.append(rich_table(f"Decisions under gate {decisions['gate_hash'].iloc[0][:12]} (gate artifact {key})",
                          frame.drop(columns=criteria)))
    if criteria:
        verdicts = frame.melt(id_vars="candidate", value_vars=criteria, var_name="criterion", value_name="verdict")
        out.append(rich_table("Criterion verdicts per candidate", verdicts.sort_values("candidate", kind="stable")))
    return out


def criteria_lines(gate_cfg) -> list[str]:
    """Each criterion of a ``[gate]`` config as ``name: metric op threshold at confidence``."""
    return [f"{c.name}: {c.metric} {c.op} {c.threshold:g} at {c.confidence:.0%}{_scoring_note(c.model_dump())}"
            for c in gate_cfg.criteria]


def _scoring_note(criterion: dict) -> str:
    """`` (per_token scoring)`` for a cloze criterion of a normalised scoring; "" at the sum (its dump has none)."""
    scoring = criterion.get("scoring", "sum")
    return "" if scoring == "sum" else f" ({scoring} scoring)"


CLOZE_SCORING_COLUMNS = {"cloze_accuracy_per_token": "cloze acc/token", "cloze_accuracy_per_byte": "cloze acc/byte"}


def decision_frame(decisions: pd.DataFrame) -> pd.DataFrame:
    """The gate's decision table in the form of the CPT replay grid (docs/methods.md §11), one row per candidate: its CPT parameters, each metric as
    ``value [low, high]`` (nats; cloze accuracy ± its standard error, per token and per byte too when the table
    has them, ``evals.cloze``), each criterion's status and the decision.

    Args:
        decisions: rows of ``decisions.parquet`` / DuckDB ``gate_decisions``.
    """
    def interval(row, metric):
        low, high = row.get(f"{metric}_ci_low"), row.get(f"{metric}_ci_high")
        value = row.get(metric)
        if value is None or value != value:
            return "-"
        return f"{value:+.3f} [{low:+.3f}, {high:+.3f}]"

    rows = []
    for row in decisions.to_dict("records"):
        entry = {"candidate": row["candidate"],
                 **({"recipe": row["param_recipe"]} if "param_recipe" in row else {}),
                 "replay": "-" if pd.isna(row.get("param_replay_fraction")) else f"{row['param_replay_fraction']:g}",
                 "peak_lr": "-" if pd.isna(row.get("param_peak_lr")) else f"{row['param_peak_lr']:g}",
                 "general rise (nats)": interval(row, "general_loss_rise_nats"),
                 "domain reduction (nats)": interval(row, "domain_loss_reduction_nats"),
                 "cloze acc": "-" if pd.isna(row.get("cloze_accuracy")) else
                 f"{row['cloze_accuracy']:.3f} ± {row.get('cloze_accuracy_se_pts', float('nan')) / 100:.3f}"}
        for column, label in CLOZE_SCORING_COLUMNS.items():
            if column in row:
                value, se = row[column], row.get(column + "_se_pts", float("nan")) / 100
                entry[label] = "-" if pd.isna(value) else f"{value:.3f} ± {se:.3f}"
        if "long_loss_reduction_nats" in row:  # a context extension (docs/methods.md §15)
            entry["long reduction (nats)"] = interval(row, "long_loss_reduction_nats")
            for column in sorted((c for c in decisions.columns if c.startswith("retrieval_accuracy_delta@")
                                  and "_" not in c.split("@")[1]), key=lambda c: int(c.split("@")[1])):
                entry[f"retrieval Δ@{column.split('@')[1]}"] = interval(row, column)
        for column in (c for c in decisions.columns if c.startswith("status_")):
            entry[column.removeprefix("status_")] = row[column]
        entry["decision"] = row["decision"] + (" (kept)" if row.get("kept") else "")
        rows.append(entry)
    return pd.DataFrame(rows)


def summary(ctx: SummaryContext) -> list[Any]:
    """The decision's summary, the decision record's line, the documents against windows behind each candidate's
    loss intervals, and what would resolve each undetermined criterion."""
    decision = json.loads((ctx.path / "decision.json").read_text())
    table = pd.read_parquet(ctx.path / "decisions.parquet")
    out: list[Any] = [f"[bold]Gate decision[/]\n{decision['summary']}"]
    if isinstance(decision.get("decision"), dict):
        record = DecisionRecord.from_dict(decision["decision"])
        out.append(f"  {record.line()}")
        if record.declared_after_evidence:
            before = escape(str(record.evidence.get("evidence_before_declaration", "")))
            out.append(f"  [yellow]the gate was declared after evidence existed[/]{': ' + before if before else ''}; "
                       "this decision is no predeclaration (docs/methods.md §11)")
    out.extend(f"  {line}" for line in cluster_lines(table))
    out.extend(f"  {line}" for line in undetermined_lines(table))
    return out


def report(ctx: ReportContext) -> list[Block]:
    """The gate decision: the gate, when it was declared (DuckDB ``gates``) and its criteria, the verdict, the
    decision table with intervals, the undetermined criteria, and the scatter figure (copied into
    ``ctx.plots_dir``) when the artifact has it."""
    path = ctx.path
    decision = json.loads((path / "decision.json").read_text())
    out: list[Block] = [Heading("Gate decision")]
    # The experiment's own first declaration of this gate: other experiments share the table.
    experiment = getattr(ctx.cfg, "name", None)
    declared = ctx.warehouse.query(
        "SELECT * FROM gates WHERE gate_hash = ? AND experiment = ? ORDER BY declared_at LIMIT 1",
        [decision["gate_hash"], experiment]) if experiment and ctx.warehouse.has_table("gates") else pd.DataFrame()
    when = f", declared {declared['declared_at'].iloc[0]:%Y-%m-%d %H:%M:%S} UTC" if not declared.empty else ""
    if not declared.empty and declarations_frame(declared)["declared after evidence"].iloc[0] != "no":
        when += f" after evidence existed ({declared['evidence_before'].iloc[0]})"
    gate_cfg = json.loads((path / "meta.json").read_text())["config"].get("gate", {})
    criteria = "; ".join(f"{c['name']}: {c['metric']} {c['op']} {c['threshold']:g} at {c['confidence']:.0%}"
                         f"{_scoring_note(c)}" for c in gate_cfg.get("criteria", []))
    out.append(Text(f"Gate `{decision['gate_hash'][:12]}`{when}. Criteria: {criteria or '(none recorded)'}."))
    table = pd.read_parquet(path / "decisions.parquet")
    counts = table["decision"].value_counts()
    out.append(Text(f"**Verdict:** kept `{decision['kept']}` ({len(table)} candidates: "
                    + ", ".join(f"{n} {d}" for d, n in counts.items()) + ")."))
    units = "held-out documents" if "domain_loss_reduction_nats_docs" in table.columns else "windows"
    out.append(TableBlock(f"Decisions with intervals (domain reduction and general rise in nats, paired bootstrap "
                          f"over {units})", decision_frame(table)))
    out.extend(Text(line + ".") for line in undetermined_lines(table))
    if (path / "gate_scatter.png").exists():
        shutil.copyfile(path / "gate_scatter.png", ctx.plots_dir / "gate_scatter.png")
        out.append(Figure(ctx.plots_dir / "gate_scatter.png", "Domain loss reduction against general loss rise, with "
                                                              "the thresholds"))
    return out
