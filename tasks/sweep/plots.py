"""The peak-LR decision as a figure: held-out loss against peak LR per width, the fitted cubic in ln(LR) and the
Fieller confidence set of its minimum (docs/methods.md §14)."""

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
    cubic over its tried LRs, the interval of its minimum as a band (none when unbounded) and its chosen LR as a
    dashed line.

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
        coefficients = fit_coefficients(fit)
        if coefficients and len(done):
            grid = np.geomspace(done["peak_lr"].min(), done["peak_lr"].max(), 200)
            ax.plot(grid, np.polynomial.polynomial.polyval(np.log(grid), coefficients), color=colour)
        if fit.get("low") is not None and fit.get("high") is not None:
            low, high = max(fit["low"], fit["lr_min"] / 10), min(fit["high"], fit["lr_max"] * 10)
            ax.axvspan(low, high, color=colour, alpha=0.12)
        ax.axvline(entry["best_lr"], color=colour, linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set(xlabel="peak LR", ylabel="held-out loss (nats/token)",
           title="LR sweep: cubic fit in ln(LR), confidence set of its minimum")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def fit_coefficients(fit: dict) -> list[float]:
    """(c0, c1, …) of the fitted loss Σ c_k ln(LR)^k of a ``best.json`` fit; an artifact written with the earlier
    quadratic holds ``a``, ``b``, ``c`` instead; [] when there is no fit."""
    if fit.get("coefficients"):
        return [float(c) for c in fit["coefficients"]]
    if all(fit.get(k) is not None for k in ("a", "b", "c")):
        return [float(fit["c"]), float(fit["b"]), float(fit["a"])]
    return []


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
