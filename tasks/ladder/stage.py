"""Scaling-ladder stage: proxies of the main model at several widths and token budgets, a fit of
L(N, D) = E + A/N^α + B/D^β (Hoffmann et al. 2022), and the forecast of the main run's final held-out loss, made
before the main run starts (docs/methods.md §5).

Each (width × budget) rung is the main model at that width (``rungs.rung_shape``), trained on the chosen mixture at
the main run's LR rule applied at its width, with the main run's schedule (warmup-cosine by default) over its own
budget, and scored by the
token-weighted held-out loss over the general sources (nats/token), on the main run's ``eval_tokens``. N is the
non-embedding parameter count (``rungs.N_CONVENTION``), D = steps · batch · seq_len tokens.

The forecast's decision (``evals.decision``, kind ``forecast``) is declared before any rung trains: it is
``decided`` when the fit has the full five-parameter form and predicts every held-out rung within
``forecast_tolerance`` (relative); otherwise the forecast is recorded but not trusted (``undetermined``).

Outputs: ``points.parquet`` (one row per rung: shape, budget, LR, N, D, measured loss, whether held out, the fit's
prediction with its interval and relative error, why a rung was left out of the fit), ``forecast.json`` (the target
main run, the law with intervals, the prediction and its interval, ``forecast_hash`` over those three, the decision
record, goodness of fit and the compute-optimal allocation) and ``ladder.json`` (``enabled``). Disabled:
``ladder.json`` with ``enabled: false`` only.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import pandas as pd

from evals.decision import DecisionRecord
from infra.artifacts import canonical_json
from infra.errors import DataError
from infra.stage import StageContext
from models.arithmetic import param_count
from tasks.ladder.config import LadderConfig
from tasks.ladder.fit import (FORM_TEXT, FORMS, HUBER_DELTA, bootstrap_laws, choose_form, fit_law,
                              law_intervals, percentile_interval, predict_interval, token_weighted_loss)
from tasks.ladder.rungs import N_CONVENTION, Rung, RungTrainer, non_embedding_params, rung_budget, rung_peak_lr, rung_shape
from tasks.readers import load_best, load_choice
from tasks.train.corpus import TokenizedCorpus
from tasks.train.packing import PackingConfig
from tasks.train.sections import MainConfig, ProxyConfig

FALLBACK = "the forecast is recorded but not trusted"
HASHED = ("target", "law", "prediction")  # the canonical content behind forecast_hash


def forecast_hash(forecast: dict[str, Any]) -> str:
    """sha256 (hex) of the canonical JSON of the forecast's ``target``, ``law`` and ``prediction``."""
    return hashlib.sha256(canonical_json({k: forecast[k] for k in HASHED}).encode("utf-8")).hexdigest()


def declare(cfg: LadderConfig) -> DecisionRecord:
    """The forecast's rule, fixed before any rung trains."""
    held, _ = cfg.held_out()
    rule = (f"decided when the full five-parameter law L = E + A/N^α + B/D^β predicts every held-out ladder point "
            f"within ±{cfg.forecast_tolerance:.0%} relative error; else the forecast is recorded but not trusted")
    return DecisionRecord.declare("forecast", rule=rule, rule_config={
        "tolerance": cfg.forecast_tolerance, "holdout": [list(p) for p in held], "confidence": cfg.confidence,
        "bootstrap": cfg.bootstrap, "huber_delta": HUBER_DELTA, "grid": cfg.grid(),
        "forms": {form: len(names) + 1 for form, names in FORMS.items()}})


