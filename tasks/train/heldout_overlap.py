"""Held-out decontamination: training documents must not share long n-grams with the held-out documents.

The split keeps near-duplicate families on one side (tasks.tokenizer.split), but two different documents can still
share a passage (a quoted paragraph, a copied code sample). Every held-out document of every source becomes an
evaluation item; a training document holding one of its ``ngram``-grams that is not common phrasing is removed and
logged (docs/methods.md §7 decontamination, applied to the held-out splits the platform reports).
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from evals.contamination import EvalIndex, EvalItem

REMOVAL_COLUMNS = ["doc_id", "source", "stage", "rule", "value", "threshold", "detail"]


def decontam_documents(kept: pd.DataFrame) -> int:
    """The documents :func:`decontaminate_train` goes through: the held-out ones it indexes and the training ones it
    looks up."""
    return int(kept["split"].isin(("heldout", "train")).sum())


def decontaminate_train(kept: pd.DataFrame, *, ngram: int, common_min_docs: int,
                        advance: Callable[[int], None] = lambda n: None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Drop training rows of ``kept`` (columns doc_id, source, text, split) that overlap a held-out document.

    ``advance(1)`` is called as each held-out document is indexed and each training document is looked up: a
    progress bar over ``decontam_documents(kept)`` documents (none when ``ngram`` is 0).

    Returns:
        (``kept`` without those rows, one removal row per dropped document: ``value`` = distinct shared n-grams,
        ``threshold`` = 1, the first shared n-gram and the held-out document in ``detail``).
    """
    if ngram == 0:
        return kept, pd.DataFrame(columns=REMOVAL_COLUMNS)
    heldout = kept[kept["split"] == "heldout"]
    index = EvalIndex.build((EvalItem(f"heldout:{s}", d, t) for d, s, t in
                             zip(heldout["doc_id"], heldout["source"], heldout["text"])), ngram, advance)
    train = kept[kept["split"] == "train"]
    hits = []
    for doc_id, text in zip(train["doc_id"], train["text"]):
        hits.extend((doc_id, length, h) for length, h in index.hits(text))
        advance(1)
    if not hits:
        return kept, pd.DataFrame(columns=REMOVAL_COLUMNS)
    table = pd.DataFrame(hits, columns=["doc_id", "length", "hash"])
    docs_per_gram = table.groupby(["length", "hash"])["doc_id"].transform("nunique")
    table = table[(docs_per_gram < common_min_docs).to_numpy()]
    source_of = dict(zip(train["doc_id"], train["source"]))
    rows = []
    for doc_id, mine in table.groupby("doc_id", sort=False):
        text, item = index.describe(int(mine["length"].iloc[0]), int(mine["hash"].iloc[0]))
        rows.append(dict(doc_id=doc_id, source=source_of[doc_id], stage="decontam_heldout",
                         rule="decontam.heldout_overlap", value=float(len(mine)), threshold=1.0,
                         detail=f"shares {ngram}-gram {text!r} with held-out document {item.item_id} "
                                f"({len(mine)} n-grams)"))
    removals = pd.DataFrame(rows, columns=REMOVAL_COLUMNS)
    return kept[~kept["doc_id"].isin(set(removals["doc_id"])).to_numpy()], removals
