"""The peak LR with an interval: a cubic in ln(LR) over synthetic trials whose optimum is known, the Fieller set of
its minimum, the declared rule's verdicts (decided, too few trials, flat, past the edge, too wide), a null landscape
repeated under many seeds, and the width exponent."""

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from evals.stats import MIN_UNITS
from infra.errors import ConfigError, DataError
from tasks.sweep.config import SweepConfig
from tasks.sweep.lr_fit import (LrRule, bootstrap_minima, exponent_verdict, fit_lr, judge, optimum_log_lr,
                                quadratic_fit, width_exponent)

LR_MIN, LR_MAX = 1e-4, 1e-1
RULE = LrRule(factor=3.0, confidence=0.95)
LRS = np.geomspace(LR_MIN, LR_MAX, 12)


def _trials(lrs, optimum, *, curvature=0.05, skew=0.0, noise=0.002, seed=0, floor=3.0, pruned=()):
    """Held-out loss = floor + curvature·u² + skew·u³ + N(0, noise²), u = ln lr − ln optimum: a local minimum at
    u = 0, rising faster above it for skew > 0. PRUNED rows at LRs ``pruned``."""
    rng = np.random.default_rng(seed)
    u = np.log(lrs) - math.log(optimum)
    loss = floor + curvature * u**2 + skew * u**3 + rng.normal(0.0, noise, len(u))
    done = pd.DataFrame({"state": "COMPLETE", "peak_lr": lrs, "value": loss})
    cut = pd.DataFrame({"state": "PRUNED", "peak_lr": list(pruned), "value": math.nan})
    return pd.concat([done, cut], ignore_index=True)


def _fit(trials, seed=0, lr_min=LR_MIN, lr_max=LR_MAX):
    return fit_lr(trials, lr_min=lr_min, lr_max=lr_max, confidence=0.95, seed=seed)


def _json(fit):
    return json.loads(json.dumps(fit.as_dict(), allow_nan=False))


def test_a_planted_optimum_is_decided_and_its_interval_contains_it():
    truth = 3e-3
    lrs = np.exp(np.random.default_rng(5).uniform(math.log(LR_MIN), math.log(LR_MAX), 12))
    fit = _fit(_trials(lrs, truth, skew=0.006, noise=0.01, pruned=[9e-2, 1e-4]))
    assert fit.bounded and fit.low <= truth <= fit.high and fit.low <= fit.optimum <= fit.high
    assert (fit.n_trials, fit.n_lrs, fit.n_pruned) == (12, 12, 2)  # pruned trials counted, never fitted
    assert len(fit.coefficients) == 4 and fit.reason == "" and fit.edge == ""
    assert fit.curve(np.array([fit.optimum])) == pytest.approx(3.0, abs=0.02)
    judged = judge(fit, RULE)
    assert judged.verdict == "decided" and judged.source == "fit", judged.resolve
    assert judged.lr == fit.optimum and judged.fallback == judged.resolve == ""
    assert fit.ratio <= RULE.factor
    # The fitted optimum, not the nearest tried LR, is what the main run gets.
    assert judged.lr != fit.best_trial_lr and fit.best_trial_lr in lrs
    shown = _json(fit)
    assert shown["interval"] == [fit.low, fit.high] and shown["bounded"] is True and shown["method"].startswith("cubic")


def test_a_loss_that_rises_faster_above_the_optimum_is_covered_where_a_parabola_misses():
    lo, hi = 1e-3, 5e-2
    lrs = np.geomspace(lo, hi, 20)
    covered, parabola = 0, []
    for seed in range(20):
        trials = _trials(lrs, 8e-3, curvature=0.06, skew=0.008, noise=0.005, seed=seed)
        fit = fit_lr(trials, lr_min=lo, lr_max=hi, confidence=0.95, seed=seed, replicates=0)
        covered += fit.bounded and fit.low <= 8e-3 <= fit.high
        a, b, _ = quadratic_fit(np.log(lrs), trials["value"].to_numpy())
        parabola.append(math.exp(optimum_log_lr(a, b)))
    assert covered >= 17  # 95% coverage: 17 or more of 20 with probability 0.98
    assert max(parabola) < 8e-3 / 1.1  # every parabola's optimum is biased below the truth


