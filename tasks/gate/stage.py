"""Gate stage: apply the predeclared gate to the CPT candidates with paired statistics.

Outputs: ``decisions.parquet`` (the decision table: per candidate the general loss rise, the domain loss
reduction and cloze accuracy with confidence intervals, each criterion pass/fail/inconclusive, the overall
decision and which one is kept) and ``decision.json`` (gate hash, kept candidate, kept checkpoint path); with
harness criteria, ``harness_items.parquet`` (``tasks.gate.harness``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from evals.gate import HARNESS_METRICS, CandidateEval, GateConfig, HeldoutArrays, decide, gate_hash
from infra.stage import StageContext
from tasks.readers import load_candidates


def load_eval(cpt_dir: Path, name: str, params: dict, harness_correct: dict | None = None) -> CandidateEval:
    """The paired arrays one model was scored on (same windows and items as every other model); ``harness_correct``
    the per-document arrays of the gate's harness criteria (``tasks.gate.harness``)."""
    data = np.load(cpt_dir / "evals" / f"{name}.npz", allow_pickle=False)
    return CandidateEval(
        name=name,
        general=HeldoutArrays(data["general_window_nats"], data["general_window_tokens"]),
        domain=HeldoutArrays(data["domain_window_nats"], data["domain_window_tokens"]),
        cloze_correct=data["cloze_correct"].astype(bool),
        params=params,
        harness_correct=dict(harness_correct or {}),
    )


def plot_decision(table, cfg: GateConfig, path: Path) -> None:
    """The CPT replay grid's figure (docs/methods.md §11): domain loss reduction (x) against general loss rise (y) per candidate, with the intervals
    as error bars, the gate's thresholds as lines, and the verdict as colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"pass": "tab:green", "fail": "tab:red", "inconclusive": "tab:orange"}
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for row in table.to_dict("records"):
        x, y = row["domain_loss_reduction_nats"], row["general_loss_rise_nats"]
        xerr = [[x - row["domain_loss_reduction_nats_ci_low"]], [row["domain_loss_reduction_nats_ci_high"] - x]]
        yerr = [[y - row["general_loss_rise_nats_ci_low"]], [row["general_loss_rise_nats_ci_high"] - y]]
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="o", color=colours.get(row["decision"], "grey"), capsize=3)
        ax.annotate(row["candidate"] + (" (kept)" if row.get("kept") else ""), (x, y), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    for c in cfg.criteria:
        if c.metric == "domain_loss_reduction_nats":
            ax.axvline(c.threshold, color="grey", linestyle="--", linewidth=1)
        elif c.metric == "general_loss_rise_nats":
            ax.axhline(c.threshold, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("domain loss reduction (nats/token, base − candidate)")
    ax.set_ylabel("general loss rise (nats/token, candidate − base)")
    ax.set_title("CPT candidates and the gate (green pass, red fail, orange inconclusive)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(ctx: StageContext, cfg: GateConfig) -> dict[str, Any]:
    """Decide; the kept checkpoint is the best passing candidate, else the base (the main run)."""
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
    base = load_eval(cpt_dir, "base", {}, harness.get("base"))
    candidates = [load_eval(cpt_dir, name, {k: v for k, v in params.items() if k in ("replay_fraction", "peak_lr")},
                            harness.get(name))
                  for name, params in described.items() if name != "base"]
    decision = decide(cfg, base, candidates, seed=ctx.seed)
    decision.table.to_parquet(ctx.out / "decisions.parquet", index=False)
    kept_path = base_path if decision.kept == "base" else cpt_dir / "candidates" / decision.kept
    record = {"gate_hash": gate_hash(cfg), "kept": decision.kept, "kept_checkpoint": str(kept_path),
              "candidates_dir": str(cpt_dir / "candidates"), "base_checkpoint": str(base_path),
              "summary": decision.summary()}
    (ctx.out / "decision.json").write_text(json.dumps(record, indent=2))
    plot_decision(decision.table, cfg, ctx.out / "gate_scatter.png")
    return {"kept": decision.kept, "gate_hash": record["gate_hash"]}
