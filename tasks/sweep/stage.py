"""LR-sweep stage: an Optuna study over the proxy's peak LR under the chosen mixture, at one or more widths.

Each trial trains the proxy with its own seed and reports the token-weighted held-out loss over the
general sources every ``sweep.report_every`` steps, so the median pruner can stop bad trials early. The
studies live in ``<runs>/optuna/`` (journal file with a lock, shared by workers, resumable after a kill). A study's
name leaves ``n_trials`` out (TPE), so raising it continues the study instead of starting over; under
``--refresh sweep`` (``StageContext.refresh``) the study is deleted and run again from its first trial.

Outputs: ``trials.parquet`` (every trial of every width, numbered as an uninterrupted study numbers them:
``sweep_table``) and ``best.json``: per width, a cubic fit of held-out loss in ln(peak LR) with the Fieller
confidence set of its minimum and the declared rule's verdict (``tasks.sweep.lr_fit``, docs/methods.md §14): decided
→ the fitted optimum, undetermined → the best COMPLETE trial's LR (``best_lr``, which the main run reads), the
``decision`` record of the proxy width, the drift of the LR optimum across widths (an exponent only from ≥ 3
widths), the spread of LRs near the best trial, and the loss forecast of the best trial (docs/methods.md §10).
``best.json`` holds no NaN or infinity: a missing number is null with a ``reason`` beside it, and a decision record
leaves out an estimate or bound it does not have (``DecisionRecord.from_dict`` reads it back as NaN).
"""

from __future__ import annotations

import json
import math
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from evals.decision import DecisionRecord
from infra.artifacts import artifact_key, code_version
from infra.errors import DataError
from infra.runs import ensure_folder
from infra.stage import StageContext
from tasks.readers import load_choice
from tasks.sweep.config import SweepConfig
from tasks.sweep.forecast import forecast
from evals.stats import MIN_UNITS
from tasks.sweep.lr_fit import N_BOOTSTRAP, LrFit, LrRule, exponent_verdict, fit_lr, judge, width_exponent
from tasks.sweep.study import SweepResult, drop_study, finished_trials, run_sweep
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
    """Run (or resume, or extend) the study at each width and decide its peak LR; returns the peak LR at the proxy
    width (``best_lr``: the fitted optimum when decided, else the best trial's), its verdict and interval."""
    corpus = TokenizedCorpus(ctx.inputs["tokenizer"])
    weights = load_choice(ctx.inputs["mixture"])["weights"]
    budget = proxy.budget.model_copy(update={"eval_every": cfg.report_every})
    base = proxy.model.d_model
    widths = [base, *(w for w in cfg.widths if w != base)]
    ensure_folder(ctx.layout.optuna)
    rule = lr_rule(cfg)
    # The rules are fixed before any trial runs (docs/methods.md §14).
    declared = {w: DecisionRecord.declare("peak_lr", rule=rule.text(cfg.lr_min, cfg.lr_max),
                                          rule_config={**rule.config(cfg.lr_min, cfg.lr_max), "d_model": w})
                for w in widths}
    exponent_record = (DecisionRecord.declare("lr_width_exponent", rule=EXPONENT_RULE.format(c=cfg.confidence),
                                              rule_config={"confidence": cfg.confidence, "widths": sorted(widths),
                                                           "replicates": N_BOOTSTRAP,
                                                           "min_trials_per_width": MIN_UNITS["trials"]})
                       if len(widths) > 1 else None)
    results: dict[int, SweepResult] = {}
    storage = ctx.layout.optuna / ctx.experiment
    studies = {w: f"{ctx.experiment}-lr-d{w}-{study_key(ctx, cfg, proxy, at_width(proxy.model, w), packing)}"
               for w in widths}
    for name in studies.values():
        if not ctx.reuses(name, True):  # --refresh sweep: the study starts over (once: a rerun after a kill resumes)
            drop_study(storage, name)
            ctx.wrote(name)
    # The bar counts the trials still to run: a resumed sweep's finished ones are not work of this call.
    to_run = sum(max(0, cfg.n_trials - finished_trials(storage, name)) for name in studies.values())
    bar = ctx.progress.task("sweep: Optuna trials", to_run) if to_run else nullcontext(lambda n=1, doing=None: None)
    with bar as advance:
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

            results[width] = run_sweep(objective, cfg, storage_path=storage, study_name=studies[width])
    trials = pd.concat([sweep_table(r, w) for w, r in results.items()], ignore_index=True)
    best = results[base]
    tokens_per_step = budget.batch_size * proxy.model.seq_len
    fits = {w: fit_lr(r.trials, lr_min=cfg.lr_min, lr_max=cfg.lr_max, confidence=cfg.confidence,
                      seed=[ctx.seed, cfg.seed, w], replicates=N_BOOTSTRAP) for w, r in results.items()}
    entries = [width_entry(w, results[w], fits[w], rule, declared[w], cfg, ctx.key) for w in widths]
    chosen = entries[0]
    record = {"best_lr": chosen["best_lr"], "best_trial_lr": best.best_lr, "best_value": best.best_value,
              "study_name": best.study_name, "lr_source": chosen["lr_source"], "fit": chosen["fit"],
              "decision": chosen["decision"],
              "warning": edge_warning(best.best_lr, cfg),
              "spread": lr_spread(best.trials, cfg.spread_tolerance),
              "widths": entries,
              "forecast": best_trial_forecast(best.trials, tokens_per_step, cfg.forecast_windows)}
    if exponent_record is not None:
        record["lr_drift"] = width_drift(entries, fits, cfg.confidence, exponent_record, ctx.key)
        record["decisions"] = [record["lr_drift"]["decision"]]
    trials["intermediate"] = trials["intermediate"].map(lambda d: json.dumps(d, default=str))
    trials.to_parquet(ctx.out / "trials.parquet", index=False)
    (ctx.out / "best.json").write_text(json.dumps(json_safe(record), indent=2, allow_nan=False))
    summary = {"best_lr": chosen["best_lr"], "best_trial_lr": best.best_lr, "best_value": best.best_value,
               "study_name": best.study_name, "peak_lr_verdict": chosen["verdict"]}
    fit = fits[base]
    summary.update({k: v for k, v in (("peak_lr_fit", fit.optimum), ("peak_lr_low", fit.low),
                                      ("peak_lr_high", fit.high)) if math.isfinite(v)})
    exponent = record.get("lr_drift", {}).get("exponent")
    if exponent is not None:
        summary["lr_width_exponent"] = exponent
    return summary


