"""The ladder's forecast as a pure function of arrays: fit, bootstrap, held-out check, backtest, interval and verdict
(docs/methods.md §5). The stage (``tasks.ladder.stage``) and the coverage benchmark
(``benchmarks/coverage_ladder.py``) both call :func:`forecast_from_points`, so the benchmark measures the production
procedure.

Units: N parameters (non-embedding in the stage), D tokens, L nats/token, C = 6·N·D FLOPs.

The forecast is ``decided`` only when every rule below holds; each failed rule gives a reason and what would
resolve it (``Reason``):

- ``form``: the full five-parameter form was fitted (≥ 6 fitted rungs, ``fit.choose_form``).
- ``levels``: the fitted rungs have ≥ 3 distinct N and ≥ 3 distinct D. With two values of N the data fix only one
  difference of the N-term, A·(N₁^−α − N₂^−α), so A, α and E trade off along a line (the same for D): the full form
  is not identified, whatever the noise.
- ``bound``: no exponent lies within ``bound_tolerance`` of ``fit.EXPONENT_BOUNDS`` and E has not collapsed onto
  its bound 0 (E below ``E_FLOOR_SHARE`` of the smallest fitted loss): a parameter on a bound is one the data did
  not determine (the demo's α = 4 with A = 1.7e17).
- ``interval_ratio``: the bootstrap intervals of A and B span at most ``max_interval_ratio`` (high/low). E is
  reported but not judged by its ratio: its lower end reaches the bound 0 on most well-determined 9-rung ladders of
  the coverage study (an infinite ratio) while their forecasts still cover, since the ladder's range cannot
  separate the floor from a slowly falling term; an E collapsed at the point fit is the ``bound`` rule's.
- ``exponent_width``: the bootstrap intervals of α and β are at most ``max_exponent_width`` wide.
- ``extrapolation``: the target's compute is at most ``max_extrapolation`` × the largest measured rung's (fitted or
  held out: the law's predictions are checked up to there).
- ``backtest``: the largest fitted rung (by compute) is dropped, the same form refitted on the rest (which needs
  parameters + 1 rungs), and the dropped rung forecast within ``forecast_tolerance`` (relative).
- ``heldout``: every held-out rung is predicted within ``forecast_tolerance``.
- ``interval``: the forecast and its interval are finite and the interval has a positive width.

The interval: the bootstrap percentile interval of L̂(target) (the parameters' uncertainty), widened to contain the
point forecast, then each side lengthened by a model-error term m = L̂ · max_j |e_j| · κ_j over the out-of-sample
checks j (the backtest and the held-out rungs), e_j the check's relative error and
κ_j = max(1, (ln C_target − c̄) / (ln C_j − c̄_j)) its extrapolation scale: how much farther the target lies from the
centre c̄ of the fitted rungs' log compute than the check lay from the centre c̄_j of the rungs it was predicted
from (the prediction error of a regression grows with the distance from the centre of its data, e.g. Draper & Smith
1998, Applied Regression Analysis). The two parts add, [b_low − m, b_high + m], rather than in quadrature: of the
decided forecasts on the simulated ladders of ``benchmarks/coverage_ladder.py --variants --replicates 400``, the
quadrature sum covered 93.4% (``near``) and 86.7% (the demo's ladder) at a nominal 95%, the sum 97.9% and 95.6%. The bootstrap of a Huber
fit on 8 rungs understates the parameters' spread (likely because many resamples reproduce the same
near-interpolating fit), so the checks' error is less a second, independent source than the part the bootstrap
misses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from infra.errors import DataError
from tasks.ladder.config import LadderConfig
from tasks.ladder.fit import (EXPONENT_BOUNDS, FORMS, ScalingLaw, bootstrap_many, choose_form, fit_law,
                              law_intervals, percentile_interval)

E_FLOOR_SHARE = 1e-3  # E below 0.1% of the smallest fitted loss: the floor has collapsed onto its bound E = 0
RATIO_NAMES = ("A", "B")  # judged by max_interval_ratio; E is reported (module docstring)
EXPONENT_NAMES = ("alpha", "beta")
SYMBOL = {"E": "E", "A": "A", "alpha": "α", "B": "B", "beta": "β"}
FALLBACK = "the forecast is recorded but not trusted"
INTERVAL_RULE = ("bootstrap percentile interval, each side lengthened by m = L̂ · max_j |e_j| · κ_j over the backtest "
                 "and held-out rungs (κ_j: the target's distance from the fitted rungs' mean log compute over the "
                 "check's, at least 1)")


_DEFAULTS = {name: f.default for name, f in LadderConfig.model_fields.items()}


@dataclass(frozen=True)
class ForecastRules:
    """The settings of the forecast's rule: ``LadderConfig``'s fields of the same names and defaults (their
    meaning and the source of each default: ``LadderConfig``, docs/configuration.md, docs/methods.md §5).

    Attributes:
        bootstrap: resamples for the percentile intervals (≥ 10).
        confidence: the intervals' level, in (0, 1).
        forecast_tolerance: the largest |relative error| of a held-out rung or the backtest that still decides.
        max_extrapolation: the largest target compute, as a multiple of the largest rung's (fitted or held out),
            that decides.
        max_interval_ratio: the largest high/low of A's and B's bootstrap intervals that decides.
        max_exponent_width: the widest bootstrap interval of α and β (absolute) that decides.
        bound_tolerance: an exponent this close to a bound of ``EXPONENT_BOUNDS`` counts as on it.
    """

    bootstrap: int = _DEFAULTS["bootstrap"]
    confidence: float = _DEFAULTS["confidence"]
    forecast_tolerance: float = _DEFAULTS["forecast_tolerance"]
    max_extrapolation: float = _DEFAULTS["max_extrapolation"]
    max_interval_ratio: float = _DEFAULTS["max_interval_ratio"]
    max_exponent_width: float = _DEFAULTS["max_exponent_width"]
    bound_tolerance: float = _DEFAULTS["bound_tolerance"]

    @classmethod
    def of(cls, settings: Any) -> "ForecastRules":
        """The rules of anything with these attributes (a ``LadderConfig``, a namespace, a ``ForecastRules``)."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class Reason:
    """Why a rule failed (``problem``) and what would resolve it (``resolve``); ``rule`` names the rule."""

    rule: str
    problem: str
    resolve: str