def run(ctx: StageContext, cfg: LadderConfig, main: MainConfig, proxy: ProxyConfig, *, general: list[str],
        packing: PackingConfig = PackingConfig()) -> dict[str, Any]:
    """Train (or read back) every rung, fit the law, forecast the main run. Returns the headline figures.

    Raises:
        DataError: fewer than 3 rungs finished with a finite loss, or no general source has a held-out split.
        ConfigError: no ``[main] peak_lr`` and no sweep result.
    """
    if not cfg.enabled:
        (ctx.out / "ladder.json").write_text(json.dumps({"enabled": False}))
        return {"enabled": False}
    record = declare(cfg)
    corpus = TokenizedCorpus(ctx.inputs["tokenizer"])
    if not any(corpus.has(source, "heldout") for source in general):
        raise DataError(f"none of the general sources {general} has a held-out split to score the ladder on")
    weights = load_choice(ctx.inputs["mixture"])["weights"]
    best = load_best(ctx.inputs["sweep"]) if "sweep" in ctx.inputs else None
    batch = main.budget.batch_size if cfg.batch == "main" else proxy.budget.batch_size
    trainer = RungTrainer(ctx, corpus, weights, general, packing, main.stability,
                          min_lr_ratio=getattr(main, "min_lr_ratio", 0.1))
    held, holdout_rule = cfg.held_out()
    rows = []
    with ctx.progress.task("ladder: proxy runs (width × budget)", len(cfg.grid())) as advance:
        for index, (width, steps) in enumerate(cfg.grid()):
            shape = rung_shape(main.model, width, cfg.scale_layers)
            lr, lr_from = rung_peak_lr(main, best, width)
            rung = Rung(width, shape, rung_budget(main, steps, batch), lr, lr_from)
            rows.append(_score(ctx, trainer, rung, corpus.vocab_size, general, held, index))
            advance(1)
    points = pd.DataFrame(rows)
    target = _target(main, corpus.vocab_size, general, best)
    forecast, points = _forecast(points, cfg, target, holdout_rule, seed=ctx.seed)
    forecast["forecast_hash"] = forecast_hash(forecast)
    record = settle(record, forecast, cfg, ctx.key)
    forecast["decision"] = record.as_dict()
    forecast["rungs"] = {"trained": trainer.trained, "reused": trainer.reused}
    points.to_parquet(ctx.out / "points.parquet", index=False)
    (ctx.out / "forecast.json").write_text(json.dumps(forecast, indent=2, default=str))
    (ctx.out / "ladder.json").write_text(json.dumps({"enabled": True}))
    prediction = forecast["prediction"]
    return {"enabled": True, "form": forecast["law"]["form"], "predicted_loss_nats": prediction["predicted"],
            "predicted_low": prediction["low"], "predicted_high": prediction["high"], "verdict": record.verdict,
            "forecast_hash": forecast["forecast_hash"], "rungs_trained": trainer.trained,
            "rungs_reused": trainer.reused}


def _score(ctx: StageContext, trainer: RungTrainer, rung: Rung, vocab_size: int, general: list[str],
           held: list[tuple[int, int]], index: int) -> dict[str, Any]:
    """One rung's row of ``points.parquet``; a diverged rung gets a NaN loss and its reason."""
    tokens = rung.budget.steps * rung.budget.batch_size * rung.shape.seq_len
    n_params = non_embedding_params(rung.shape, vocab_size)
    row = {"width": rung.width, "n_layers": rung.shape.n_layers, "d_ff": rung.shape.d_ff, "steps": rung.budget.steps,
           "batch_size": rung.budget.batch_size, "warmup_steps": rung.budget.warmup_steps, "peak_lr": rung.peak_lr,
           "lr_from": json.dumps(rung.lr_from, sort_keys=True), "n_params": n_params,
           "n_params_total": int(param_count(rung.shape.build(vocab_size)).total), "tokens": tokens,
           "held_out": (rung.width, rung.budget.steps) in held, "excluded": ""}
    try:
        scored, cached = trainer.scores(rung)
    except DataError as err:
        row.update(loss_nats=math.nan, heldout_tokens=0, tokens_seen=0, wall_s=math.nan, cached=False,
                   excluded=f"training failed: {err}")
        print(f"warning: ladder rung d{rung.width} × {rung.budget.steps} steps left out of the fit: {err}")
        return row
    loss = token_weighted_loss(scored, general, tokens="heldout_tokens")
    row.update(loss_nats=loss, heldout_tokens=int(scored["heldout_tokens"].sum()),
               tokens_seen=int(scored["tokens_seen"].iloc[0]), wall_s=float(scored["wall_s"].iloc[0]), cached=cached)
    if not math.isfinite(loss):
        row["excluded"] = "non-finite held-out loss"
    ctx.log_metrics({"rung.heldout_loss_nats": loss, "rung.n_params": n_params, "rung.tokens": tokens}, index)
    ctx.log_child(f"rung d{rung.width} × {rung.budget.steps} steps",
                  {"d_model": rung.width, "n_layers": rung.shape.n_layers, "steps": rung.budget.steps,
                   "batch_size": rung.budget.batch_size, "peak_lr": rung.peak_lr, "n_params": n_params,
                   "tokens": tokens, "cached": cached, "held_out": row["held_out"]},
                  [{"step": rung.budget.steps, "heldout_loss_nats": loss, "tokens": float(tokens)}])
    return row


