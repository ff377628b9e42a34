"""Exact-substring deduplication with a suffix array (Lee et al. 2022, "Deduplicating Training Data Makes Language
Models Better", §4.1 ExactSubstr; docs/methods.md §7).

Within one partition (documents concatenated in corpus order), every window of ``min_len`` bytes that lies inside
one document and occurred at an earlier position of the partition is a repeat; the union of the repeat windows is
cut, narrowed to whole UTF-8 characters. The first occurrence of each window is never cut by its own repeats, so
of a span repeated across documents the earliest copy survives (Lee et al.'s released tool strikes every copy;
keeping one is the choice of later pipelines). A run with period p < ``min_len`` inside one document keeps about
one period: each later window of the run repeats the one p bytes before it.

The suffix array (libdivsufsort via ``pydivsufsort.divsufsort``) and the LCP array (Kasai et al. 2001,
``pydivsufsort.kasai``) group the window starts by their first ``min_len`` bytes: suffixes sharing that prefix are
adjacent in suffix order, joined by LCP ≥ ``min_len``. Of a group's starts whose window fits inside its document,
the earliest is the first occurrence and every other is a repeat; starts whose window runs past the document's end
are skipped, so no separator byte is needed and no repeat spans two documents.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Cuts", "repeated_spans", "apply_cuts", "MAX_PARTITION_BYTES"]

# Positions are int32 (half the memory of int64): a partition holds fewer than 2^31 bytes.
MAX_PARTITION_BYTES = 2**31 - 1


@dataclass(frozen=True)
class Cuts:
    """The spans cut from a partition of ``k`` documents, ``m`` spans in document order then byte order.

    ``doc`` (m,) int64: the document's index in the partition; ``start``, ``end`` (m,) int64: byte offsets
    [start, end) in that document's UTF-8 text, on character boundaries; ``first_doc``, ``first_start`` (m,)
    int64: where the earliest occurrence of the span's first repeated window lies (document index, byte offset).
    """

    doc: np.ndarray
    start: np.ndarray
    end: np.ndarray
    first_doc: np.ndarray
    first_start: np.ndarray

    def __len__(self) -> int:
        return len(self.doc)

    def bytes_per_doc(self, k: int) -> np.ndarray:
        """(k,) int64: bytes cut from each of the partition's ``k`` documents."""
        return np.bincount(self.doc, weights=self.end - self.start, minlength=k).astype(np.int64)


def _empty() -> Cuts:
    z = np.zeros(0, dtype=np.int64)
    return Cuts(z, z, z, z, z)