@dataclass
class LadderForecast:
    """The result of :func:`forecast_from_points`.

    Attributes:
        form, law, objective: the fitted form, its law and the fit's objective (Σ Huber_δ/δ).
        laws: the bootstrap laws (``rules.bootstrap`` of them).
        intervals: {E, A, alpha, B, beta: [low, high]} percentile intervals (NaN where none is finite).
        predicted, low, high: the forecast at the target and its interval (nats/token).
        bootstrap_low, bootstrap_high: the bootstrap percentile part of that interval (before the model-error term).
        model_error: the model-error term m (nats/token) added to each side of the bootstrap interval.
        widened: the percentile interval missed the point forecast and was widened to contain it.
        extrapolation: target compute / the largest measured rung's compute (fitted or held out).
        point_predicted, point_low, point_high: per input rung (m,), the fit's prediction and bootstrap interval.
        goodness: one dict per held-out rung (index, n, d, measured, predicted, low, high, relative_error, covered).
        backtest: the backtest's dict (index of the dropped rung, n, d, measured, predicted, low, high,
            relative_error, covered, extrapolation, fitted) or None when it could not run (``backtest_note`` says
            why).
        spreads: {A, B, E: high/low; alpha, beta: high − low} of the bootstrap intervals (inf when unbounded).
        reasons: the failed rules (empty: decided).
        fitted: how many rungs the law was fitted on; levels: how many distinct N and D among them.
    """

    form: str
    law: ScalingLaw
    objective: float
    laws: list[ScalingLaw]
    intervals: dict[str, list[float]]
    predicted: float
    low: float
    high: float
    bootstrap_low: float
    bootstrap_high: float
    model_error: float
    widened: bool
    extrapolation: float
    point_predicted: np.ndarray
    point_low: np.ndarray
    point_high: np.ndarray
    goodness: list[dict[str, Any]]
    backtest: dict[str, Any] | None
    backtest_note: str
    spreads: dict[str, float]
    fitted: int
    levels: tuple[int, int]
    reasons: list[Reason] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "undetermined" if self.reasons else "decided"

    @property
    def finite_interval(self) -> bool:
        """The interval is finite and ordered around the forecast."""
        values = (self.low, self.predicted, self.high)
        return all(map(math.isfinite, values)) and self.low <= self.predicted <= self.high


