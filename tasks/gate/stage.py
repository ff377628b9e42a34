"""Gate stage: apply the predeclared gate to the CPT candidates with paired statistics.

Outputs: ``decisions.parquet`` (the decision table: per candidate the general loss rise, the domain loss
reduction and cloze accuracy with confidence intervals, each criterion pass/fail/inconclusive, the overall
decision and which one is kept) and ``decision.json`` (gate hash, kept candidate, kept checkpoint path).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from evals.gate import CandidateEval, GateConfig, HeldoutArrays, decide, gate_hash
from infra.stage import StageContext
from tasks.cpt.stage import load_candidates


def load_eval(cpt_dir: Path, name: str, params: dict) -> CandidateEval:
    """The paired arrays one model was scored on (same windows and items as every other model)."""
    data = np.load(cpt_dir / "evals" / f"{name}.npz")
    return CandidateEval(
        name=name,
        general=HeldoutArrays(data["general_window_nats"], data["general_window_tokens"]),
        domain=HeldoutArrays(data["domain_window_nats"], data["domain_window_tokens"]),
        cloze_correct=data["cloze_correct"].astype(bool),
        params=params,
    )


def run(ctx: StageContext, cfg: GateConfig) -> dict[str, Any]:
    """Decide; the kept checkpoint is the best passing candidate, else the base (the main run)."""
    cpt_dir = ctx.inputs["cpt"]
    described = load_candidates(cpt_dir)
    base = load_eval(cpt_dir, "base", {})
    candidates = [load_eval(cpt_dir, name, {k: v for k, v in params.items() if k in ("replay_fraction", "peak_lr")})
                  for name, params in described.items() if name != "base"]
    decision = decide(cfg, base, candidates, seed=ctx.seed)
    decision.table.to_parquet(ctx.out / "decisions.parquet", index=False)
    kept_path = (ctx.inputs["main"] / "checkpoint" if decision.kept == "base"
                 else cpt_dir / "candidates" / decision.kept)
    record = {"gate_hash": gate_hash(cfg), "kept": decision.kept, "kept_checkpoint": str(kept_path),
              "summary": decision.summary()}
    (ctx.out / "decision.json").write_text(json.dumps(record, indent=2))
    return {"kept": decision.kept, "gate_hash": record["gate_hash"]}
