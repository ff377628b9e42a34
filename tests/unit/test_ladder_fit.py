"""The scaling-law fit of the ladder (docs/methods.md §5): planted constants come back inside their bootstrap
intervals, the compute-optimal closed form is the numeric optimum, a 2 × 2 ladder takes a reduced form and leaves
the forecast undetermined."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import check_grad, minimize_scalar

from infra.errors import DataError
from tasks.ladder.config import LadderConfig
from tasks.ladder.fit import (FORMS, ScalingLaw, _objective, bootstrap_laws, choose_form, fit_law, forecast_check,
                              law_intervals, predict_interval, token_weighted_loss)
from tasks.ladder.stage import FALLBACK, _forecast, declare, forecast_hash, settle

PLANTED = ScalingLaw(E=1.69, A=406.4, alpha=0.34, B=410.7, beta=0.28)


def _grid(law: ScalingLaw, sizes, budgets, noise: float, seed: int = 0):
    n, d = (a.ravel() for a in np.meshgrid(np.asarray(sizes, float), np.asarray(budgets, float)))
    loss = law.loss(n, d) * np.exp(np.random.default_rng(seed).normal(0.0, noise, n.size))
    return n, d, loss


def test_planted_constants_lie_inside_their_bootstrap_intervals():
    """Five noise draws on a 4 × 4 grid: each constant inside its 95% interval in at least four of them (a 95%
    interval may miss once in twenty), and so the prediction at a point beyond the grid; the point fit inside its own
