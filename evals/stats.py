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

# scipy.stats (~1 s to import) is imported in the functions that use it: a config reads MIN_UNITS without it.
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
    from scipy import stats
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
    from scipy import stats
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
    from scipy import stats
    _check_confidence(confidence)
    if not 0.0 <= p <= 1.0:
        raise DataError(f"accuracy p must be a fraction in [0, 1], got {p}")
    if half_width <= 0:
        raise ConfigError(f"half_width must be > 0 (a fraction, 0.01 = 1 point), got {half_width}")
    z = float(stats.norm.ppf(0.5 + confidence / 2.0))
    return max(1, math.ceil(z * z * p * (1.0 - p) / half_width**2 - 1e-9))


# --------------------------------------------------------------------------------------------- verdict intervals
# The intervals every verdict rests on (docs/methods.md §16). Each one's coverage at the sizes the platform sees
# (2–5 seeds, a handful of documents, tens of items) is measured by ``benchmarks/interval_coverage.py``, which calls these
# functions; ``MIN_UNITS`` is the least number of independent units from which no simulated scenario covered
# under 0.93 (some cover above 0.99: conservative). Below it a verdict is ``undetermined`` (``units_shortfall``).

MIN_UNITS: dict[str, int] = {
    "documents": 5,  # cluster_mean_ci: held-out documents behind a loss difference
    "seeds": 3,  # seed_cluster_mean_ci: training seeds per arm (at 2, one degree of freedom for the seed variance
    #              under-covers when seeds dominate the noise)
    "items": 40,  # paired_proportion_diff_ci, proportion_ci: items behind an accuracy (difference); at 20 the
    #              paired interval is ±0.13–0.16 and covers 0.99–1.00 in two of four scenarios: it settles no
    #              practical threshold (at 40 every cell is within [0.93, 0.99] but a no-change pair, 0.999)
    "trials": 10,  # loss_minimum_ci: completed sweep trials behind the LR optimum of a cubic
}


WIDTH_TOLERANCE = 1e-9  # relative: an interval narrower than this is rounding, not evidence


def has_width(low: float, high: float, estimate: float = 0.0) -> bool:
    """Whether [low, high] is an interval at all: high − low above rounding (``WIDTH_TOLERANCE`` ×
    max(1, |estimate|)); infinite bounds count as wide, NaN ones as none. A constant difference gives a width of
    ~1e-16 from floating-point sums; no verdict may rest on it (docs/methods.md §14)."""
    if math.isnan(low) or math.isnan(high):
        return False
    return high - low > WIDTH_TOLERANCE * max(1.0, abs(estimate) if math.isfinite(estimate) else 1.0)


def units_shortfall(units: str, n: int, fix: str = "") -> str:
    """"" when ``n`` independent ``units`` (a key of ``MIN_UNITS``) meet the minimum; else the reason a verdict
    on them is undetermined: ``needs >= 5 documents, has 2`` and, when given, how to get more (``fix``).

    Raises:
        ConfigError: ``units`` is not a key of ``MIN_UNITS``.
    """
    if units not in MIN_UNITS:
        raise ConfigError(f"unknown unit {units!r}; one of {sorted(MIN_UNITS)}")
    need = MIN_UNITS[units]
    if n >= need:
        return ""
    return f"needs >= {need} {units}, has {n}" + (f": {fix}" if fix else "")


class ClusterMeanCI(NamedTuple):
    """``delta`` = Σw(b−a)/Σw with its t interval [low, high] over ``n_clusters`` independent clusters (``n_units``
    paired units in all); ``se`` its cluster-robust standard error and ``df`` the t degrees of freedom."""

    delta: float
    low: float
    high: float
    n_clusters: int
    n_units: int
    se: float
    df: float


def _t_interval(delta: float, se: float, df: float, confidence: float) -> tuple[float, float]:
    from scipy import stats
    half = float(stats.t.ppf(0.5 + confidence / 2.0, df)) * se
    return delta - half, delta + half