def _target(main: MainConfig, vocab_size: int, general: list[str], best: dict | None) -> dict[str, Any]:
    """The main run the forecast is for: its shape, budget, N (non-embedding), D and the general sources."""
    lr, _ = rung_peak_lr(main, best, main.model.d_model)
    return {"model": main.model.model_dump(), "vocab_size": vocab_size,
            "n_params": non_embedding_params(main.model, vocab_size),
            "n_params_total": int(param_count(main.model.build(vocab_size)).total), "steps": main.budget.steps,
            "batch_size": main.budget.batch_size, "seq_len": main.model.seq_len,
            "tokens": main.budget.steps * main.budget.batch_size * main.model.seq_len, "peak_lr": lr,
            "eval_tokens": main.budget.eval_tokens, "general_sources": sorted(general), "n_convention": N_CONVENTION}


def _forecast(points: pd.DataFrame, cfg: LadderConfig, target: dict[str, Any], holdout_rule: str,
              seed: int) -> tuple[dict[str, Any], pd.DataFrame]:
    """Fit, bootstrap, goodness of fit on the held-out rungs, compute-optimal allocation and the forecast."""
    usable = points["excluded"] == ""
    fit_rows = points[usable & ~points["held_out"]]
    form = choose_form(len(fit_rows))
    n, d, loss = (fit_rows[c].to_numpy(float) for c in ("n_params", "tokens", "loss_nats"))
    law, objective = fit_law(n, d, loss, form)
    laws = bootstrap_laws(n, d, loss, law, cfg.bootstrap, seed=seed)
    c = cfg.confidence
    points = points.copy()
    points["predicted"] = law.loss(points["n_params"].to_numpy(float), points["tokens"].to_numpy(float))
    bounds = [predict_interval(laws, r.n_params, r.tokens, c) for r in points.itertuples()]
    points["predicted_low"], points["predicted_high"] = [b[0] for b in bounds], [b[1] for b in bounds]
    points["relative_error"] = (points["predicted"] - points["loss_nats"]) / points["loss_nats"]
    checked = points[usable & points["held_out"]]
    goodness = [{"width": int(r.width), "steps": int(r.steps), "n_params": int(r.n_params), "tokens": int(r.tokens),
                 "measured": float(r.loss_nats), "predicted": float(r.predicted), "low": float(r.predicted_low),
                 "high": float(r.predicted_high), "relative_error": float(r.relative_error),
                 "covered": bool(r.predicted_low <= r.loss_nats <= r.predicted_high)} for r in checked.itertuples()]
    in_fit = points[usable & ~points["held_out"]]
    n_main, d_main = float(target["n_params"]), float(target["tokens"])
    predicted = float(law.loss(n_main, d_main))
    low, high = predict_interval(laws, n_main, d_main, c)
    if not (math.isfinite(predicted) and math.isfinite(low) and math.isfinite(high)):
        raise DataError(f"the ladder's law gives no finite forecast of the main run ({predicted} [{low}, {high}]): "
                        "check the rungs' losses in points.parquet")
    widened = not (low <= predicted <= high)
    low, high = min(low, predicted), max(high, predicted)  # a percentile interval can miss a skewed point fit
    compute = 6.0 * n_main * d_main
    optima = [b.optimum(compute) for b in laws]
    n_opt, d_opt = law.optimum(compute)
    notes = [f"held-out points: {holdout_rule}"]
    if form != "full":
        notes.append(f"{len(fit_rows)} fitted points are fewer than the full form's 6: fitted the {FORM_TEXT[form]}")
    if widened:
        notes.append("the bootstrap percentile interval missed the point fit's prediction; it is widened to include it")
    excluded = points[~usable]
    for r in excluded.itertuples():
        notes.append(f"rung d{r.width} × {r.steps} steps left out: {r.excluded}")
    forecast = {
        "target": target,
        "law": {**law.as_dict(), "form_text": FORM_TEXT[form], "confidence": c, "intervals": law_intervals(laws, c)},
        "prediction": {"predicted": predicted, "low": low, "high": high, "confidence": c, "unit": "nats/token",
                       "n_params": int(n_main), "tokens": int(d_main)},
        "fit": {"form": form, "points": int(len(fit_rows)), "held_out": int(len(checked)),
                "excluded": int(len(excluded)), "objective": objective, "huber_delta": HUBER_DELTA,
                "bootstrap": cfg.bootstrap, "holdout_rule": holdout_rule,
                "in_fit_max_abs_relative_error": float(in_fit["relative_error"].abs().max())},
        "goodness": goodness,
        "max_abs_heldout_relative_error": max((abs(g["relative_error"]) for g in goodness), default=math.nan),
        "optimum": {"compute_flops": compute, "convention": "C = 6·N·D with N non-embedding", "n_opt": n_opt,
                    "d_opt": d_opt, "n_opt_interval": list(percentile_interval([o[0] for o in optima], c)),
                    "d_opt_interval": list(percentile_interval([o[1] for o in optima], c)),
                    "loss_at_optimum": float(law.loss(n_opt, d_opt)) if math.isfinite(n_opt) else math.nan,
                    "main_n": n_main, "main_d": d_main},
        "ladder_range": {"n_params": [int(points["n_params"].min()), int(points["n_params"].max())],
                         "tokens": [int(points["tokens"].min()), int(points["tokens"].max())]},
        "notes": notes,
    }
    return forecast, points


