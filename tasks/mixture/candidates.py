"""Turn mixture candidates into per-source sampling weights, and check how often each source repeats.

Formulas (docs/methods.md §8):
    temperature sampling  p_s = q_s^α / Σ_t q_t^α, with q_s = n_s / Σ_t n_t the natural token share;
    epochs of source s    e_s = w_s · D / U_s (D main-run tokens, U_s unique tokens of s).
Up to ~4 epochs of a small high-quality source is almost as good as fresh data (docs/methods.md §8), hence the default limit.
"""

from dataclasses import dataclass

from infra.errors import ConfigError, DataError
from tasks.mixture.config import MixtureConfig, MixtureGenerate, check_alpha
from tasks.mixture.design import grid_mixtures, simplex_mixtures


@dataclass(frozen=True)
class ResolvedCandidate:
    """A candidate with concrete weights for every known source (weights sum to 1; ``alpha`` None if explicit)."""

    name: str
    weights: dict[str, float]
    alpha: float | None


def _check_sizes(sizes: dict[str, int], what: str) -> None:
    if not sizes:
        raise DataError(f"{what} is empty: need the token count of at least one source")
    bad = {s: n for s, n in sizes.items() if n < 0}
    if bad:
        raise DataError(f"{what} has negative token counts {bad}: counts must be ≥ 0")
    if sum(sizes.values()) == 0:
        raise DataError(f"{what} are all zero: at least one source must have tokens")


def temperature_weights(sizes: dict[str, int], alpha: float) -> dict[str, float]:
    """Sampling weights p_s ∝ q_s^α over sources (docs/methods.md §8), keyed like ``sizes``.

    Args:
        sizes: tokens per source (the natural shares q come from these).
        alpha: temperature in [0, 1]; 1 keeps the natural shares, 0 gives every non-empty source the same weight.

    Returns:
        Weights summing to 1; a source with 0 tokens gets weight 0.

    Raises:
        ConfigError: ``alpha`` outside [0, 1].
        DataError: ``sizes`` empty, negative, or all zero.
    """
    check_alpha(alpha, "alpha")
    _check_sizes(sizes, "sizes")
    total = sum(sizes.values())
    powered = {s: (n / total) ** alpha if n > 0 else 0.0 for s, n in sizes.items()}
    norm = sum(powered.values())
    return {s: p / norm for s, p in powered.items()}


def resolve_candidates(cfg: MixtureConfig, sizes: dict[str, int]) -> list[ResolvedCandidate]:
    """Concrete weights for every candidate, in config order.

    Args:
        cfg: the mixture section.
        sizes: tokens per known source.

    Raises:
        ConfigError: explicit weights name an unknown source, leave out a known one, or put weight on a source
            with 0 tokens (names the candidate and the source).
        DataError: ``sizes`` empty, negative, or all zero.
    """
    _check_sizes(sizes, "sizes")
    resolved = []
    for candidate in cfg.candidates:
        if candidate.alpha is not None:
            weights = temperature_weights(sizes, candidate.alpha)
        else:
            weights = _explicit_weights(candidate.name, candidate.weights, sizes)
        resolved.append(ResolvedCandidate(candidate.name, weights, candidate.alpha))
    if cfg.generate is not None:
        resolved += generated_candidates(cfg.generate, sizes)
    return resolved


def generated_candidates(gen: MixtureGenerate, sizes: dict[str, int]) -> list[ResolvedCandidate]:
    """The ``[mixture.generate]`` candidates over the sources with tokens, named ``<kind>-<i>`` (1-based);
    sources without tokens get weight 0."""
    active = [s for s in sizes if sizes[s] > 0]
    if gen.kind == "grid":
        mixtures = grid_mixtures(active, gen.step, gen.count)
    else:
        mixtures = simplex_mixtures(active, gen.count, gen.seed, gen.concentration)
    return [ResolvedCandidate(f"{gen.kind}-{i}", {s: m.get(s, 0.0) for s in sizes}, None)
            for i, m in enumerate(mixtures, start=1)]


def _explicit_weights(name: str, weights: dict[str, float], sizes: dict[str, int]) -> dict[str, float]:
    where = f"mixture.candidates[{name!r}].weights"
    unknown = sorted(set(weights) - set(sizes))
    if unknown:
        raise ConfigError(f"{where} names unknown source(s) {unknown}: known sources are {sorted(sizes)}")
    missing = sorted(set(sizes) - set(weights))
    if missing:
        raise ConfigError(f"{where} leaves out source(s) {missing}: give every known source a weight (0 is allowed)")
    empty = sorted(s for s, w in weights.items() if w > 0 and sizes[s] == 0)
    if empty:
        raise ConfigError(f"{where} puts weight on source(s) {empty} that have 0 tokens: set their weight to 0")
    return {s: float(weights[s]) for s in sizes}