def sweep_table(result: SweepResult, width: int) -> pd.DataFrame:
    """``trials.parquet``'s rows of one width's study (``SweepResult.sweep_trials``): one per trial of the sweep,
    numbered as an uninterrupted study numbers them (``number``: the trial's slot, ``study.trial_slot``), with
    ``optuna_number`` (its number in the Optuna journal, which also numbers the attempts a kill cut short) and
    ``retries`` (how often it was redone after a kill or Ctrl-C). Those cut-short attempts are left out: the retry
    that took each one's place has its LR and seed and so its result; the journal keeps them, with their
    ``fail_reason``."""
    return result.sweep_trials.assign(d_model=width, study_name=result.study_name)


EXPONENT_RULE = ("lr* ∝ d_model^b with b the least-squares slope of ln(fitted LR optimum) on ln(d_model) over ≥ 3 "
                 "widths whose optimum is resolved (a bounded Fieller set of the cubic's minimum from ≥ "
                 + str(MIN_UNITS["trials"]) + " COMPLETE trials); decided that the LR optimum moves with width when "
                 "≥ {c:.0%} of the bootstrap replicates (trials resampled within each width, the cubic refitted) "
                 "give a slope and its {c:.0%} percentile interval excludes 0; an interval containing 0 is "
                 "undetermined (it does not show that the LR transfers)")


def lr_rule(cfg: SweepConfig) -> LrRule:
    """The declared peak-LR rule of ``cfg`` (``lr_decided_factor``, ``confidence``, ``min_fit_trials``)."""
    return LrRule(factor=cfg.lr_decided_factor, confidence=cfg.confidence, min_fit_trials=cfg.min_fit_trials)