def settle(record: DecisionRecord, forecast: dict[str, Any], cfg: LadderConfig, key: str) -> DecisionRecord:
    """The forecast's verdict under the declared rule (see ``declare``)."""
    form, goodness = forecast["fit"]["form"], forecast["goodness"]
    worst = forecast["max_abs_heldout_relative_error"]
    reasons = []
    if form != "full":
        reasons.append(f"add sizes/budgets (ladder.widths, ladder.steps): the full form needs at least 6 fitted "
                       f"rungs, this ladder fits {forecast['fit']['points']}")
    if not goodness:
        reasons.append("hold out at least one rung (ladder.holdout; by default the largest once there are 5 rungs) "
                       "so that the fit is checked on a rung it did not see")
    elif not worst <= cfg.forecast_tolerance:
        reasons.append(f"add sizes/budgets nearer the main run: the held-out relative error {worst:.1%} exceeds "
                       f"the tolerance {cfg.forecast_tolerance:.0%}")
    prediction = forecast["prediction"]
    return record.settle(
        choice=f"{prediction['predicted']:.4f} nats/token", verdict="undetermined" if reasons else "decided",
        estimate=prediction["predicted"], low=prediction["low"], high=prediction["high"], unit="nats/token",
        confidence=cfg.confidence, fallback=FALLBACK if reasons else "", resolve="; ".join(reasons),
        evidence={"table": "ladder_points", "artifact_key": key, "forecasts": "forecasts",
                  "forecast_hash": forecast["forecast_hash"]})
