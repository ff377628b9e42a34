"""The peak LR with an interval: a quadratic in ln(LR) over synthetic trials whose optimum is known, the declared
rule's verdicts (decided, flat, noisy, past the edge, too few trials), and the width exponent."""

import math
import re

import numpy as np
import pandas as pd
import pytest

from infra.errors import ConfigError, DataError
from tasks.sweep.config import SweepConfig
from tasks.sweep.lr_fit import (LrRule, bootstrap_optima, exponent_verdict, few_lrs_probability, fit_lr, judge,
                                quadratic_fit, width_exponent)

LR_MIN, LR_MAX = 1e-4, 1e-1
RULE = LrRule(factor=3.0, confidence=0.95, min_fit_trials=4)
LRS = np.geomspace(LR_MIN, LR_MAX, 10)


def _trials(lrs, optimum, *, curvature=0.05, noise=0.002, seed=0, floor=3.0, pruned=()):
    """Held-out loss = floor + curvature·(ln lr − ln optimum)² + N(0, noise²); PRUNED rows at LRs ``pruned``."""
    rng = np.random.default_rng(seed)
    x = np.log(lrs)
    loss = floor + curvature * (x - math.log(optimum)) ** 2 + rng.normal(0.0, noise, len(x))
    done = pd.DataFrame({"state": "COMPLETE", "peak_lr": lrs, "value": loss})
    cut = pd.DataFrame({"state": "PRUNED", "peak_lr": list(pruned), "value": math.nan})
    return pd.concat([done, cut], ignore_index=True)


def _fit(trials, seed=0):
    return fit_lr(trials, lr_min=LR_MIN, lr_max=LR_MAX, confidence=0.95, seed=seed)


def test_a_planted_optimum_is_recovered_inside_its_interval_and_decided():
    truth = 3e-3
    fit = _fit(_trials(LRS, truth, pruned=[9e-2, 1e-4]))
    assert fit.a == pytest.approx(0.05, rel=0.1)
    assert fit.low <= truth <= fit.high and fit.low <= fit.optimum <= fit.high
    assert fit.optimum == pytest.approx(truth, rel=0.05)
    assert fit.ok_share == 1.0 and fit.ratio <= RULE.factor
    assert (fit.n_trials, fit.n_lrs, fit.n_pruned) == (10, 10, 2)  # pruned trials counted, never fitted
    judged = judge(fit, RULE)
    assert judged.verdict == "decided" and judged.source == "fit"
    assert judged.lr == fit.optimum and judged.fallback == judged.resolve == ""
    # The fitted optimum, not the nearest grid point, is what the main run gets.
    assert judged.lr != fit.best_trial_lr and fit.best_trial_lr in LRS


def test_the_bootstrap_is_seeded_and_deterministic():
    trials = _trials(LRS, 3e-3, noise=0.02)
    first, again, other = _fit(trials, seed=[1, 2]), _fit(trials, seed=[1, 2]), _fit(trials, seed=[1, 3])
    assert (first.low, first.high) == (again.low, again.high)
    assert (first.low, first.high) != (other.low, other.high)
    x = np.log(trials["peak_lr"][:10].to_numpy())
    optima, few = bootstrap_optima(x, trials["value"][:10].to_numpy(), replicates=50, seed=7)
    again, _ = bootstrap_optima(x, trials["value"][:10].to_numpy(), replicates=50, seed=7)
    assert optima.shape == few.shape == (50,) and np.array_equal(optima, again, equal_nan=True)
    assert not few.any()  # ten distinct LRs: a resample with fewer than three is vanishingly rare


def test_few_trials_are_undetermined_until_resamples_hold_three_distinct_lrs():
    assert few_lrs_probability(4) == pytest.approx(88 / 256)  # 4 one-LR + 6·14 two-LR resamples of 4⁴
    assert few_lrs_probability(5) > 0.05 >= few_lrs_probability(6)
    fit = _fit(_trials(LRS[[1, 3, 5, 7, 9]], 3e-3, noise=1e-4))
    assert fit.few_lrs_share == pytest.approx(few_lrs_probability(5), abs=0.02)
    judged = judge(fit, RULE)
    assert judged.verdict == "undetermined"
    assert judged.resolve.startswith("add ≥ 1 trials at new LRs between ")
    assert "(6 trials at distinct LRs are needed" in judged.resolve
    assert judge(_fit(_trials(LRS[[0, 2, 4, 5, 7, 9]], 3e-3, noise=1e-4)), RULE).verdict == "decided"


def test_flat_data_is_undetermined_and_says_so():
    fit = _fit(_trials(LRS, 3e-3, curvature=0.0, noise=0.01, seed=1))
    judged = judge(fit, RULE)
    assert judged.verdict == "undetermined" and judged.source == "best trial"
    assert judged.lr == fit.best_trial_lr
    assert "the landscape is flat over [1.00e-04, 1.00e-01]" in judged.resolve
    assert f"the loss varies by only {fit.loss_range:.3g} nats" in judged.resolve
    assert judged.fallback.startswith(f"fall back to the best COMPLETE trial's LR {fit.best_trial_lr:.3e}")


def test_noise_much_larger_than_the_curvature_widens_the_interval_and_is_undetermined():
    clean = _fit(_trials(LRS, 3e-3))
    noisy = _fit(_trials(LRS, 3e-3, curvature=0.002, noise=0.02, seed=2))
    assert noisy.has_minimum  # a minimum on the full data, but the bootstrap does not pin it down
    assert noisy.ratio > 100 * clean.ratio or noisy.ok_share < 0.95
    judged = judge(noisy, RULE)
    assert judged.verdict == "undetermined" and judged.lr == noisy.best_trial_lr
    assert "add ≥ " in judged.resolve and " trials between " in judged.resolve