def min_rungs() -> int:
    """The fewest fitted rungs a ``decided`` forecast needs: the full form (5 parameters) refitted by the backtest on
    the rest needs parameters + 1 = 6 of them, so 7 fitted rungs."""
    return len(FORMS["full"]) + 2


def _arrays(n, d, loss, held_out) -> tuple[np.ndarray, ...]:
    """The inputs as float arrays of one length, with the field and the fix named on a bad value.

    Raises:
        DataError: shapes differ; an N or D not positive and finite; a loss not finite and positive.
    """
    n, d, loss = (np.asarray(x, dtype=float) for x in (n, d, loss))
    held = np.zeros(n.shape, dtype=bool) if held_out is None else np.asarray(held_out, dtype=bool)
    if n.ndim != 1 or not (n.shape == d.shape == loss.shape == held.shape):
        raise DataError(f"ladder forecast: n, d, loss and held_out must be 1-D of one length; got shapes {n.shape}, "
                        f"{d.shape}, {loss.shape}, {held.shape}")
    for name, values in (("n", n), ("d", d)):
        bad = np.flatnonzero(~(np.isfinite(values) & (values > 0)))
        if len(bad):
            raise DataError(f"ladder forecast: {name}[{int(bad[0])}] = {values[bad[0]]}: parameters and tokens must be "
                            "positive and finite")
    bad = np.flatnonzero(~(np.isfinite(loss) & (loss > 0)))
    if len(bad):
        raise DataError(f"ladder forecast: loss[{int(bad[0])}] = {loss[bad[0]]} ({len(bad)} rung(s) without a finite "
                        "positive loss): leave those rungs out of the arrays (the stage marks them excluded) or rerun "
                        "them")
    return n, d, loss, held


def _check(index: int, n, d, loss, law: ScalingLaw, laws: list[ScalingLaw], confidence: float) -> dict[str, Any]:
    predicted = float(law.loss(n[index], d[index]))
    (low,), (high,) = point_intervals(laws, n[index], d[index], confidence)
    low, high, measured = float(low), float(high), float(loss[index])
    return {"index": int(index), "n_params": float(n[index]), "tokens": float(d[index]), "measured": measured,
            "predicted": predicted, "low": low, "high": high, "relative_error": (predicted - measured) / measured,
            "covered": bool(low <= measured <= high)}


def _backtest_rungs(n, d, fit: np.ndarray, form: str) -> tuple[int, np.ndarray, str]:
    """The backtest's dropped rung (the largest fitted by compute) and the rungs it is forecast from, or (-1, [],
    why not) when those are fewer than the form's parameters + 1."""
    compute = 6.0 * n * d
    order = sorted(np.flatnonzero(fit), key=lambda i: (compute[i], n[i], d[i]))
    need = len(FORMS[form]) + 1
    if len(order) - 1 < need:
        return -1, np.array([], dtype=int), (
            f"the backtest refits the {form} form ({len(FORMS[form])} parameters) on the fitted rungs but the "
            f"largest, and needs {need} of them; there are {len(order) - 1}")
    return int(order[-1]), np.array(order[:-1]), ""


def _backtest(dropped: int, rest: np.ndarray, n, d, loss, law: ScalingLaw, laws: list[ScalingLaw],
              confidence: float) -> dict[str, Any]:
    """The backtest's report: the dropped rung's forecast by ``law`` (fitted on ``rest``) and ``laws`` (its
    bootstrap), against what it measured."""
    compute = 6.0 * n * d
    out = _check(dropped, n, d, loss, law, laws, confidence)
    out["low"], out["high"] = min(out["low"], out["predicted"]), max(out["high"], out["predicted"])
    out["covered"] = bool(out["low"] <= out["measured"] <= out["high"])
    out["extrapolation"] = float(compute[dropped] / compute[rest].max())
    out["fitted"] = int(len(rest))
    out["_scale_from"] = float(np.log(compute[rest]).mean())  # centre of the log compute it was predicted from
    return out


