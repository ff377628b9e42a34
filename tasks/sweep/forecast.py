"""Loss forecast from the early part of a training curve: L(D) = L∞ + a·D^−γ (docs/methods.md §10).

The fit is made on the points up to a fraction of the run and judged by how well it predicts the last point. Two
fit windows are reported side by side, because the forecast is only as good as its sensitivity to the window
(docs/methods.md §10: "show sensitivity to the fit window").
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit

from infra.errors import DataError

MIN_POINTS = 3  # three parameters


def power_law(d: np.ndarray, l_inf: float, a: float, gamma: float) -> np.ndarray:
    """L(D) = L∞ + a·D^−γ, D in tokens, L in nats/token."""
    return l_inf + a * np.power(d, -gamma)


@dataclass(frozen=True)
class Forecast:
    """One fit: the window (share of the curve's tokens, points used), the parameters, and the prediction at the
    curve's last point against what was measured there (nats/token; ``error`` = predicted − actual)."""

    window: float
    points: int
    l_inf: float
    a: float
    gamma: float
    target_tokens: int
    predicted: float
    actual: float
    error: float

    def as_dict(self) -> dict:
        return asdict(self)


def fit_power_law(tokens: Sequence[float], losses: Sequence[float]) -> tuple[float, float, float]:
    """Least-squares (L∞, a, γ) of ``power_law`` through the points (tokens > 0, finite losses).

    Raises:
        DataError: fewer than three usable points, or the fit does not converge.
    """
    d = np.asarray(tokens, dtype=float)
    loss = np.asarray(losses, dtype=float)
    usable = (d > 0) & np.isfinite(loss)
    d, loss = d[usable], loss[usable]
    if len(d) < MIN_POINTS:
        raise DataError(f"a loss forecast needs at least {MIN_POINTS} points with tokens > 0; got {len(d)}: report "
                        "held-out loss more often (sweep.report_every) or train longer")
    # Start from a flat floor just under the lowest loss and a decay fitted through the first and last points.
    l0 = float(loss.min()) * 0.9
    start = (l0, max(float(loss[0] - l0), 1e-6) * float(d[0]) ** 0.3, 0.3)
    try:
        with warnings.catch_warnings():  # an exact fit (3 points) has no covariance; only the parameters are used
            warnings.simplefilter("ignore", OptimizeWarning)
            params, _ = curve_fit(power_law, d, loss, p0=start, bounds=([0.0, 0.0, 1e-3], [np.inf, np.inf, 3.0]),
                                  maxfev=20_000)
    except (RuntimeError, ValueError) as err:
        raise DataError(f"the power-law fit did not converge on {len(d)} points: {err}") from err
    return float(params[0]), float(params[1]), float(params[2])


def forecast(tokens: Sequence[float], losses: Sequence[float], windows: Sequence[float] = (0.3, 0.6)) -> list[Forecast]:
    """Fit on the points with tokens ≤ window × the last point's tokens, predict the last point; one Forecast per
    window (a window with fewer than three points is skipped).

    Raises:
        DataError: the curve is empty, or no window holds enough points.
    """
    d = np.asarray(tokens, dtype=float)
    loss = np.asarray(losses, dtype=float)
    if len(d) == 0:
        raise DataError("a loss forecast needs a curve; this one is empty")
    target, actual = float(d[-1]), float(loss[-1])
    results = []
    for window in windows:
        inside = d <= window * target + 1e-9
        if inside.sum() < MIN_POINTS:
            continue
        l_inf, a, gamma = fit_power_law(d[inside], loss[inside])
        predicted = float(power_law(np.array([target]), l_inf, a, gamma)[0])
        results.append(Forecast(window=float(window), points=int(inside.sum()), l_inf=l_inf, a=a, gamma=gamma,
                                target_tokens=int(target), predicted=predicted, actual=actual,
                                error=predicted - actual if math.isfinite(predicted) else math.nan))
    if not results:
        raise DataError(f"no fit window among {list(windows)} holds {MIN_POINTS} points of a {len(d)}-point curve: "
                        "report held-out loss more often (sweep.report_every)")
    return results