def test_a_wide_interval_says_how_many_trials_where_and_following_it_narrows_the_interval():
    trials = _trials(LRS, 3e-3, curvature=0.005, noise=0.02)
    fit = _fit(trials)
    assert fit.ok_share >= 0.95 and fit.low <= 3e-3 <= fit.high and fit.ratio > RULE.factor
    judged = judge(fit, RULE)
    assert judged.verdict == "undetermined" and judged.lr == fit.best_trial_lr
    match = re.match(r"add ≥ (\d+) trials between (\S+) and (\S+), around the interval", judged.resolve)
    assert match, judged.resolve
    k, low, high = int(match[1]), float(match[2]), float(match[3])
    assert low < fit.low and high > fit.high and LR_MIN <= low and high <= LR_MAX
    assert f"spans a factor {fit.ratio:.3g} > 3" in judged.resolve
    more = _fit(pd.concat([trials, _trials(np.geomspace(low, high, k), 3e-3, curvature=0.005, noise=0.02, seed=9)],
                          ignore_index=True))
    assert more.ratio < fit.ratio and more.low <= 3e-3 <= more.high


def test_an_optimum_beyond_lr_max_says_widen():
    fit = _fit(_trials(LRS, 0.5))
    assert fit.has_minimum and fit.optimum > LR_MAX
    judged = judge(fit, RULE)
    assert judged.verdict == "undetermined" and judged.lr == fit.best_trial_lr == LR_MAX
    assert judged.resolve.startswith("widen lr_max beyond 1.00e-01")


def test_too_few_complete_trials_fall_back_to_the_best_trial():
    trials = _trials(LRS[[2, 5, 8]], 3e-3, pruned=[1e-4, 5e-2])
    fit = _fit(trials)
    judged = judge(fit, RULE)
    assert judged.verdict == "undetermined" and judged.lr == fit.best_trial_lr
    # 3 of the ≥ 6 distinct LRs the bootstrap needs to decide at 95% (few_lrs_probability)
    assert judged.resolve.startswith("add ≥ 3 trials between 1.00e-04 and 1.00e-01")
    assert "≥ 6 at distinct LRs to decide at 95%" in judged.resolve
    assert "pruned trials do not count" in judged.resolve
    assert fit.has_minimum and math.isnan(fit.low) and fit.ok_share == 0.0  # 3 points: interpolated, no interval
    two = _fit(_trials(LRS[[2, 5]], 3e-3))
    assert not two.fitted and math.isnan(two.optimum) and judge(two, RULE).verdict == "undetermined"
    with pytest.raises(DataError, match="distinct peak LRs"):
        quadratic_fit(np.log([1e-3, 1e-3, 2e-3]), np.array([3.0, 3.1, 3.2]))
    with pytest.raises(DataError, match="COMPLETE"):
        _fit(pd.DataFrame({"state": ["PRUNED"], "peak_lr": [1e-3], "value": [math.nan]}))


def _widths(exponent, base_lr=3e-3, widths=(64, 128, 256)):
    return {w: fit_lr(_trials(LRS, base_lr * (w / widths[0]) ** exponent, seed=w), lr_min=LR_MIN, lr_max=LR_MAX,
                      confidence=0.95, seed=[0, w]) for w in widths}


@pytest.mark.parametrize("planted", [-1.0, -0.5])
def test_three_widths_recover_a_planted_exponent_within_its_interval(planted):
    drift = width_exponent(_widths(planted), 0.95)
    assert drift["low"] <= planted <= drift["high"]
    assert drift["exponent"] == pytest.approx(planted, abs=0.05)
    assert drift["ok_share"] == 1.0
    assert exponent_verdict(drift, 0.95) == ("decided", "")


def test_an_lr_that_transfers_is_not_decided_to_move():
    drift = width_exponent(_widths(0.0), 0.95)
    assert drift["low"] <= 0.0 <= drift["high"]
    verdict, resolve = exponent_verdict(drift, 0.95)
    assert verdict == "undetermined" and "contains 0" in resolve


def test_two_widths_report_no_exponent():
    fits = _widths(-1.0, widths=(64, 128))
    drift = width_exponent(fits, 0.95)
    assert drift["exponent"] is None and drift["low"] is None
    assert drift["reason"] == "needs ≥ 3 widths with a fitted optimum; got 2"
    assert drift["optima"][0] == pytest.approx(3e-3, rel=0.05)
    verdict, resolve = exponent_verdict(drift, 0.95)
    assert verdict == "undetermined" and "≥ 3 widths" in resolve
    # A third width without an optimum in range does not make three.
    fits[256] = fit_lr(_trials(LRS, 0.5, seed=3), lr_min=LR_MIN, lr_max=LR_MAX, confidence=0.95, seed=1)
    drift = width_exponent(fits, 0.95)
    assert drift["exponent"] is None
    assert drift["reason"].startswith("needs ≥ 3 widths with a fitted optimum; got 2 (d256")


def test_the_rule_fields_are_checked():
    base = dict(lr_min=1e-3, lr_max=1e-1, report_every=1)
    for field, value in (("lr_decided_factor", 1.0), ("confidence", 1.0), ("min_fit_trials", 3)):
        with pytest.raises(ConfigError, match=f"sweep.{field}"):
            SweepConfig(**base, **{field: value})
    cfg = SweepConfig(**base)
    assert (cfg.lr_decided_factor, cfg.confidence, cfg.min_fit_trials) == (3.0, 0.95, 4)
