"""Figures of a run's evidence, drawn from its artifacts: the main run's loss and LR curves, the corpus funnel per
source, the LSH S-curve of the near-dedup configuration, and the mixture comparison.

Each ``plot_*`` writes one PNG and returns its path. ``stage_plots`` draws every figure a stage's artifact allows
into a folder; the pipeline logs that folder as the stage run's ``plots/`` artifacts and ``pretrain report`` embeds
the same files, so MLflow and the report show the same pictures.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on workers or in CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from tasks.corpus.minhash import lsh_candidate_probability, lsh_threshold  # noqa: E402

CURVE_METRICS = ("loss_nats", "lr")


def s_curve(bands: int, rows: int, points: int = 201) -> tuple[np.ndarray, np.ndarray]:
    """The LSH candidate S-curve on a grid of Jaccard similarities.

    Args:
        bands: LSH bands b (>= 1).
        rows: rows per band r (>= 1).
        points: grid size over s in [0, 1] (>= 2).

    Returns:
        (s, p), two float arrays of shape (points,): p = 1 − (1 − s^r)^b is the probability that a pair with
        Jaccard similarity s shares at least one band and so becomes a candidate.

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
    s, p = s_curve(bands, rows)
    fig, ax = plt.subplots(figsize=(6.5, 4), dpi=110)
    ax.plot(s, p, color="tab:blue", label=f"P(candidate) = 1−(1−s^{rows})^{bands}")
    steepest = lsh_threshold(bands, rows)
    ax.axvline(steepest, color="grey", ls=":", label=f"(1/b)^(1/r) = {steepest:.2f}")
    ax.axvline(jaccard_threshold, color="tab:red", ls="--", label=f"removed at exact J ≥ {jaccard_threshold:g}")
    ax.set(xlabel="Jaccard similarity s of a pair (word shingles)", ylabel="probability of becoming a candidate",
           xlim=(0, 1), ylim=(-0.02, 1.02), title=f"LSH S-curve: {bands} bands × {rows} rows")
    ax.legend(loc="upper left", fontsize=8)
    return _save(fig, path)


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
    return _save(fig, path)


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
    return _save(fig, path)


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
    return _save(fig, path)


def training_history(client, run_id: str, metrics: tuple[str, ...] = CURVE_METRICS) -> pd.DataFrame:
    """The logged history of ``metrics`` of one MLflow run, one row per step (columns ``step`` and the metrics
    found; empty when none was logged)."""
    frames = []
    for name in metrics:
        points = client.get_metric_history(run_id, name)
        if points:
            frames.append(pd.DataFrame({"step": [m.step for m in points], name: [m.value for m in points]})
                          .drop_duplicates("step", keep="last").set_index("step"))
    return pd.concat(frames, axis=1).reset_index() if frames else pd.DataFrame()


def stage_plots(stage: str, artifact: Path, out: Path, history: pd.DataFrame | None = None) -> list[Path]:
    """Every figure the ``stage`` artifact at ``artifact`` allows, written into ``out``; returns their paths.

    corpus: ``funnel.png`` and ``s_curve.png``; mixture: ``mixture_scores.png``; main: ``training_curves.png``
    (from ``history``, the run's logged ``step``/``loss_nats``/``lr``). Other stages have none here.
    """
    out.mkdir(parents=True, exist_ok=True)
    made = []
    if stage == "corpus":
        manifest = json.loads((artifact / "manifest.json").read_text())
        kept = pd.Series({name: int(info["docs_out"]) for name, info in manifest["sources"].items()})
        made.append(plot_funnel(funnel_counts(pd.read_parquet(artifact / "removals.parquet"), kept),
                                out / "funnel.png"))
        near = json.loads((artifact / "meta.json").read_text())["config"]["corpus"]["near_dedup"]
        made.append(plot_s_curve(near["bands"], near["rows"], near["jaccard_threshold"], out / "s_curve.png"))
    elif stage == "mixture":
        choice = json.loads((artifact / "choice.json").read_text())
        made.append(plot_mixture(pd.DataFrame(choice["scores"]), choice["name"], out / "mixture_scores.png"))
    elif stage == "main" and history is not None and not history.empty:
        made.append(plot_training_curves(history, out / "training_curves.png"))
    return made


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
