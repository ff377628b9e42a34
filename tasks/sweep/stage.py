"""LR-sweep stage: an Optuna study over the proxy's peak LR under the chosen mixture.

Each trial trains the proxy with its own seed and reports the token-weighted held-out loss over the
general sources every ``sweep.report_every`` steps, so the median pruner can stop bad trials early. The
study lives in ``<runs>/optuna/`` (journal file with a lock, shared by workers, resumable after a kill).

Outputs: ``trials.parquet`` and ``best.json`` (best peak LR and its held-out loss).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

from infra.stage import StageContext
from tasks.mixture.stage import load_choice
from tasks.sweep.config import SweepConfig
from tasks.sweep.study import run_sweep
from tasks.tokenizer.stage import TokenizedCorpus
from tasks.train.loop import Callback
from tasks.train.runner import build_model, evaluate_sources, make_sampler, run_training, token_weighted_loss
from tasks.train.sections import ProxyConfig
from tasks.tokenizer.config import PackingConfig


class _Report(Callback):
    """Reports the held-out loss to Optuna at each evaluation (the pruner may raise TrialPruned)."""

    def __init__(self, corpus, sources, seq_len, eval_tokens, report: Callable[[int, float], None], curve: list):
        self.corpus, self.sources, self.seq_len, self.eval_tokens = corpus, sources, seq_len, eval_tokens
        self.report, self.curve = report, curve

    def on_eval(self, state, model) -> None:
        if state.step == 0:  # the untrained model says nothing about the LR; never prune on it
            return
        evals = evaluate_sources(model, self.corpus, self.sources, seq_len=self.seq_len, eval_tokens=self.eval_tokens)
        value = token_weighted_loss(evals)
        self.curve.append({"step": state.step, "heldout_loss_nats": value})
        self.report(state.step, value)


def run(ctx: StageContext, cfg: SweepConfig, proxy: ProxyConfig, *, general: list[str],
        packing: PackingConfig = PackingConfig()) -> dict[str, Any]:
    """Run (or resume) the study; returns the best peak LR."""
    corpus = TokenizedCorpus(ctx.inputs["tokenizer"])
    weights = load_choice(ctx.inputs["mixture"])["weights"]
    model_cfg = proxy.model.build(corpus.vocab_size)
    budget = proxy.budget.model_copy(update={"eval_every": cfg.report_every})

    def objective(peak_lr: float, seed: int, report: Callable[[int, float], None]) -> float:
        curve: list[dict] = []
        model = build_model(model_cfg, seed)
        sampler = make_sampler(corpus, weights, seq_len=model_cfg.seq_len, batch_size=budget.batch_size, seed=seed,
                               packing=packing)
        callback = _Report(corpus, general, model_cfg.seq_len, budget.eval_tokens, report, curve)
        try:
            run_training(model, sampler, peak_lr=peak_lr, budget=budget, seed=seed, callbacks=[callback])
        finally:
            ctx.log_child(f"trial lr={peak_lr:.2e}", {"peak_lr": peak_lr, "seed": seed}, curve)
        return curve[-1]["heldout_loss_nats"]

    ctx.layout.optuna.mkdir(parents=True, exist_ok=True)
    with ctx.progress.task("sweep: Optuna trials", cfg.n_trials) as advance:
        def counted(peak_lr: float, seed: int, report: Callable[[int, float], None]) -> float:
            try:
                return objective(peak_lr, seed, report)
            finally:
                advance(1)

        result = run_sweep(counted, cfg, storage_path=ctx.layout.optuna / ctx.experiment,
                           study_name=f"{ctx.experiment}-lr-{ctx.key}")
    trials = result.trials.copy()
    trials["intermediate"] = trials["intermediate"].map(lambda d: json.dumps(d, default=str))
    trials["study_name"] = result.study_name
    trials.to_parquet(ctx.out / "trials.parquet", index=False)
    best = {"best_lr": result.best_lr, "best_value": result.best_value, "study_name": result.study_name,
            "warning": edge_warning(result.best_lr, cfg)}
    (ctx.out / "best.json").write_text(json.dumps(best, indent=2))
    return best


def edge_warning(best_lr: float, cfg: SweepConfig, tolerance: float = 0.05) -> str:
    """A best LR on the edge of the searched range means the optimum may lie outside it."""
    for edge, side in ((cfg.lr_min, "lower"), (cfg.lr_max, "upper")):
        if abs(math.log(best_lr / edge)) <= tolerance:
            return (f"best peak LR {best_lr:.2e} is at the {side} edge of the searched range "
                    f"[{cfg.lr_min:.1e}, {cfg.lr_max:.1e}]; widen the range to locate the optimum")
    return ""


def load_best(path: Path) -> dict[str, Any]:
    return json.loads((path / "best.json").read_text())
