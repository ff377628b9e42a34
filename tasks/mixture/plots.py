"""The mixture decision as a figure: each candidate's score under the declared rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from infra.figures import save_figure  # noqa: E402


def plot_mixture(scores: pd.DataFrame, chosen: str, path: Path) -> Path:
    """The declared rule's score per candidate (lower is better), the chosen one highlighted, ineligible hatched.

    Args:
        scores: ``choice.json`` ``scores``: columns ``candidate``, ``score`` and optionally ``eligible``.
    """
    frame = scores.sort_values("score").reset_index(drop=True)
    eligible = frame["eligible"] if "eligible" in frame else pd.Series(True, index=frame.index)
    fig, ax = plt.subplots(figsize=(6.5, 1.2 + 0.45 * len(frame)), dpi=110)
    colours = ["tab:orange" if c == chosen else "tab:blue" for c in frame["candidate"]]
    bars = ax.barh(frame["candidate"], frame["score"], color=colours)
    for bar, ok in zip(bars, eligible):
        if not ok:
            bar.set_hatch("//")
            bar.set_alpha(0.5)
    low, high = frame["score"].min(), frame["score"].max()
    pad = max((high - low) * 0.5, abs(high) * 0.01, 1e-6)
    ax.set_xlim(low - pad, high + pad)  # scores differ in the third decimal: a zero-based axis would hide that
    ax.invert_yaxis()
    ax.set(xlabel="score under the declared rule (lower is better)", title=f"Mixture candidates: {chosen} chosen")
    return save_figure(fig, path)


def mixture_figures(artifact: Path, out: Path, history: Any = None) -> list[Path]:
    """``mixture_scores.png`` of the mixture artifact at ``artifact``, written into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    choice = json.loads((artifact / "choice.json").read_text())
    return [plot_mixture(pd.DataFrame(choice["scores"]), choice["name"], out / "mixture_scores.png")]
