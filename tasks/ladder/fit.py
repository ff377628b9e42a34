"""The fit of L(N, D) = E + A/N^α + B/D^β to ladder points, its bootstrap and the compute-optimal allocation
(Hoffmann et al. 2022, approach 3; docs/methods.md §5).

Units: N parameters (the ladder uses non-embedding parameters), D tokens, L nats/token, C FLOPs (C = 6·N·D).

As Hoffmann et al. (2022) did, the fit minimises the Huber loss (δ = 1e-3) between log L̂ and log L, with
L̂ = exp(LSE(a − α·log N, b − β·log D, e)), A = e^a, B = e^b, E = e^e, by L-BFGS from a grid of initialisations
(a, b ∈ {0, 5, …, 25}, e ∈ {−1, −0.5, …, 2}, α, β ∈ {0, 0.5, …, 2}); the best of the local optima is kept.
The intervals resample the ladder points with replacement and refit (Efron 1979), percentile intervals.

A fit with fewer points than parameters + 1 has no residual to judge it by, so fewer points take a reduced form:

- ``full``: E, A, α, B, β (5 parameters), from 6 points;
- ``shared_exponent``: β = α (4 parameters), from 5 points;
- ``shared_exponent_no_floor``: β = α and E = 0 (3 parameters: A, B, α), from 4 points (3 points fit it
  exactly, with nothing left to check it).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import minimize

from infra.errors import DataError
from models.planning import Chinchilla

HUBER_DELTA = 1e-3
EXPONENT_BOUNDS = (0.0, 4.0)  # a negative exponent would make loss grow with size or data
FORMS: dict[str, tuple[str, ...]] = {
    "full": ("a", "b", "e", "alpha", "beta"),
    "shared_exponent": ("a", "b", "e", "alpha"),
    "shared_exponent_no_floor": ("a", "b", "alpha"),
}
FORM_TEXT = {
    "full": "full form L = E + A/N^α + B/D^β (5 parameters)",
    "shared_exponent": "reduced form with a shared exponent β = α (4 parameters: E, A, B, α)",
    "shared_exponent_no_floor": "reduced form with a shared exponent β = α and no irreducible loss, E = 0 "
                                "(3 parameters: A, B, α)",
}
GRID = {"a": np.arange(0.0, 26.0, 5.0), "b": np.arange(0.0, 26.0, 5.0), "e": np.arange(-1.0, 2.01, 0.5),
        "alpha": np.arange(0.0, 2.01, 0.5), "beta": np.arange(0.0, 2.01, 0.5)}
POINT_STARTS = 16  # L-BFGS runs from the best grid points


@dataclass(frozen=True)
class ScalingLaw:
    """L(N, D) = E + A/N^α + B/D^β (N parameters, D tokens, L nats/token) and the form it was fitted in."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float
    form: str = "full"

    def loss(self, n, d):
        """L at ``n`` parameters and ``d`` tokens (scalars or arrays, broadcast)."""
        n, d = np.asarray(n, dtype=float), np.asarray(d, dtype=float)
        return self.E + self.A / n ** self.alpha + self.B / d ** self.beta

    def optimum(self, c: float) -> tuple[float, float]:
        """The loss-minimising (N, D) at compute C = 6·N·D FLOPs, closed form (Hoffmann et al. 2022, Eq. 4 and
        Appendix D.2): G = (αA/(βB))^(1/(α+β)), N_opt = G·(C/6)^(β/(α+β)), D_opt = C/(6·N_opt). NaN when an
        exponent or a coefficient is 0 (no interior optimum)."""
        if min(self.alpha, self.beta, self.A, self.B) <= 0:
            return math.nan, math.nan
        return Chinchilla(E=self.E, A=self.A, B=self.B, alpha=self.alpha, beta=self.beta).optimum(c)

    def as_dict(self) -> dict:
        return asdict(self)


def law_of(forecast: dict) -> ScalingLaw:
    """The fitted law of a ladder artifact's ``forecast.json``."""
    law = forecast["law"]
    return ScalingLaw(E=law["E"], A=law["A"], alpha=law["alpha"], B=law["B"], beta=law["beta"], form=law["form"])


def choose_form(n_points: int) -> str:
    """The richest form with at least (parameters + 1) points; ``shared_exponent_no_floor`` below that.

    Raises:
        DataError: fewer than 3 points (not even the 3-parameter form is determined).
    """
    for form, names in FORMS.items():
        if n_points >= len(names) + 1:
            return form
    if n_points >= len(FORMS["shared_exponent_no_floor"]):
        return "shared_exponent_no_floor"
    raise DataError(f"the scaling fit needs at least 3 ladder points; got {n_points}: add widths or budgets to "
                    "[ladder], or hold out fewer points")


