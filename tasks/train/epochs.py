"""How often the main run repeats each source: e_s = w_s · D / U_s, and the warnings past a limit."""

from __future__ import annotations

from infra.errors import ConfigError, DataError

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
