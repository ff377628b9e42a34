"""Cross-document boilerplate: lines and paragraphs repeated across many documents (SPEC §7 exact dedup).

Navigation bars, footers and licence paragraphs survive document-level deduplication because each page around them
differs. A unit (a line, or a paragraph of two or more lines) is keyed by the xxh3-64 hash of its normal form
(lower-cased, whitespace collapsed); units shorter than ``min_chars`` are never keyed, so short common lines ("Yes.",
"Notes") are left alone. Counting is per document (a unit repeated inside one page counts once) and is summed over
shards, so the decision is the same whatever the shard size.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
import xxhash

from tasks.corpus.dedup import normal_form

COUNT_COLUMNS = ["unit_hash", "n_docs", "example"]


def _paragraphs(text: str) -> list[list[str]]:
    """Paragraphs (blank-line separated) as lists of their lines."""
    return [block.split("\n") for block in text.split("\n\n")]


def _key(unit: str, min_chars: int) -> int | None:
    norm = normal_form(unit)
    if len(norm) < min_chars:
        return None
    return xxhash.xxh3_64_intdigest(norm.encode("utf-8"))


def unit_keys(text: str, min_chars: int) -> dict[int, str]:
    """Distinct unit hashes of one document → the unit's text (lines, plus paragraphs of two or more lines)."""
    keys: dict[int, str] = {}
    for lines in _paragraphs(text):
        if len(lines) > 1:
            joined = "\n".join(lines)
            key = _key(joined, min_chars)
            if key is not None:
                keys.setdefault(key, joined)
        for line in lines:
            key = _key(line, min_chars)
            if key is not None:
                keys.setdefault(key, line)
    return keys


def count_units(texts: Iterable[str], min_chars: int) -> pd.DataFrame:
    """Document frequency of every unit in ``texts``: columns ``COUNT_COLUMNS`` (hash uint64, docs, one example)."""
    counts: Counter[int] = Counter()
    examples: dict[int, str] = {}
    for text in texts:
        keys = unit_keys(text, min_chars)
        counts.update(keys.keys())
        for key, unit in keys.items():
            examples.setdefault(key, unit[:200])
    hashes = np.fromiter(counts.keys(), dtype=np.uint64, count=len(counts))
    return pd.DataFrame({"unit_hash": hashes, "n_docs": np.fromiter(counts.values(), dtype=np.int64, count=len(counts)),
                         "example": pd.array([examples[int(h)] for h in hashes], dtype="string")},
                        columns=COUNT_COLUMNS)


def frequent_units(counts: pd.DataFrame, min_docs: int) -> pd.DataFrame:
    """Units in at least ``min_docs`` documents, most frequent first (``counts`` may hold one row per shard)."""
    total = counts.groupby("unit_hash", sort=False).agg(n_docs=("n_docs", "sum"), example=("example", "first"))
    return total[total.n_docs >= min_docs].sort_values("n_docs", ascending=False).reset_index()


def strip_units(texts: Sequence[str], frequent: set[int], min_chars: int) -> tuple[list[str], list[int]]:
    """Remove frequent paragraphs, then frequent lines, from each text.

    Returns:
        (texts with those units cut and blank runs squeezed, number of lines removed per text).
    """
    if not frequent:
        return list(texts), [0] * len(texts)
    out, removed = [], []
    for text in texts:
        kept_paragraphs, n_removed = [], 0
        for lines in _paragraphs(text):
            if len(lines) > 1 and _key("\n".join(lines), min_chars) in frequent:
                n_removed += len(lines)
                continue
            kept = [ln for ln in lines if _key(ln, min_chars) not in frequent]
            n_removed += len(lines) - len(kept)
            if kept:
                kept_paragraphs.append("\n".join(kept))
        out.append("\n\n".join(kept_paragraphs).strip() if n_removed else text)
        removed.append(n_removed)
    return out, removed
