"""The peak LR with an interval: a cubic in ln(peak LR) fitted to the sweep's held-out losses, the confidence set of
its minimum, the declared rule that decides it, and the exponent of the LR optimum across widths
(docs/methods.md §14, §16, §6).

Held-out loss against x = ln(peak LR) is a basin that rises faster above the optimal LR than below it (the LR
sensitivity curves of Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities"). A parabola fitted over a wide range to such a curve puts its optimum off the true one by a bias that
does not shrink with more trials, so the fit is a cubic y = Σ c_k x^k (k = 0…3) by least squares over the COMPLETE
trials (y in nats/token). The optimum x* is the cubic's minimum over the tried range; its interval is the
generalised Fieller confidence set of the cubic's zero-slope point (Fieller 1954; ``evals.stats.loss_minimum_ci``):
the x where a zero slope is not rejected at the rule's confidence. The set is unbounded (``bounded`` False) when the
minimum sits on the tried range's edge or the set reaches an edge: the minimum is then not resolved. The coverage
of that set was measured by simulation (``benchmarks/interval_coverage.py``, docs/methods.md §16): it stays within
[0.93, 0.99] from ``MIN_UNITS["trials"]`` = 10 COMPLETE trials, so the rule decides only from there. Pruned trials
are left out: their final loss was never measured, and their last intermediate loss belongs to a shorter run.

    fit = fit_lr(trials, lr_min=1e-4, lr_max=1e-2, confidence=0.95, seed=0)
    judged = judge(fit, LrRule(factor=3.0, confidence=0.95))

The width exponent keeps a nonparametric bootstrap over trials (Efron & Tibshirani 1993): each replicate refits the
cubic and takes its minimum (``bootstrap_minima``), and the exponent's interval regresses replicate r of every
width. ``quadratic_fit``, ``optimum_log_lr``, ``bootstrap_optima`` and ``percentile_interval`` are the parabola and
percentile bootstrap the peak-LR verdict used before; ``benchmarks/interval_coverage.py --before`` still measures them.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from evals.stats import LOSS_MINIMUM_DEGREE, MIN_UNITS, loss_minimum_ci, units_shortfall
from infra.errors import ConfigError, DataError

N_BOOTSTRAP = 2000  # replicates per width: the 2.5% and 97.5% percentiles rest on 50 replicates each
MIN_DISTINCT_LRS = 3  # three coefficients of the parabola
CUBIC_DISTINCT_LRS = LOSS_MINIMUM_DEGREE + 1  # four coefficients of the cubic
CUBIC_MIN_TRIALS = LOSS_MINIMUM_DEGREE + 2  # one residual degree of freedom at least (evals.stats.loss_minimum_ci)
BOOTSTRAP_GRID_POINTS = 1001  # a replicate's minimum is searched on this grid over its tried range
METHOD = (f"cubic least squares in ln(peak LR); interval: the generalised Fieller confidence set of its zero-slope "
          f"point (Fieller 1954); decides from >= {MIN_UNITS['trials']} COMPLETE trials")


def quadratic_fit(log_lr: np.ndarray, loss: np.ndarray) -> tuple[float, float, float]:
    """Least-squares (a, b, c) of y = a·x² + b·x + c (``numpy.polyfit``), x = ln(peak LR), y in nats/token.

    Raises:
        DataError: the arrays differ in length, hold a non-finite value, or have fewer than 3 distinct x.
    """
    x, y = np.asarray(log_lr, dtype=float), np.asarray(loss, dtype=float)
    if x.shape != y.shape or not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise DataError(f"a quadratic LR fit needs finite ln-LRs and losses of one length; got {x.shape}, {y.shape}")
    if len(np.unique(x)) < MIN_DISTINCT_LRS:
        raise DataError(f"a quadratic LR fit needs ≥ {MIN_DISTINCT_LRS} distinct peak LRs; got {len(np.unique(x))}")
    a, b, c = np.polyfit(x, y, 2)
    return float(a), float(b), float(c)


def optimum_log_lr(a: float, b: float) -> float:
    """x* = −b/(2a), the minimum of the parabola in ln(peak LR); NaN when a ≤ 0 (no minimum)."""
    return -b / (2.0 * a) if a > 0 else math.nan


def bootstrap_optima(log_lr: np.ndarray, loss: np.ndarray, *, replicates: int,
                     seed: int | list[int]) -> tuple[np.ndarray, np.ndarray]:
    """x* of ``replicates`` nonparametric bootstrap refits of the parabola over trials (Efron & Tibshirani 1993).

    Each replicate resamples the (x, y) pairs with replacement, from ``numpy.random.default_rng(seed)``, so the
    result is deterministic. Returns two arrays of shape ``(replicates,)``: the ln(peak LR) optima, NaN where a
    replicate has no interior optimum (fewer than 3 distinct LRs, or a ≤ 0), and whether a replicate held fewer than
    3 distinct LRs.
    """
    x, y = np.asarray(log_lr, dtype=float), np.asarray(loss, dtype=float)
    rng = np.random.default_rng(seed)
    out = np.full(replicates, math.nan)
    few = np.zeros(replicates, dtype=bool)
    draws = rng.integers(0, len(x), size=(replicates, len(x)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", np.exceptions.RankWarning)  # near-collinear resamples: judged by a below
        for r, idx in enumerate(draws):
            if len(np.unique(x[idx])) < MIN_DISTINCT_LRS:
                few[r] = True
                continue
            a, b, _ = np.polyfit(x[idx], y[idx], 2)
            out[r] = optimum_log_lr(float(a), float(b))
    return out, few


def percentile_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """The (1 − confidence)/2 and (1 + confidence)/2 percentiles of the finite ``values``; NaNs when none."""
    finite = values[np.isfinite(values)]
    if not len(finite):
        return math.nan, math.nan
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(finite, [tail, 100.0 - tail])
    return float(low), float(high)


def bootstrap_minima(log_lr: np.ndarray, loss: np.ndarray, *, replicates: int, seed: int | list[int],
                     degree: int = LOSS_MINIMUM_DEGREE) -> np.ndarray:
    """x* of ``replicates`` nonparametric bootstrap refits over trials (Efron & Tibshirani 1993, ch. 9: resampling
    pairs) of the least-squares polynomial of ``degree`` (a cubic by default), each minimised on
    ``BOOTSTRAP_GRID_POINTS`` over its own tried range, as ``evals.stats.loss_minimum_ci`` does for the data.

    ``log_lr``, ``loss``: shape (n,), ln(peak LR) and held-out loss (nats/token). The resamples are drawn from
    ``numpy.random.default_rng(seed)``, so the result is deterministic.

    Returns:
        shape ``(replicates,)``: the ln(peak LR) minima, NaN where a replicate holds fewer than degree + 1 distinct
        LRs (no fit) or its minimum sits on an edge of its range (no interior minimum).

    Raises:
        DataError: shapes differ or a value is not finite.
    """
    x, y = np.asarray(log_lr, dtype=float), np.asarray(loss, dtype=float)
    if x.ndim != 1 or x.shape != y.shape or not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise DataError(f"a bootstrap of the LR minimum needs finite x and y of one (n,) shape, got {x.shape} and "
                        f"{y.shape}")
    out = np.full(replicates, math.nan)
    if replicates < 1 or not len(x):
        return out
    draws = np.random.default_rng(seed).integers(0, len(x), size=(replicates, len(x)))
    # Centring and scaling x only conditions the normal equations; the minimiser does not depend on it.
    centre, scale = float(x.mean()), float(np.ptp(x)) / 2.0 or 1.0
    u, v = (x[draws] - centre) / scale, y[draws]  # (replicates, n)
    ordered = np.sort(u, axis=1)
    ok = 1 + (np.diff(ordered, axis=1) > 0).sum(axis=1) >= degree + 1
    design = u[..., None] ** np.arange(degree + 1)  # (replicates, n, degree + 1)
    gram = np.einsum("rni,rnj->rij", design, design)
    rhs = np.einsum("rni,rn->ri", design, v)
    gram[~ok], rhs[~ok] = np.eye(degree + 1), 0.0  # left out below; the identity keeps the batch solvable
    beta = np.linalg.solve(gram, rhs[..., None])[..., 0]  # (replicates, degree + 1)
    grid = ordered[:, :1] + (ordered[:, -1:] - ordered[:, :1]) * np.linspace(0.0, 1.0, BOOTSTRAP_GRID_POINTS)
    values = np.zeros_like(grid)
    for k in range(degree, -1, -1):  # Horner
        values = values * grid + beta[:, k:k + 1]
    best = values.argmin(axis=1)
    interior = ok & (best > 0) & (best < BOOTSTRAP_GRID_POINTS - 1)
    out[interior] = centre + scale * grid[interior, best[interior]]
    return out


@dataclass(frozen=True)
class LrFit:
    """The cubic fit of one width's sweep and the confidence set of its minimum.

    Attributes:
        n_trials: COMPLETE trials fitted; ``n_lrs`` their distinct LRs; ``n_pruned`` PRUNED trials left out.
        coefficients: (c0, c1, c2, c3) of y = Σ c_k x^k, x = ln(peak LR), y in nats/token; empty when there are
            too few trials to fit a cubic (``reason`` says so).
        optimum: exp(x*), the peak LR at the cubic's minimum over the tried LRs (NaN: no fit, or the minimum sits
            on an edge of the tried range).
        low, high: the ``confidence`` Fieller set of the minimum in peak LR (``evals.stats.loss_minimum_ci``);
            NaN unless ``bounded``.
        bounded: the set is a finite range inside the tried LRs, i.e. the minimum is resolved.
        edge: ``lowest`` or ``highest`` when the fitted minimum sits on that edge of the tried LRs, else "".
        reason: why ``optimum`` or ``low``/``high`` are missing ("" when the minimum is resolved).
        confidence: of the set, in (0, 1).
        lr_min, lr_max: the searched range; ``tried_low``, ``tried_high`` the lowest and highest COMPLETE LR.
        loss_range: max − min held-out loss over the COMPLETE trials (nats/token).
        best_trial_lr, best_trial_value: the COMPLETE trial with the lowest held-out loss (peak LR, nats/token).
        replicates: bootstrap replicates behind ``log_optima``.
        log_optima: ln(peak LR) minimum per bootstrap replicate (``bootstrap_minima``; NaN where none), shape
            ``(replicates,)``: only the width exponent uses them; not serialised.
    """

    n_trials: int
    n_lrs: int
    n_pruned: int
    coefficients: tuple[float, ...]
    optimum: float
    low: float
    high: float
    bounded: bool
    edge: str
    reason: str
    confidence: float
    lr_min: float
    lr_max: float
    tried_low: float
    tried_high: float
    loss_range: float
    best_trial_lr: float
    best_trial_value: float
    replicates: int
    log_optima: np.ndarray = field(repr=False, compare=False, default_factory=lambda: np.empty(0))

    @property
    def fitted(self) -> bool:
        return bool(self.coefficients)

    @property
    def has_minimum(self) -> bool:
        """The cubic has its minimum inside the tried LRs (resolved or not)."""
        return math.isfinite(self.optimum)

    @property
    def ratio(self) -> float:
        """high / low of the interval (NaN: none)."""
        return self.high / self.low if self.bounded and self.low > 0 else math.nan

    def curve(self, lrs: np.ndarray) -> np.ndarray:
        """The fitted loss (nats/token) at peak LRs ``lrs`` (any shape; NaN where there is no fit)."""
        x = np.log(np.asarray(lrs, dtype=float))
        if not self.fitted:
            return np.full(x.shape, math.nan)
        return np.polynomial.polynomial.polyval(x, self.coefficients)

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe: non-finite numbers are None, and ``reason`` says why they are missing."""
        out = asdict(self)
        out.pop("log_optima")
        out["coefficients"] = list(self.coefficients)
        out["ratio"] = self.ratio
        out["interval"] = [self.low, self.high]
        out["method"] = METHOD
        return {k: ([_finite(x) for x in v] if isinstance(v, list) else _finite(v)) for k, v in out.items()}