def _spreads(intervals: dict[str, list[float]], form: str) -> dict[str, float]:
    out = {}
    for name in (*RATIO_NAMES, "E"):
        if name == "E" and "e" not in FORMS[form]:
            continue
        low, high = intervals[name]
        out[name] = high / low if math.isfinite(low) and math.isfinite(high) and low > 0 else math.inf
    for name in EXPONENT_NAMES:
        low, high = intervals[name]
        out[name] = high - low if math.isfinite(low) and math.isfinite(high) else math.inf
    return out


def _g(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def _reasons(result: LadderForecast, rules: ForecastRules, loss_min: float, compute_max: float,
             target_compute: float) -> list[Reason]:
    law, reasons = result.law, []
    if result.form != "full":
        reasons.append(Reason("form", f"{result.fitted} fitted rungs are fewer than the full form's 6: the "
                              f"{result.form} form was fitted",
                              "add sizes/budgets (ladder.widths, ladder.steps): the full form needs at least 6 fitted "
                              f"rungs and the backtest one more (≥ {min_rungs()})"))
    for axis, symbol, count, knob in (("N", "α", result.levels[0], "ladder.widths"),
                                      ("D", "β", result.levels[1], "ladder.steps")):
        if result.form == "full" and count < 3:
            reasons.append(Reason("levels", f"the fitted rungs have {count} distinct {axis}: the {axis}-term's A or B, "
                                  f"{symbol} and E are not separately determined (the full form needs 3)",
                                  f"add a value to {knob}"))
    low, high = EXPONENT_BOUNDS
    for name in EXPONENT_NAMES:
        value = getattr(law, name)
        if min(value - low, high - value) <= rules.bound_tolerance:
            bound = low if value - low <= high - value else high
            reasons.append(Reason("bound", f"{SYMBOL[name]} = {value:.4g} sits on its bound {bound:g} "
                                  f"(within ladder.bound_tolerance = {rules.bound_tolerance:g}): the ladder does not "
                                  "determine that exponent",
                                  "spread the rungs wider in " + ("N (ladder.widths)" if name == "alpha" else
                                                                  "D (ladder.steps)") + " or add rungs"))
    if "e" in FORMS[result.form] and law.E < E_FLOOR_SHARE * loss_min:
        reasons.append(Reason("bound", f"E = {law.E:.3g} has collapsed onto its bound 0 (below {E_FLOOR_SHARE:.1%} of "
                              f"the smallest fitted loss {loss_min:.4g}): the ladder does not determine the floor",
                              "add larger or longer rungs (ladder.widths, ladder.steps) where the loss flattens"))
    for name, spread in result.spreads.items():
        lo_hi = result.intervals[name]
        if name in RATIO_NAMES and not spread <= rules.max_interval_ratio:
            reasons.append(Reason("interval_ratio", f"{SYMBOL[name]}'s bootstrap interval [{_g(lo_hi[0])}, "
                                  f"{_g(lo_hi[1])}] spans a ratio {_g(spread)} > ladder.max_interval_ratio = "
                                  f"{rules.max_interval_ratio:g}",
                                  "add rungs (ladder.widths, ladder.steps) so that the fit pins its constants"))
        if name in EXPONENT_NAMES and not spread <= rules.max_exponent_width:
            reasons.append(Reason("exponent_width", f"{SYMBOL[name]}'s bootstrap interval [{_g(lo_hi[0])}, "
                                  f"{_g(lo_hi[1])}] is {_g(spread)} wide > ladder.max_exponent_width = "
                                  f"{rules.max_exponent_width:g}",
                                  "spread the rungs wider in " + ("N (ladder.widths)" if name == "alpha" else
                                                                  "D (ladder.steps)") + " or add rungs"))
    if not result.extrapolation <= rules.max_extrapolation:
        reasons.append(Reason("extrapolation", f"the target's compute {target_compute:.3g} FLOPs is "
                              f"{result.extrapolation:.3g}× the largest rung's {compute_max:.3g} (C = 6·N·D) > "
                              f"ladder.max_extrapolation = {rules.max_extrapolation:g}×",
                              "add rungs nearer the main run (larger ladder.widths or ladder.steps)"))
    if result.backtest is None:
        reasons.append(Reason("backtest", f"no backtest: {result.backtest_note}",
                              f"add sizes/budgets: a decided forecast needs ≥ {min_rungs()} fitted rungs"))
    elif not abs(result.backtest["relative_error"]) <= rules.forecast_tolerance:
        bt = result.backtest
        reasons.append(Reason("backtest", f"the backtest (the largest fitted rung, N {bt['n_params']:.3g}, D "
                              f"{bt['tokens']:.3g}, forecast from the others) missed by {bt['relative_error']:+.1%}, "
                              f"beyond ladder.forecast_tolerance = ±{rules.forecast_tolerance:.0%}",
                              "add sizes/budgets nearer the main run; the law does not extrapolate across this ladder"))
    worst = max((abs(g["relative_error"]) for g in result.goodness), default=math.nan)
    if result.goodness and not worst <= rules.forecast_tolerance:
        reasons.append(Reason("heldout", f"the held-out relative error {worst:.1%} exceeds the tolerance "
                              f"{rules.forecast_tolerance:.0%}",
                              "add sizes/budgets nearer the main run (ladder.widths, ladder.steps)"))
    if not result.finite_interval:
        reasons.append(Reason("interval", f"the forecast {result.predicted} [{result.low}, {result.high}] is not a "
                              "finite value inside a finite interval",
                              "check the rungs' losses (points.parquet) and add rungs"))
    elif not result.high - result.low > 1e-9 * abs(result.predicted):  # rounding-level width: none at all
        reasons.append(Reason("interval", f"the interval [{result.low:.6g}, {result.high:.6g}] has zero width: the "
                              "bootstrap and the checks see no error (rungs fitted exactly)",
                              "measure the rungs' noise: add rungs or seeds"))
    return reasons


def forecast_from_points(n, d, loss, held_out, target_n: float, target_d: float, rules: Any,
                         seed: int = 0) -> LadderForecast:
    """Fit L(N, D) = E + A/N^α + B/D^β to the rungs not held out, forecast L(target_n, target_d) with its interval,
    check it on the held-out rungs and by the backtest, and judge it under ``rules`` (module docstring).

    Args:
        n, d, loss: (m,) parameters, tokens and measured loss (nats/token) of each rung; every value finite and
            positive (leave failed rungs out).
        held_out: (m,) bool, rungs left out of the fit and only checked (None: none).
        target_n, target_d: the forecast's N and D.
        rules: a ``ForecastRules`` or anything with its attributes (a ``LadderConfig``).
        seed: seeds the bootstrap (the backtest's uses seed + 1; the two run as one batch, ``fit.bootstrap_many``).

    Returns:
        A ``LadderForecast``; ``verdict`` is ``decided`` when no rule failed, else its ``reasons`` say why.

    Raises:
        DataError: a bad input (the field and the fix named), or fewer than 3 rungs to fit.
    """
    rules = ForecastRules.of(rules)
    n, d, loss, held = _arrays(n, d, loss, held_out)
    if not all(math.isfinite(x) and x > 0 for x in (target_n, target_d)):
        raise DataError(f"ladder forecast: target N {target_n}, D {target_d} must be positive and finite")
    fit = ~held
    form = choose_form(int(fit.sum()))
    law, objective = fit_law(n[fit], d[fit], loss[fit], form)
    dropped, rest, backtest_note = _backtest_rungs(n, d, fit, form)
    jobs = [(np.ones(int(fit.sum()), dtype=bool), law, seed)]
    if dropped >= 0:
        backtest_law, _ = fit_law(n[rest], d[rest], loss[rest], form)
        jobs.append((np.isin(np.flatnonzero(fit), rest), backtest_law, seed + 1))
    # One batch for the fit's bootstrap and the backtest's: their resamples advance together.
    laws, *backtest_laws = bootstrap_many(n[fit], d[fit], loss[fit], jobs, rules.bootstrap)
    c = rules.confidence
    point_predicted = np.asarray(law.loss(n, d), dtype=float)
    point_low, point_high = point_intervals(laws, n, d, c)
    goodness = [_check(int(j), n, d, loss, law, laws, c) for j in np.flatnonzero(held)]
    backtest = _backtest(dropped, rest, n, d, loss, backtest_law, backtest_laws[0], c) if dropped >= 0 else None

    predicted = float(law.loss(target_n, target_d))
    (boot_low,), (boot_high,) = point_intervals(laws, target_n, target_d, c)
    boot_low, boot_high = float(boot_low), float(boot_high)
    widened = math.isfinite(boot_low) and not (boot_low <= predicted <= boot_high)
    compute = 6.0 * n * d
    target_compute = 6.0 * float(target_n) * float(target_d)
    centre = float(np.log(compute[fit]).mean())
    model_error = _model_error(predicted, math.log(target_compute), centre, goodness, backtest)
    low, high = interval(predicted, boot_low, boot_high, model_error)
    intervals = law_intervals(laws, c)
    result = LadderForecast(
        form=form, law=law, objective=objective, laws=laws, intervals=intervals, predicted=predicted, low=low,
        high=high, bootstrap_low=boot_low, bootstrap_high=boot_high, model_error=model_error, widened=widened,
        extrapolation=target_compute / float(compute.max()), point_predicted=point_predicted,
        point_low=point_low, point_high=point_high, goodness=goodness, backtest=backtest,
        backtest_note=backtest_note, spreads=_spreads(intervals, form), fitted=int(fit.sum()),
        levels=(len(np.unique(n[fit])), len(np.unique(d[fit]))))
    result.reasons = _reasons(result, rules, float(loss[fit].min()), float(compute.max()), target_compute)
    if backtest is not None:
        backtest.pop("_scale_from", None)
    return result


def point_intervals(laws: list[ScalingLaw], n, d, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """The bootstrap percentile interval of L at each (n, d) (arrays (m,)) over ``laws``: (low (m,), high (m,)),
    NaN where no law gives a finite value."""
    n, d = np.atleast_1d(np.asarray(n, dtype=float)), np.atleast_1d(np.asarray(d, dtype=float))
    constants = np.array([[law.E, law.A, law.alpha, law.B, law.beta] for law in laws], dtype=float).reshape(-1, 5, 1)
    with np.errstate(over="ignore", invalid="ignore"):  # an inf or NaN from a wild resample is left out
        values = constants[:, 0] + constants[:, 1] / n ** constants[:, 2] + constants[:, 3] / d ** constants[:, 4]
    low, high = np.full(len(n), np.nan), np.full(len(n), np.nan)
    for j in range(len(n)):
        low[j], high[j] = percentile_interval(values[:, j], confidence)
    return low, high


def _model_error(predicted: float, log_target: float, centre: float, goodness: list[dict],
                 backtest: dict | None) -> float:
    """m = L̂ · max_j |e_j| · κ_j over the out-of-sample checks (module docstring), nats/token; 0 when there is
    none. ``centre``: the fitted rungs' mean log compute, the origin of the held-out rungs' reach."""
    scaled = []
    for check in goodness + ([backtest] if backtest is not None else []):
        origin = check.get("_scale_from", centre)
        reach = math.log(6.0 * check["n_params"] * check["tokens"]) - origin
        kappa = max(1.0, (log_target - centre) / reach) if reach > 0 else 1.0
        scaled.append(abs(check["relative_error"]) * kappa)
    return predicted * max(scaled) if scaled and math.isfinite(predicted) else 0.0


def interval(predicted: float, boot_low: float, boot_high: float, model_error: float) -> tuple[float, float]:
    """The bootstrap interval (first widened to contain ``predicted``) with each side lengthened by
    ``model_error`` (nats/token): (min(b₋, L̂) − m, max(b₊, L̂) + m). NaN, NaN when the bootstrap interval is not
    finite. The sum rather than the quadrature sum: chosen by the coverage study (module docstring)."""
    if not all(map(math.isfinite, (predicted, boot_low, boot_high))):
        return math.nan, math.nan
    return min(boot_low, predicted) - model_error, max(boot_high, predicted) + model_error


def decision_of(forecast: dict[str, Any]):
    """The ``DecisionRecord`` of a ``forecast.json`` (null numbers read back as NaN)."""
    from evals.decision import DecisionRecord

    data = dict(forecast["decision"])
    for name in ("estimate", "low", "high", "confidence"):
        if data.get(name) is None:
            data[name] = math.nan
    return DecisionRecord.from_dict(data)
