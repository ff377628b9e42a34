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


def epochs(weights: dict[str, float], main_tokens: int, unique_tokens: dict[str, int]) -> dict[str, float]:
    """Epochs of each source over the main run: e_s = w_s · D / U_s (docs/methods.md §8).

    docs/methods.md §12 example: web 0.80 × 1,000B / 900B = 0.89, wiki 0.05 × 1,000B / 20B = 2.5,
    code 0.15 × 1,000B / 150B = 1.0.

    Args:
        weights: sampling weight per source.
        main_tokens: D, the planned main-run tokens.
        unique_tokens: U_s, unique tokens per source.

    Returns:
        Epochs per source (0 for weight 0).

    Raises:
        ConfigError: ``main_tokens`` ≤ 0.
        DataError: a weighted source is missing from ``unique_tokens`` or has 0 unique tokens.
    """
    if main_tokens <= 0:
        raise ConfigError(f"main_tokens = {main_tokens}: must be > 0 tokens")
    result = {}
    for source, weight in weights.items():
        if weight == 0:
            result[source] = 0.0
            continue
        unique = unique_tokens.get(source)
        if unique is None or unique <= 0:
            raise DataError(f"source {source!r} has weight {weight} but {unique} unique tokens: count its tokens first")
        result[source] = weight * main_tokens / unique
    return result


def epoch_warnings(epochs: dict[str, float], max_epochs: float) -> list[str]:
    """One message per source repeated more than ``max_epochs`` times (docs/methods.md §8: up to ~4 epochs is nearly free).

    Returns:
        Human-readable warnings, in source order; empty when every source is within the limit.
    """
    return [
        f"source {source!r} is repeated {e:.2f} epochs (> {max_epochs:g}): beyond ~4 epochs repeated tokens are worth "
        f"less than fresh ones (docs/methods.md §8); lower its weight or add unique data"
        for source, e in epochs.items()
        if e > max_epochs
    ]
