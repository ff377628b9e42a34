"""The fit of L(N, D) = E + A/N^α + B/D^β to ladder points, its bootstrap and the compute-optimal allocation
(Hoffmann et al. 2022, approach 3; docs/methods.md §5).

Units: N parameters (the ladder uses non-embedding parameters), D tokens, L nats/token, C FLOPs (C = 6·N·D).

As Hoffmann et al. (2022) did, the fit minimises the Huber loss (δ = 1e-3) between log L̂ and log L, with
L̂ = exp(LSE(a − α·log N, b − β·log D, e)), A = e^a, B = e^b, E = e^e, from the best points of a grid of
initialisations (a, b ∈ {0, 5, …, 25}, e ∈ {−1, −0.5, …, 2}, α, β ∈ {0, 0.5, …, 2}); the best of the local optima
is kept. The optimiser (``_solve``) is Levenberg–Marquardt on the iteratively reweighted least-squares majoriser of
the Huber loss (Holland & Welsch 1977), every start and bootstrap resample advancing as one numpy batch; it reaches
the optima of scipy's L-BFGS-B (tests/unit/test_ladder_forecast.py) an order of magnitude faster, which the coverage
study (benchmarks/coverage_ladder.py) needs. The intervals resample the ladder points with replacement and refit
(Efron 1979), percentile intervals.

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
POINT_STARTS = 16  # optimiser runs from the best grid points
MAX_ITER = 400  # Levenberg–Marquardt iterations per start (most rows stop after 20–80)


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
    """Huber loss divided by δ (the minimiser is the same; the scale keeps the optimiser's tolerances meaningful)."""
    small = np.abs(r) <= HUBER_DELTA
    return np.where(small, 0.5 * r * r / HUBER_DELTA, np.abs(r) - 0.5 * HUBER_DELTA)


def _objective(theta: np.ndarray, form: str, log_n: np.ndarray, log_d: np.ndarray,
               log_l: np.ndarray) -> tuple[float, np.ndarray]:
    """Σ Huber_δ(r)/δ of one parameter vector (k,) of ``FORMS[form]`` and its analytic gradient: the objective as
    scipy's L-BFGS-B takes it, the reference ``_solve`` is tested against (with ``_bounds``)."""
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


def _jacobian(theta: np.ndarray, form: str, log_n, log_d, log_l) -> tuple[np.ndarray, np.ndarray]:
    """Residuals r = log L̂ − log L (R, m) and their Jacobian ∂r/∂θ (R, m, k) for rows (R, k) of the solver's
    parameters: those of ``FORMS`` with E itself in place of e = log E (see ``_solve``)."""
    a, b, floor, alpha, beta = (None if p is None else np.asarray(p)[..., None] for p in _parts(theta, form))
    t_n, t_d = a - alpha * log_n, b - beta * log_d
    lse = np.logaddexp(t_n, t_d)
    if floor is not None:
        with np.errstate(divide="ignore"):  # log 0 = −inf: no floor term
            lse = np.logaddexp(lse, np.log(floor))
    soft_n, soft_d = np.exp(t_n - lse), np.exp(t_d - lse)  # ∂ log L̂ / ∂ a, ∂ b
    d_alpha, d_beta = -soft_n * log_n, -soft_d * log_d
    columns = {"a": soft_n, "b": soft_d, "e": np.exp(-lse) if floor is not None else None, "beta": d_beta,
               "alpha": d_alpha if form == "full" else d_alpha + d_beta}
    return lse - log_l, np.stack([columns[name] for name in FORMS[form]], axis=-1)


def _solve(starts: np.ndarray, form: str, log_n, log_d, log_l, weights: np.ndarray | None = None,
           max_iter: int = MAX_ITER) -> tuple[np.ndarray, np.ndarray]:
    """Minimise Σ_j w_j · Huber_δ(log L̂_j − log L_j)/δ from every row of ``starts`` (R, k) at once; returns the
    optima (R, k) and their objectives (R,). ``weights`` (R, m): each row's point multiplicities (a bootstrap
    resample), default 1.

    Levenberg–Marquardt on the iteratively reweighted least-squares majoriser of the Huber loss (weights
    1/max(|r|, δ); Holland & Welsch 1977), projected on ``EXPONENT_BOUNDS`` with the exponents that press on a
    bound held there; a step is kept only when it lowers the Huber objective itself, so every row descends
    monotonically. E is optimised as itself, bounded below by 0, rather than as e = log E: a floor the data do not
    support reaches 0 in a few steps instead of crawling towards e = −∞. A row stops after 4 iterations without a
    relative decrease above 1e-10, when its damping exceeds 1e12, or at ``max_iter``. Rows are independent: one batch
    of numpy operations advances all of them, so a thousand bootstrap refits take a fraction of a second.
    """
    theta = np.array(starts, dtype=float, ndmin=2)
    rows, k = theta.shape
    w = np.ones((rows, len(log_l))) if weights is None else np.asarray(weights, dtype=float)
    names = FORMS[form]
    floor = names.index("e") if "e" in names else None
    if floor is not None:  # E itself, bounded below by 0 (see above)
        theta[:, floor] = np.exp(theta[:, floor])
    bounds = np.array([EXPONENT_BOUNDS if name in ("alpha", "beta") else (0.0, np.inf) if name == "e"
                       else (-np.inf, np.inf) for name in names])
    theta = np.clip(theta, bounds[:, 0], bounds[:, 1])
    r, jac = _jacobian(theta, form, log_n, log_d, log_l)
    value = (w * _huber(r)).sum(axis=-1)
    lam = np.full(rows, 1e-3)
    still = np.zeros(rows, dtype=int)  # consecutive iterations without a meaningful decrease
    active = np.arange(rows)
    eye = np.eye(k)
    for _ in range(max_iter):
        # Only the rows still moving are computed: most stop within 20–80 iterations, a few crawl much longer.
        t, rr, jj, ww, lm = theta[active], r[active], jac[active], w[active], lam[active]
        omega = ww / np.maximum(np.abs(rr), HUBER_DELTA)  # the majoriser's weights
        grad = np.einsum("rm,rmk->rk", omega * rr, jj)
        hess = np.einsum("rmk,rm,rml->rkl", jj, omega, jj)
        pinned = ((t <= bounds[:, 0]) & (grad > 0)) | ((t >= bounds[:, 1]) & (grad < 0))
        diag = np.diagonal(hess, axis1=1, axis2=2)
        damp = lm[:, None] * (diag + 1e-9 * diag.max(axis=1, keepdims=True) + 1e-12)
        system = np.where(pinned[:, :, None] | pinned[:, None, :], eye, hess + damp[:, :, None] * eye)
        step = -np.linalg.solve(system, np.where(pinned, 0.0, grad)[..., None])[..., 0]
        trial = np.clip(t + step, bounds[:, 0], bounds[:, 1])
        r_new, jac_new = _jacobian(trial, form, log_n, log_d, log_l)
        value_new = (ww * _huber(r_new)).sum(axis=-1)
        ok = np.isfinite(value_new) & (value_new < value[active])
        gain = np.where(ok, value[active] - value_new, 0.0)
        moved = np.abs(trial - t).max(axis=1) > 1e-10
        still[active] = np.where((gain > 1e-10 * (1.0 + value[active])) & moved, 0, still[active] + 1)
        keep = active[ok]
        theta[keep], r[keep], jac[keep], value[keep] = trial[ok], r_new[ok], jac_new[ok], value_new[ok]
        lam[active] = np.where(ok, np.maximum(lm / 3.0, 1e-12), lm * 4.0)
        active = active[(still[active] < 4) & (lam[active] < 1e12)]
        if not len(active):
            break
    if floor is not None:
        with np.errstate(divide="ignore"):
            theta[:, floor] = np.log(theta[:, floor])  # E = 0 → e = −inf, an exact zero floor
    return theta, value


def _minimise(starts: np.ndarray, form: str, log_n, log_d, log_l) -> tuple[np.ndarray, float]:
    """The best optimum over ``starts`` (the rows run together, ``_solve``)."""
    theta, value = _solve(starts, form, log_n, log_d, log_l)
    value = np.where(np.isnan(theta).any(axis=1), np.inf, value)
    best = int(np.argmin(value))
    return theta[best], float(value[best])


def _law(theta: np.ndarray, form: str) -> ScalingLaw:
    a, b, e, alpha, beta = (None if p is None else float(p) for p in _parts(np.asarray(theta), form))
    return ScalingLaw(E=0.0 if e is None else math.exp(e), A=math.exp(a), alpha=alpha, B=math.exp(b), beta=beta,
                      form=form)


def _theta(law: ScalingLaw) -> np.ndarray:
    values = {"a": math.log(law.A) if law.A > 0 else -700.0, "b": math.log(law.B) if law.B > 0 else -700.0,
              "e": math.log(law.E) if law.E > 0 else -30.0,
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
    hundred times more for the same optimum). All refits run as one batch (``_solve``).
    """
    return bootstrap_many(n, d, loss, [(np.ones(len(np.atleast_1d(n)), dtype=bool), law, seed)], resamples)[0]


def bootstrap_many(n, d, loss, fits: list[tuple[np.ndarray, ScalingLaw, int]],
                   resamples: int) -> list[list[ScalingLaw]]:
    """``bootstrap_laws`` of several fits to subsets of one set of points, run as one batch: ``fits`` holds
    (mask (m,) bool of the points fitted, the law fitted to them, seed), all of one form. Returns one list of
    ``resamples`` laws per fit, each the same as ``bootstrap_laws`` on that subset with that seed gives.

    Raises:
        DataError: the points are not positive and finite, or the fits differ in form.
    """
    log_n, log_d, log_l = _logs(n, d, loss)
    m = len(log_n)
    forms = {law.form for _, law, _ in fits}
    if len(forms) != 1:
        raise DataError(f"bootstrap_many: one form per batch; got {sorted(forms)}")
    form = forms.pop()
    grid = _grid(form)
    starts, weights, seconds = [], [], []  # seconds: the resamples that also start from a grid point
    for mask, law, seed in fits:
        index = np.flatnonzero(mask)
        sub = (log_n[index], log_d[index], log_l[index])
        candidates = grid[np.argsort(_grid_values(grid, form, *sub))[:POINT_STARTS]]
        rng, start = np.random.default_rng(seed), _theta(law)
        picks = rng.integers(0, len(index), (resamples, len(index)))
        w = np.zeros((resamples, m))
        w[:, index] = (picks[:, :, None] == np.arange(len(index))).sum(axis=1)  # multiplicity of each point
        cand_values = w[:, index] @ _huber(_lse(_terms(candidates, form, sub[0], sub[1])) - sub[2]).T
        start_values = w[:, index] @ _huber(_lse(_terms(start, form, sub[0], sub[1])) - sub[2])
        best = np.argmin(cand_values, axis=1)
        second = np.flatnonzero(cand_values[np.arange(resamples), best] < start_values)
        starts += [np.broadcast_to(start, (resamples, len(start))), candidates[best[second]]]
        weights += [w, w[second]]
        seconds.append(second)
    theta, value = _solve(np.vstack(starts), form, log_n, log_d, log_l, np.vstack(weights))
    value = np.where(np.isnan(theta).any(axis=1), np.inf, value)
    chosen, row = [], 0
    for second in seconds:  # per resample, the grid start's optimum replaces the first when lower
        pick = row + np.arange(resamples)
        alt = row + resamples + np.arange(len(second))
        better = value[alt] < value[pick[second]]
        pick[second[better]] = alt[better]
        chosen.append(pick)
        row += resamples + len(second)
    return [[_law(theta[i], form) for i in pick] for pick in chosen]


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
