"""The peak-LR decision as a figure: held-out loss against peak LR per width, the fitted parabola in ln(LR) and the
bootstrap interval of its optimum (docs/methods.md §14)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from infra.figures import save_figure  # noqa: E402


def plot_lr_fit(trials: pd.DataFrame, widths: list[dict], path: Path) -> Path:
    """COMPLETE trials (dots) and PRUNED ones (crosses at their last reported loss, not fitted), each width's fitted
    parabola over its tried LRs, its interval as a band and its chosen LR as a dashed line.

    Args:
        trials: ``trials.parquet``: ``d_model``, ``state``, ``peak_lr``, ``value``, ``intermediate`` (JSON text).
        widths: ``best.json`` ``widths`` entries (``d_model``, ``best_lr``, ``verdict``, ``fit``).
    """
    fig, ax = plt.subplots(figsize=(6.5, 4.0), dpi=110)
    for colour, entry in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], widths):
        rows = trials[trials["d_model"] == entry["d_model"]] if "d_model" in trials else trials
        done = rows[rows["state"] == "COMPLETE"]
        ax.scatter(done["peak_lr"], done["value"], color=colour, zorder=3,
                   label=f"d{entry['d_model']}: {entry['verdict']}, LR {entry['best_lr']:.2e}")
        pruned = rows[rows["state"] == "PRUNED"]
        last = [_last_loss(v) for v in pruned["intermediate"]] if "intermediate" in pruned else []
        if len(last):
            ax.scatter(pruned["peak_lr"], last, color=colour, marker="x", alpha=0.6)
        fit = entry.get("fit") or {}
        if fit.get("a") is not None and len(done):
            grid = np.geomspace(done["peak_lr"].min(), done["peak_lr"].max(), 100)
            x = np.log(grid)
            ax.plot(grid, fit["a"] * x * x + fit["b"] * x + fit["c"], color=colour)
        if fit.get("low") is not None and fit.get("high") is not None:
            low, high = max(fit["low"], fit["lr_min"] / 10), min(fit["high"], fit["lr_max"] * 10)
            ax.axvspan(low, high, color=colour, alpha=0.12)
        ax.axvline(entry["best_lr"], color=colour, linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set(xlabel="peak LR", ylabel="held-out loss (nats/token)",
           title="LR sweep: quadratic fit in ln(LR), bootstrap interval of the optimum")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _last_loss(intermediate: Any) -> float:
    steps = json.loads(intermediate) if isinstance(intermediate, str) else dict(intermediate or {})
    return float(steps[max(steps, key=int)]) if steps else float("nan")


def sweep_figures(artifact: Path, out: Path, history: Any = None) -> list[Path]:
    """``sweep_lr_fit.png`` of the sweep artifact at ``artifact``, written into ``out``; none for an artifact
    without fits."""
    best = json.loads((artifact / "best.json").read_text())
    widths = [w for w in best.get("widths", []) if "fit" in w]
    if not widths:
        return []
    out.mkdir(parents=True, exist_ok=True)
    return [plot_lr_fit(pd.read_parquet(artifact / "trials.parquet"), widths, out / "sweep_lr_fit.png")]
