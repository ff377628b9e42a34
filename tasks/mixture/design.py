"""Designing and reading a mixture ablation: candidates generated from a budget of proxy runs, the rank agreement
of two proxy sizes, and a regression over the trials that proposes a mixture the grid did not contain.

Generated candidates (``[mixture.generate]``):

* ``grid``: every composition of the general sources whose weights are multiples of ``step`` (a simplex lattice),
  thinned to ``count`` by an even stride when there are more (the budget of proxy runs).
* ``simplex``: ``count`` draws from a symmetric Dirichlet(``concentration``) (1 = uniform over the simplex).

Proposal: each source's held-out bits/byte is modelled from its own weight as L_s(w) = c_s − k_s·ln(w_s + ε)
(k_s ≥ 0; more of a source never hurts that source), fitted by least squares over the trials; the proposed mixture
minimises the rule's weighted sum Σ_s τ_s·L_s(w) on the simplex. With ε → 0 the optimum is w_s ∝ τ_s·k_s: a source
earns weight in proportion to how much its loss responds to its weight and how much it counts in the score.
The proposal is a hypothesis; the stage verifies it with one more proxy run before it may be chosen.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats
from scipy.optimize import minimize

from infra.errors import DataError

EPSILON = 1e-3  # weight floor inside the log: a source at weight 0 still has a finite predicted loss


def grid_mixtures(sources: Sequence[str], step: float, count: int) -> list[dict[str, float]]:
    """Simplex-lattice mixtures over ``sources`` with weights in multiples of ``step`` (1/step must be an integer),
    at most ``count`` of them chosen by an even stride over the lattice in lexicographic order.

    Raises:
        DataError: fewer than two sources, or 1/step is not a positive integer.
    """
    parts = round(1.0 / step)
    if len(sources) < 2 or parts < 1 or abs(parts * step - 1.0) > 1e-9:
        raise DataError(f"a mixture grid needs ≥ 2 sources and a step dividing 1 (got {len(sources)} sources, step "
                        f"{step}); use e.g. step = 0.25")
    lattice = [c for c in itertools.product(range(parts + 1), repeat=len(sources)) if sum(c) == parts]
    if len(lattice) > count:
        lattice = [lattice[round(i * (len(lattice) - 1) / max(count - 1, 1))] for i in range(count)]
    return [{s: n / parts for s, n in zip(sources, c)} for c in lattice]


def simplex_mixtures(sources: Sequence[str], count: int, seed: int, concentration: float = 1.0) -> list[dict[str, float]]:
    """``count`` Dirichlet(``concentration``) draws over ``sources``, rounded to 4 decimals (still summing to 1)."""
    rng = np.random.default_rng(seed)
    draws = rng.dirichlet(np.full(len(sources), concentration), size=count)
    out = []
    for row in draws:
        rounded = np.round(row, 4)
        rounded[np.argmax(rounded)] += 1.0 - rounded.sum()  # keep the sum exact after rounding
        out.append({s: float(w) for s, w in zip(sources, rounded)})
    return out


@dataclass(frozen=True)
class RankAgreement:
    """Kendall's τ between the candidates' scores at two proxy sizes (τ-b, scipy), its two-sided p-value, the
    winner at each size, and every pair of candidates whose order flips."""

    tau: float
    p_value: float
    best_small: str
    best_large: str
    flipped_pairs: list[tuple[str, str]]

    @property
    def winner_flips(self) -> bool:
        return self.best_small != self.best_large


def rank_agreement(small: pd.Series, large: pd.Series) -> RankAgreement:
    """Agreement of two score series (candidate → score, lower is better) over their common candidates.

    Raises:
        DataError: fewer than two common candidates with finite scores.
    """
    common = [c for c in small.index if c in large.index and np.isfinite(small[c]) and np.isfinite(large[c])]
    if len(common) < 2:
        raise DataError(f"a rank comparison needs ≥ 2 candidates scored at both sizes; got {common}")
    a, b = small[common].astype(float), large[common].astype(float)
    result = stats.kendalltau(a.to_numpy(), b.to_numpy())
    flips = [(x, y) for x, y in itertools.combinations(common, 2) if (a[x] - a[y]) * (b[x] - b[y]) < 0]
    return RankAgreement(tau=float(result.statistic), p_value=float(result.pvalue), best_small=str(a.idxmin()),
                         best_large=str(b.idxmin()), flipped_pairs=flips)


@dataclass(frozen=True)
class Proposal:
    """A proposed mixture, the fitted per-source law (c_s, k_s, R² over the trials) and its predicted bits/byte."""

    weights: dict[str, float]
    predicted_bpb: dict[str, float]
    predicted_score: float
    fit: pd.DataFrame


def propose_mixture(trials: pd.DataFrame, score_weights: dict[str, float]) -> Proposal:
    """Fit L_s(w) = c_s − k_s·ln(w_s + ε) per source on ``trials`` (columns source, weight, bits_per_byte) and
    minimise Σ_s τ_s·L_s(w) over the simplex, τ = ``score_weights`` (normalised).

    Raises:
        DataError: a source has fewer than two distinct weights among the trials (its slope is not identified).
    """
    sources = sorted(score_weights)
    fit_rows = []
    for source in sources:
        rows = trials[trials["source"] == source]
        x = -np.log(rows["weight"].to_numpy(dtype=float) + EPSILON)
        y = rows["bits_per_byte"].to_numpy(dtype=float)
        if len(np.unique(np.round(x, 9))) < 2:
            raise DataError(f"source {source!r} was trained at only one weight across the candidates: a mixture "
                            "regression needs at least two (add a candidate that changes its weight)")
        slope, intercept = np.polyfit(x, y, 1)
        k = max(float(slope), 0.0)  # more of a source never hurts it; a negative fit is noise
        c = float(np.mean(y - k * x))
        residual = y - (c + k * x)
        r2 = 1.0 - float(residual.var() / y.var()) if y.var() > 0 else 1.0
        fit_rows.append({"source": source, "c": c, "k": k, "r2": r2, "trials": len(rows)})
    fit = pd.DataFrame(fit_rows)
    tau = np.array([score_weights[s] for s in sources], dtype=float)
    tau = tau / tau.sum()
    c, k = fit["c"].to_numpy(), fit["k"].to_numpy()

    def score(w: np.ndarray) -> float:
        return float(np.sum(tau * (c - k * np.log(w + EPSILON))))

    start = np.full(len(sources), 1.0 / len(sources))
    solved = minimize(score, start, method="SLSQP", bounds=[(0.0, 1.0)] * len(sources),
                      constraints=[{"type": "eq", "fun": lambda w: float(np.sum(w) - 1.0)}])
    w = np.clip(solved.x, 0.0, 1.0)
    w = np.round(w / w.sum(), 4)
    w[np.argmax(w)] += 1.0 - w.sum()
    weights = {s: float(v) for s, v in zip(sources, w)}
    predicted = {s: float(ci - ki * math.log(weights[s] + EPSILON)) for s, ci, ki in zip(sources, c, k)}
    return Proposal(weights=weights, predicted_bpb=predicted, predicted_score=score(w), fit=fit)
