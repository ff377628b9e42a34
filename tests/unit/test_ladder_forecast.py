"""The ladder's forecast as a pure function (tasks/ladder/forecast.py; docs/methods.md §5): a ladder drawn from a
known law is decided and covers the truth; flat or random losses, two widths, too few rungs and far extrapolation are
undetermined with the rule and its fix named; the backtest is reported; bad input is refused by field; forecast.json
is standard JSON; the batched solver finds the optimum scipy's L-BFGS-B finds."""

import json
import math

import numpy as np
import pytest
from scipy.optimize import minimize

from infra.errors import DataError
from tasks.ladder.config import LadderConfig
from tasks.ladder.fit import (FORMS, ScalingLaw, _bounds, _objective, _solve, _theta, bootstrap_laws, bootstrap_many,
                              fit_law)
from tasks.ladder.forecast import ForecastRules, forecast_from_points, interval, min_rungs
from tasks.ladder.stage import _forecast, declare, forecast_hash, json_safe, settle
from tasks.ladder.views import _lines

# Hoffmann et al. 2022's exponents, A and B scaled so that rungs of 1e4–2e5 parameters and 3e4–5e5 tokens lose
# 4.5–8 nats/token (as the demo's do); the same law as benchmarks/coverage_ladder.py.
LAW = ScalingLaw(E=2.0, A=70.0, alpha=0.34, B=55.0, beta=0.28)
RULES = ForecastRules(bootstrap=200)
TARGET_N, TARGET_D = 2e5 * 1.6, 5e5 * 2.5  # 4× the largest rung's compute


def _ladder(widths: int = 3, budgets: int = 3, noise: float = 0.005, seed: int = 0, law: ScalingLaw = LAW):
    """(n, d, loss, held_out) of a widths × budgets grid, the largest × largest rung held out."""
    n, d = (a.ravel() for a in np.meshgrid(np.geomspace(1e4, 2e5, widths), np.geomspace(3e4, 5e5, budgets),
                                           indexing="ij"))
    loss = law.loss(n, d) * np.exp(noise * np.random.default_rng(seed).normal(size=n.size))
    return n, d, loss, (n == n.max()) & (d == d.max())


def _rules(result) -> set[str]:
    return {r.rule for r in result.reasons}


@pytest.mark.parametrize("widths, budgets, seed", [(3, 3, 0), (3, 3, 3), (4, 4, 1)])
def test_a_ladder_from_a_known_law_within_range_is_decided_and_covers_the_truth(widths, budgets, seed):
    n, d, loss, held = _ladder(widths, budgets, noise=0.005, seed=seed)
    result = forecast_from_points(n, d, loss, held, TARGET_N, TARGET_D, RULES, seed=0)
    truth = float(LAW.loss(TARGET_N, TARGET_D))
    assert result.verdict == "decided" and result.reasons == [] and result.form == "full"
    assert result.low <= truth <= result.high and result.low < result.predicted < result.high
    assert result.extrapolation == pytest.approx(4.0)
    # The interval is the bootstrap's lengthened by the checks' error on each side (the additive rule).
    assert result.model_error > 0
    assert result.low == pytest.approx(min(result.bootstrap_low, result.predicted) - result.model_error)
    assert result.high == pytest.approx(max(result.bootstrap_high, result.predicted) + result.model_error)


def test_the_backtest_forecasts_the_largest_fitted_rung_from_the_others():
    n, d, loss, held = _ladder(3, 3, noise=0.005, seed=0)
    result = forecast_from_points(n, d, loss, held, TARGET_N, TARGET_D, RULES, seed=0)
    bt = result.backtest
    fitted = np.flatnonzero(~held)
    assert bt["index"] == fitted[np.argmax((n * d)[fitted])] and bt["fitted"] == len(fitted) - 1 == 7
    assert bt["low"] <= bt["predicted"] <= bt["high"] and bt["measured"] == loss[bt["index"]]
    assert bt["relative_error"] == pytest.approx((bt["predicted"] - bt["measured"]) / bt["measured"])
    assert abs(bt["relative_error"]) < 0.05 and bt["extrapolation"] >= 1.0
    (check,) = result.goodness  # the configured held-out rung is reported beside the backtest
    assert check["index"] == 8 and abs(check["relative_error"]) < 0.05


