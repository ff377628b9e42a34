"""Train / held-out split by near-duplicate family, decided before the tokenizer is fitted (docs/methods.md §8, §10).

Whole families land on one side so a near-copy of a held-out document never leaks into training (docs/methods.md §10: "group
near-duplicates before splitting"). The side of a family comes from a seeded SHA-256 of its id, so the split is the
same on every machine and Python process (Python's ``hash`` is salted per process).
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
    families = kept["family_id"].astype(str)
    scores: dict[str, float] = {}
    heldout: set[str] = set()
    for source, rows in kept.assign(family_id=families).groupby("source", sort=True):
        docs_per_family = rows["family_id"].value_counts()
        # A family is scored when its first source (in name order) comes up: the sources before it never saw it,
        # so the result is the one of scoring every family first.
        for family in docs_per_family.index:
            if family not in scores:
                scores[family] = family_score(family, cfg.seed)
                if scores[family] < cfg.heldout_fraction:
                    heldout.add(family)
        _enforce_source(str(source), docs_per_family, heldout, scores, cfg.min_heldout_docs)
        advance(len(rows))
    labels = np.where(families.isin(heldout), HELDOUT, TRAIN)
    return pd.Series(labels, index=kept.index, name="split")


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


def _enforce_source(source: str, docs_per_family: pd.Series, heldout: set[str], scores: dict[str, float],
                    min_docs: int) -> None:
    """Move families of one source across the split (in place) to meet the per-source minimums."""
    by_score = sorted(docs_per_family.index, key=scores.__getitem__)
    if len(by_score) == 1:
        heldout.discard(by_score[0])
        log.warning("source %r has one family: all train, no held-out documents", source)
        return
    if all(f in heldout for f in by_score):
        heldout.discard(by_score[-1])  # keep the highest-scoring family for training
    n_heldout = sum(int(docs_per_family[f]) for f in by_score if f in heldout)
    train = [f for f in by_score if f not in heldout]
    while n_heldout < min_docs and len(train) > 1:
        moved = train.pop(0)
        heldout.add(moved)
        n_heldout += int(docs_per_family[moved])
    if n_heldout < min_docs:
        log.warning("source %r: %d held-out docs < min_heldout_docs=%d", source, n_heldout, min_docs)
