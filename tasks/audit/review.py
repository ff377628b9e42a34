"""Removed documents laid out for a person to judge: id, rule, measured value, threshold and the text's opening."""

from __future__ import annotations

import random

import pandas as pd

from tasks.corpus.extract import extract_many, one_line

EXCERPT_CHARS = 200
REVIEW_COLUMNS = ["doc_id", "stage", "rule", "value", "threshold", "detail", "excerpt"]


def excerpt(text: str, n: int = EXCERPT_CHARS) -> str:
    """The first ``n`` characters of ``text`` on one line (whitespace runs collapsed)."""
    return one_line(text)[:n]


def with_excerpts(removals: pd.DataFrame, texts: dict[str, str]) -> pd.DataFrame:
    """``removals`` rows (``REVIEW_COLUMNS`` less excerpt) with the excerpt of ``texts[doc_id]`` ("" if absent)."""
    frame = removals.reset_index(drop=True)
    return frame.assign(excerpt=[excerpt(texts.get(d, "")) for d in frame["doc_id"]])[REVIEW_COLUMNS]


def sample_per_rule(removals: pd.DataFrame, k: int, seed: int) -> pd.DataFrame:
    """Up to ``k`` rows per rule, drawn at random with ``seed`` (path order would show one corner of the source),
    sorted by rule then doc_id."""
    rng = random.Random(seed)
    picked = []
    for _, group in removals.groupby("rule", sort=True):
        rows = list(range(len(group)))
        picked.append(group.iloc[sorted(rng.sample(rows, min(k, len(rows))))])
    if not picked:
        return removals.iloc[0:0]
    return pd.concat(picked).sort_values(["rule", "doc_id"]).reset_index(drop=True)


def review_corpus_removals(removals: pd.DataFrame, docs: pd.DataFrame, source: str, k: int,
                           seed: int, extractor: str = "trafilatura") -> pd.DataFrame:
    """Up to ``k`` removed documents of ``source`` per rule from a corpus artifact, with excerpts.

    Args:
        removals: the artifact's removal ledger (``tasks.readers.load_removals``: doc_id, source, stage, rule, value, threshold, detail).
        docs: the raw documents of its sources artifact (doc_id, content, content_type); HTML is reduced to its
            main text by ``extractor`` for the excerpt, and a page with no main text shows its raw opening.

    Returns:
        ``REVIEW_COLUMNS``, sorted by rule then doc_id.
    """
    chosen = sample_per_rule(removals[removals["source"] == source], k, seed)
    raw = docs[docs["doc_id"].isin(chosen["doc_id"])]
    html = raw["content_type"] == "html"
    texts = dict(zip(raw["doc_id"], raw["content"]))
    for doc_id, main in zip(raw["doc_id"][html], extract_many(raw["content"][html].tolist(), extractor=extractor)):
        texts[doc_id] = main or texts[doc_id]
    return with_excerpts(chosen, texts)