def repeated_spans(texts: Sequence[bytes], min_len: int) -> Cuts:
    """The spans to cut from ``texts`` (UTF-8 documents of one partition, in the order that decides which copy is
    first): the union of every in-document ``min_len``-byte window that occurred earlier, narrowed to whole
    characters and merged per document.

    Memory: the concatenation (1 byte per input byte), the suffix and LCP arrays (int32, 4 + 4) and boolean work
    arrays: 13.0 bytes per input byte at the peak, beyond the ``texts`` themselves (``benchmarks/substring_dedup.py``,
    2–32 MB). Time: about 0.15–0.26 CPU seconds per MB over that range (suffix sorting grows slightly faster than
    linearly), plus a sort of the repeat starts.

    Raises:
        ValueError: ``min_len`` < 1, or the partition holds ``MAX_PARTITION_BYTES`` bytes or more.
    """
    from pydivsufsort import divsufsort, kasai

    if min_len < 1:
        raise ValueError(f"min_len={min_len} must be >= 1 byte")
    lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    n = int(lengths.sum())
    if n >= MAX_PARTITION_BYTES:
        raise ValueError(f"partition of {n} bytes is too large for int32 positions; lower partition_bytes")
    if n < 2 or int(lengths.max(initial=0)) < min_len:
        return _empty()
    data = b"".join(texts)
    ends = np.cumsum(lengths).astype(np.int32)  # doc d covers [ends[d-1], ends[d])
    sa = divsufsort(data)  # (n,) int32
    lcp = kasai(data, sa)  # lcp[r] = common prefix of the suffixes at ranks r and r + 1
    link = lcp[:-1] >= min_len  # ranks r and r + 1 share their first min_len bytes
    del lcp
    member = np.zeros(n, dtype=bool)
    member[:-1] = link
    member[1:] |= link
    ranks = np.flatnonzero(member).astype(np.int32)
    del member
    if not len(ranks):
        return _empty()
    opens = np.ones(len(ranks), dtype=bool)  # a group starts where a rank is not linked to the one before
    opens[1:] = ~link[ranks[1:] - 1]
    del link
    pos = sa[ranks]
    del sa, ranks
    # A suffix whose first min_len bytes run past its document's end is no window, but it stays in its group:
    # its neighbours still share those bytes with each other.
    window = (ends[np.searchsorted(ends, pos, side="right")] - pos) >= min_len
    never = np.int32(MAX_PARTITION_BYTES)
    group_starts = np.flatnonzero(opens)
    firsts = np.minimum.reduceat(np.where(window, pos, never), group_starts)
    first_of = np.repeat(firsts, np.diff(np.append(group_starts, len(pos))))
    repeat = window & (pos != first_of)
    starts, origin = pos[repeat], first_of[repeat]
    del pos, first_of, opens, window
    if not len(starts):
        return _empty()
    order = np.argsort(starts, kind="stable")
    starts, origin = starts[order].astype(np.int64), origin[order].astype(np.int64)
    return _merge(data, starts, origin, ends.astype(np.int64), min_len)


def _merge(data: bytes, starts: np.ndarray, origin: np.ndarray, ends: np.ndarray, min_len: int) -> Cuts:
    """Union of the windows [s, s + min_len) for sorted ``starts``, merged per document (windows that overlap or
    touch join), then narrowed to UTF-8 character boundaries."""
    doc = np.searchsorted(ends, starts, side="right")
    win_end = starts + min_len
    # A window opens a new span unless it begins inside or at the end of the span so far in the same document.
    reach = np.maximum.accumulate(win_end)
    opens = np.ones(len(starts), dtype=bool)
    opens[1:] = (starts[1:] > reach[:-1]) | (doc[1:] != doc[:-1])
    first = np.flatnonzero(opens)
    last = np.append(first[1:], len(starts)) - 1
    lo, hi = starts[first], reach[last]
    span_doc, span_origin = doc[first], origin[first]
    buf = np.frombuffer(data, dtype=np.uint8)
    doc_end = ends[span_doc]

    def continuation(at: np.ndarray, valid: np.ndarray) -> np.ndarray:
        out = np.zeros(len(at), dtype=bool)
        out[valid] = (buf[at[valid]] & 0xC0) == 0x80
        return out

    for _ in range(3):  # a UTF-8 character has at most three continuation bytes
        lo = lo + continuation(lo, lo < hi)
        hi = hi - continuation(hi, (hi < doc_end) & (hi > lo))
    keep = lo < hi
    doc_start = np.concatenate([[0], ends])[span_doc]
    origin_doc = np.searchsorted(ends, span_origin, side="right")
    origin_start = span_origin - np.concatenate([[0], ends])[origin_doc]
    return Cuts(doc=span_doc[keep].astype(np.int64), start=(lo - doc_start)[keep], end=(hi - doc_start)[keep],
                first_doc=origin_doc[keep].astype(np.int64), first_start=origin_start[keep])


def apply_cuts(text: bytes, starts: Sequence[int], ends: Sequence[int]) -> bytes:
    """``text`` without the byte spans [starts[i], ends[i]) (sorted, disjoint)."""
    out, at = [], 0
    for s, e in zip(starts, ends):
        out.append(text[at:s])
        at = e
    out.append(text[at:])
    return b"".join(out)
