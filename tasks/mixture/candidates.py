"""Turn mixture candidates into per-source sampling weights, and check how often each source repeats.

Formulas (docs/methods.md §8):
    temperature sampling  p_s = q_s^α / Σ_t q_t^α, with q_s = n_s / Σ_t n_t the natural token share;
    over languages        p_ℓ = q_ℓ^α / Σ_m q_m^α, q_ℓ = Σ_{s in ℓ} n_s / Σ_t n_t, then w_s = p_ℓ · n_s / n_ℓ
                          (Conneau et al. 2020, XLM-R; Arivazhagan et al. 2019: the rule is stated per language);
    epochs of source s    e_s = w_s · D / U_s (D main-run tokens, U_s unique tokens of s).
Up to ~4 epochs of a small high-quality source is almost as good as fresh data (docs/methods.md §8), hence the default limit.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from infra.errors import ConfigError, DataError
from tasks.mixture.config import MixtureConfig, MixtureGenerate, check_alpha
from tasks.mixture.design import grid_mixtures, simplex_mixtures


@dataclass(frozen=True)
class ResolvedCandidate:
    """A candidate with concrete weights for every known source (weights sum to 1; ``alpha`` None if explicit;
    ``alpha_over`` what the temperature was applied over, "source" or "language")."""

    name: str
    weights: dict[str, float]
    alpha: float | None
    alpha_over: str = "source"


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


def language_temperature_weights(sizes: dict[str, int], languages: Mapping[str, str], alpha: float) -> dict[str, float]:
    """Sampling weights with the temperature applied over languages (Conneau et al. 2020, XLM-R; Arivazhagan
    et al. 2019): p_ℓ = q_ℓ^α / Σ_m q_m^α with q_ℓ = n_ℓ / N the natural token share of language ℓ (n_ℓ the tokens
    of its sources), and within a language every source keeps its natural share: w_s = p_ℓ · n_s / n_ℓ.

    With one source per language this is :func:`temperature_weights`; α = 1 is the natural mixture whatever the
    languages; α = 0 gives every language with tokens the same total weight.

    Args:
        sizes: tokens per source.
        languages: source → language (e.g. ``"en"``); every source with tokens needs one.
        alpha: temperature in [0, 1].

    Returns:
        Weights keyed like ``sizes``, summing to 1; a source with 0 tokens gets weight 0.

    Raises:
        ConfigError: ``alpha`` outside [0, 1], or a source with tokens has no language (naming the sources and
            the field to set).
        DataError: ``sizes`` empty, negative, or all zero.
    """
    check_alpha(alpha, "alpha")
    _check_sizes(sizes, "sizes")
    missing = sorted(s for s, n in sizes.items() if n > 0 and not languages.get(s))
    if missing:
        raise ConfigError(f"temperature over languages needs each source's language; {missing} have none: set "
                          f"sources.<name>.language (e.g. language = \"en\") for them")
    by_language: dict[str, int] = {}
    for source, n in sizes.items():
        if n > 0:
            by_language[languages[source]] = by_language.get(languages[source], 0) + n
    per_language = temperature_weights(by_language, alpha)
    return {s: per_language[languages[s]] * n / by_language[languages[s]] if n > 0 else 0.0
            for s, n in sizes.items()}


def resolve_candidates(cfg: MixtureConfig, sizes: dict[str, int],
                       languages: Mapping[str, str | None] | None = None) -> list[ResolvedCandidate]:
    """Concrete weights for every candidate, in config order.

    Args:
        cfg: the mixture section.
        sizes: tokens per known source.
        languages: source → language (``sources.<name>.language``); read only by candidates with
            ``alpha_over = "language"``.

    Raises:
        ConfigError: explicit weights name an unknown source, leave out a known one, or put weight on a source
            with 0 tokens (names the candidate and the source); a candidate over languages meets a source
            without a language.
        DataError: ``sizes`` empty, negative, or all zero.
    """
    _check_sizes(sizes, "sizes")
    resolved = []
    for candidate in cfg.candidates:
        if candidate.alpha is not None and candidate.alpha_over == "language":
            try:
                weights = language_temperature_weights(sizes, {s: l for s, l in (languages or {}).items() if l},
                                                        candidate.alpha)
            except ConfigError as err:
                raise ConfigError(f"mixture.candidates[{candidate.name!r}].alpha_over = 'language': {err}") from None
        elif candidate.alpha is not None:
            weights = temperature_weights(sizes, candidate.alpha)
        else:
            weights = _explicit_weights(candidate.name, candidate.weights, sizes)
        resolved.append(ResolvedCandidate(candidate.name, weights, candidate.alpha, candidate.alpha_over))
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
