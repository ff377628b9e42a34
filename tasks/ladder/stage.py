"""Scaling-ladder stage: proxies of the main model at several widths and token budgets, a fit of
L(N, D) = E + A/N^α + B/D^β (Hoffmann et al. 2022), and the forecast of the main run's final held-out loss, made
before the main run starts (docs/methods.md §5).

Each (width × budget) rung is the main model at that width (``rungs.rung_shape``), trained on the chosen mixture at
the main run's LR rule applied at its width, with the main run's schedule (warmup-cosine by default) over its own
budget, and scored by the
token-weighted held-out loss over the general sources (nats/token), on the main run's ``eval_tokens``. N is the
non-embedding parameter count (``rungs.N_CONVENTION``), D = steps · batch · seq_len tokens.

The forecast's decision (``evals.decision``, kind ``forecast``) is declared before any rung trains (``declare``): it
is ``decided`` only when the fit is determined (the full form, no parameter on a bound, bootstrap intervals within
the declared spreads), the main run lies within ``max_extrapolation`` of the largest rung in compute, and the
backtest and the held-out rungs are predicted within ``forecast_tolerance`` (``tasks.ladder.forecast``); otherwise
the forecast is recorded but not trusted (``undetermined``), with each reason and what would resolve it.

Outputs: ``points.parquet`` (one row per rung: shape, budget, LR, N, D, measured loss, whether held out, the fit's
prediction with its interval and relative error, the backtest's forecast of the rung it dropped, why a rung was left
out of the fit), ``forecast.json`` (the target main run, the law with intervals, the prediction and its interval,
``forecast_hash`` over those three, the decision record, goodness of fit, the backtest, the rule's checks and
reasons, and the compute-optimal allocation; standard JSON, null where a number is undefined) and ``ladder.json``
(``enabled``). Disabled: ``ladder.json`` with ``enabled: false`` only.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import numpy as np
import pandas as pd

from evals.decision import DecisionRecord
from infra.artifacts import canonical_json
from infra.errors import DataError
from infra.stage import StageContext
from models.arithmetic import param_count
from tasks.ladder.config import LadderConfig
from tasks.ladder.fit import EXPONENT_BOUNDS, FORM_TEXT, FORMS, HUBER_DELTA, percentile_interval, token_weighted_loss
from tasks.ladder.forecast import (E_FLOOR_SHARE, FALLBACK, INTERVAL_RULE, RATIO_NAMES, forecast_from_points,
                                   min_rungs, point_intervals)
from tasks.ladder.rungs import N_CONVENTION, Rung, RungTrainer, non_embedding_params, rung_budget, rung_peak_lr, rung_shape
from tasks.readers import load_best, load_choice
from tasks.train.corpus import TokenizedCorpus
from tasks.train.packing import PackingConfig
from tasks.train.sections import MainConfig, ProxyConfig

HASHED = ("target", "law", "prediction")  # the canonical content behind forecast_hash


def forecast_hash(forecast: dict[str, Any]) -> str:
    """sha256 (hex) of the canonical JSON of the forecast's ``target``, ``law`` and ``prediction``."""
    return hashlib.sha256(canonical_json({k: forecast[k] for k in HASHED}).encode("utf-8")).hexdigest()