def _cluster_robust_se(diff: np.ndarray, cluster: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """(estimate, CV3 standard error) of the weighted mean Σw·diff/Σw: the delete-one-cluster jackknife,
    √((G−1)/G · Σ_g (Δ̂_(g) − Δ̂)²) (MacKinnon, Nielsen & Webb 2023, "Cluster-robust inference: a guide to
    empirical practice", §4: with few or unequal clusters CV3 with t(G − 1) keeps its level where the sandwich
    CV1 of ``statsmodels``' ``cov_type="cluster"`` over-rejects; the coverage study in docs/methods.md §16
    measured both)."""
    num = np.bincount(cluster, weights=w * diff)
    den = np.bincount(cluster, weights=w)
    n_clusters = len(den)
    delta = float(num.sum() / den.sum())
    leave_out = (num.sum() - num) / (den.sum() - den)  # (G,): Δ̂ without each cluster
    se = math.sqrt((n_clusters - 1) / n_clusters * float(np.sum((leave_out - delta) ** 2)))
    return delta, se


def _clusters(ids: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Units of positive weight: (keep mask, dense cluster index of the kept units, clusters)."""
    keep = w > 0
    _, cluster = np.unique(ids[keep], return_inverse=True)
    return keep, cluster, int(cluster.max() + 1) if keep.any() else 0


def cluster_mean_ci(a: np.ndarray, b: np.ndarray, clusters: np.ndarray, *, weights: np.ndarray | None = None,
                    confidence: float = 0.95) -> ClusterMeanCI:
    """t interval of the weighted mean difference Σw(b−a)/Σw over G independent clusters (units nats/token, or
    those of ``a`` and ``b``).

    ``a``, ``b``, ``clusters``, ``weights``: shape (N,) over the same N paired units (e.g. nats/token of each
    held-out window for two models, the document each window starts in, tokens per window). Windows of one
    document are correlated, so the variance is the delete-one-document jackknife (CV3, ``_cluster_robust_se``)
    and the quantile is Student's t with G − 1 degrees of freedom (Cameron, Gelbach & Miller 2008; Cameron & Miller 2015 §VI.C: with
    few clusters the percentile cluster bootstrap and the normal quantile both under-cover). Its coverage at 2–500
    documents is in docs/methods.md §16; verdicts need ``MIN_UNITS["documents"]``.

    Raises:
        DataError: shapes differ, values are not finite, weights are negative, or fewer than 2 clusters of
            positive weight.
        ConfigError: confidence outside (0, 1).
    """
    _check_confidence(confidence)
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ids = np.asarray(clusters)
    w = np.ones_like(a) if weights is None else np.asarray(weights, dtype=float)
    if a.ndim != 1 or a.shape != b.shape or ids.shape != a.shape or w.shape != a.shape:
        raise DataError(f"paired samples, clusters and weights need one (N,) shape, got a {a.shape}, b {b.shape}, "
                        f"clusters {ids.shape}, weights {w.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all() and np.isfinite(w).all()) or (w < 0).any():
        raise DataError("paired samples must be finite and weights >= 0; drop windows with NaN/inf loss")
    keep, cluster, n_clusters = _clusters(ids, w)
    if n_clusters < 2:
        raise DataError(f"an interval needs >= 2 clusters of positive weight, got {n_clusters}; evaluate on more "
                        "documents")
    delta, se = _cluster_robust_se((b - a)[keep], cluster, w[keep])
    low, high = _t_interval(delta, se, n_clusters - 1, confidence)
    return ClusterMeanCI(delta, low, high, n_clusters, int(keep.sum()), se, float(n_clusters - 1))


class SeedClusterCI(NamedTuple):
    """Δ averaged over ``n_seeds`` training seeds with its t interval; ``seed_se`` and ``doc_se`` are the two
    standard-error components (training seeds, held-out clusters) and ``df`` the Welch–Satterthwaite degrees of
    freedom of their sum."""

    delta: float
    low: float
    high: float
    n_seeds: int
    n_clusters: int
    n_units: int
    seed_se: float
    doc_se: float
    df: float


def seed_cluster_mean_ci(a: np.ndarray, b: np.ndarray, clusters: np.ndarray, *, weights: np.ndarray | None = None,
                         confidence: float = 0.95) -> SeedClusterCI:
    """Interval of Δ = mean over training seeds of Σw(b−a)/Σw, with both sources of noise: the training seed and
    the held-out sample.

    ``a``, ``b``: shape (S, N): S training seeds (row s of ``a`` and of ``b`` trained with the same seed) scored
    on the same N units; ``clusters``, ``weights``: shape (N,) (the document of each window, its tokens or bytes).
    Var(Δ̂) = s²_seed/S + V_doc: s²_seed the sample variance of the per-seed Δ_s, V_doc the delete-one-cluster
    jackknife (CV3) variance of the seed-averaged differences over the G clusters; the t quantile takes the Welch–Satterthwaite
    degrees of freedom (Satterthwaite 1946) of the two components, S − 1 and G − 1. The sum counts the
    seed × document interaction twice, which errs wide. With S = 1 only the held-out part is estimated (the caller
    must not decide on one seed: ``MIN_UNITS["seeds"]``). Coverage: docs/methods.md §16.

    Raises:
        DataError: shapes disagree, values are not finite, weights are negative, or fewer than 2 clusters.
        ConfigError: confidence outside (0, 1).
    """
    _check_confidence(confidence)
    a, b = np.atleast_2d(np.asarray(a, dtype=float)), np.atleast_2d(np.asarray(b, dtype=float))
    ids = np.asarray(clusters)
    w = np.ones(a.shape[1]) if weights is None else np.asarray(weights, dtype=float)
    if a.shape != b.shape or ids.shape != (a.shape[1],) or w.shape != ids.shape:
        raise DataError(f"seeded paired samples need a, b of one (S, N) shape and clusters, weights of (N,), got "
                        f"a {a.shape}, b {b.shape}, clusters {ids.shape}, weights {w.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all() and np.isfinite(w).all()) or (w < 0).any():
        raise DataError("paired samples must be finite and weights >= 0")
    keep, cluster, n_clusters = _clusters(ids, w)
    if n_clusters < 2:
        raise DataError(f"an interval needs >= 2 clusters of positive weight, got {n_clusters}; evaluate on more "
                        "documents")
    diff, w = (b - a)[:, keep], w[keep]
    n_seeds = diff.shape[0]
    per_seed = diff @ w / w.sum()  # (S,)
    delta, doc_se = _cluster_robust_se(diff.mean(axis=0), cluster, w)
    doc_var, doc_df = doc_se**2, float(n_clusters - 1)
    seed_var = float(np.var(per_seed, ddof=1)) / n_seeds if n_seeds > 1 else 0.0
    total = seed_var + doc_var
    if total <= 0:  # identical arms: nothing varies, and there is no interval to speak of
        return SeedClusterCI(delta, delta, delta, n_seeds, n_clusters, int(keep.sum()), 0.0, 0.0, math.inf)
    parts = [(doc_var, doc_df)] + ([(seed_var, float(n_seeds - 1))] if n_seeds > 1 else [])
    df = total**2 / sum(v * v / d for v, d in parts if v > 0)
    low, high = _t_interval(delta, math.sqrt(total), df, confidence)
    return SeedClusterCI(delta, low, high, n_seeds, n_clusters, int(keep.sum()), math.sqrt(seed_var),
                         doc_se, float(df))


class ProportionCI(NamedTuple):
    """``k`` of ``n`` items, the proportion ``estimate`` = k/n and its interval."""

    estimate: float
    low: float
    high: float
    k: int
    n: int


def proportion_ci(k: int, n: int, confidence: float = 0.95) -> ProportionCI:
    """Wilson score interval of an accuracy k/n (Wilson 1927; ``scipy.stats.binomtest(k, n).proportion_ci``);
    never of zero width, also at 0/n and n/n. Coverage at 10–500 items: docs/methods.md §16.

    Raises:
        DataError: n < 1 or k outside [0, n].
        ConfigError: confidence outside (0, 1).
    """
    from scipy import stats
    _check_confidence(confidence)
    if n < 1 or not 0 <= k <= n:
        raise DataError(f"a proportion needs n >= 1 items and 0 <= k <= n, got k={k}, n={n}")
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return ProportionCI(k / n, float(ci.low), float(ci.high), int(k), int(n))


class PairedBinaryCI(NamedTuple):
    """Δ = accuracy(cand) − accuracy(base) over ``n`` paired items and its interval; ``b01`` items only the
    candidate got right, ``b10`` only the base."""

    delta: float
    low: float
    high: float
    n: int
    b01: int
    b10: int


def paired_proportion_diff_ci(base_correct: np.ndarray, cand_correct: np.ndarray,
                              confidence: float = 0.95) -> PairedBinaryCI:
    """Interval of the difference of two paired accuracies, cand − base (fractions; 0.01 = one point).

    Newcombe's (1998) method 10: Wilson intervals of both marginal accuracies combined through the phi
    correlation of the 2×2 table (with his continuity correction of the numerator, ad − bc − n/2 when ad > bc).
    Unlike a bootstrap or Wald interval it has a nonzero width when no item is discordant: agreement on all of 40
    items does not bound a regression at 0. Coverage at 10–500 items: docs/methods.md §16.

    ``base_correct``, ``cand_correct``: bool (N,), the same items in the same order.

    Raises:
        DataError: shapes differ or no items.
        ConfigError: confidence outside (0, 1).
    """
    base = np.asarray(base_correct, dtype=bool)
    cand = np.asarray(cand_correct, dtype=bool)
    if base.ndim != 1 or base.shape != cand.shape or base.size == 0:
        raise DataError(f"paired correctness needs equal non-empty 1-D shapes, got {base.shape} and {cand.shape}")
    n = int(base.size)
    both, only_base = int(np.sum(base & cand)), int(np.sum(base & ~cand))
    only_cand, neither = int(np.sum(~base & cand)), int(np.sum(~base & ~cand))
    p1, l1, u1 = proportion_ci(both + only_base, n, confidence)[:3]  # base
    p2, l2, u2 = proportion_ci(both + only_cand, n, confidence)[:3]  # candidate
    num = both * neither - only_base * only_cand
    if num > 0:
        num = max(num - n / 2.0, 0.0)
    den = math.sqrt(float(both + only_base) * (only_cand + neither) * (both + only_cand) * (only_base + neither))
    phi = num / den if den > 0 else 0.0
    theta = p1 - p2  # Newcombe's orientation; Δ = −θ
    below = math.sqrt(max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0))
    above = math.sqrt(max((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2, 0.0))
    return PairedBinaryCI(0.0 - theta, -(theta + above), -(theta - below), n, only_cand, only_base)


class OptimumCI(NamedTuple):
    """x* minimising a fitted polynomial y(x) with its confidence set; ``bounded`` False when the set is not a
    finite range inside the tried x (the minimum is not resolved): then low, high are ±inf and ``optimum`` may be
    NaN. ``coefficients``: (c0, c1, …) of y = Σ c_k x^k, the least-squares fit."""

    optimum: float
    low: float
    high: float
    bounded: bool
    n: int
    coefficients: tuple[float, ...]


LOSS_MINIMUM_DEGREE = 3  # a cubic: held-out loss rises faster above the optimal LR than below it
GRID_POINTS = 4001


def loss_minimum_ci(x: np.ndarray, y: np.ndarray, confidence: float = 0.95,
                    degree: int = LOSS_MINIMUM_DEGREE) -> OptimumCI:
    """The minimiser x* of the least-squares polynomial of ``degree`` through (x, y) over the tried range, and the
    set of x where a zero slope is not rejected: {θ : (c(θ)ᵀβ̂)² ≤ t²·c(θ)ᵀV̂c(θ)}, c(θ) = ∂/∂θ (1, θ, θ², …), t
    the Student quantile with n − degree − 1 degrees of freedom (Fieller 1954, generalised to any polynomial's
    stationary point; exact when the residuals are normal with equal variance and the polynomial is right). The
    interval is that set's connected part around x*, on a grid of ``GRID_POINTS`` over [min x, max x].

    A cubic (the default) follows a loss curve that rises faster on one side, as held-out loss against ln(peak
    LR) does (Wortsman et al. 2023): a parabola fitted to such a curve puts its optimum off the true one by a bias
    that does not shrink with more trials, and its interval then covers less and less (docs/methods.md §16).
    Coefficients and covariance: ordinary least squares (``statsmodels.OLS``).

    ``x``, ``y``: shape (n,), e.g. ln(peak LR) and held-out loss in nats/token. Unbounded (``bounded`` False) when
    the fitted minimum sits on the range's edge, the slope at it is not resolved, or the set reaches an edge.

    Raises:
        DataError: shapes differ, values are not finite, or fewer than degree + 2 points at degree + 1 distinct x.
        ConfigError: confidence outside (0, 1), or degree < 2.
    """
    from scipy import stats
    import statsmodels.api as sm  # deferred: statsmodels costs ~1 s to import and only verdicts need it

    _check_confidence(confidence)
    if degree < 2:
        raise ConfigError(f"a loss minimum needs a polynomial of degree >= 2, got {degree}")
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.ndim != 1 or x.shape != y.shape or not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise DataError(f"a loss-curve fit needs finite x and y of one (n,) shape, got {x.shape} and {y.shape}")
    if len(x) < degree + 2 or len(np.unique(x)) < degree + 1:
        raise DataError(f"a degree-{degree} loss-curve fit needs >= {degree + 2} points at >= {degree + 1} distinct "
                        f"x, got {len(x)} points at {len(np.unique(x))}")
    powers = np.arange(degree + 1)
    fit = sm.OLS(y, x[:, None] ** powers).fit()
    beta, cov = np.asarray(fit.params), np.asarray(fit.cov_params())
    grid = np.linspace(x.min(), x.max(), GRID_POINTS)
    slope_rows = np.zeros((len(grid), degree + 1))
    slope_rows[:, 1:] = powers[1:] * grid[:, None] ** (powers[1:] - 1)  # (grid, degree + 1): d/dθ of each power
    slope = slope_rows @ beta
    slope_var = np.einsum("ij,jk,ik->i", slope_rows, cov, slope_rows)
    t2 = float(stats.t.ppf(0.5 + confidence / 2.0, len(x) - degree - 1)) ** 2
    inside = slope * slope <= t2 * slope_var
    best = int(np.argmin((grid[:, None] ** powers) @ beta))
    coefficients = tuple(float(c) for c in beta)
    if best in (0, len(grid) - 1) or not inside[best]:
        return OptimumCI(float(grid[best]) if 0 < best < len(grid) - 1 else math.nan, -math.inf, math.inf, False,
                         len(x), coefficients)
    outside = np.flatnonzero(~inside)
    below, above = outside[outside < best], outside[outside > best]
    if not len(below) or not len(above):  # the set runs to an edge of the tried range
        return OptimumCI(float(grid[best]), -math.inf, math.inf, False, len(x), coefficients)
    # The set's ends lie between grid points: take the outer ones, so that a set narrower than a grid step keeps
    # a width and still holds the true zero-slope point.
    return OptimumCI(float(grid[best]), float(grid[below[-1]]), float(grid[above[0]]), True, len(x), coefficients)