@pytest.mark.parametrize("kind", ["flat", "random"])
def test_flat_or_random_losses_are_a_degenerate_fit_with_the_bound_or_spread_named(kind):
    n, d, _, held = _ladder(3, 3)
    rng = np.random.default_rng(1)
    loss = 6.0 * np.exp(0.003 * rng.normal(size=9)) if kind == "flat" else rng.uniform(4.0, 8.0, 9)
    result = forecast_from_points(n, d, loss, held, TARGET_N, TARGET_D, RULES, seed=0)
    assert result.verdict == "undetermined"
    assert {"bound", "interval_ratio", "exponent_width"} <= _rules(result)
    bound = next(r for r in result.reasons if r.rule == "bound")
    assert "sits on its bound 0" in bound.problem and "ladder.bound_tolerance" in bound.problem
    assert any("ladder.max_interval_ratio = 100" in r.problem for r in result.reasons)


def test_far_extrapolation_is_undetermined_and_names_the_factor():
    n, d, loss, held = _ladder(3, 3, noise=0.005, seed=0)
    result = forecast_from_points(n, d, loss, held, 2e5 * 10, 5e5 * 100, RULES, seed=0)
    (reason,) = result.reasons
    assert reason.rule == "extrapolation" and "is 1e+03× the largest rung's" in reason.problem
    assert "ladder.max_extrapolation = 10×" in reason.problem and "nearer the main run" in reason.resolve
    wider = forecast_from_points(n, d, loss, held, 2e5 * 10, 5e5 * 100,
                                 ForecastRules(bootstrap=200, max_extrapolation=2000.0), seed=0)
    assert wider.verdict == "decided"  # the same fit, under a declared looser limit


def test_two_widths_do_not_determine_the_full_form():
    n, d, loss, held = _ladder(2, 4, noise=0.005, seed=0)
    result = forecast_from_points(n, d, loss, held, TARGET_N, TARGET_D, RULES, seed=0)
    levels = next(r for r in result.reasons if r.rule == "levels")
    assert result.levels == (2, 4) and "2 distinct N" in levels.problem and "ladder.widths" in levels.resolve


def test_fewer_rungs_than_parameters_are_undetermined_or_refused():
    n, d, loss, _ = _ladder(2, 2, noise=0.005)
    result = forecast_from_points(n[:3], d[:3], loss[:3], None, TARGET_N, TARGET_D, RULES, seed=0)
    assert result.form == "shared_exponent_no_floor" and {"form", "backtest"} <= _rules(result)
    assert result.backtest is None and "needs 4" in result.backtest_note
    assert min_rungs() == 7
    with pytest.raises(DataError, match="at least 3 ladder points"):
        forecast_from_points(n[:2], d[:2], loss[:2], None, TARGET_N, TARGET_D, RULES)


@pytest.mark.parametrize("field, value, message", [
    ("loss", math.nan, r"loss\[4\] = nan \(1 rung\(s\) without a finite positive loss\): leave those rungs out"),
    ("loss", math.inf, r"loss\[4\] = inf"),
    ("n", 0.0, r"n\[4\] = 0.0: parameters and tokens must be positive and finite"),
    ("d", math.nan, r"d\[4\] = nan"),
])
def test_non_finite_input_is_refused_naming_the_field(field, value, message):
    n, d, loss, held = _ladder(3, 3)
    arrays = {"n": n.copy(), "d": d.copy(), "loss": loss.copy()}
    arrays[field][4] = value
    with pytest.raises(DataError, match=message):
        forecast_from_points(arrays["n"], arrays["d"], arrays["loss"], held, TARGET_N, TARGET_D, RULES)
    with pytest.raises(DataError, match="target N"):
        forecast_from_points(n, d, loss, held, math.nan, TARGET_D, RULES)


def test_an_exactly_fitted_ladder_has_no_interval_to_decide_on():
    n, d, loss, held = _ladder(3, 3, noise=0.0)
    result = forecast_from_points(n, d, loss, held, TARGET_N, TARGET_D, RULES, seed=0)
    assert result.predicted == pytest.approx(float(LAW.loss(TARGET_N, TARGET_D)), rel=1e-6)
    (reason,) = result.reasons  # the truth, to rounding, with nothing to measure an error by: never decided
    assert reason.rule == "interval" and "zero width" in reason.problem


def test_the_interval_rule_adds_the_model_error_to_each_side():
    assert interval(4.0, 3.9, 4.2, 0.05) == pytest.approx((3.85, 4.25))
    assert interval(4.0, 4.1, 4.3, 0.0) == pytest.approx((4.0, 4.3))  # widened to contain the point forecast
    assert all(map(math.isnan, interval(4.0, math.nan, 4.3, 0.1)))


