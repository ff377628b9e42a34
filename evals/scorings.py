"""How a cloze item's options are compared (docs/methods.md §10): the names of the scorings, for configs and the
gate's declaration to read without the scoring code (``evals.cloze``)."""

from __future__ import annotations

from typing import Literal

Scoring = Literal["sum", "per_token", "per_byte"]
SCORINGS: tuple[str, ...] = ("sum", "per_token", "per_byte")
NORMALISED_SCORINGS: tuple[str, ...] = ("per_token", "per_byte")


def check_scoring(scoring: str) -> str:
    """``scoring`` itself when it is one of ``SCORINGS``.

    Raises:
        ValueError: any other value, naming the allowed ones and what each divides by.
    """
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be 'sum' (summed log-probability), 'per_token' (divided by the option's "
                         f"tokens) or 'per_byte' (divided by its UTF-8 bytes), got {scoring!r}")
    return scoring