def test_six_trials_are_undetermined_below_the_minimum_of_ten():
    fit = _fit(_trials(LRS[[1, 3, 5, 6, 8, 10]], 3e-3, noise=1e-4))
    assert fit.bounded  # the set exists, but at 6 trials its coverage is not established
    judged = judge(fit, RULE)
    assert judged.verdict == "undetermined" and judged.lr == fit.best_trial_lr and judged.source == "best trial"
    assert judged.resolve.startswith("needs >= 10 trials, has 6: raise sweep.n_trials so that ≥ 4 more trials "
                                     "complete, between 1.00e-04 and 1.00e-01")
    assert judged.fallback.startswith(f"fall back to the best COMPLETE trial's LR {fit.best_trial_lr:.3e}")
    pruned = judge(_fit(_trials(LRS[[1, 3, 5, 6, 8, 10]], 3e-3, pruned=[1e-4, 5e-2])), RULE)
    assert "the 2 pruned trials do not count (raise sweep.pruner_startup_trials" in pruned.resolve


def test_a_rule_asking_more_than_the_minimum_says_so():
    fit = _fit(_trials(LRS[:11], 3e-3))
    judged = judge(fit, LrRule(factor=3.0, confidence=0.95, min_fit_trials=12))
    assert judged.verdict == "undetermined"
    assert judged.resolve.startswith("needs >= 12 trials (sweep.min_fit_trials), has 11: ")


def test_too_few_trials_for_a_cubic_give_no_fit_and_json_nulls_with_a_reason():
    fit = _fit(_trials(LRS[[2, 5, 8]], 3e-3, pruned=[1e-4]))
    assert not fit.fitted and math.isnan(fit.optimum) and not fit.bounded
    assert fit.reason == "no cubic fit: it needs >= 5 COMPLETE trials at >= 4 distinct LRs, got 3 at 3"
    assert np.isnan(fit.curve(np.array([1e-3]))).all()
    shown = _json(fit)
    assert shown["optimum"] is None and shown["interval"] == [None, None] and shown["coefficients"] == []
    assert judge(fit, RULE).resolve.startswith("needs >= 10 trials, has 3: ")
    with pytest.raises(DataError, match="COMPLETE"):
        _fit(pd.DataFrame({"state": ["PRUNED"], "peak_lr": [1e-3], "value": [math.nan]}))


def test_flat_losses_are_undetermined_because_the_minimum_is_not_resolved():
    fit = _fit(_trials(LRS, 3e-3, curvature=0.0, noise=0.01, seed=1))
    assert not fit.bounded and math.isnan(fit.low) and math.isnan(fit.ratio)
    judged = judge(fit, RULE)
    assert judged.verdict == "undetermined" and judged.lr == fit.best_trial_lr
    assert "the minimum is not resolved" in judged.resolve
    shown = _json(fit)
    assert shown["interval"] == [None, None] and shown["reason"]


def test_a_flat_landscape_under_forty_seeds_is_almost_never_decided():
    rng = np.random.default_rng(2024)
    verdicts = []
    for seed in range(40):
        lrs = np.exp(rng.uniform(math.log(LR_MIN), math.log(LR_MAX), 12))
        fit = fit_lr(_trials(lrs, 3e-3, curvature=0.0, noise=0.01, seed=seed), lr_min=LR_MIN, lr_max=LR_MAX,
                     confidence=0.95, seed=seed, replicates=0)  # the verdict does not use the bootstrap
        verdicts.append(judge(fit, RULE).verdict)
    assert verdicts.count("undetermined") >= 0.95 * len(verdicts), verdicts


def test_an_optimum_beyond_lr_max_says_widen():
    fit = _fit(_trials(LRS, 0.5))
    assert fit.edge == "highest" and math.isnan(fit.optimum) and not fit.bounded
    assert fit.reason.startswith("no interior minimum: the fitted cubic is lowest at the highest tried LR")
    judged = judge(fit, RULE)
    assert judged.verdict == "undetermined" and judged.lr == fit.best_trial_lr == LR_MAX
    assert judged.resolve.endswith("so the optimum may lie above it; widen sweep.lr_max beyond 1.00e-01")
    # Tried from 1e-3 only, in a range that starts at 1e-4: the untried part is where to look.
    below = judge(_fit(_trials(np.geomspace(1e-3, LR_MAX, 10), 1e-5)), RULE)
    assert below.resolve.endswith("so the optimum may lie below it; add trials between 1.00e-04 and 1.00e-03")