interval every time."""
    names = ("E", "A", "alpha", "B", "beta")
    covered = {name: 0 for name in (*names, "prediction")}
    for seed in range(5):
        n, d, loss = _grid(PLANTED, np.geomspace(1e7, 1e9, 4), np.geomspace(1e9, 1e11, 4), noise=0.002, seed=seed)
        law, objective = fit_law(n, d, loss)
        assert law.form == "full" and objective < 16  # Huber/δ summed: residuals of the order of the noise
        laws = bootstrap_laws(n, d, loss, law, resamples=60, seed=seed)
        intervals = law_intervals(laws, 0.95)
        for name in names:
            low, high = intervals[name]
            covered[name] += low <= getattr(PLANTED, name) <= high
            assert low <= getattr(law, name) <= high, name
        assert intervals["alpha"][1] - intervals["alpha"][0] < 0.1
        assert intervals["beta"][1] - intervals["beta"][0] < 0.1
        # A prediction beyond the grid: the truth inside its interval (counted), the point fit within 1%.
        low, high = predict_interval(laws, 3e9, 3e11, 0.95)
        covered["prediction"] += low <= float(PLANTED.loss(3e9, 3e11)) <= high
        assert float(law.loss(3e9, 3e11)) == pytest.approx(float(PLANTED.loss(3e9, 3e11)), rel=0.01)
    assert all(count >= 4 for count in covered.values()), covered


def test_the_analytic_gradient_is_the_objectives():
    n, d, loss = _grid(PLANTED, np.geomspace(1e7, 1e9, 3), np.geomspace(1e9, 1e11, 3), noise=0.01)
    args = (np.log(n), np.log(d), np.log(loss))
    for form, theta in (("full", [6.0, 6.0, 0.5, 0.3, 0.3]), ("shared_exponent", [6.0, 6.0, 0.5, 0.3]),
                        ("shared_exponent_no_floor", [6.0, 6.0, 0.3])):
        value = lambda t, form=form: _objective(t, form, *args)[0]  # noqa: E731
        grad = lambda t, form=form: _objective(t, form, *args)[1]  # noqa: E731
        assert check_grad(value, grad, np.array(theta)) < 1e-3 * np.linalg.norm(grad(np.array(theta))) + 1e-4


@pytest.mark.parametrize("compute", [1e18, 1.146e23, 1e26])
def test_compute_optimal_closed_form_matches_numeric_minimisation(compute):
    for law in (PLANTED, ScalingLaw(E=2.0, A=50.0, alpha=0.5, B=900.0, beta=0.2)):
        n_opt, d_opt = law.optimum(compute)
        assert 6 * n_opt * d_opt == pytest.approx(compute)
        found = minimize_scalar(lambda log_n, law=law: float(law.loss(math.exp(log_n), compute / 6 / math.exp(log_n))),
                                bounds=(math.log(1e3), math.log(compute / 6 / 1e3)), method="bounded",
                                options={"xatol": 1e-10})
        assert math.exp(found.x) == pytest.approx(n_opt, rel=1e-4)


def test_the_form_follows_the_number_of_points():
    assert [choose_form(k) for k in (3, 4, 5, 6, 16)] == ["shared_exponent_no_floor", "shared_exponent_no_floor",
                                                          "shared_exponent", "full", "full"]
    assert {form: len(names) for form, names in FORMS.items()} == {"full": 5, "shared_exponent": 4,
                                                                  "shared_exponent_no_floor": 3}
    with pytest.raises(DataError, match="at least 3 ladder points"):
        choose_form(2)


def _points(law: ScalingLaw, widths, steps, n_of, d_of, cfg: LadderConfig, noise=0.0) -> pd.DataFrame:
    held, _ = cfg.held_out()
    rows = []
    for i, (w, s) in enumerate(cfg.grid()):
        n, d = n_of[w], d_of[s]
        rows.append({"width": w, "n_layers": 1, "steps": s, "n_params": n, "tokens": d,
                     "loss_nats": float(law.loss(n, d)) * (1 + noise * (-1) ** i), "held_out": (w, s) in held,
                     "excluded": ""})
    return pd.DataFrame(rows)


TARGET = {"n_params": 10 ** 9, "tokens": 2 * 10 ** 10, "general_sources": ["a", "b"]}


def test_a_two_by_two_ladder_is_reduced_and_its_forecast_undetermined():
    cfg = LadderConfig(enabled=True, widths=[16, 32], steps=[10, 20], bootstrap=50)
    points = _points(PLANTED, cfg.widths, cfg.steps, {16: 1e7, 32: 4e7}, {10: 1e9, 20: 4e9}, cfg, noise=0.003)
    record = declare(cfg)
    forecast, table = _forecast(points, cfg, TARGET, cfg.held_out()[1], seed=0)
    forecast["forecast_hash"] = forecast_hash(forecast)
    settled = settle(record, forecast, cfg, "k")
    assert forecast["fit"]["form"] == "shared_exponent_no_floor" and forecast["law"]["E"] == 0.0
    assert forecast["law"]["alpha"] == forecast["law"]["beta"]
    assert forecast["goodness"] == [] and math.isnan(forecast["max_abs_heldout_relative_error"])
    assert settled.verdict == "undetermined" and settled.fallback == FALLBACK
    assert "add sizes/budgets" in settled.resolve and "no backtest" in settled.resolve
    assert (settled.n_units, settled.units, settled.min_units) == (4, "rungs", 7)
    assert {r["rule"] for r in forecast["assessment"]["reasons"]} == {"form", "backtest", "extrapolation"}
    assert settled.low <= settled.estimate <= settled.high and settled.unit == "nats/token"
    assert settled.declared_at <= settled.decided_at and settled.kind == "forecast"
    assert any("reduced form" in note for note in forecast["notes"])
    assert len(table) == 4 and table["predicted"].notna().all()


def test_a_full_ladder_with_a_good_holdout_is_decided_and_a_bad_one_is_not():
    cfg = LadderConfig(enabled=True, widths=[16, 32, 48, 64], steps=[10, 20, 40, 80], bootstrap=50)
    n_of = {16: 1e7, 32: 4e7, 48: 1.5e8, 64: 5e8}
    d_of = {10: 1e9, 20: 4e9, 40: 1.5e10, 80: 6e10}
    points = _points(PLANTED, cfg.widths, cfg.steps, n_of, d_of, cfg, noise=0.001)
    forecast, table = _forecast(points, cfg, TARGET, cfg.held_out()[1], seed=0)
    forecast["forecast_hash"] = forecast_hash(forecast)
    settled = settle(declare(cfg), forecast, cfg, "k")
    (check,) = forecast["goodness"]
    assert (check["width"], check["steps"]) == (64, 80) and abs(check["relative_error"]) < 0.01
    assert forecast["fit"]["form"] == "full" and settled.verdict == "decided" and settled.fallback == ""
    assert settled.n_units == 15 and settled.min_units == 7 and forecast["assessment"]["reasons"] == []
    backtest = forecast["backtest"]  # the largest fitted rung, forecast from the 14 others
    assert (backtest["width"], backtest["steps"], backtest["fitted"]) == (48, 80, 14)
    assert abs(backtest["relative_error"]) < 0.01
    assert table["backtest"].sum() == 1 and table.loc[table["backtest"], "backtest_predicted"].notna().all()
    assert forecast["prediction"]["predicted"] == pytest.approx(float(PLANTED.loss(1e9, 2e10)), rel=0.01)
    optimum = forecast["optimum"]
    assert optimum["n_opt_interval"][0] <= optimum["n_opt"] <= optimum["n_opt_interval"][1]

    # The held-out rung measured 20% higher than the law says: the forecast is recorded but not trusted.
    worse = points.copy()
    worse.loc[worse["held_out"], "loss_nats"] *= 1.2
    forecast, _ = _forecast(worse, cfg, TARGET, cfg.held_out()[1], seed=0)
    forecast["forecast_hash"] = forecast_hash(forecast)
    settled = settle(declare(cfg), forecast, cfg, "k")
    assert settled.verdict == "undetermined" and "exceeds the tolerance 5%" in settled.resolve


def test_the_forecast_hash_covers_target_law_and_prediction_only():
    forecast = {"target": {"n": 1}, "law": {"E": 1.0}, "prediction": {"predicted": 2.0}, "notes": ["x"]}
    same = {**forecast, "notes": ["y"], "decision": {"decided_at": "now"}}
    assert forecast_hash(forecast) == forecast_hash(same) and len(forecast_hash(forecast)) == 64
    assert forecast_hash({**forecast, "prediction": {"predicted": 2.0001}}) != forecast_hash(forecast)


def test_pooled_loss_and_check():
    heldout = pd.DataFrame({"source": ["a", "b", "domain"], "tokens": [300, 100, 500],
                            "loss_nats": [4.0, 6.0, 1.0]})
    assert token_weighted_loss(heldout, ["a", "b"]) == pytest.approx(4.5)
    check = forecast_check(4.6, 4.4, 4.8, 4.5)
    assert check["error"] == pytest.approx(0.1) and check["relative_error"] == pytest.approx(0.1 / 4.5)
    assert check["covered"] and not forecast_check(4.6, 4.55, 4.8, 4.5)["covered"]
    with pytest.raises(DataError, match="no held-out tokens"):
        token_weighted_loss(heldout, ["c"])


@pytest.mark.parametrize("fields, message", [
    ({"enabled": True, "widths": [16], "steps": [10, 20]}, "at least 2 widths and 2 budgets"),
    ({"widths": [16, 16]}, "distinct positive"),
    ({"steps": [1, 4]}, "at least 2 optimiser steps"),
    ({"enabled": True, "widths": [16, 32], "steps": [10, 20], "holdout": [[16, 30]]}, "not a \\[width, steps\\]"),
    ({"enabled": True, "widths": [16, 32], "steps": [10, 20], "holdout": [[16, 10], [32, 20]]}, "fewer than 3"),
    ({"bootstrap": 5}, "at least 10"),
    ({"forecast_tolerance": 0.0}, "forecast_tolerance"),
    ({"max_extrapolation": 1.0}, "ladder.max_extrapolation = 1.0: must be > 1"),
    ({"max_interval_ratio": 0.5}, "ladder.max_interval_ratio = 0.5: must be > 1"),
    ({"max_exponent_width": 0.0}, "ladder.max_exponent_width = 0.0: must be > 0"),
    ({"bound_tolerance": -0.1}, "ladder.bound_tolerance = -0.1: must lie in \\[0, 1\\)"),
])
def test_bad_ladder_sections_are_refused(fields, message):
    from infra.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        LadderConfig(**fields)


def test_a_failed_rung_is_left_out_of_the_fit_with_its_reason():
    cfg = LadderConfig(enabled=True, widths=[16, 32, 48], steps=[10, 20], bootstrap=20)
    points = _points(PLANTED, cfg.widths, cfg.steps, {16: 1e7, 32: 4e7, 48: 1.5e8}, {10: 1e9, 20: 4e9}, cfg)
    failed = (points["width"] == 16) & (points["steps"] == 10)
    points.loc[failed, "loss_nats"] = math.nan
    points.loc[failed, "excluded"] = "training failed: 5 loss spikes in a row"
    forecast, table = _forecast(points, cfg, TARGET, cfg.held_out()[1], seed=0)
    assert forecast["fit"]["points"] == 4 and forecast["fit"]["excluded"] == 1 and len(table) == 6
    assert "rung d16 × 10 steps left out: training failed: 5 loss spikes in a row" in forecast["notes"]
    assert forecast["fit"]["form"] == "shared_exponent_no_floor"  # 6 rungs − 1 held out − 1 failed = 4 fitted