def _finite(value: Any) -> Any:
    """NaN and infinities as None (JSON null)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def fit_lr(trials: pd.DataFrame, *, lr_min: float, lr_max: float, confidence: float, seed: int | list[int],
           replicates: int = N_BOOTSTRAP) -> LrFit:
    """The cubic fit of held-out loss against ln(peak LR) over the COMPLETE ``trials``, the Fieller set of its
    minimum (``evals.stats.loss_minimum_ci``) and, for the width exponent, its bootstrap minima.

    Args:
        trials: one row per trial with ``state``, ``peak_lr`` and ``value`` (final held-out loss, nats/token).
        lr_min, lr_max: the searched range (peak LR).
        confidence: of the Fieller set, in (0, 1).
        seed: of the bootstrap (an int or a list of ints for ``numpy.random.default_rng``).
        replicates: bootstrap replicates (``bootstrap_minima``); 0 skips the bootstrap.

    Raises:
        DataError: no COMPLETE trial, or a COMPLETE trial with a non-finite or non-positive LR or a non-finite loss.
        ConfigError: ``confidence`` outside (0, 1).
    """
    done = trials[trials["state"] == "COMPLETE"]
    if done.empty:
        raise DataError("the LR fit needs at least one COMPLETE trial; got none (see the trials' fail_reason)")
    lrs, losses = done["peak_lr"].to_numpy(dtype=float), done["value"].to_numpy(dtype=float)
    if not (np.isfinite(lrs).all() and (lrs > 0).all() and np.isfinite(losses).all()):
        raise DataError("a COMPLETE sweep trial has a non-positive peak LR or a non-finite held-out loss")
    if not 0.0 < confidence < 1.0:
        raise ConfigError(f"confidence = {confidence}: must lie in (0, 1), e.g. 0.95")
    x = np.log(lrs)
    best = int(np.argmin(losses))
    n_lrs = int(len(np.unique(x)))
    coefficients: tuple[float, ...] = ()
    optimum = low = high = math.nan
    bounded, edge = False, ""
    log_optima = np.full(replicates, math.nan)
    if len(x) < CUBIC_MIN_TRIALS or n_lrs < CUBIC_DISTINCT_LRS:
        reason = (f"no cubic fit: it needs >= {CUBIC_MIN_TRIALS} COMPLETE trials at >= {CUBIC_DISTINCT_LRS} "
                  f"distinct LRs, got {len(x)} at {n_lrs}")
    else:
        ci = loss_minimum_ci(x, losses, confidence)
        coefficients, bounded = ci.coefficients, ci.bounded
        if math.isfinite(ci.optimum):
            optimum = math.exp(ci.optimum)
        if bounded:
            low, high, reason = math.exp(ci.low), math.exp(ci.high), ""
        elif not math.isfinite(ci.optimum):
            ends = np.polynomial.polynomial.polyval(np.array([x.min(), x.max()]), coefficients)
            edge = "lowest" if ends[0] <= ends[1] else "highest"
            reason = (f"no interior minimum: the fitted cubic is lowest at the {edge} tried LR "
                      f"{(lrs.min() if edge == 'lowest' else lrs.max()):.3e}")
        else:
            reason = (f"minimum not resolved: the {confidence:.0%} confidence set of the cubic's zero-slope point is "
                      "not a finite range inside the tried LRs")
        log_optima = bootstrap_minima(x, losses, replicates=replicates, seed=seed)
    return LrFit(n_trials=len(done), n_lrs=n_lrs, n_pruned=int((trials["state"] == "PRUNED").sum()),
                 coefficients=coefficients, optimum=optimum, low=low, high=high, bounded=bounded, edge=edge,
                 reason=reason, confidence=confidence, lr_min=lr_min, lr_max=lr_max, tried_low=float(lrs.min()),
                 tried_high=float(lrs.max()), loss_range=float(losses.max() - losses.min()),
                 best_trial_lr=float(lrs[best]), best_trial_value=float(losses[best]), replicates=replicates,
                 log_optima=log_optima)


@dataclass(frozen=True)
class LrRule:
    """The declared rule for the peak LR (docs/methods.md §14).

    Attributes:
        factor: decided only when the interval's high/low ≤ factor (> 1).
        confidence: of the Fieller set, in (0, 1).
        min_fit_trials: COMPLETE trials needed before the fit may decide, ≥ ``MIN_UNITS["trials"]`` (10): the
            fewest from which the simulated coverage of the set stayed within [0.93, 0.99] (docs/methods.md §16).

    Raises:
        ConfigError: a field out of range, naming it.
    """

    factor: float
    confidence: float
    min_fit_trials: int = MIN_UNITS["trials"]

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor > 1.0):
            raise ConfigError(f"factor = {self.factor}: must be > 1 (a high/low ratio)")
        if not 0.0 < self.confidence < 1.0:
            raise ConfigError(f"confidence = {self.confidence}: must lie in (0, 1), e.g. 0.95")
        if self.min_fit_trials < MIN_UNITS["trials"]:
            raise ConfigError(min_trials_error("min_fit_trials", self.min_fit_trials))

    def text(self, lr_min: float, lr_max: float) -> str:
        return (f"peak LR = the minimum over the tried LRs of a cubic in ln(peak LR) fitted by least squares to the "
                f"COMPLETE trials' held-out loss, its {self.confidence:.0%} interval the generalised Fieller "
                f"confidence set of the cubic's zero-slope point (Fieller 1954); decided when ≥ "
                f"{self.min_fit_trials} COMPLETE trials (the minimum is {MIN_UNITS['trials']}: the fewest from "
                f"which the set's simulated coverage stayed within [0.93, 0.99], docs/methods.md §16), the set is a "
                f"bounded range inside the tried LRs (searched: [{lr_min:.2e}, {lr_max:.2e}]) and its high/low ≤ "
                f"{self.factor:g}; otherwise the best COMPLETE trial's LR")

    def config(self, lr_min: float, lr_max: float) -> dict[str, Any]:
        return {**asdict(self), "lr_min": lr_min, "lr_max": lr_max, "model": "cubic in ln(peak LR)",
                "degree": LOSS_MINIMUM_DEGREE, "interval": "generalised Fieller set of the zero-slope point",
                "min_trials": MIN_UNITS["trials"]}


def min_trials_error(name: str, value: int) -> str:
    """The ConfigError text for a ``min_fit_trials`` below ``MIN_UNITS["trials"]`` (field ``name``)."""
    return (f"{name} = {value}: must be ≥ {MIN_UNITS['trials']}, the fewest COMPLETE trials from which the "
            "simulated coverage of the LR optimum's interval stayed within [0.93, 0.99] (docs/methods.md §16)")


@dataclass(frozen=True)
class LrJudgement:
    """The outcome of the rule on one fit: the verdict, the LR the platform goes on with and why (``source``:
    ``fit`` or ``best trial``), the fallback and what would resolve an undetermined verdict."""

    verdict: str
    lr: float
    source: str
    fallback: str = ""
    resolve: str = ""


def _trials_needed(n: int, ratio: float, factor: float) -> int:
    """Extra trials for the interval's high/low to reach ``factor``: the standard error of the minimum shrinks as
    1/√n, so ln(ratio) shrinks to ln(factor) at n·(ln ratio / ln factor)² trials (an estimate, at least 1)."""
    if not (math.isfinite(ratio) and ratio > 1.0):
        return max(1, n)
    return max(1, math.ceil(n * ((math.log(ratio) / math.log(factor)) ** 2 - 1.0)))


def judge(fit: LrFit, rule: LrRule) -> LrJudgement:
    """Apply ``rule`` to ``fit`` (docs/methods.md §14): decided → the fitted optimum (clipped to the searched
    range); undetermined → the best COMPLETE trial's LR, with what would settle it. Undetermined when fewer than
    ``rule.min_fit_trials`` COMPLETE trials (the reason from ``evals.stats.units_shortfall``), when the Fieller set
    is unbounded (the minimum is not resolved), or when it spans more than ``rule.factor``.

    Raises:
        ConfigError: ``fit`` was computed at another confidence than the rule's.
    """
    if not math.isclose(fit.confidence, rule.confidence):
        raise ConfigError(f"the LR fit's interval is at confidence {fit.confidence}, the rule's at {rule.confidence}: "
                          "fit at the rule's confidence")
    fallback = (f"fall back to the best COMPLETE trial's LR {fit.best_trial_lr:.3e} "
                f"(held-out {fit.best_trial_value:.4f} nats/token)")
    lo, hi = fit.lr_min, fit.lr_max

    def undetermined(resolve: str) -> LrJudgement:
        return LrJudgement("undetermined", fit.best_trial_lr, "best trial", fallback, resolve)

    if fit.n_trials < rule.min_fit_trials:
        pruned = (f"; the {fit.n_pruned} pruned trials do not count (raise sweep.pruner_startup_trials or "
                  "sweep.pruner_warmup_steps to prune fewer)" if fit.n_pruned else "")
        fix = (f"raise sweep.n_trials so that ≥ {rule.min_fit_trials - fit.n_trials} more trials complete, between "
               f"{lo:.2e} and {hi:.2e}{pruned}{_edge_hint(fit) if fit.n_lrs > 1 else ''}")
        return undetermined(units_shortfall("trials", fit.n_trials, fix)
                            or f"needs >= {rule.min_fit_trials} trials (sweep.min_fit_trials), has {fit.n_trials}: "
                               f"{fix}")
    if not fit.fitted:  # enough trials, too few distinct LRs (repeated grid points)
        return undetermined(f"add trials at new LRs between {lo:.2e} and {hi:.2e}: the cubic needs COMPLETE trials "
                            f"at ≥ {CUBIC_DISTINCT_LRS} distinct LRs, the {fit.n_trials} have {fit.n_lrs}")
    if fit.edge == "lowest":
        beyond = (f"lower sweep.lr_min below {lo:.2e}" if fit.tried_low <= lo * 1.05 else
                  f"add trials between {lo:.2e} and {fit.tried_low:.2e}")
        return undetermined(f"the minimum is not resolved: the fitted cubic is lowest at the lowest tried LR "
                            f"{fit.tried_low:.2e}, so the optimum may lie below it; {beyond}")
    if fit.edge == "highest":
        beyond = (f"widen sweep.lr_max beyond {hi:.2e}" if fit.tried_high >= hi * 0.95 else
                  f"add trials between {fit.tried_high:.2e} and {hi:.2e}")
        return undetermined(f"the minimum is not resolved: the fitted cubic is lowest at the highest tried LR "
                            f"{fit.tried_high:.2e}, so the optimum may lie above it; {beyond}")
    if not fit.bounded:
        spread = 3.0 * rule.factor
        near_lo, near_hi = max(lo, fit.best_trial_lr / spread), min(hi, fit.best_trial_lr * spread)
        return undetermined(
            f"the minimum is not resolved: the {rule.confidence:.0%} confidence set of the fitted cubic's zero-slope "
            f"point is not a finite range inside the tried LRs [{fit.tried_low:.2e}, {fit.tried_high:.2e}] (the "
            f"loss varies by {fit.loss_range:.3g} nats over them: flat, or its slope lost in the noise); add trials "
            f"around the best COMPLETE trial's LR {fit.best_trial_lr:.2e}, between {near_lo:.2e} and "
            f"{near_hi:.2e}, where the loss should rise on both sides{_edge_hint(fit)}")
    ratio = fit.ratio
    if not ratio <= rule.factor:
        k = _trials_needed(fit.n_trials, ratio, rule.factor)
        span_lo, span_hi = _around(fit, rule.factor)
        return undetermined(
            f"add ≥ {k} trials between {span_lo:.2e} and {span_hi:.2e}, around the interval (the count is estimated "
            "from the 1/√n narrowing of the interval; the basin's walls fix the curvature, trials inside the "
            f"interval alone barely narrow it): the {rule.confidence:.0%} interval [{fit.low:.2e}, {fit.high:.2e}] "
            f"spans a factor {ratio:.3g} > {rule.factor:g}")
    return LrJudgement("decided", float(np.clip(fit.optimum, lo, hi)), "fit")


def _around(fit: LrFit, factor: float) -> tuple[float, float]:
    """Where added trials narrow the interval: the interval widened on each side by 3·max(its high/low, factor),
    within the searched range (all of it when there is no interval). Measured on synthetic basins: the same
    number of trials spread this wide narrows the interval far more than trials inside it."""
    if not fit.bounded:
        return fit.lr_min, fit.lr_max
    spread = 3.0 * max(fit.ratio, factor)
    return max(fit.lr_min, fit.low / spread), min(fit.lr_max, fit.high * spread)


def _edge_hint(fit: LrFit) -> str:
    """When the lowest loss sits at the top or bottom of the tried LRs, the optimum may lie beyond them."""
    if fit.best_trial_lr >= fit.tried_high:
        return (f"; the lowest loss is at the highest tried LR, so the optimum may lie above it: widen lr_max beyond "
                f"{fit.lr_max:.2e}" if fit.tried_high >= fit.lr_max * 0.95 else
                f"; the lowest loss is at the highest tried LR {fit.tried_high:.2e}")
    if fit.best_trial_lr <= fit.tried_low:
        return (f"; the lowest loss is at the lowest tried LR, so the optimum may lie below it: lower lr_min below "
                f"{fit.lr_min:.2e}" if fit.tried_low <= fit.lr_min * 1.05 else
                f"; the lowest loss is at the lowest tried LR {fit.tried_low:.2e}")
    return ""


def width_exponent(fits: dict[int, LrFit], confidence: float) -> dict[str, Any]:
    """The exponent b of lr* ∝ d_model^b: the least-squares slope of ln lr* on ln d_model over the widths' fitted
    optima, with a percentile bootstrap interval (docs/methods.md §5, §14).

    Replicate r regresses replicate r of every width's bootstrap minima (``bootstrap_minima``: trials resampled
    within each width, independently across widths, the cubic refitted); replicates where any width lacks an
    interior minimum are left out. Needs ≥ 3 widths whose minimum is resolved (a bounded Fieller set from
    ≥ ``MIN_UNITS["trials"]`` COMPLETE trials); otherwise ``exponent`` is None with a ``reason`` (two points always
    lie on a line, so their slope has no error to show).

    Returns:
        ``widths``, ``optima`` (fitted peak LR per width, None where none), ``exponent``, ``low``, ``high``,
        ``ok_share``, ``confidence``, ``reason``.
    """
    widths = sorted(fits)
    need = MIN_UNITS["trials"]
    why = {w: (f"{fits[w].n_trials} COMPLETE trials, needs >= {need}" if fits[w].n_trials < need else
               "" if fits[w].bounded else "minimum not resolved") for w in widths}
    usable = [w for w in widths if not why[w]]
    out: dict[str, Any] = {"widths": widths, "optima": [_finite(fits[w].optimum) for w in widths],
                           "exponent": None, "low": None, "high": None, "ok_share": None, "confidence": confidence,
                           "reason": ""}
    if len(widths) < 3 or len(usable) < len(widths):
        missing = [f"d{w}: {why[w]}" for w in widths if w not in usable]
        out["reason"] = (f"needs ≥ 3 widths with a resolved optimum; got {len(usable)}"
                         + (f" ({'; '.join(missing)})" if missing else ""))
        return out
    ln_d = np.log(np.asarray(widths, dtype=float))
    slope = float(np.polyfit(ln_d, [math.log(fits[w].optimum) for w in widths], 1)[0])
    optima = np.vstack([fits[w].log_optima for w in widths])  # (widths, replicates)
    ok = np.isfinite(optima).all(axis=0)
    slopes = np.full(optima.shape[1], math.nan)
    if ok.any():
        # Least-squares slope of every replicate at once: Σ(x − x̄)(y − ȳ) / Σ(x − x̄)².
        centred = ln_d - ln_d.mean()
        slopes[ok] = centred @ (optima[:, ok] - optima[:, ok].mean(axis=0)) / (centred @ centred)
    low, high = percentile_interval(slopes, confidence)
    if math.isfinite(low):
        low, high = min(low, slope), max(high, slope)
    out.update(exponent=slope, low=None if math.isnan(low) else low, high=None if math.isnan(high) else high,
               ok_share=float(ok.mean()) if ok.size else 0.0)
    return out


def exponent_verdict(drift: dict[str, Any], confidence: float) -> tuple[str, str]:
    """(verdict, resolve) of the width exponent: decided when ≥ ``confidence`` of the replicates give a slope and
    its interval excludes 0, i.e. the LR optimum moves with width. An interval containing 0 is undetermined: it does
    not show that the LR transfers, only that these widths do not tell."""
    if drift["exponent"] is None:
        return "undetermined", f"sweep ≥ 3 widths (sweep.widths) with a resolved optimum each: {drift['reason']}"
    if drift["ok_share"] < confidence:
        return "undetermined", (f"only {drift['ok_share']:.0%} of the bootstrap replicates give every width a "
                                "minimum: add trials per width around each optimum")
    if drift["low"] <= 0.0 <= drift["high"]:
        return "undetermined", (f"the {confidence:.0%} interval [{drift['low']:+.2f}, {drift['high']:+.2f}] contains 0:"
                                f" add trials per width near each optimum, or widths beyond d{drift['widths'][0]}–"
                                f"d{drift['widths'][-1]}, to narrow it")
    return "decided", ""
