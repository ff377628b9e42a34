"""The peak LR with an interval: a quadratic in ln(peak LR) fitted to the sweep's held-out losses and bootstrapped
over trials, the declared rule that decides it, and the exponent of the LR optimum across widths
(docs/methods.md §14, §6).

Near its minimum the held-out loss of a short proxy run is close to a parabola in x = ln(peak LR): the LR
sensitivity curves of Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training
instabilities") and the optimal-LR fits of Bi et al. 2024 (DeepSeek LLM) use this local model. The fit is
y = a·x² + b·x + c over the COMPLETE trials (y in nats/token), with optimum x* = −b/(2a) when a > 0. Its interval
is a nonparametric bootstrap over trials (Efron & Tibshirani 1993, ch. 9: resampling pairs; ch. 13: percentile
intervals): resample the COMPLETE trials with replacement, refit, take x*; a replicate with fewer than 3 distinct
LRs or a ≤ 0 has no interior optimum. The percentile interval is taken over the replicates that have one (extended
to contain the full-data optimum in the rare case it falls outside), and the rule separately asks that most
replicates have one. Pruned trials are left out: their final loss was never measured, and their last intermediate
loss belongs to a shorter run.

    fit = fit_lr(trials, lr_min=1e-4, lr_max=1e-2, confidence=0.95, seed=0)
    judged = judge(fit, LrRule(factor=3.0, confidence=0.95, min_fit_trials=4))
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from infra.errors import DataError

N_BOOTSTRAP = 2000  # replicates per width: the 2.5% and 97.5% percentiles rest on 50 replicates each
MIN_DISTINCT_LRS = 3  # three coefficients


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
    """x* of ``replicates`` nonparametric bootstrap refits over trials (Efron & Tibshirani 1993).

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


def few_lrs_probability(n: int) -> float:
    """Probability that a resample of ``n`` trials at distinct LRs holds fewer than 3 distinct LRs:
    (n + C(n, 2)·(2ⁿ − 2)) / nⁿ (one LR, or exactly two)."""
    return (n + math.comb(n, 2) * (2 ** n - 2)) / n ** n if n >= 1 else 1.0


