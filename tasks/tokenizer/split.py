"""Train / held-out split by near-duplicate family, decided before the tokenizer is fitted (docs/methods.md §8, §10).

Whole families land on one side so a near-copy of a held-out document never leaks into training (docs/methods.md §10: "group
near-duplicates before splitting"). The side of a family comes from a seeded SHA-256 of its id, so the split is the
same on every machine and Python process (Python's ``hash`` is salted per process).

A corpus larger than memory is split in two cheap passes over its (source, family_id) columns, never its text: the
first counts documents per (source, family key) (:func:`family_keys`, :func:`family_counts`) and fixes which families
are held out (:func:`heldout_families`, the per-source minimums need every family's size); the second labels each
document from its family key (:func:`labels`). The family key is the first 8 bytes of the SHA-256 the score is
taken from, so a family's score is its key / 2^64.
"""

import hashlib
import logging
from typing import Callable

import numpy as np
import pandas as pd

from infra.errors import DataError
from tasks.tokenizer.config import TokenizerConfig

log = logging.getLogger(__name__)

TRAIN, HELDOUT = "train", "heldout"
REQUIRED_COLUMNS = ("doc_id", "source", "family_id")


def family_score(family_id: object, seed: int) -> float:
    """Uniform in [0, 1) from SHA-256 of ``"{seed}:{family_id}"``; a family is held out when below the fraction."""
    digest = hashlib.sha256(f"{seed}:{family_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def family_keys(families: pd.Series, seed: int) -> np.ndarray:
    """The uint64 key of each family id (first 8 bytes of SHA-256 of ``"{seed}:{family_id}"``, ids as strings);
    :func:`family_score` is key / 2^64.

    Raises:
        DataError: a family id is null.
    """
    if families.isna().any():
        raise DataError("family_id has nulls: give every document a family (its own doc_id when it has no duplicates)")
    prefix = f"{seed}:"
    return np.fromiter((int.from_bytes(hashlib.sha256((prefix + f).encode()).digest()[:8], "big")
                        for f in families.astype(str)), dtype=np.uint64, count=len(families))


def family_counts(sources: pd.Series, keys: np.ndarray) -> pd.DataFrame:
    """Documents per (source, family key): columns source, key, n_docs (one row per pair; concatenate the counts of
    several parts and sum again with :func:`merge_counts`)."""
    frame = pd.DataFrame({"source": sources.astype(str).to_numpy(), "key": keys})
    return frame.groupby(["source", "key"], sort=False).size().rename("n_docs").reset_index()


def merge_counts(counts: list[pd.DataFrame]) -> pd.DataFrame:
    """The sum of several :func:`family_counts` frames."""
    frame = pd.concat(counts, ignore_index=True) if counts else pd.DataFrame(columns=["source", "key", "n_docs"])
    return frame.groupby(["source", "key"], sort=False)["n_docs"].sum().reset_index()


def pair_counts(codes: np.ndarray, keys: np.ndarray, n_docs: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Documents per (source code, family key) in arrays, the pairs sorted; ``n_docs`` (None: one per row) lets
    counts of several parts, concatenated, be summed again. A few dozen bytes per pair, no Python object per row."""
    order = np.lexsort((keys, codes))
    codes, keys = codes[order], keys[order]
    n_docs = np.ones(len(order), np.int64) if n_docs is None else n_docs[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (codes[1:] != codes[:-1]) | (keys[1:] != keys[:-1])
    starts = np.flatnonzero(new)
    return codes[starts], keys[starts], np.add.reduceat(n_docs, starts) if len(starts) else n_docs[:0]


def heldout_families(counts: pd.DataFrame, cfg: TokenizerConfig) -> np.ndarray:
    """The sorted uint64 keys of the held-out families, from the documents per (source, family key) of the whole
    corpus (:func:`family_counts`, or a frame of :func:`pair_counts` with a categorical source): the rule of
    :func:`assign_splits`, in arrays (a few dozen bytes per family).

    Sources are taken in name order. A family is held out when its score is below ``heldout_fraction`` unless a
    source before changed its side (a family shared by several sources keeps one side everywhere); then each
    source's minimums move its families (:func:`_enforce_source`), which are remembered as overrides.
    """
    keys = counts["key"].to_numpy(dtype=np.uint64)
    n_docs = counts["n_docs"].to_numpy(dtype=np.int64)
    below = keys.astype(np.float64) / 2**64 < cfg.heldout_fraction  # family_score, as float division rounds
    codes, names = pd.factorize(counts["source"], sort=True)
    by_source = np.argsort(codes, kind="stable")
    ends = np.cumsum(np.bincount(codes, minlength=len(names)))
    override: dict[int, bool] = {}
    for c, source in enumerate(names):
        rows = by_source[(ends[c - 1] if c else 0):ends[c]]
        order = rows[np.argsort(keys[rows], kind="stable")]  # by score (the key's order)
        families, docs = keys[order], n_docs[order]
        held = below[order].copy()
        if override:
            for i in np.flatnonzero(np.isin(families, np.fromiter(override, np.uint64, len(override)))):
                held[i] = override[int(families[i])]
        _enforce_source(str(source), families, docs, held, override, cfg.min_heldout_docs)
    chosen = below.copy()
    if override:
        changed = np.isin(keys, np.fromiter(override, np.uint64, len(override)))
        chosen[changed] = [override[int(k)] for k in keys[changed]]
    return np.unique(keys[chosen])


def labels(keys: np.ndarray, heldout: np.ndarray) -> np.ndarray:
    """True where a document's family key is among the ``heldout`` keys (sorted)."""
    if not len(heldout):
        return np.zeros(len(keys), dtype=bool)
    at = np.searchsorted(heldout, keys)
    at[at == len(heldout)] = 0
    return heldout[at] == keys


def assign_splits(kept: pd.DataFrame, cfg: TokenizerConfig,
                  advance: Callable[[int], None] = lambda n: None) -> pd.Series:
    """Label each kept document "train" or "heldout".

    Args:
        kept: one row per document, columns doc_id, source, family_id (near-duplicate group, docs/methods.md §7/§10).
        cfg: uses heldout_fraction (share of families), min_heldout_docs (per source) and seed.
        advance: called with each source's document count once its documents are placed (a progress bar over
            ``len(kept)`` documents).

    Returns:
        str Series named "split", aligned to ``kept.index``.

    Per source (docs/methods.md §10, held-out loss per source): at least ``min_heldout_docs`` held-out documents and at least one
    training document when the source has two or more families; lowest-scoring families are moved first, so the result
    is deterministic. A one-family source cannot satisfy both and goes wholly to train, logged as a warning and shown
    by :func:`split_summary`. A family shared by several sources keeps one side everywhere.

    Raises:
        DataError: a required column is missing or family_id has nulls.
    """
    _check_input(kept)
    keys = family_keys(kept["family_id"], cfg.seed)
    heldout = heldout_families(family_counts(kept["source"], keys), cfg)
    advance(len(kept))
    return pd.Series(np.where(labels(keys, heldout), HELDOUT, TRAIN), index=kept.index, name="split")


def split_summary(kept: pd.DataFrame, splits: pd.Series, cfg: TokenizerConfig) -> pd.DataFrame:
    """Per source: n_families, n_train_docs, n_heldout_docs and a note when a docs/methods.md §10 requirement could not be met."""
    frame = kept.assign(split=splits)
    rows = []
    for source, g in frame.groupby("source", sort=True):
        n_families, n_heldout = g["family_id"].nunique(), int((g["split"] == HELDOUT).sum())
        note = ""
        if n_families == 1:
            note = "single family: all train, no held-out loss for this source"
        elif n_heldout < cfg.min_heldout_docs:
            note = f"only {n_heldout} held-out docs < min_heldout_docs={cfg.min_heldout_docs}"
        rows.append(dict(source=source, n_families=n_families, n_train_docs=len(g) - n_heldout,
                         n_heldout_docs=n_heldout, note=note))
    return pd.DataFrame(rows)


def _check_input(kept: pd.DataFrame) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in kept.columns]
    if missing:
        raise DataError(f"assign_splits needs columns {REQUIRED_COLUMNS}; missing {missing}")
    if kept["family_id"].isna().any():
        raise DataError("family_id has nulls: give every document a family (its own doc_id when it has no duplicates)")


def _enforce_source(source: str, families: np.ndarray, docs: np.ndarray, held: np.ndarray,
                    override: dict[int, bool], min_docs: int) -> None:
    """Move families of one source across the split to meet the per-source minimums: ``families`` (keys, in score
    order), their documents in this source and whether each is ``held`` out now; each move is recorded in
    ``override`` (key → held out)."""
    if len(families) == 1:
        override[int(families[0])] = False
        log.warning("source %r has one family: all train, no held-out documents", source)
        return
    if held.all():
        override[int(families[-1])] = False  # keep the highest-scoring family for training
        held[-1] = False
    n_heldout = int(docs[held].sum())
    train = np.flatnonzero(~held)
    if n_heldout < min_docs and len(train) > 1:
        # the lowest-scoring training families move until the minimum is met or one training family is left
        reached = np.flatnonzero(n_heldout + np.cumsum(docs[train[:-1]]) >= min_docs)
        moved = train[:reached[0] + 1] if len(reached) else train[:-1]
        for i in moved:
            override[int(families[i])] = True
        n_heldout += int(docs[moved].sum())
    if n_heldout < min_docs:
        log.warning("source %r: %d held-out docs < min_heldout_docs=%d", source, n_heldout, min_docs)