def _parts(theta: np.ndarray, form: str) -> tuple:
    """(a, b, e or None, α, β) of parameter rows ``theta`` (..., k)."""
    if form == "full":
        return theta[..., 0], theta[..., 1], theta[..., 2], theta[..., 3], theta[..., 4]
    if form == "shared_exponent":
        return theta[..., 0], theta[..., 1], theta[..., 2], theta[..., 3], theta[..., 3]
    return theta[..., 0], theta[..., 1], None, theta[..., 2], theta[..., 2]


def _terms(theta: np.ndarray, form: str, log_n: np.ndarray, log_d: np.ndarray) -> np.ndarray:
    """The LSE terms (..., points, 2 or 3): a − α·log N, b − β·log D (and e)."""
    a, b, e, alpha, beta = (None if p is None else np.asarray(p)[..., None] for p in _parts(theta, form))
    terms = [a - alpha * log_n, b - beta * log_d]
    if e is not None:
        terms.append(np.broadcast_to(e, terms[0].shape))
    return np.stack(terms, axis=-1)


def _lse(terms: np.ndarray) -> np.ndarray:
    """log Σ exp over the last axis, shifted by the maximum so that nothing overflows."""
    top = terms.max(axis=-1)
    return top + np.log(np.exp(terms - top[..., None]).sum(axis=-1))


def _huber(r: np.ndarray) -> np.ndarray:
    """Huber loss divided by δ (the minimiser is the same; the scale keeps L-BFGS's tolerances meaningful)."""
    small = np.abs(r) <= HUBER_DELTA
    return np.where(small, 0.5 * r * r / HUBER_DELTA, np.abs(r) - 0.5 * HUBER_DELTA)


def _objective(theta: np.ndarray, form: str, log_n: np.ndarray, log_d: np.ndarray,
               log_l: np.ndarray) -> tuple[float, np.ndarray]:
    terms = _terms(theta, form, log_n, log_d)
    lse = _lse(terms)
    r = lse - log_l
    dr = np.clip(r / HUBER_DELTA, -1.0, 1.0)  # d huber/δ / dr
    w = np.exp(terms - lse[:, None]) * dr[:, None]  # softmax weights × the residual's pull
    grad = {"a": w[:, 0].sum(), "b": w[:, 1].sum(), "alpha_n": -(w[:, 0] * log_n).sum(),
            "beta_d": -(w[:, 1] * log_d).sum()}
    if form == "full":
        g = [grad["a"], grad["b"], w[:, 2].sum(), grad["alpha_n"], grad["beta_d"]]
    elif form == "shared_exponent":
        g = [grad["a"], grad["b"], w[:, 2].sum(), grad["alpha_n"] + grad["beta_d"]]
    else:
        g = [grad["a"], grad["b"], grad["alpha_n"] + grad["beta_d"]]
    return float(_huber(r).sum()), np.asarray(g, dtype=float)


def _grid(form: str) -> np.ndarray:
    return np.array(list(itertools.product(*(GRID[name] for name in FORMS[form]))), dtype=float)


def _grid_values(starts: np.ndarray, form: str, log_n, log_d, log_l) -> np.ndarray:
    lse = _lse(_terms(starts, form, log_n, log_d))
    return _huber(lse - log_l).sum(axis=-1)


def _bounds(form: str) -> list[tuple[float | None, float | None]]:
    return [EXPONENT_BOUNDS if name in ("alpha", "beta") else (None, None) for name in FORMS[form]]


def _minimise(starts: np.ndarray, form: str, log_n, log_d, log_l) -> tuple[np.ndarray, float]:
    """The best L-BFGS optimum over ``starts``."""
    best, best_value = starts[0], math.inf
    for start in starts:
        result = minimize(_objective, start, args=(form, log_n, log_d, log_l), jac=True, method="L-BFGS-B",
                          bounds=_bounds(form), options={"maxiter": 2000, "ftol": 1e-14, "gtol": 1e-10})
        if np.all(np.isfinite(result.x)) and result.fun < best_value:
            best, best_value = result.x, float(result.fun)
    return best, best_value


def _law(theta: np.ndarray, form: str) -> ScalingLaw:
    a, b, e, alpha, beta = (None if p is None else float(p) for p in _parts(np.asarray(theta), form))
    return ScalingLaw(E=0.0 if e is None else math.exp(e), A=math.exp(a), alpha=alpha, B=math.exp(b), beta=beta,
                      form=form)


def _theta(law: ScalingLaw) -> np.ndarray:
    values = {"a": math.log(law.A), "b": math.log(law.B), "e": math.log(law.E) if law.E > 0 else -30.0,
              "alpha": law.alpha, "beta": law.beta}
    return np.array([values[name] for name in FORMS[law.form]])


