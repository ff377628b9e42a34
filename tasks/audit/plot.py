"""The LSH S-curve plots (docs/methods.md §7): empirical detection rate per Jaccard bin beside
P(s) = 1 − (1 − s^r)^b, and several layouts' S-curves overlaid with the design constraints."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on workers or in CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from infra.figures import save_figure  # noqa: E402
from tasks.corpus.lsh_design import LshConstraints  # noqa: E402
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


def plot_lsh_layouts(layouts: pd.DataFrame, design: LshConstraints | None, jaccard_threshold: float, path: Path,
                     title: str) -> Path:
    """Write a PNG of the S-curves P(s) = 1 − (1 − s^r)^b of the ``drawn`` rows of ``layouts``
    (``tasks.audit.layouts.layout_table``), the configured layout in bold black.

    With ``design``, the constraint box is shaded: the regions s ≥ s1, P < p1 (pairs to detect, missed too often)
    and s ≤ s2, P > p2 (pairs to keep out, admitted too often) are what a layout meeting the constraints never
    enters; the corners (s1, p1) and (s2, p2) are marked.
    """
    s = np.linspace(0.0, 1.0, 401)
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    if design is not None:
        ax.fill_between([design.s1, 1.0], 0.0, design.p1, color="tab:red", alpha=0.12, lw=0,
                        label=f"fails detect: s ≥ {design.s1:g}, P < {design.p1:g}")
        ax.fill_between([0.0, design.s2], design.p2, 1.0, color="tab:purple", alpha=0.12, lw=0,
                        label=f"fails admit: s ≤ {design.s2:g}, P > {design.p2:g}")
        ax.plot([design.s1, design.s2], [design.p1, design.p2], "kx", ms=7)
    for row in layouts[layouts["drawn"]].itertuples(index=False):
        configured = row.role == "configured"
        ax.plot(s, [lsh_candidate_probability(x, row.bands, row.rows) for x in s],
                color="black" if configured else None, lw=2.4 if configured else 1.3,
                ls="-" if configured or row.role == "listed" else "--",
                label=f"{row.bands}×{row.rows} ({row.hashes} hashes, {row.role})")
    ax.axvline(jaccard_threshold, color="grey", ls=":", label=f"verify at J ≥ {jaccard_threshold:g}")
    ax.set(xlabel="Jaccard similarity s of the pair", ylabel="P(candidate) = 1 − (1 − s^r)^b", xlim=(0, 1),
           ylim=(-0.02, 1.02), title=title)
    ax.legend(loc="upper left", fontsize=7)
    return save_figure(fig, path)
