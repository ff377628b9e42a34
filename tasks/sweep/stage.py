"""LR-sweep stage: an Optuna study over the proxy's peak LR under the chosen mixture, at one or more widths.

Each trial trains the proxy with its own seed and reports the token-weighted held-out loss over the
general sources every ``sweep.report_every`` steps, so the median pruner can stop bad trials early. The
studies live in ``<runs>/optuna/`` (journal file with a lock, shared by workers, resumable after a kill). A study's
name leaves ``n_trials`` out (TPE), so raising it continues the study instead of starting over.

Outputs: ``trials.parquet`` (every trial of every width) and ``best.json``: the best peak LR at the proxy width
(it feeds the main run) with the spread of LRs near the optimum, the best LR per width and the drift between
widths, and the loss forecast of the best trial (docs/methods.md §10).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from infra.artifacts import artifact_key, code_version
from infra.errors import DataError
from infra.runs import ensure_folder
from infra.stage import StageContext
from tasks.readers import load_choice
from tasks.sweep.config import SweepConfig
from tasks.sweep.forecast import forecast
from tasks.sweep.study import SweepResult, run_sweep
from tasks.train.corpus import TokenizedCorpus
from tasks.train.loop import Callback
from tasks.train.runner import build_model, evaluate_sources, make_sampler, run_training, token_weighted_loss
from tasks.train.sections import ModelShape, ProxyConfig
from tasks.train.packing import PackingConfig

SWEEP_CODE = ("tasks.sweep", "tasks.train", "models", "evals.heldout")


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


def at_width(shape: ModelShape, width: int) -> ModelShape:
    """``shape`` at d_model = ``width``: d_ff scaled in proportion (rounded to a multiple of 8), heads kept.

    Raises:
        DataError: ``width`` is not a multiple of the number of heads.
    """
    if width % shape.n_heads:
        raise DataError(f"sweep width {width} is not a multiple of n_heads = {shape.n_heads}: pick another width")
    d_ff = max(8, int(round(shape.d_ff * width / shape.d_model / 8)) * 8)
    return shape.model_copy(update={"d_model": width, "d_ff": d_ff})


def run(ctx: StageContext, cfg: SweepConfig, proxy: ProxyConfig, *, general: list[str],
        packing: PackingConfig = PackingConfig()) -> dict[str, Any]:
    """Run (or resume, or extend) the study at each width; returns the best peak LR at the proxy width."""
    corpus = TokenizedCorpus(ctx.inputs["tokenizer"])
    weights = load_choice(ctx.inputs["mixture"])["weights"]
    budget = proxy.budget.model_copy(update={"eval_every": cfg.report_every})
    base = proxy.model.d_model
    widths = [base, *(w for w in cfg.widths if w != base)]
    ensure_folder(ctx.layout.optuna)
    results: dict[int, SweepResult] = {}
    with ctx.progress.task("sweep: Optuna trials", cfg.n_trials * len(widths)) as advance:
        for width in widths:
            shape = at_width(proxy.model, width)
            model_cfg = shape.build(corpus.vocab_size)

            def objective(peak_lr: float, seed: int, report: Callable[[int, float], None], model_cfg=model_cfg,
                          width=width) -> float:
                curve: list[dict] = []
                model = build_model(model_cfg, seed)
                sampler = make_sampler(corpus, weights, seq_len=model_cfg.seq_len, batch_size=budget.batch_size,
                                       seed=seed, packing=packing)
                callback = _Report(corpus, general, model_cfg.seq_len, budget.eval_tokens, report, curve)
                try:
                    run_training(model, sampler, peak_lr=peak_lr, budget=budget, seed=seed, callbacks=[callback])
                finally:
                    ctx.log_child(f"trial d{width} lr={peak_lr:.2e}", {"peak_lr": peak_lr, "seed": seed,
                                                                       "d_model": width}, curve)
                    advance(1)
                return curve[-1]["heldout_loss_nats"]

            results[width] = run_sweep(objective, cfg, storage_path=ctx.layout.optuna / ctx.experiment,
                                       study_name=f"{ctx.experiment}-lr-d{width}-{study_key(ctx, cfg, proxy, shape, packing)}")
    trials = pd.concat([r.trials.assign(d_model=w, study_name=r.study_name) for w, r in results.items()],
                       ignore_index=True)
    best = results[base]
    tokens_per_step = budget.batch_size * proxy.model.seq_len
    record = {"best_lr": best.best_lr, "best_value": best.best_value, "study_name": best.study_name,
              "warning": edge_warning(best.best_lr, cfg),
              "spread": lr_spread(best.trials, cfg.spread_tolerance),
              "widths": [{"d_model": w, "best_lr": r.best_lr, "best_value": r.best_value, "study_name": r.study_name,
                          "edge_warning": edge_warning(r.best_lr, cfg)} for w, r in results.items()],
              "forecast": best_trial_forecast(best.trials, tokens_per_step, cfg.forecast_windows)}
    if len(widths) > 1:
        record["lr_drift"] = width_drift(results)
    trials["intermediate"] = trials["intermediate"].map(lambda d: json.dumps(d, default=str))
    trials.to_parquet(ctx.out / "trials.parquet", index=False)
    (ctx.out / "best.json").write_text(json.dumps(record, indent=2))
    summary = {"best_lr": best.best_lr, "best_value": best.best_value, "study_name": best.study_name,
               "lr_low": record["spread"]["lr_low"], "lr_high": record["spread"]["lr_high"]}
    if "lr_drift" in record:
        summary["lr_width_exponent"] = record["lr_drift"]["exponent"]
    return summary


def study_key(ctx: StageContext, cfg: SweepConfig, proxy: ProxyConfig, shape: ModelShape,
              packing: PackingConfig) -> str:
    """Key of one width's study: what changes its trials, without ``n_trials`` for TPE (raising it continues the
    study; a grid's points depend on it, so a grid keeps it) and without the reporting-only fields."""
    fields = cfg.model_dump(exclude={"widths", "spread_tolerance", "forecast_windows"}
                            | ({"n_trials"} if cfg.sampler == "tpe" else set()))
    config = {"sweep": fields, "proxy": proxy.model_copy(update={"model": shape}).model_dump(),
              "packing": packing.model_dump(), "seed": ctx.seed}
    inputs = {name: Path(path).name for name, path in sorted(ctx.inputs.items())}
    return artifact_key("sweep-study", config, inputs, code_version(*SWEEP_CODE))


