"""The main run's training curves: loss and learning rate against optimiser step."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from infra.figures import save_figure  # noqa: E402

def plot_training_curves(history: pd.DataFrame, path: Path, title: str = "main run") -> Path:
    """Training loss (nats/token) and learning rate against optimiser step.

    Args:
        history: one row per logged step, columns ``step`` and any of ``loss_nats``, ``lr``.

    Raises:
        ValueError: ``history`` has no ``step`` column or no rows.
    """
    if history.empty or "step" not in history:
        raise ValueError("training history is empty or has no 'step' column: nothing to plot")
    history = history.sort_values("step")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.5, 5), dpi=110, sharex=True)
    if "loss_nats" in history:
        top.plot(history["step"], history["loss_nats"], marker=".", color="tab:blue")
    top.set(ylabel="training loss (nats/token)", title=f"{title}: loss and learning rate")
    if "lr" in history:
        bottom.plot(history["step"], history["lr"], marker=".", color="tab:green")
    bottom.set(xlabel="optimiser step", ylabel="learning rate")
    bottom.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    return save_figure(fig, path)



def main_figures(artifact: Path, out: Path, history: pd.DataFrame | None) -> list[Path]:
    """``training_curves.png`` from ``history`` (the run's logged ``step``/``loss_nats``/``lr``), if any."""
    out.mkdir(parents=True, exist_ok=True)
    if history is None or history.empty:
        return []
    return [plot_training_curves(history, out / "training_curves.png")]