def width_entry(width: int, result: SweepResult, fit: LrFit, rule: LrRule, declared: DecisionRecord,
                cfg: SweepConfig, key: str) -> dict[str, Any]:
    """One width's part of ``best.json``: ``best_lr`` (the LR the rule chose: the fitted optimum when decided,
    else the best trial's), the best trial, the fit, the verdict and the settled ``peak_lr`` decision record."""
    judged = judge(fit, rule)
    evidence = {"table": "sweep_trials", "artifact_key": key, "study_name": result.study_name, "d_model": width,
                "state": "COMPLETE", "n_trials": fit.n_trials, "n_pruned_left_out": fit.n_pruned,
                "bounded": fit.bounded, "ratio": fit.ratio if math.isfinite(fit.ratio) else None}
    if fit.reason:
        evidence["no_interval"] = fit.reason
    decision = declared.settle(
        choice=f"{judged.lr:.4g}", verdict=judged.verdict, estimate=fit.optimum, low=fit.low, high=fit.high,
        unit="peak LR", confidence=rule.confidence, fallback=judged.fallback, resolve=judged.resolve,
        evidence=evidence, n_units=fit.n_trials, units="trials", min_units=rule.min_fit_trials)
    return {"d_model": width, "best_lr": judged.lr, "lr_source": judged.source, "best_trial_lr": result.best_lr,
            "best_value": result.best_value, "study_name": result.study_name,
            "edge_warning": edge_warning(result.best_lr, cfg), "verdict": judged.verdict,
            "fallback": judged.fallback, "resolve": judged.resolve, "fit": fit.as_dict(),
            "decision": decision_json(decision)}


def decision_json(record: DecisionRecord) -> dict[str, Any]:
    """``record.as_dict()`` without the estimate and bounds that are NaN or infinite: JSON has no NaN, and a null
    would not read back as a number (``DecisionRecord.from_dict`` fills a left-out field with its NaN default).
    ``evidence`` says why an interval is missing."""
    return {k: v for k, v in record.as_dict().items()
            if not (k in ("estimate", "low", "high") and not math.isfinite(v))}


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (NumPy's too) in nested dicts, lists and tuples replaced by None, so
    ``json.dumps(..., allow_nan=False)`` writes it."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def study_key(ctx: StageContext, cfg: SweepConfig, proxy: ProxyConfig, shape: ModelShape,
              packing: PackingConfig) -> str:
    """Key of one width's study: what changes its trials, without ``n_trials`` for TPE (raising it continues the
    study; a grid's points depend on it, so a grid keeps it) and without the reporting-only fields."""
    fields = cfg.model_dump(exclude={"widths", "spread_tolerance", "forecast_windows", "lr_decided_factor",
                                     "confidence", "min_fit_trials"}
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


def width_drift(entries: list[dict[str, Any]], fits: dict[int, LrFit], confidence: float,
                declared: DecisionRecord, key: str) -> dict[str, Any]:
    """The chosen LR against width: the ratio between the widest and the narrowest sweep, and the exponent b of
    lr* ∝ d_model^b with its bootstrap interval (``lr_fit.width_exponent``; None with a ``reason`` below 3 widths
    with a fitted optimum), settled as the ``lr_width_exponent`` decision record."""
    by_width = {e["d_model"]: e for e in entries}
    widths = sorted(by_width)
    drift = width_exponent(fits, confidence)
    verdict, resolve = exponent_verdict(drift, confidence)
    nan = math.nan
    estimate, low, high = (nan if drift[k] is None else drift[k] for k in ("exponent", "low", "high"))
    choice = (f"lr* ∝ d_model^{estimate:+.2f}" if verdict == "decided" else
              "per-width LRs" if drift["exponent"] is None else f"b = {estimate:+.2f}, not separated from 0")
    decision = declared.settle(
        choice=choice, verdict=verdict, estimate=estimate, low=low, high=high, unit="exponent of d_model",
        confidence=confidence, resolve=resolve,
        fallback="no exponent is used: each width keeps its own swept LR and the main run takes the width nearest "
                 "its d_model",
        evidence={"table": "sweep_trials", "artifact_key": key, "d_model": widths, "state": "COMPLETE"})
    return {**drift, "best_lrs": [by_width[w]["best_lr"] for w in widths],
            "ratio": by_width[widths[-1]]["best_lr"] / by_width[widths[0]]["best_lr"], "verdict": verdict,
            "decision": decision_json(decision)}


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