def declare(cfg: LadderConfig) -> DecisionRecord:
    """The forecast's rule, fixed before any rung trains: every setting that can change the verdict is in
    ``rule_config`` (and so in its hash)."""
    held, _ = cfg.held_out()
    rule = (f"decided when the full five-parameter law L = E + A/N^α + B/D^β is fitted on ≥ {min_rungs()} rungs "
            f"with ≥ 3 distinct N and D; no exponent lies within {cfg.bound_tolerance:g} of its bounds "
            f"{list(EXPONENT_BOUNDS)} and E is not "
            f"collapsed onto 0; the bootstrap intervals of A and B span at most ×{cfg.max_interval_ratio:g} and "
            f"those of α and β at most {cfg.max_exponent_width:g}; the main run's compute is at most "
            f"{cfg.max_extrapolation:g}× the largest rung's; and the backtest (the largest fitted rung "
            f"forecast from the others) and every held-out rung are predicted within ±{cfg.forecast_tolerance:.0%} "
            "relative error; else the forecast is recorded but not trusted")
    return DecisionRecord.declare("forecast", rule=rule, rule_config={
        "tolerance": cfg.forecast_tolerance, "holdout": [list(p) for p in held], "confidence": cfg.confidence,
        "bootstrap": cfg.bootstrap, "huber_delta": HUBER_DELTA, "grid": cfg.grid(),
        "forms": {form: len(names) + 1 for form, names in FORMS.items()},
        "max_extrapolation": cfg.max_extrapolation, "max_interval_ratio": cfg.max_interval_ratio,
        "max_exponent_width": cfg.max_exponent_width, "bound_tolerance": cfg.bound_tolerance,
        "exponent_bounds": list(EXPONENT_BOUNDS), "e_floor_share": E_FLOOR_SHARE, "min_rungs": min_rungs(),
        "min_levels": 3, "ratio_of": list(RATIO_NAMES),
        "backtest": "drop the largest fitted rung by compute, refit the same form, forecast it",
        "interval": INTERVAL_RULE})


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
    if trainer.reused:
        print(f"ladder: {trainer.trained} rung(s) trained, {trainer.reused} reused from runs/cache/ladder")
    points = pd.DataFrame(rows)
    target = _target(main, corpus.vocab_size, general, best)
    forecast, points = _forecast(points, cfg, target, holdout_rule, seed=ctx.seed)
    forecast = json_safe(forecast)  # null, not NaN, where a number is undefined (the notes and reasons say why)
    forecast["forecast_hash"] = forecast_hash(forecast)
    record = settle(record, forecast, cfg, ctx.key)
    forecast["decision"] = json_safe(record.as_dict())
    forecast["rungs"] = {"trained": trainer.trained, "reused": trainer.reused}
    points.to_parquet(ctx.out / "points.parquet", index=False)
    (ctx.out / "forecast.json").write_text(json.dumps(forecast, indent=2, default=str, allow_nan=False))
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
    """The forecast (``forecast.forecast_from_points`` on the rungs with a finite loss), goodness of fit on the
    held-out rungs, the backtest, the rule's checks, the compute-optimal allocation, and the points with the fit's
    predictions. Non-finite values are written as null by ``run`` (``json_safe``).

    Raises:
        DataError: fewer than 3 rungs to fit, or no finite forecast of the main run.
    """
    usable = (points["excluded"] == "").to_numpy()
    rows = points[usable]
    n_main, d_main = float(target["n_params"]), float(target["tokens"])
    result = forecast_from_points(rows["n_params"].to_numpy(float), rows["tokens"].to_numpy(float),
                                  rows["loss_nats"].to_numpy(float), rows["held_out"].to_numpy(bool), n_main, d_main,
                                  cfg, seed=seed)
    law, laws, form, c = result.law, result.laws, result.form, cfg.confidence
    if not all(map(math.isfinite, (result.predicted, result.low, result.high))):
        raise DataError(f"the ladder's law gives no finite forecast of the main run ({result.predicted} "
                        f"[{result.low}, {result.high}]): check the rungs' losses in points.parquet")
    points = points.copy()
    n_all, d_all = points["n_params"].to_numpy(float), points["tokens"].to_numpy(float)
    points["predicted"] = law.loss(n_all, d_all)
    points["predicted_low"], points["predicted_high"] = point_intervals(laws, n_all, d_all, c)
    points["relative_error"] = (points["predicted"] - points["loss_nats"]) / points["loss_nats"]
    index = np.flatnonzero(usable)  # rows of ``points`` in the order forecast_from_points saw them
    bt = result.backtest
    points["backtest"] = False
    for column in ("backtest_predicted", "backtest_low", "backtest_high"):
        points[column] = math.nan
    if bt is not None:
        row = points.index[index[bt["index"]]]
        points.loc[row, ["backtest", "backtest_predicted", "backtest_low", "backtest_high"]] = \
            [True, bt["predicted"], bt["low"], bt["high"]]
        bt = {"width": int(points.loc[row, "width"]), "steps": int(points.loc[row, "steps"]),
              **{k: v for k, v in bt.items() if k != "index"}}
    goodness = []
    for g in result.goodness:
        row = points.index[index[g["index"]]]
        goodness.append({"width": int(points.loc[row, "width"]), "steps": int(points.loc[row, "steps"]),
                         "n_params": int(g["n_params"]), "tokens": int(g["tokens"]),
                         **{k: g[k] for k in ("measured", "predicted", "low", "high", "relative_error", "covered")}})
    fitted = usable & ~points["held_out"].to_numpy(bool)
    compute = 6.0 * n_main * d_main
    optima = [b.optimum(compute) for b in laws]
    n_opt, d_opt = law.optimum(compute)
    notes = [f"held-out points: {holdout_rule}"]
    if form != "full":
        notes.append(f"{result.fitted} fitted points are fewer than the full form's 6: fitted the {FORM_TEXT[form]}")
    if result.widened:
        notes.append("the bootstrap percentile interval missed the point fit's prediction; it is widened to include it")
    if not math.isfinite(n_opt):
        notes.append("no compute-optimal allocation: the law has a zero exponent or coefficient")
    for r in points[~usable].itertuples():
        notes.append(f"rung d{r.width} × {r.steps} steps left out: {r.excluded}")
    in_fit = points.loc[fitted, "relative_error"].abs()
    forecast = {
        "target": target,
        "law": {**law.as_dict(), "form_text": FORM_TEXT[form], "confidence": c, "intervals": result.intervals},
        "prediction": {"predicted": result.predicted, "low": result.low, "high": result.high, "confidence": c,
                       "unit": "nats/token", "n_params": int(n_main), "tokens": int(d_main),
                       "bootstrap_low": result.bootstrap_low, "bootstrap_high": result.bootstrap_high,
                       "model_error": result.model_error, "interval_rule": INTERVAL_RULE},
        "fit": {"form": form, "points": result.fitted, "held_out": len(goodness),
                "excluded": int((~usable).sum()), "objective": result.objective, "huber_delta": HUBER_DELTA,
                "bootstrap": cfg.bootstrap, "holdout_rule": holdout_rule,
                "in_fit_max_abs_relative_error": float(in_fit.max()) if len(in_fit) else math.nan},
        "goodness": goodness,
        "max_abs_heldout_relative_error": max((abs(g["relative_error"]) for g in goodness), default=math.nan),
        "backtest": bt,
        "backtest_note": result.backtest_note,
        "checks": {"extrapolation": result.extrapolation, "max_extrapolation": cfg.max_extrapolation,
                   "levels": {"n_params": result.levels[0], "tokens": result.levels[1]},
                   "spreads": result.spreads, "max_interval_ratio": cfg.max_interval_ratio,
                   "max_exponent_width": cfg.max_exponent_width, "bound_tolerance": cfg.bound_tolerance,
                   "exponent_bounds": list(EXPONENT_BOUNDS), "forecast_tolerance": cfg.forecast_tolerance,
                   "min_rungs": min_rungs()},
        "assessment": {"verdict": result.verdict,
                       "reasons": [{"rule": r.rule, "problem": r.problem, "resolve": r.resolve}
                                   for r in result.reasons]},
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


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, ±inf) as None and numpy scalars as Python ones, so that
    ``json.dumps(..., allow_nan=False)`` writes standard JSON (null where a number is undefined)."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def settle(record: DecisionRecord, forecast: dict[str, Any], cfg: LadderConfig, key: str) -> DecisionRecord:
    """The forecast's verdict under the declared rule (see ``declare``): ``decided`` when no rule failed
    (``forecast["assessment"]``); else ``undetermined`` with each failed rule's problem and what would resolve it.
    The interval rests on the fitted rungs (``n_units``), of which a decided forecast needs ``min_rungs()``."""
    reasons = forecast["assessment"]["reasons"]
    prediction = forecast["prediction"]
    return record.settle(
        choice=f"{prediction['predicted']:.4f} nats/token", verdict="undetermined" if reasons else "decided",
        estimate=prediction["predicted"], low=prediction["low"], high=prediction["high"], unit="nats/token",
        confidence=cfg.confidence, fallback=FALLBACK if reasons else "",
        resolve="; ".join(f"{r['resolve']} ({r['problem']})" for r in reasons),
        evidence={"table": "ladder_points", "artifact_key": key, "forecasts": "forecasts",
                  "forecast_hash": forecast["forecast_hash"]},
        n_units=int(forecast["fit"]["points"]), units="rungs", min_units=min_rungs())
