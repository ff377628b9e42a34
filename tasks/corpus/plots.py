"""Figures of a corpus artifact: the funnel per source and the LSH S-curve of its near-dedup settings."""

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
from tasks.corpus.config import lsh_candidate_probability, lsh_threshold  # noqa: E402
from tasks.readers import load_removals  # noqa: E402


def s_curve_grid(bands: int, rows: int, points: int = 201) -> tuple[np.ndarray, np.ndarray]:
    """The LSH candidate S-curve on a grid of Jaccard similarities.

    Args:
        bands: LSH bands b (>= 1).
        rows: rows per band r (>= 1).
        points: grid size over s in [0, 1] (>= 2).

    Returns:
        (s, p), two float arrays of shape (points,): p = 1 − (1 − s^r)^b is the probability that a pair with
        Jaccard similarity s shares at least one band and so becomes a candidate (Leskovec, Rajaraman & Ullman,
        Mining of Massive Datasets, §3.4; docs/methods.md §7).

    Raises:
        ValueError: bands or rows below 1, or fewer than 2 points.
    """
    if bands < 1 or rows < 1:
        raise ValueError(f"bands={bands} and rows={rows} must both be >= 1 (corpus.near_dedup)")
    if points < 2:
        raise ValueError(f"points={points}: the S-curve needs at least 2 grid points")
    s = np.linspace(0.0, 1.0, points)
    return s, lsh_candidate_probability(s, bands, rows)


def plot_s_curve(bands: int, rows: int, jaccard_threshold: float, path: Path) -> Path:
    """The S-curve of ``bands`` × ``rows`` with the steepest point (1/b)^(1/r) and the verification threshold."""
    s, p = s_curve_grid(bands, rows)
    fig, ax = plt.subplots(figsize=(6.5, 4), dpi=110)
    ax.plot(s, p, color="tab:blue", label=f"P(candidate) = 1−(1−s^{rows})^{bands}")
    steepest = lsh_threshold(bands, rows)
    ax.axvline(steepest, color="grey", ls=":", label=f"(1/b)^(1/r) = {steepest:.2f}")
    ax.axvline(jaccard_threshold, color="tab:red", ls="--", label=f"removed at exact J ≥ {jaccard_threshold:g}")
    ax.set(xlabel="Jaccard similarity s of a pair (word shingles)", ylabel="probability of becoming a candidate",
           xlim=(0, 1), ylim=(-0.02, 1.02), title=f"LSH S-curve: {bands} bands × {rows} rows")
    ax.legend(loc="upper left", fontsize=8)
    return save_figure(fig, path)


def funnel_counts(removals: pd.DataFrame, kept: pd.Series) -> pd.DataFrame:
    """Documents per source (rows) kept and removed by each rule (columns ``kept`` then the rules, most first).

    Args:
        removals: the corpus removal ledger, one row per removed document (columns ``source``, ``rule``).
        kept: documents kept per source, indexed by source.
    """
    by_rule = removals.groupby(["source", "rule"]).size().unstack("rule", fill_value=0) if len(removals) else \
        pd.DataFrame(index=pd.Index([], name="source"))
    table = by_rule.reindex(kept.index, fill_value=0)
    table = table[table.sum().sort_values(ascending=False).index] if len(table.columns) else table
    return pd.concat([kept.rename("kept").astype(int), table.astype(int)], axis=1)


def plot_funnel(counts: pd.DataFrame, path: Path) -> Path:
    """Stacked horizontal bars per source: documents kept, then removed by each rule (``funnel_counts`` output)."""
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.55 * len(counts)), dpi=110)
    left = np.zeros(len(counts))
    colours = plt.get_cmap("tab20").colors
    for i, column in enumerate(counts.columns):
        values = counts[column].to_numpy(dtype=float)
        colour = "0.35" if column == "kept" else colours[(i - 1) % len(colours)]
        ax.barh(counts.index, values, left=left, color=colour, label=column, edgecolor="white", linewidth=0.5)
        left += values
    ax.invert_yaxis()
    ax.set(xlabel="documents", title="Corpus funnel: kept and removed by rule")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7, frameon=False)
    return save_figure(fig, path)


def corpus_figures(artifact: Path, out: Path, history: Any = None) -> list[Path]:
    """``funnel.png`` and ``s_curve.png`` of the corpus artifact at ``artifact``, written into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((artifact / "manifest.json").read_text())
    kept = pd.Series({name: int(info["docs_out"]) for name, info in manifest["sources"].items()})
    near = json.loads((artifact / "meta.json").read_text())["config"]["corpus"]["near_dedup"]
    return [plot_funnel(funnel_counts(load_removals(artifact, ["source", "rule"]), kept), out / "funnel.png"),
            plot_s_curve(near["bands"], near["rows"], near["jaccard_threshold"], out / "s_curve.png")]
