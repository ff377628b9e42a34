"""Exact deduplication (docs/methods.md §7): normalise (lower-case, collapse whitespace), hash with xxh3-128, keep first."""

import re
from collections.abc import Sequence

import xxhash

_SPACE_RE = re.compile(r"\s+")


def normal_form(text: str) -> str:
    """Lower-cased text with every whitespace run collapsed to one space, stripped."""
    return _SPACE_RE.sub(" ", text.lower()).strip()


def exact_duplicates(texts: Sequence[str]) -> list[int | None]:
    """For each text, the index of the first earlier text with the same normal form, or None if it is first."""
    first: dict[bytes, int] = {}
    out: list[int | None] = []
    for i, text in enumerate(texts):
        key = xxhash.xxh3_128_digest(normal_form(text).encode("utf-8"))
        out.append(first.get(key))
        first.setdefault(key, i)
    return out
