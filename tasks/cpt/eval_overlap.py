"""Evaluation sets checked against the CPT training stream, in token 13-grams, before any CPT step.

The corpus stage already removed training documents that contain an evaluation text (docs/methods.md §7). CPT trains on a
new stream (domain sources plus replay), so the evaluation it is judged by is checked once more, in the unit the
model sees: a held-out window or a cloze item (context + correct continuation) that shares any 13-gram of token
ids with the stream's training split is listed and left out of every score — for the base and every candidate
alike, so the comparison stays paired.

13-grams are hashed to uint64 with a polynomial rolling hash; a hash collision can only add a false hit (an item
dropped needlessly), never hide a real one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from evals.cloze import ClozeItem

NGRAM = 13
_BASE = np.uint64(1_000_003)


def ngram_hashes(tokens: np.ndarray, n: int = NGRAM) -> np.ndarray:
    """uint64 hashes of every length-``n`` window of a 1-D token array (empty when shorter than ``n``)."""
    t = np.asarray(tokens, dtype=np.uint64)
    if len(t) < n:
        return np.empty(0, dtype=np.uint64)
    h = np.zeros(len(t) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):  # arithmetic modulo 2^64 is the hash
        for k in range(n):
            h = h * _BASE + t[k:len(t) - n + 1 + k] + np.uint64(1)
    return h


def training_ngrams(streams: Iterable[np.ndarray], n: int = NGRAM) -> np.ndarray:
    """Sorted unique 13-gram hashes of the training token streams (each stream hashed on its own)."""
    parts = [np.unique(ngram_hashes(s, n)) for s in streams]
    return np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.uint64)


def _count_members(hashes: np.ndarray, train: np.ndarray) -> int:
    """How many of ``hashes`` occur in the sorted array ``train`` (binary search: O(k log m))."""
    if len(train) == 0 or len(hashes) == 0:
        return 0
    idx = np.minimum(np.searchsorted(train, hashes), len(train) - 1)
    return int((train[idx] == hashes).sum())


def window_hits(windows: np.ndarray, train: np.ndarray, n: int = NGRAM) -> np.ndarray:
    """Per row of ``windows`` (N, T+1): how many of its 13-grams occur in ``train`` (sorted hashes). Shape (N,)."""
    return np.array([_count_members(ngram_hashes(row, n), train) for row in windows], dtype=np.int64)


def cloze_hits(items: Sequence[ClozeItem], encode: Callable[[str], list[int]], train: np.ndarray,
               n: int = NGRAM) -> np.ndarray:
    """Per item: 13-grams of the tokens of context + correct continuation found in ``train``. Shape (items,)."""
    return np.array([_count_members(ngram_hashes(np.array(encode(i.context + i.options[i.answer])), n), train)
                     for i in items], dtype=np.int64)


def hits_frame(kind: str, source: str, ids: Sequence[str], hits: np.ndarray) -> pd.DataFrame:
    """Rows of ``decontamination.parquet`` for the items with at least one hit."""
    rows = [{"set": kind, "source": source, "item": str(i), "ngram_hits": int(h)} for i, h in zip(ids, hits) if h > 0]
    return pd.DataFrame(rows, columns=["set", "source", "item", "ngram_hits"])