def test_a_wide_interval_says_how_many_trials_where_and_following_it_narrows_the_interval():
    trials = _trials(LRS, 3e-3, curvature=0.005, noise=0.02, seed=1)
    fit = _fit(trials)
    assert fit.bounded and fit.low <= 3e-3 <= fit.high and fit.ratio > RULE.factor
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


def test_the_bootstrap_minima_are_seeded_and_need_four_distinct_lrs():
    trials = _trials(LRS, 3e-3, noise=0.02)
    x, y = np.log(trials["peak_lr"].to_numpy()), trials["value"].to_numpy()
    first, again, other = (bootstrap_minima(x, y, replicates=200, seed=s) for s in ([1, 2], [1, 2], [1, 3]))
    assert first.shape == (200,) and np.array_equal(first, again, equal_nan=True)
    assert not np.array_equal(first, other, equal_nan=True)
    assert np.nanmedian(first) == pytest.approx(math.log(3e-3), abs=0.3)
    three = bootstrap_minima(x[[0, 5, 11]], y[[0, 5, 11]], replicates=50, seed=0)
    assert np.isnan(three).all()  # three LRs never fit a cubic


def test_the_fit_must_be_judged_at_the_rules_confidence():
    fit = fit_lr(_trials(LRS, 3e-3), lr_min=LR_MIN, lr_max=LR_MAX, confidence=0.9, seed=0)
    with pytest.raises(ConfigError, match="confidence 0.9"):
        judge(fit, RULE)


def _widths(exponent, base_lr=3e-3, widths=(64, 128, 256)):
    return {w: fit_lr(_trials(LRS, base_lr * (w / widths[0]) ** exponent, seed=w), lr_min=LR_MIN, lr_max=LR_MAX,
                      confidence=0.95, seed=[0, w]) for w in widths}


@pytest.mark.parametrize("planted", [-1.0, -0.5])
def test_three_widths_recover_a_planted_exponent_within_its_interval(planted):
    drift = width_exponent(_widths(planted), 0.95)
    assert drift["low"] <= planted <= drift["high"]
    assert drift["exponent"] == pytest.approx(planted, abs=0.05)
    assert drift["ok_share"] >= 0.95
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
    assert drift["reason"] == "needs ≥ 3 widths with a resolved optimum; got 2"
    assert drift["optima"][0] == pytest.approx(3e-3, rel=0.05)
    verdict, resolve = exponent_verdict(drift, 0.95)
    assert verdict == "undetermined" and "≥ 3 widths" in resolve
    # A third width whose minimum is not resolved, or with too few trials, does not make three.
    fits[256] = fit_lr(_trials(LRS, 0.5, seed=3), lr_min=LR_MIN, lr_max=LR_MAX, confidence=0.95, seed=1)
    assert width_exponent(fits, 0.95)["reason"] == ("needs ≥ 3 widths with a resolved optimum; got 2 "
                                                    "(d256: minimum not resolved)")
    fits[256] = fit_lr(_trials(LRS[::2], 1e-3, seed=3), lr_min=LR_MIN, lr_max=LR_MAX, confidence=0.95, seed=1)
    assert width_exponent(fits, 0.95)["reason"].endswith("(d256: 6 COMPLETE trials, needs >= 10)")


def test_the_rule_fields_are_checked_and_the_declared_rule_names_method_and_minimum():
    base = dict(lr_min=1e-3, lr_max=1e-1, report_every=1)
    for field, value in (("lr_decided_factor", 1.0), ("confidence", 1.0), ("min_fit_trials", 9)):
        with pytest.raises(ConfigError, match=f"sweep.{field}"):
            SweepConfig(**base, **{field: value})
    with pytest.raises(ConfigError, match=r"sweep.min_fit_trials = 9: must be ≥ 10, .*docs/methods.md §16"):
        SweepConfig(**base, min_fit_trials=9)
    cfg = SweepConfig(**base)
    assert (cfg.lr_decided_factor, cfg.confidence, cfg.min_fit_trials) == (3.0, 0.95, MIN_UNITS["trials"]) == (
        3.0, 0.95, 10)
    with pytest.raises(ConfigError, match="min_fit_trials = 4"):
        LrRule(factor=3.0, confidence=0.95, min_fit_trials=4)
    text, config = RULE.text(1e-3, 1e-1), RULE.config(1e-3, 1e-1)
    assert "cubic in ln(peak LR)" in text and "Fieller" in text and "≥ 10 COMPLETE trials" in text
    assert config["model"] == "cubic in ln(peak LR)" and config["min_trials"] == config["min_fit_trials"] == 10