def percentile_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """The (1 − confidence)/2 and (1 + confidence)/2 percentiles of the finite ``values``; NaNs when none."""
    finite = values[np.isfinite(values)]
    if not len(finite):
        return math.nan, math.nan
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(finite, [tail, 100.0 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class LrFit:
    """The quadratic fit of one width's sweep and its bootstrap.

    Attributes:
        n_trials: COMPLETE trials fitted; ``n_lrs`` their distinct LRs; ``n_pruned`` PRUNED trials left out.
        a, b, c: coefficients of y = a·x² + b·x + c, x = ln(peak LR), y in nats/token (NaN: no fit).
        optimum: exp(x*), the fitted peak LR (NaN: no fit or a ≤ 0); may lie outside the searched range.
        low, high: the percentile interval of the bootstrap optima at ``confidence`` (peak LR), extended to
            contain ``optimum`` should it fall outside (NaN: no replicate has an interior optimum, or only three
            trials, which the parabola interpolates exactly).
        ok_share: share of the ``replicates`` with an interior optimum; ``few_lrs_share`` the share that held
            fewer than 3 distinct LRs (1.0 when no bootstrap was run).
        lr_min, lr_max: the searched range; ``tried_low``, ``tried_high`` the lowest and highest COMPLETE LR.
        loss_range: max − min held-out loss over the COMPLETE trials (nats/token).
        best_trial_lr, best_trial_value: the COMPLETE trial with the lowest held-out loss.
        log_optima: ln(peak LR) optimum per replicate (NaN where none), shape ``(replicates,)``; not serialised.
    """

    n_trials: int
    n_lrs: int
    n_pruned: int
    a: float
    b: float
    c: float
    optimum: float
    low: float
    high: float
    ok_share: float
    few_lrs_share: float
    replicates: int
    confidence: float
    lr_min: float
    lr_max: float
    tried_low: float
    tried_high: float
    loss_range: float
    best_trial_lr: float
    best_trial_value: float
    log_optima: np.ndarray = field(repr=False, compare=False, default_factory=lambda: np.empty(0))

    @property
    def fitted(self) -> bool:
        return math.isfinite(self.a)

    @property
    def has_minimum(self) -> bool:
        return self.fitted and self.a > 0

    @property
    def inside(self) -> bool:
        """The fitted optimum lies in [lr_min, lr_max]."""
        return self.has_minimum and self.lr_min <= self.optimum <= self.lr_max

    @property
    def ratio(self) -> float:
        """high / low of the interval (NaN: none)."""
        return self.high / self.low if self.low > 0 and math.isfinite(self.high) else math.nan

    def curve(self, lrs: np.ndarray) -> np.ndarray:
        """The fitted loss (nats/token) at peak LRs ``lrs``."""
        x = np.log(np.asarray(lrs, dtype=float))
        return self.a * x * x + self.b * x + self.c

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("log_optima")
        out["ratio"] = self.ratio
        out["interval"] = [self.low, self.high]
        return {k: ([_finite(x) for x in v] if isinstance(v, list) else _finite(v)) for k, v in out.items()}


def _finite(value: Any) -> Any:
    """NaN and infinities as None (JSON null)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def fit_lr(trials: pd.DataFrame, *, lr_min: float, lr_max: float, confidence: float, seed: int | list[int],
           replicates: int = N_BOOTSTRAP) -> LrFit:
    """The quadratic fit of held-out loss against ln(peak LR) over the COMPLETE ``trials`` and its bootstrap.

    Args:
        trials: one row per trial with ``state``, ``peak_lr`` and ``value`` (final held-out loss, nats/token).
        lr_min, lr_max: the searched range (peak LR).
        confidence: of the percentile interval, in (0, 1).
        seed: of the bootstrap (an int or a list of ints for ``numpy.random.default_rng``).

    Raises:
        DataError: no COMPLETE trial, or a COMPLETE trial with a non-finite or non-positive LR or a non-finite loss.
    """
    done = trials[trials["state"] == "COMPLETE"]
    if done.empty:
        raise DataError("the LR fit needs at least one COMPLETE trial; got none (see the trials' fail_reason)")
    lrs, losses = done["peak_lr"].to_numpy(dtype=float), done["value"].to_numpy(dtype=float)
    if not (np.isfinite(lrs).all() and (lrs > 0).all() and np.isfinite(losses).all()):
        raise DataError("a COMPLETE sweep trial has a non-positive peak LR or a non-finite held-out loss")
    x = np.log(lrs)
    best = int(np.argmin(losses))
    a = b = c = optimum = low = high = math.nan
    log_optima = np.full(replicates, math.nan)
    few = np.ones(replicates, dtype=bool)
    if len(np.unique(x)) >= MIN_DISTINCT_LRS:
        a, b, c = quadratic_fit(x, losses)
        # Three points are interpolated exactly: every usable resample is the same three, so no interval.
        if len(x) > MIN_DISTINCT_LRS:
            log_optima, few = bootstrap_optima(x, losses, replicates=replicates, seed=seed)
        x_opt = optimum_log_lr(a, b)
        x_low, x_high = percentile_interval(log_optima, confidence)
        if math.isfinite(x_opt):
            optimum = math.exp(min(x_opt, 700.0))
            if math.isfinite(x_low):
                x_low, x_high = min(x_low, x_opt), max(x_high, x_opt)
        low, high = (math.exp(min(v, 700.0)) if math.isfinite(v) else math.nan for v in (x_low, x_high))
    return LrFit(n_trials=len(done), n_lrs=int(len(np.unique(x))), n_pruned=int((trials["state"] == "PRUNED").sum()),
                 a=a, b=b, c=c, optimum=optimum, low=low, high=high,
                 ok_share=float(np.isfinite(log_optima).mean()) if replicates else 0.0,
                 few_lrs_share=float(few.mean()) if replicates else 1.0, replicates=replicates,
                 confidence=confidence, lr_min=lr_min, lr_max=lr_max, tried_low=float(lrs.min()),
                 tried_high=float(lrs.max()), loss_range=float(losses.max() - losses.min()),
                 best_trial_lr=float(lrs[best]), best_trial_value=float(losses[best]), log_optima=log_optima)


@dataclass(frozen=True)
class LrRule:
    """The declared rule for the peak LR.

    Attributes:
        factor: decided only when the interval's high/low ≤ factor (> 1).
        confidence: of the interval, and the share of bootstrap replicates that must have an interior optimum.
        min_fit_trials: COMPLETE trials needed before the fit may decide (≥ 4: three are fitted exactly).
        replicates: bootstrap replicates.
    """

    factor: float
    confidence: float
    min_fit_trials: int
    replicates: int = N_BOOTSTRAP

    def text(self, lr_min: float, lr_max: float) -> str:
        return (f"peak LR = the minimum of a quadratic in ln(peak LR) fitted to the COMPLETE trials' held-out loss, "
                f"when ≥ {self.min_fit_trials} COMPLETE trials, the fit has a minimum (a > 0) inside "
                f"[{lr_min:.2e}, {lr_max:.2e}], ≥ {self.confidence:.0%} of {self.replicates} bootstrap replicates "
                f"have one, and the {self.confidence:.0%} percentile interval's high/low ≤ {self.factor:g}; "
                f"otherwise the best COMPLETE trial's LR")

    def config(self, lr_min: float, lr_max: float) -> dict[str, Any]:
        return {**asdict(self), "lr_min": lr_min, "lr_max": lr_max, "model": "quadratic in ln(peak LR)",
                "interval": "bootstrap percentile over COMPLETE trials"}


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
    """Extra trials for the interval's high/low to reach ``factor``: a bootstrap interval narrows as 1/√n, so
    ln(ratio) shrinks to ln(factor) at n·(ln ratio / ln factor)² trials (an estimate, at least 1)."""
    if not (math.isfinite(ratio) and ratio > 1.0):
        return max(1, n)
    return max(1, math.ceil(n * ((math.log(ratio) / math.log(factor)) ** 2 - 1.0)))


def judge(fit: LrFit, rule: LrRule) -> LrJudgement:
    """Apply ``rule`` to ``fit`` (docs/methods.md §14): decided → the fitted optimum (clipped to the searched
    range); undetermined → the best COMPLETE trial's LR, with what would settle it."""
    fallback = (f"fall back to the best COMPLETE trial's LR {fit.best_trial_lr:.3e} "
                f"(held-out {fit.best_trial_value:.4f} nats/token)")
    lo, hi = fit.lr_min, fit.lr_max

    def undetermined(resolve: str) -> LrJudgement:
        return LrJudgement("undetermined", fit.best_trial_lr, "best trial", fallback, resolve)

    if fit.n_lrs < MIN_DISTINCT_LRS or fit.n_trials < rule.min_fit_trials:
        # The bootstrap also needs enough distinct LRs that few resamples hold fewer than 3 of them.
        decidable = next(n for n in range(MIN_DISTINCT_LRS, 100) if few_lrs_probability(n) <= 1.0 - rule.confidence)
        needed = max(rule.min_fit_trials, decidable)
        k = max(needed - fit.n_trials, MIN_DISTINCT_LRS - fit.n_lrs, 1)
        pruned = (f"; the {fit.n_pruned} pruned trials do not count (raise sweep.pruner_startup_trials or "
                  "sweep.pruner_warmup_steps to prune fewer)" if fit.n_pruned else "")
        return undetermined(f"add ≥ {k} trials between {lo:.2e} and {hi:.2e} (raise sweep.n_trials): "
                            f"{fit.n_trials} COMPLETE trials at {fit.n_lrs} distinct LRs; the rule needs "
                            f"≥ {rule.min_fit_trials} to fit and ≥ {decidable} at distinct LRs to decide at "
                            f"{rule.confidence:.0%}{pruned}{_edge_hint(fit) if fit.n_lrs >= MIN_DISTINCT_LRS else ''}")
    if not fit.has_minimum:
        edge = _edge_hint(fit)
        return undetermined(f"the landscape is flat over [{fit.tried_low:.2e}, {fit.tried_high:.2e}]: the loss varies "
                            f"by only {fit.loss_range:.3g} nats and the fitted curve has no minimum "
                            f"(a = {fit.a:.3g} ≤ 0); add trials below {fit.tried_low:.2e} or above "
                            f"{fit.tried_high:.2e} to find where it rises{edge}")
    if fit.optimum > hi:
        return undetermined(f"widen lr_max beyond {hi:.2e}: the fitted optimum {fit.optimum:.2e} lies above the "
                            "searched range")
    if fit.optimum < lo:
        return undetermined(f"lower lr_min below {lo:.2e}: the fitted optimum {fit.optimum:.2e} lies below the "
                            "searched range")
    ratio = fit.ratio
    if fit.ok_share < rule.confidence or not ratio <= rule.factor:
        k = _trials_needed(fit.n_trials, ratio, rule.factor)
        span_lo, span_hi = _around(fit, rule.factor)
        more = (f"≥ {k} trials between {span_lo:.2e} and {span_hi:.2e}, around the interval (the count is estimated "
                "from the 1/√n narrowing of the interval; the basin's walls fix the curvature, trials inside the "
                "interval alone barely narrow it)")
        past = ""
        if math.isfinite(fit.high) and fit.high > hi:
            past += f"; widen lr_max beyond {hi:.2e} (the interval reaches past it)"
        if math.isfinite(fit.low) and fit.low < lo:
            past += f"; lower lr_min below {lo:.2e} (the interval reaches past it)"
        if fit.few_lrs_share > 1.0 - rule.confidence:  # too few trials for the resamples to hold 3 distinct LRs
            need = next(n for n in range(fit.n_lrs, 10 * fit.n_lrs + 10)
                        if few_lrs_probability(n) <= 1.0 - rule.confidence)
            return undetermined(
                f"add ≥ {max(1, need - fit.n_lrs)} trials at new LRs between {span_lo:.2e} and {span_hi:.2e}: with "
                f"{fit.n_trials} COMPLETE trials {fit.few_lrs_share:.0%} of the bootstrap resamples hold fewer than 3 "
                f"distinct LRs and cannot be fitted, more than the {1.0 - rule.confidence:.0%} the rule allows "
                f"({need} trials at distinct LRs are needed for that){past}")
        if fit.ok_share < rule.confidence:  # the curvature itself is not established: flat within the noise
            return undetermined(
                f"the landscape is flat over [{fit.tried_low:.2e}, {fit.tried_high:.2e}] within the noise: the loss "
                f"varies by only {fit.loss_range:.3g} nats and only {fit.ok_share:.0%} of the bootstrap replicates "
                f"have a minimum (the rule needs {rule.confidence:.0%}); add trials below {fit.tried_low:.2e} or above "
                f"{fit.tried_high:.2e} where the loss should rise, or add {more}{past}")
        return undetermined(f"add {more}: the {rule.confidence:.0%} interval [{fit.low:.2e}, {fit.high:.2e}] spans a "
                            f"factor {ratio:.3g} > {rule.factor:g}{past}")
    return LrJudgement("decided", float(np.clip(fit.optimum, lo, hi)), "fit")


def _around(fit: LrFit, factor: float) -> tuple[float, float]:
    """Where added trials narrow the interval: the interval widened on each side by 3·max(its high/low, factor),
    within the searched range (all of it when there is no interval). Measured on synthetic parabolas: the same
    number of trials spread this wide narrows the interval far more than trials inside it."""
    if not (math.isfinite(fit.low) and math.isfinite(fit.high)):
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
    optima, with a bootstrap interval (docs/methods.md §5, §14).

    Replicate r regresses replicate r of every width's bootstrap (trials resampled within each width,
    independently across widths); replicates where any width lacks an interior optimum are left out. Needs ≥ 3
    widths whose full-data fit has a minimum inside the searched range; otherwise ``exponent`` is None with a
    ``reason`` (two points always lie on a line, so their slope has no error to show).

    Returns:
        ``widths``, ``optima`` (fitted peak LR per width, None where none), ``exponent``, ``low``, ``high``,
        ``ok_share``, ``confidence``, ``reason``.
    """
    widths = sorted(fits)
    usable = [w for w in widths if fits[w].inside]
    out: dict[str, Any] = {"widths": widths, "optima": [_finite(fits[w].optimum) for w in widths],
                           "exponent": None, "low": None, "high": None, "ok_share": None, "confidence": confidence,
                           "reason": ""}
    if len(widths) < 3 or len(usable) < len(widths):
        missing = [f"d{w}" for w in widths if w not in usable]
        out["reason"] = (f"needs ≥ 3 widths with a fitted optimum; got {len(usable)}"
                         + (f" ({', '.join(missing)}: no fitted minimum inside the searched range)" if missing else ""))
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
               ok_share=float(ok.mean()))
    return out


def exponent_verdict(drift: dict[str, Any], confidence: float) -> tuple[str, str]:
    """(verdict, resolve) of the width exponent: decided when ≥ ``confidence`` of the replicates give a slope and
    its interval excludes 0, i.e. the LR optimum moves with width. An interval containing 0 is undetermined: it does
    not show that the LR transfers, only that these widths do not tell."""
    if drift["exponent"] is None:
        return "undetermined", f"sweep ≥ 3 widths (sweep.widths) with a fitted optimum each: {drift['reason']}"
    if drift["ok_share"] < confidence:
        return "undetermined", (f"only {drift['ok_share']:.0%} of the bootstrap replicates give every width a "
                                "minimum: add trials per width around each optimum")
    if drift["low"] <= 0.0 <= drift["high"]:
        return "undetermined", (f"the {confidence:.0%} interval [{drift['low']:+.2f}, {drift['high']:+.2f}] contains 0:"
                                f" add trials per width near each optimum, or widths beyond d{drift['widths'][0]}–"
                                f"d{drift['widths'][-1]}, to narrow it")
    return "decided", ""
