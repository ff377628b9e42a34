"""Uncertainty for evaluation results: binomial SE, paired bootstrap, exact McNemar, items needed (docs/methods.md §10).

Accuracies here are fractions in [0, 1]; multiply by 100 for points. Loss differences are in nats per token.
Two checkpoints scored on the same windows or items are compared pairwise (docs/methods.md §10: "use paired comparisons").

    binomial_se(0.40, 500)            # 0.0219 -> 2.19 points
    paired_bootstrap_ci(base_nats, cand_nats, weights=tokens)   # BootstrapCI(delta, low, high)
    cluster_bootstrap_ci(base_nats, cand_nats, doc_of_window, weights=tokens)  # whole documents resampled
    mcnemar_exact(base_correct, cand_correct)                   # McNemar(b01, b10, p_value)
    items_needed(0.40, 0.043)         # ~500 items for +/-4.3 points at 95%
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy import stats

from infra.errors import ConfigError, DataError


class BootstrapCI(NamedTuple):
    """Point estimate ``delta`` = mean(b) − mean(a) and its percentile-bootstrap interval [low, high]."""

    delta: float
    low: float
    high: float


class McNemar(NamedTuple):
    """Discordant pairs and the exact two-sided McNemar p-value.

    ``b01``: items the base got wrong and the candidate right; ``b10``: base right, candidate wrong.
    """

    b01: int
    b10: int
    p_value: float


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ConfigError(f"confidence must lie in (0, 1), got {confidence}; use e.g. 0.95")


def binomial_se(p: float, n: int) -> float:
    """Standard error √(p(1−p)/n) of an accuracy ``p`` (fraction) measured on ``n`` items (docs/methods.md §10).

    40% on 500 items → 0.0219 (2.19 points); 24 items at 50% → 0.102. Raises DataError for p outside
    [0, 1] or n < 1.
    """
    if not 0.0 <= p <= 1.0:
        raise DataError(f"accuracy p must be a fraction in [0, 1], got {p}")
    if n < 1:
        raise DataError(f"number of items n must be >= 1, got {n}")
    return math.sqrt(p * (1.0 - p) / n)


def _as_paired(a: np.ndarray, b: np.ndarray, weights: np.ndarray | None) -> tuple[np.ndarray, ...]:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    w = np.ones_like(a) if weights is None else np.asarray(weights, dtype=float)
    if a.ndim != 1 or a.shape != b.shape or a.shape != w.shape:
        raise DataError(f"paired samples need equal 1-D shapes, got a {a.shape}, b {b.shape}, weights {w.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all() and np.isfinite(w).all()):
        raise DataError("paired samples and weights must be finite; drop windows with NaN/inf loss")
    if (w < 0).any():
        raise DataError("weights must be >= 0 (e.g. tokens per window)")
    keep = w > 0  # a zero-weight unit adds nothing to the mean, and would only dilute the resamples
    if keep.sum() < 2:
        raise DataError(f"paired bootstrap needs >= 2 units of positive weight, got {int(keep.sum())}; "
                        "evaluate on more windows or items")
    return a[keep], b[keep], w[keep]


def paired_bootstrap_ci(a: np.ndarray, b: np.ndarray, *, weights: np.ndarray | None = None,
                        n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> BootstrapCI:
    """Paired percentile-bootstrap CI of the weighted mean difference Σw(b−a)/Σw.

    ``a``, ``b``: shape (N,) per-unit values for the same N units (e.g. nats/token per held-out window for
    base and candidate); ``weights``: shape (N,), e.g. tokens per window, so the mean is token-weighted (None:
    equal weights). Units are resampled with replacement, keeping each unit's (a, b, w) together (Efron &
    Tibshirani 1993, ch. 13, percentile interval; computed with ``scipy.stats.bootstrap``). For constant
    differences the interval collapses to the point.

    Units of zero weight are dropped. Raises DataError for mismatched shapes, fewer than 2 units of positive
    weight, non-finite values or negative weights; ConfigError
    for a confidence outside (0, 1) or n_resamples < 1.
    """
    _check_confidence(confidence)
    if n_resamples < 1:
        raise ConfigError(f"n_resamples must be >= 1, got {n_resamples}")
    a, b, w = _as_paired(a, b, weights)
    diff = b - a
    delta = float(np.sum(w * diff) / np.sum(w))

    def weighted_mean(d: np.ndarray, ww: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.sum(d * ww, axis=axis) / np.sum(ww, axis=axis)

    res = stats.bootstrap((diff, w), weighted_mean, paired=True, vectorized=True, n_resamples=n_resamples,
                          confidence_level=confidence, method="percentile", batch=256,
                          rng=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return BootstrapCI(delta, min(low, delta), max(high, delta))


class ClusterCI(NamedTuple):
    """``delta`` = Σw(b−a)/Σw with its cluster-bootstrap interval [low, high] over ``n_clusters`` independent units
    (``n_units`` paired units in all)."""

    delta: float
    low: float
    high: float
    n_clusters: int
    n_units: int


def cluster_bootstrap_ci(a: np.ndarray, b: np.ndarray, clusters: np.ndarray, *, weights: np.ndarray | None = None,
                         n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> ClusterCI:
    """Paired cluster-bootstrap CI of the weighted mean difference Σw(b−a)/Σw.

    ``a``, ``b``, ``clusters`` and ``weights``: shape (N,) over the same N paired units (e.g. nats/token of each
    held-out window for two models, the document each window starts in, and tokens per window). Windows cut from
    one document are correlated, so whole clusters are resampled with replacement (Cameron, Gelbach & Miller 2008;
    percentile interval of the ratio Σ_c Σw(b−a) / Σ_c Σw: :func:`seed_cluster_bootstrap_ci` with one seed). With one
    unit per cluster this is :func:`paired_bootstrap_ci`'s interval.

    Raises:
        DataError: mismatched shapes, non-finite values, negative weights, or fewer than 2 clusters of positive
            weight.
        ConfigError: confidence outside (0, 1) or n_resamples < 1.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if np.shape(clusters) != a.shape or a.shape != b.shape or a.ndim != 1:
        raise DataError(f"clusters need the shape of the paired samples, got {np.shape(clusters)}, {a.shape} and "
                        f"{b.shape}")
    return seed_cluster_bootstrap_ci(a[None], b[None], clusters, weights=weights, n_resamples=n_resamples,
                                     confidence=confidence, seed=seed)