def test_the_rule_settings_are_declared_and_hashed():
    cfg = LadderConfig(enabled=True, widths=[16, 32, 48], steps=[10, 20, 40])
    record = declare(cfg)
    assert "10× the largest rung's" in record.rule and "≥ 7 rungs" in record.rule
    for field in ("max_extrapolation", "max_interval_ratio", "max_exponent_width", "bound_tolerance"):
        changed = cfg.model_copy(update={field: getattr(cfg, field) * 1.5 + 0.01})
        assert declare(changed).rule_hash != record.rule_hash, field


def test_the_batched_solver_reaches_scipys_optimum():
    n, d, loss, _ = _ladder(3, 3, noise=0.01, seed=2)
    logs = np.log(n), np.log(d), np.log(loss)
    for form in FORMS:
        law, value = fit_law(n, d, loss, form)
        start = _theta(law) + 0.3  # away from the optimum
        reference = minimize(_objective, start, args=(form, *logs), jac=True, method="L-BFGS-B",
                             bounds=_bounds(form), options={"maxiter": 5000, "ftol": 1e-15, "gtol": 1e-12})
        theta, found = _solve(start[None, :], form, *logs)
        assert found[0] <= reference.fun * (1 + 1e-6) + 1e-9, form
        assert value <= found[0] * (1 + 1e-6) + 1e-9  # the grid-started fit is at least as good


def _stage_forecast(loss_of) -> dict:
    """forecast.json's content for a 3 × 3 ladder whose losses are ``loss_of(n, d)``, as the stage writes it."""
    import pandas as pd

    cfg = LadderConfig(enabled=True, widths=[32, 64, 96], steps=[15, 30, 60], bootstrap=100)
    n_of = dict(zip(cfg.widths, np.geomspace(1e4, 2e5, 3)))
    d_of = dict(zip(cfg.steps, np.geomspace(3e4, 5e5, 3)))
    held, rule = cfg.held_out()
    points = pd.DataFrame([{"width": w, "n_layers": 1, "steps": s, "n_params": n_of[w], "tokens": d_of[s],
                            "loss_nats": float(loss_of(n_of[w], d_of[s])), "held_out": (w, s) in held, "excluded": ""}
                           for w, s in cfg.grid()])
    target = {"n_params": int(TARGET_N), "tokens": int(TARGET_D), "general_sources": ["a"]}
    forecast, _ = _forecast(points, cfg, target, rule, seed=0)
    forecast = json_safe(forecast)
    forecast["forecast_hash"] = forecast_hash(forecast)
    forecast["decision"] = json_safe(settle(declare(cfg), forecast, cfg, "k").as_dict())
    return forecast


def test_forecast_json_is_standard_json_and_the_view_names_a_degenerate_fit():
    flat = _stage_forecast(lambda n, d: 6.0 * (1 + 0.002 * math.sin(n * d)))
    text = json.dumps(flat, allow_nan=False)  # raises on a NaN or an infinity
    assert "NaN" not in text and "Infinity" not in text
    assert flat["checks"]["spreads"]["alpha"] is None or flat["checks"]["spreads"]["alpha"] > 0.5
    assert flat["decision"]["verdict"] == "undetermined" and flat["decision"]["min_units"] == 7
    lines = "\n".join(_lines(flat, {}))
    assert "degenerate fit: " in lines and "sits on its bound" in lines and "backtest: rung d96 × 30 steps" in lines
    assert "not to plan with" in lines

    good = _stage_forecast(lambda n, d: float(LAW.loss(n, d)) * (1 + 0.004 * math.sin(n / 7 + d)))
    assert good["decision"]["verdict"] == "decided", good["assessment"]
    lines = "\n".join(_lines(good, {}))
    assert "degenerate fit" not in lines and "forecast: " in lines and "model error" in lines
    assert good["backtest"]["width"] == 96 and good["backtest"]["steps"] == 30


def test_one_batch_of_bootstraps_is_each_bootstrap_on_its_own():
    n, d, loss, _ = _ladder(3, 3, noise=0.01, seed=4)
    subset = np.arange(9) != 8
    whole, _ = fit_law(n, d, loss)
    part, _ = fit_law(n[subset], d[subset], loss[subset])
    together = bootstrap_many(n, d, loss, [(np.ones(9, dtype=bool), whole, 3), (subset, part, 4)], 40)
    alone = [bootstrap_laws(n, d, loss, whole, 40, seed=3),
             bootstrap_laws(n[subset], d[subset], loss[subset], part, 40, seed=4)]
    for batch, single in zip(together, alone):
        assert [b.loss(3e5, 1e6) for b in batch] == pytest.approx([s.loss(3e5, 1e6) for s in single], rel=1e-9)
