"""The LSH S-curve plot: empirical detection rate per Jaccard bin beside P(s) = 1 − (1 − s^r)^b (docs/methods.md §7)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on workers or in CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from tasks.corpus.minhash import lsh_candidate_probability, lsh_threshold  # noqa: E402


def plot_s_curve(bins: pd.DataFrame, bands: int, rows: int, jaccard_threshold: float, path: Path,
                 title: str) -> Path:
    """Write a PNG of ``bins`` (``measure.detection_by_bin`` output) over the theoretical S-curve.

    Points sit at the mean Jaccard of each bin's pairs, with ±1 binomial standard error √(p(1−p)/n) and the
    bin's pair count.
    """
    s = np.linspace(0.0, 1.0, 201)
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.plot(s, [lsh_candidate_probability(x, bands, rows) for x in s], color="tab:blue",
            label=f"theory P(s) = 1−(1−s^{rows})^{bands}")
    shown = bins[bins["num_pairs"] > 0]
    mid = shown["mean_jaccard"]
    rate = shown["detection_rate"]
    se = np.sqrt(rate * (1 - rate) / shown["num_pairs"])
    ax.errorbar(mid, rate, yerr=se, fmt="o", color="tab:orange", capsize=3, label="empirical (same-family pairs)")
    for x, y, n in zip(mid, rate, shown["num_pairs"]):
        ax.annotate(f"n={n}", (x, y), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=7)
    steepest = lsh_threshold(bands, rows)
    ax.axvline(steepest, color="grey", ls=":", label=f"(1/b)^(1/r) = {steepest:.2f}")
    ax.axvline(jaccard_threshold, color="tab:red", ls="--", label=f"verify at J ≥ {jaccard_threshold:g}")
    ax.set(xlabel="exact Jaccard similarity of the pair", ylabel="share that are LSH candidates", xlim=(0, 1),
           ylim=(-0.05, 1.1), title=title)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