def seed_cluster_bootstrap_ci(a: np.ndarray, b: np.ndarray, clusters: np.ndarray, *,
                              weights: np.ndarray | None = None, n_resamples: int = 2000, confidence: float = 0.95,
                              seed: int = 0) -> ClusterCI:
    """Interval of Δ = mean over training seeds of Σw(b−a)/Σw, resampling both training seeds and held-out clusters.

    ``a``, ``b``: shape (S, N): S training seeds (row s of ``a`` and of ``b`` trained with the same seed) scored on
    the same N units; ``clusters``, ``weights``: shape (N,) (the document each window starts in, tokens or bytes
    per window). The held-out sample and the training run are two independent sources of noise, so each replicate
    draws S seeds and then the clusters with replacement, the same clusters for every drawn seed (two-stage
    resampling, Davison & Hinkley 1997, §3.8), and takes the mean over its seeds of the ratio of cluster sums;
    percentile interval. With S = 1 only the held-out sample is resampled (:func:`cluster_bootstrap_ci`).

    Raises:
        DataError: shapes disagree, values are not finite, weights are negative, or fewer than 2 clusters.
        ConfigError: confidence outside (0, 1) or n_resamples < 1.
    """
    _check_confidence(confidence)
    if n_resamples < 1:
        raise ConfigError(f"n_resamples must be >= 1, got {n_resamples}")
    a, b = np.atleast_2d(np.asarray(a, dtype=float)), np.atleast_2d(np.asarray(b, dtype=float))
    ids = np.asarray(clusters)
    w = np.ones(a.shape[1]) if weights is None else np.asarray(weights, dtype=float)
    if a.shape != b.shape or ids.shape != (a.shape[1],) or w.shape != ids.shape:
        raise DataError(f"seeded paired samples need a, b of one (S, N) shape and clusters, weights of (N,), got "
                        f"a {a.shape}, b {b.shape}, clusters {ids.shape}, weights {w.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all() and np.isfinite(w).all()) or (w < 0).any():
        raise DataError("paired samples must be finite and weights >= 0")
    _, cluster = np.unique(ids, return_inverse=True)
    den = np.bincount(cluster, weights=w)
    num = np.stack([np.bincount(cluster, weights=w * (bs - as_)) for as_, bs in zip(a, b)])  # (S, C)
    live = den > 0
    num, den = num[:, live], den[live]
    n_seeds, n_clusters = num.shape
    if n_clusters < 2:
        raise DataError(f"the bootstrap needs >= 2 clusters of positive weight, got {n_clusters}; evaluate on more "
                        "documents")
    delta = float(np.mean(num.sum(axis=1) / den.sum()))
    rng = np.random.default_rng(seed)
    draws = np.empty(n_resamples)
    for start in range(0, n_resamples, 256):
        r = min(256, n_resamples - start)
        counts = rng.multinomial(n_clusters, np.full(n_clusters, 1.0 / n_clusters), size=r)  # (r, C)
        ratio = (num @ counts.T) / (den @ counts.T)  # (S, r): each seed's Δ on each resampled held-out set
        seeds = rng.integers(0, n_seeds, size=(r, n_seeds)) if n_seeds > 1 else np.zeros((r, 1), dtype=int)
        draws[start:start + r] = ratio[seeds, np.arange(r)[:, None]].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = (float(q) for q in np.quantile(draws, [tail, 1.0 - tail]))
    return ClusterCI(delta, min(low, delta), max(high, delta), int(n_clusters), int(a.shape[1]))


def mcnemar_exact(base_correct: np.ndarray, cand_correct: np.ndarray) -> McNemar:
    """Exact McNemar test on paired per-item correctness (McNemar 1947; exact form: binomial on discordants).

    ``base_correct``, ``cand_correct``: bool arrays of shape (N,) over the same items in the same order. Under
    the null each discordant item is equally likely to favour either model, so p = two-sided
    ``scipy.stats.binomtest(b01, b01 + b10, 0.5)``; 1.0 when there are no discordant items. Raises DataError
    for mismatched shapes.
    """
    base = np.asarray(base_correct, dtype=bool)
    cand = np.asarray(cand_correct, dtype=bool)
    if base.ndim != 1 or base.shape != cand.shape:
        raise DataError(f"paired correctness needs equal 1-D shapes, got {base.shape} and {cand.shape}")
    b01 = int(np.sum(~base & cand))
    b10 = int(np.sum(base & ~cand))
    if b01 + b10 == 0:
        return McNemar(b01, b10, 1.0)
    return McNemar(b01, b10, float(stats.binomtest(b01, b01 + b10, 0.5).pvalue))


def items_needed(p: float, half_width: float, confidence: float = 0.95) -> int:
    """Items n so that a normal-approximation binomial CI at ``confidence`` has half-width ``half_width``.

    n = ⌈z² p(1−p) / h²⌉ with z the two-sided normal quantile (docs/methods.md §10: 40% on 500 → ±4.3 points at 95%);
    at least 1. ``p`` and ``half_width`` are fractions (0.043 = 4.3 points). Raises DataError for p outside
    [0, 1]; ConfigError for half_width <= 0 or confidence outside (0, 1).
    """
    _check_confidence(confidence)
    if not 0.0 <= p <= 1.0:
        raise DataError(f"accuracy p must be a fraction in [0, 1], got {p}")
    if half_width <= 0:
        raise ConfigError(f"half_width must be > 0 (a fraction, 0.01 = 1 point), got {half_width}")
    z = float(stats.norm.ppf(0.5 + confidence / 2.0))
    return max(1, math.ceil(z * z * p * (1.0 - p) / half_width**2 - 1e-9))
