"""What the console summary and ``pretrain report`` show of the sweep artifact: the best peak LR, the spread of
good trials, the LR drift across widths and the loss forecast."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from infra.report_blocks import Block, Heading, TableBlock, Text
from infra.stage import ReportContext, SummaryContext


def summary(ctx: SummaryContext) -> list[Any]:
    """The best peak LR (proxy held-out nats/token), the spread, the drift across widths, the forecast and any
    warning."""
    best = json.loads((ctx.path / "best.json").read_text())
    out: list[Any] = [f"[bold]Peak LR:[/] {best['best_lr']:.3e} (proxy held-out {best['best_value']:.4f} nats/token)"]
    if best.get("spread"):
        sp = best["spread"]
        out.append(f"  {sp['n_within']} of {sp['n_complete']} completed trials within {sp['tolerance']:.0%} of the "
                   f"best loss, LR {sp['lr_low']:.2e} – {sp['lr_high']:.2e}")
    if best.get("lr_drift"):
        d = best["lr_drift"]
        lrs = ", ".join(f"d{w}: {lr:.2e}" for w, lr in zip(d["widths"], d["best_lrs"]))
        out.append(f"  best LR by width {lrs}; ratio {d['ratio']:.2f}, lr* ∝ d_model^{d['exponent']:.2f}")
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
    """The learning-rate sweep: best LR and study, best LR per width, spread, drift, forecast, warning, and the
    trials."""
    path = ctx.path
    best = json.loads((path / "best.json").read_text())
    out: list[Block] = [Heading("Learning-rate sweep"), Text(
        f"**Best peak LR** {best['best_lr']:.3e} (proxy held-out {best['best_value']:.4f} nats/token), study "
        f"`{best['study_name']}`.")]
    if best.get("widths"):
        out.append(TableBlock("Best LR per width", pd.DataFrame(best["widths"])[["d_model", "best_lr", "best_value",
                                                                                "study_name"]]))
    if best.get("spread"):
        sp = best["spread"]
        out.append(Text(f"Spread: {sp['n_within']} of {sp['n_complete']} completed trials within "
                        f"{sp['tolerance']:.0%} of the best loss, LR {sp['lr_low']:.2e} – {sp['lr_high']:.2e}."))
    if best.get("lr_drift"):
        d = best["lr_drift"]
        out.append(Text(f"Drift across widths: ratio {d['ratio']:.2f}, lr* ∝ d_model^{d['exponent']:.2f}."))
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
