"""What the console summary and ``pretrain report`` show of the scaling ladder: the fitted law with its intervals,
whether the fit is degenerate and why, the goodness of fit on the held-out rungs, the backtest, the compute-optimal
allocation at the main run's compute, the forecast with its decision, and — once the main run exists — the forecast
against its measured held-out loss."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
from rich.markup import escape

from infra.report_blocks import Block, Heading, TableBlock, Text
from infra.stage import ReportContext, SummaryContext
from tasks.ladder.fit import forecast_check, token_weighted_loss
from tasks.ladder.forecast import decision_of

DEGENERATE = ("form", "bound", "interval_ratio", "exponent_width")  # rules that say the fit itself is undetermined

CONSTANTS = (("E", "E"), ("A", "A"), ("alpha", "α"), ("B", "B"), ("beta", "β"))


def _forecast(path: Path) -> dict[str, Any] | None:
    if not json.loads((Path(path) / "ladder.json").read_text()).get("enabled"):
        return None
    return json.loads((Path(path) / "forecast.json").read_text())


def _num(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.4g}"


def law_line(forecast: dict[str, Any]) -> str:
    """``E 1.2 [1.1, 1.3], A …`` with the bootstrap intervals."""
    law = forecast["law"]
    return ", ".join(f"{sym} {_num(law[name])} [{_num(law['intervals'][name][0])}, {_num(law['intervals'][name][1])}]"
                     for name, sym in CONSTANTS)


def main_check(forecast: dict[str, Any], paths: Mapping[str, Path]) -> dict[str, Any] | None:
    """The forecast against the main artifact's held-out loss (token-weighted over the forecast's general sources),
    or None when no main artifact is among ``paths``."""
    main = paths.get("main")
    if main is None or not (Path(main) / "heldout.parquet").is_file():
        return None
    heldout = pd.read_parquet(Path(main) / "heldout.parquet")
    actual = token_weighted_loss(heldout, forecast["target"]["general_sources"])
    p = forecast["prediction"]
    return forecast_check(p["predicted"], p["low"], p["high"], actual)


def _lines(forecast: dict[str, Any], paths: Mapping[str, Path], *, tail: bool = True) -> list[str]:
    """The ladder's lines; without ``tail`` the decision's fallback and what would resolve it are left out (the
    summary's closing decisions block says them)."""
    fit, p, opt, target = forecast["fit"], forecast["prediction"], forecast["optimum"], forecast["target"]
    level = f"{p['confidence']:.0%}"
    out = [f"  {forecast['law']['form_text']}, {fit['points']} rungs fitted (Huber δ {fit['huber_delta']:g} on log L, "
           f"{fit['bootstrap']} bootstrap resamples, {level} intervals): {law_line(forecast)}"]
    if forecast["goodness"]:
        for g in forecast["goodness"]:
            out.append(f"  held-out rung d{g['width']} × {g['steps']:,} steps: predicted {g['predicted']:.4f} "
                       f"[{_num(g['low'])}, {_num(g['high'])}], measured {g['measured']:.4f} nats/token "
                       f"(relative error {g['relative_error']:+.2%})")
    else:
        out.append(f"  goodness of fit: no held-out rung ({fit['holdout_rule']})")
    backtest = forecast.get("backtest")
    if backtest:
        out.append(f"  backtest: rung d{backtest['width']} × {backtest['steps']:,} steps (the largest fitted by "
                   f"compute, {_num(backtest['extrapolation'])}× the others' largest) forecast from the other "
                   f"{backtest['fitted']} fitted rungs: predicted {_num(backtest['predicted'])} "
                   f"[{_num(backtest['low'])}, {_num(backtest['high'])}], measured {_num(backtest['measured'])} "
                   f"nats/token (relative error {backtest['relative_error']:+.2%}, "
                   f"{'inside' if backtest['covered'] else 'outside'} the interval)")
    elif "backtest" in forecast:
        out.append(f"  backtest: not run ({forecast.get('backtest_note', '')})")
    reasons = forecast.get("assessment", {}).get("reasons", [])
    degenerate = [r for r in reasons if r["rule"] in DEGENERATE]
    for r in degenerate:
        out.append(f"  degenerate fit: {r['problem']}")
    out.append(f"  compute-optimal at the main run's C = 6·N·D = {opt['compute_flops']:.3g} FLOPs (N non-embedding): "
               f"N_opt {_num(opt['n_opt'])} [{_num(opt['n_opt_interval'][0])}, {_num(opt['n_opt_interval'][1])}], "
               f"D_opt {_num(opt['d_opt'])} [{_num(opt['d_opt_interval'][0])}, {_num(opt['d_opt_interval'][1])}] "
               f"tokens; the main run has N {target['n_params']:,}, D {target['tokens']:,}"
               + ("; not to plan with: the fit is degenerate" if degenerate else ""))
    parts = ""
    if p.get("bootstrap_low") is not None:
        checks = forecast.get("checks", {})
        error = (f"lengthened on each side by the backtest/held-out model error {_num(p['model_error'])}"
                 if backtest or forecast["goodness"] else "no backtest or held-out rung to measure a model error by")
        parts = (f"; bootstrap [{_num(p['bootstrap_low'])}, {_num(p['bootstrap_high'])}] {error}; the main run is "
                 f"{_num(checks.get('extrapolation'))}× the largest rung's compute")
    out.append(f"  forecast of the main run's held-out loss: {p['predicted']:.4f} [{p['low']:.4f}, {p['high']:.4f}] "
               f"nats/token{parts} (forecast {forecast['forecast_hash'][:12]})")
    out.append("  " + decision_of(forecast).line(tail=tail))
    check = main_check(forecast, paths)
    if check is not None:
        out.append(f"  main run measured {check['actual']:.4f} nats/token: error {check['error']:+.4f} "
                   f"({check['relative_error']:+.2%}), {'inside' if check['covered'] else 'outside'} the interval")
    out += [f"  note: {note}" for note in forecast["notes"]]
    return out


def summary(ctx: SummaryContext) -> list[Any]:
    """The law, goodness of fit, optimum, forecast and decision; the check when the main artifact exists."""
    forecast = _forecast(ctx.path)
    if forecast is None:
        return []
    return ["[bold]Scaling ladder[/] L(N, D) = E + A/N^α + B/D^β (Hoffmann et al. 2022):",
            *(escape(line) for line in _lines(forecast, ctx.paths, tail=False))]  # intervals and field names are not markup


def report(ctx: ReportContext) -> list[Block]:
    """The rungs with the fit's predictions, the constants with their intervals, the forecast and its check."""
    forecast = _forecast(ctx.path)
    if forecast is None:
        return []
    points = pd.read_parquet(ctx.path / "points.parquet")
    columns = ["width", "n_layers", "steps", "n_params", "tokens", "peak_lr", "loss_nats", "predicted",
               "predicted_low", "predicted_high", "relative_error", "held_out", "backtest", "backtest_predicted",
               "backtest_low", "backtest_high", "excluded"]
    shown = points[[c for c in columns if c in points.columns]]
    law = forecast["law"]
    constants = pd.DataFrame([{"constant": sym, "value": law[name], "low": law["intervals"][name][0],
                               "high": law["intervals"][name][1]} for name, sym in CONSTANTS])
    return [Heading("Scaling ladder"),
            Text("Proxies of the main model at several widths and token budgets, fitted with "
                 "L(N, D) = E + A/N^α + B/D^β (Hoffmann et al. 2022); N non-embedding parameters, D tokens, "
                 "L held-out nats/token over the general sources.\n\n"
                 + "\n".join("- " + line.strip() for line in _lines(forecast, ctx.paths))),
            TableBlock("Ladder rungs and the fit's predictions", shown),
            TableBlock(f"Fitted constants ({forecast['prediction']['confidence']:.0%} bootstrap intervals)", constants)]
