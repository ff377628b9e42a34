"""What the console summary and ``pretrain report`` show of the sweep artifact: the peak LR with its fitted
optimum, interval and verdict (and, undetermined, the fallback and what would resolve it), per width, the LR
drift across widths and the loss forecast."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
from rich.markup import escape

from infra.report_blocks import Block, Figure, Heading, TableBlock, Text
from infra.stage import ReportContext, SummaryContext


def fit_line(entry: dict, *, tail: bool = True) -> str:
    """One width's peak LR in words: the fit (trials used, optimum with its interval, or why there is none), the
    verdict, and (undetermined, with ``tail``) the fallback and what would resolve it."""
    fit = entry.get("fit") or {}
    if not fit:
        return ""
    pruned = f", {fit['n_pruned']} pruned not fitted" if fit.get("n_pruned") else ""
    if fit.get("low") is not None and fit.get("high") is not None and fit.get("optimum") is not None:
        ratio = f", high/low {fit['ratio']:.3g}" if fit.get("ratio") is not None else ""
        outcome = f"optimum {fit['optimum']:.2e} [{fit['low']:.2e}, {fit['high']:.2e}] ({fit['confidence']:.0%}{ratio})"
    elif fit.get("optimum") is not None:
        outcome = f"optimum {fit['optimum']:.2e}, {fit.get('reason') or 'no interval'}"
    else:
        outcome = fit.get("reason") or "no fit"
    model = "cubic" if "coefficients" in fit else "quadratic"
    line = f"{model} fit in ln(LR) over {fit['n_trials']} COMPLETE trials{pruned}: {outcome} — {entry['verdict']}"
    if tail and entry.get("verdict") == "undetermined":
        line += f"; {entry['fallback']}; to resolve: {entry['resolve']}"
    return line


def drift_line(drift: dict) -> str:
    """The LR against width: the chosen LR per width, their ratio and the exponent with its interval, or the reason
    there is none."""
    lrs = ", ".join(f"d{w}: {lr:.2e}" for w, lr in zip(drift["widths"], drift["best_lrs"]))
    line = f"LR by width {lrs}; ratio {drift['ratio']:.2f}"
    if drift.get("exponent") is None:
        return line + f"; no width exponent: {drift.get('reason', '')}"
    interval = f" [{drift['low']:+.2f}, {drift['high']:+.2f}]" if drift.get("low") is not None else ""
    verdict = f" ({drift.get('confidence', 0.95):.0%}) — {drift['verdict']}" if drift.get("verdict") else ""
    return line + f"; lr* ∝ d_model^b, b = {drift['exponent']:+.2f}{interval}{verdict}"


def main_lr(best: dict, run: dict | None, cfg: Any = None) -> dict[str, Any]:
    """The peak LR the main run trains at and where it comes from: the main artifact's ``run.json`` when there is
    one, else what ``tasks.main.stage.main_peak_lr`` would take under ``cfg`` (``[main] peak_lr``, or the swept width
    nearest the main model's d_model), else the proxy width's. Keys: ``lr``, ``from`` (``config``/``sweep``),
    ``entry`` (the swept width's ``best.json`` entry, None when set in [main]), ``trained`` (the main run exists)."""
    from tasks.readers import nearest_width_lr

    if run is not None and "peak_lr" in run:
        source = run.get("peak_lr_source") or {}
        entry = None if source.get("from") == "config" else next(
            (w for w in best.get("widths") or [] if w["d_model"] == source.get("d_model")), None)
        return {"lr": float(run["peak_lr"]), "from": source.get("from", "sweep"), "entry": entry, "trained": True,
                "main_d_model": source.get("main_d_model")}
    main = getattr(cfg, "main", None)
    if main is not None and main.peak_lr:
        return {"lr": float(main.peak_lr), "from": "config", "entry": None, "trained": False}
    width = main.model.d_model if main is not None else None
    entry = nearest_width_lr(best, width) if width else (best.get("widths") or [None])[0]
    lr = entry["best_lr"] if entry else best["best_lr"]
    return {"lr": float(lr), "from": "sweep", "entry": entry, "trained": False, "main_d_model": width}


def headline(best: dict, used: dict[str, Any]) -> str:
    """The summary's ``Peak LR`` line: the LR the main run trains at, which swept width it comes from, and that
    width's verdict with its interval (or the best trial it fell back to); a width other than the proxy's says
    the proxy's own result is not the one used."""
    who = "the main run trained at" if used["trained"] else "the main run trains at"
    if used["from"] == "config":
        return "[bold]Peak LR:[/] " + escape(f"{used['lr']:.3e}, set in [main] peak_lr ({who} it; the sweep's "
                                             f"{best['best_lr']:.3e} is not used)")
    entry = used["entry"] or {}
    fit = entry.get("fit") or best.get("fit") or {}
    width = f"the d{entry['d_model']} sweep" if entry.get("d_model") else "the sweep"
    main_width = f" (main d_model {used['main_d_model']})" if used.get("main_d_model") else ""
    verdict = entry.get("verdict") or ("decided" if entry.get("lr_source", best.get("lr_source")) == "fit"
                                       else "undetermined")
    if entry.get("lr_source", best.get("lr_source")) == "fit":
        how = f"its fitted optimum, {verdict}"
    else:
        trial = entry.get("best_trial_lr", best.get("best_trial_lr", best["best_lr"]))
        how = f"its best trial {trial:.3e}, the fit {verdict}"
    if fit.get("low") is not None and fit.get("high") is not None:
        how += f", {fit.get('confidence', 0.95):.0%} interval [{fit['low']:.2e}, {fit['high']:.2e}]"
    elif fit.get("reason"):
        how += ", no interval"
    return "[bold]Peak LR:[/] " + escape(f"{used['lr']:.3e} — {who} it{main_width}, from {width}: {how}")


def summary(ctx: SummaryContext) -> list[Any]:
    """The peak LR the main run uses (its width, verdict and interval: :func:`headline`), then each width's fit
    and verdict, the drift across widths, the forecast and any warning. What would settle an undetermined LR is in
    the closing decisions block."""
    best = json.loads((ctx.path / "best.json").read_text())
    main = ctx.paths.get("main")
    run = json.loads((main / "run.json").read_text()) if main is not None and (main / "run.json").is_file() else None
    out: list[Any] = [headline(best, main_lr(best, run, ctx.cfg))]
    widths = best.get("widths") or []
    for entry in widths:
        if "fit" in entry:
            prefix = f"d{entry['d_model']}: LR {entry['best_lr']:.2e}, " if len(widths) > 1 else ""
            out.append(f"  {prefix}{fit_line(entry, tail=False)}")
    if best.get("lr_drift"):
        out.append(f"  {drift_line(best['lr_drift'])}")
    if isinstance(best.get("forecast"), list):
        for f in best["forecast"]:
            out.append(f"  loss forecast from the first {f['window']:.0%} of the best trial: predicted "
                       f"{f['predicted']:.4f}, measured {f['actual']:.4f} nats/token (error {f['error']:+.4f})")
    elif best.get("forecast"):
        out.append(f"  no loss forecast: {best['forecast']}")
    if best.get("warning"):
        out.append(f"  [yellow]warning:[/] {best['warning']}")
    return out


def report(ctx: ReportContext) -> list[Block]:
    """The learning-rate sweep: the peak LR with its fit, interval, verdict, fallback and resolution per width, the
    figure of loss against LR, the spread of good trials, the drift, the forecast, any warning, and the trials."""
    from tasks.sweep.plots import sweep_figures

    path = ctx.path
    best = json.loads((path / "best.json").read_text())
    out: list[Block] = [Heading("Learning-rate sweep"), Text(
        f"**Peak LR** {best['best_lr']:.3e} (from the {best.get('lr_source', 'best trial')}); best trial "
        f"{best.get('best_trial_lr', best['best_lr']):.3e} at proxy held-out {best['best_value']:.4f} nats/token, "
        f"study `{best['study_name']}`.")]
    widths = best.get("widths") or []
    for entry in widths:
        if "fit" in entry:
            out.append(Text(f"d_model {entry['d_model']}: {fit_line(entry)}."))
    if widths:
        frame = pd.DataFrame([{"d_model": w["d_model"], "best_lr": w["best_lr"], "verdict": w.get("verdict", ""),
                               "fitted_optimum": (w.get("fit") or {}).get("optimum"),
                               "low": (w.get("fit") or {}).get("low"), "high": (w.get("fit") or {}).get("high"),
                               "best_trial_lr": w.get("best_trial_lr", w["best_lr"]), "best_value": w["best_value"],
                               "study_name": w["study_name"]} for w in widths])
        out.append(TableBlock("Peak LR per width (fitted optimum and its interval)", frame))
    figures = sweep_figures(path, ctx.plots_dir)
    if figures:
        out.append(Figure(figures[0], "Held-out loss against peak LR: COMPLETE trials (dots), pruned trials at their "
                                      "last report (crosses, not fitted), the fitted cubic, the confidence set of "
                                      "its minimum (band, when bounded) and the chosen LR (dashed)"))
    if best.get("spread"):
        sp = best["spread"]
        out.append(Text(f"Spread: {sp['n_within']} of {sp['n_complete']} completed trials within "
                        f"{sp['tolerance']:.0%} of the best loss, LR {sp['lr_low']:.2e} – {sp['lr_high']:.2e}."))
    if best.get("lr_drift"):
        out.append(Text(f"Drift across widths: {drift_line(best['lr_drift'])}."))
    if isinstance(best.get("forecast"), list):
        out.append(TableBlock("Loss forecast of the best trial from the start of its curve",
                              pd.DataFrame(best["forecast"])))
    elif best.get("forecast"):
        out.append(Text(f"No loss forecast: {best['forecast']}"))
    if best.get("warning"):
        out.append(Text(f"Warning: {best['warning']}"))
    trials = pd.read_parquet(path / "trials.parquet")
    shown = [c for c in ("d_model", "number", "state", "peak_lr", "value", "last_step") if c in trials]
    if shown:
        out.append(TableBlock("Sweep trials", trials[shown]))
    return out