def _logs(n, d, loss) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n, d, loss = (np.asarray(x, dtype=float) for x in (n, d, loss))
    if not (n.shape == d.shape == loss.shape) or n.ndim != 1:
        raise DataError(f"scaling fit: N, D and L must be 1-D of one length; got shapes {n.shape}, {d.shape}, "
                        f"{loss.shape}")
    if not (np.all(n > 0) and np.all(d > 0) and np.all(loss > 0) and np.all(np.isfinite(loss))):
        raise DataError("scaling fit: N, D and L must be positive and finite")
    return np.log(n), np.log(d), np.log(loss)


def fit_law(n, d, loss, form: str = "full", starts: int = POINT_STARTS) -> tuple[ScalingLaw, float]:
    """The Huber fit of ``form`` through the points (N parameters, D tokens, L nats/token), and its objective
    (Σ Huber_δ(log L̂ − log L) / δ).

    Raises:
        DataError: shapes differ, a value is not positive and finite, or ``form`` is unknown.
    """
    if form not in FORMS:
        raise DataError(f"unknown scaling-law form {form!r}; one of {sorted(FORMS)}")
    log_n, log_d, log_l = _logs(n, d, loss)
    grid = _grid(form)
    order = np.argsort(_grid_values(grid, form, log_n, log_d, log_l))
    theta, value = _minimise(grid[order[:starts]], form, log_n, log_d, log_l)
    return _law(theta, form), value


def bootstrap_laws(n, d, loss, law: ScalingLaw, resamples: int, seed: int = 0) -> list[ScalingLaw]:
    """``law``'s form refitted on ``resamples`` resamples of the points drawn with replacement (Efron 1979).

    Each refit starts from the original fit's constants, and also from the best, on the resample, of the grid
    points the original fit started from when that one starts lower (a full grid search per resample would cost a
    hundred times more for the same optimum).
    """
    log_n, log_d, log_l = _logs(n, d, loss)
    grid = _grid(law.form)
    candidates = grid[np.argsort(_grid_values(grid, law.form, log_n, log_d, log_l))[:POINT_STARTS]]
    rng, start = np.random.default_rng(seed), _theta(law)
    laws = []
    for _ in range(resamples):
        pick = rng.integers(0, len(log_n), len(log_n))
        args = (log_n[pick], log_d[pick], log_l[pick])
        values = _grid_values(candidates, law.form, *args)
        best = int(np.argmin(values))
        starts = [start] + ([candidates[best]] if values[best] < _objective(start, law.form, *args)[0] else [])
        theta, _ = _minimise(np.array(starts), law.form, *args)
        laws.append(_law(theta, law.form))
    return laws


def percentile_interval(values, confidence: float) -> tuple[float, float]:
    """The (1 − c)/2 and (1 + c)/2 percentiles of the finite ``values`` (NaN, NaN when none is finite)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if not len(values):
        return math.nan, math.nan
    low, high = np.percentile(values, [50 * (1 - confidence), 50 * (1 + confidence)])
    return float(low), float(high)


def law_intervals(laws: list[ScalingLaw], confidence: float) -> dict[str, list[float]]:
    """Percentile interval of each constant over bootstrap laws: {E, A, alpha, B, beta: [low, high]}."""
    return {name: list(percentile_interval([getattr(law, name) for law in laws], confidence))
            for name in ("E", "A", "alpha", "B", "beta")}


def predict_interval(laws: list[ScalingLaw], n: float, d: float, confidence: float) -> tuple[float, float]:
    """Percentile interval of L(n, d) over bootstrap laws (nats/token)."""
    return percentile_interval([float(law.loss(n, d)) for law in laws], confidence)


def token_weighted_loss(frame, sources, *, tokens: str = "tokens") -> float:
    """Σ loss·tokens / Σ tokens over the rows of ``sources`` (nats/token): the held-out loss of the general sources
    as the main run's summary reports it per source, pooled by held-out tokens.

    Raises:
        DataError: no row of ``sources`` has held-out tokens.
    """
    rows = frame[frame["source"].isin(list(sources))]
    total = float(rows[tokens].sum()) if len(rows) else 0.0
    if total <= 0:
        raise DataError(f"no held-out tokens of the general sources {sorted(sources)} to pool a loss over")
    return float((rows["loss_nats"] * rows[tokens]).sum() / total)


def forecast_check(predicted: float, low: float, high: float, actual: float) -> dict:
    """The forecast against the measured loss (nats/token): error = predicted − actual, relative error =
    error / actual, covered = low ≤ actual ≤ high."""
    error = predicted - actual
    return {"predicted": predicted, "low": low, "high": high, "actual": actual, "error": error,
            "relative_error": error / actual, "covered": bool(low <= actual <= high)}
