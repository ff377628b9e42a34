"""Cross-document boilerplate: lines and paragraphs repeated across many documents (docs/methods.md §7 exact dedup).

Navigation bars, footers and licence paragraphs survive document-level deduplication because each page around them
differs. A unit (a line, or a paragraph of two or more lines) is keyed by the xxh3-64 hash of its normal form
(lower-cased, whitespace collapsed); units shorter than ``min_chars`` are never keyed, so short common lines ("Yes.",
"Notes") are left alone. Counting is over distinct documents (a unit repeated inside one page counts once, and
identical pages count once, so exact dedup keeps one of them) across all shards, so the decision is the same whatever
the shard size.

A frequent unit is cut from every document but its first occurrence in corpus order (and that document's identical
copies, which exact dedup then removes), as C4 keeps one of each repeated span (Raffel et al., 2020) and Dolma one of
each repeated paragraph (Soldaini et al., 2024). Without that exception a page with ten near copies loses its own
body as "boilerplate": its lines are in eleven documents.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
import xxhash

from tasks.corpus.normalise import normal_form

COUNT_COLUMNS = ["unit_hash", "n_docs", "example"]
OCCURRENCE_COLUMNS = ["unit_hash", "doc_hash", "row"]
EXAMPLE_COLUMNS = ["unit_hash", "example"]


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


def count_units(texts: Iterable[str], min_chars: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Which units occur in which distinct documents of ``texts``.

    Returns:
        (``OCCURRENCE_COLUMNS``: one row per distinct (unit hash, document hash) with the row in ``texts`` of the
        first such document — identical documents share a document hash (:func:`doc_hash`), so 30 copies of one page
        count as one document and exact dedup, not boilerplate removal, decides their fate; ``EXAMPLE_COLUMNS``: one
        example text per unit, at most 200 characters).
    """
    pairs: dict[tuple[int, int], int] = {}
    examples: dict[int, str] = {}
    for row, text in enumerate(texts):
        keys = unit_keys(text, min_chars)
        if not keys:
            continue
        doc = doc_hash(text)
        for key in keys:
            pairs.setdefault((key, doc), row)
        for key, unit in keys.items():
            examples.setdefault(key, unit[:200])
    ordered = sorted(pairs)
    flat = np.array(ordered, dtype=np.uint64).reshape(-1, 2)
    occurrences = pd.DataFrame({"unit_hash": flat[:, 0], "doc_hash": flat[:, 1],
                                "row": np.array([pairs[k] for k in ordered], dtype=np.int32)},
                               columns=OCCURRENCE_COLUMNS)
    example_frame = pd.DataFrame({"unit_hash": np.fromiter(examples, dtype=np.uint64, count=len(examples)),
                                  "example": pd.array(list(examples.values()), dtype="string")},
                                 columns=EXAMPLE_COLUMNS)
    return occurrences, example_frame


def doc_hash(text: str) -> int:
    """The xxh3-64 hash of a document's normal form: what makes two documents one in the counts."""
    return xxhash.xxh3_64_intdigest(normal_form(text).encode("utf-8"))


def frequent_units(occurrences: pd.DataFrame, examples: pd.DataFrame, min_docs: int) -> pd.DataFrame:
    """Units in at least ``min_docs`` distinct documents (``COUNT_COLUMNS``), most frequent first; the inputs may
    stack several shards' :func:`count_units` outputs."""
    n_docs = occurrences.drop_duplicates(["unit_hash", "doc_hash"]).groupby("unit_hash").size().rename("n_docs")
    first = examples.drop_duplicates("unit_hash").set_index("unit_hash")["example"]
    frame = n_docs[n_docs >= min_docs].to_frame().join(first).reset_index()
    return frame.sort_values(["n_docs", "unit_hash"], ascending=[False, True], ignore_index=True)[COUNT_COLUMNS]


def strip_units(texts: Sequence[str], frequent: set[int] | dict[int, int],
                min_chars: int) -> tuple[list[str], list[int]]:
    """Remove frequent paragraphs, then frequent lines, from each text.

    ``frequent``: the unit hashes to cut; a dict maps each to the :func:`doc_hash` of its first occurrence in
    corpus order, a document (and its identical copies) that keeps it.

    Returns:
        (texts with those units cut and blank runs squeezed, number of lines removed per text).
    """
    if not frequent:
        return list(texts), [0] * len(texts)
    keeper = frequent if isinstance(frequent, dict) else {}
    out, removed = [], []
    for text in texts:
        kept_paragraphs, n_removed = [], 0
        own: list[int] = []  # the text's doc_hash, computed at its first frequent unit only

        def cut(key: int | None) -> bool:
            if key not in frequent:
                return False
            if not keeper:
                return True
            if not own:
                own.append(doc_hash(text))
            return keeper[key] != own[0]

        for lines in _paragraphs(text):
            if len(lines) > 1 and cut(_key("\n".join(lines), min_chars)):
                n_removed += len(lines)
                continue
            kept = [ln for ln in lines if not cut(_key(ln, min_chars))]
            n_removed += len(lines) - len(kept)
            if kept:
                kept_paragraphs.append("\n".join(kept))
        out.append("\n\n".join(kept_paragraphs).strip() if n_removed else text)
        removed.append(n_removed)
    return out, removed