def lr_spread(trials: pd.DataFrame, tolerance: float) -> dict[str, Any]:
    """The LRs of COMPLETE trials whose held-out loss is within ``tolerance`` (relative) of the best: their range,
    count, and the best loss (nats/token). One trial near the optimum means the spread is unknown, not zero."""
    done = trials[trials["state"] == "COMPLETE"]
    best = float(done["value"].min())
    near = done[done["value"] <= best * (1.0 + tolerance)]
    return {"tolerance": tolerance, "best_value": best, "lr_low": float(near["peak_lr"].min()),
            "lr_high": float(near["peak_lr"].max()), "n_within": int(len(near)), "n_complete": int(len(done))}


def width_drift(results: dict[int, SweepResult]) -> dict[str, Any]:
    """Best LR against width: the ratio between the widest and the narrowest sweep and the fitted exponent b of
    lr* ∝ d_model^b (least squares in log–log; b ≈ 0 means the LR transfers across widths)."""
    widths = sorted(results)
    x = np.log([float(w) for w in widths])
    y = np.log([results[w].best_lr for w in widths])
    exponent = float(np.polyfit(x, y, 1)[0])
    return {"widths": widths, "best_lrs": [results[w].best_lr for w in widths],
            "ratio": results[widths[-1]].best_lr / results[widths[0]].best_lr, "exponent": exponent}


def best_trial_forecast(trials: pd.DataFrame, tokens_per_step: int, windows: list[float]) -> list[dict] | str:
    """Forecasts of the best COMPLETE trial's final held-out loss from early parts of its curve, or the reason
    there is none (too few reports)."""
    done = trials[trials["state"] == "COMPLETE"]
    row = done.loc[done["value"].idxmin()]
    curve = sorted((int(step), float(loss)) for step, loss in row["intermediate"].items())
    tokens = [step * tokens_per_step for step, _ in curve]
    try:
        return [f.as_dict() for f in forecast(tokens, [loss for _, loss in curve], windows)]
    except DataError as err:
        return str(err)


def edge_warning(best_lr: float, cfg: SweepConfig, tolerance: float = 0.05) -> str:
    """A best LR on the edge of the searched range means the optimum may lie outside it."""
    for edge, side in ((cfg.lr_min, "lower"), (cfg.lr_max, "upper")):
        if abs(math.log(best_lr / edge)) <= tolerance:
            return (f"best peak LR {best_lr:.2e} is at the {side} edge of the searched range "
                    f"[{cfg.lr_min:.1e}, {cfg.lr_max:.1e}]; widen the range to locate the optimum")
    return ""
