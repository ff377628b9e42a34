"""Packing documents into training rows of T + 1 tokens (docs/methods.md §8).

A shard is a flat array of documents, each ending in EOS. A *row* is the T + 1 tokens one training sequence reads
(inputs ``row[:-1]``, targets ``row[1:]``); it is stored as segments ``(start, length)`` of the flat array, so a row
is a list of document pieces and nothing is copied until a batch is built.

Two policies:

- ``concat`` (concatenate and split): row k is the window ``[k·T, k·T + T + 1)`` of the flat array. Windows cross
  document boundaries freely; every document that straddles a window edge is cut. The tail shorter than a window is
  dropped (counted in ``tokens_dropped``).
- ``best_fit`` (Ding et al. 2024, "Fewer Truncations Improve Language Modeling"): documents longer than T + 1 are cut
  into pieces of T + 1 (unavoidable), then all pieces are placed by best-fit decreasing into rows of capacity T + 1 —
  each piece, largest first, goes to the open row whose free space is smallest among those it fits. A document is
  cut only when it is longer than a row; the price is padding at the end of rows (``padding_share``).

Best-fit runs in O(n log T) with a segment tree over free capacities (numba), so packing a shard costs far less than
tokenizing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numba
import numpy as np

from infra.errors import ConfigError, DataError
from tasks.train.sections import PackingConfig  # noqa: F401  (re-exported)

PackingPolicy = Literal["concat", "best_fit"]
POLICIES: tuple[str, ...] = ("concat", "best_fit")


@dataclass(frozen=True)
class PackPlan:
    """Rows as segments of a flat token array.

    Attributes:
        row_ptr: (n_rows + 1,) int64; row r is segments ``row_ptr[r]:row_ptr[r + 1]``.
        seg_start: (n_segments,) int64 start of each segment in the flat array.
        seg_len: (n_segments,) int64 length of each segment in tokens.
        row_tokens: T + 1, the capacity of a row.
        n_docs: documents in the shard.
        docs_cut: documents whose tokens land in more than one row (or partly in the dropped tail).
        tokens_dropped: tokens in no row (the ``concat`` tail).
    """

    row_ptr: np.ndarray
    seg_start: np.ndarray
    seg_len: np.ndarray
    row_tokens: int
    n_docs: int
    docs_cut: int
    tokens_dropped: int

    @property
    def n_rows(self) -> int:
        return len(self.row_ptr) - 1

    @property
    def padding_share(self) -> float:
        """Share of row positions that hold padding rather than tokens, in [0, 1)."""
        capacity = self.n_rows * self.row_tokens
        return float(1.0 - self.seg_len.sum() / capacity) if capacity else 0.0

    @property
    def cut_share(self) -> float:
        """Share of documents cut, in [0, 1]."""
        return self.docs_cut / self.n_docs if self.n_docs else 0.0

    def row(self, tokens: np.ndarray, doc_offsets: np.ndarray, r: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ``r``: (ids (n,), index of the document each position belongs to (n,)), n ≤ T + 1, unpadded."""
        lo, hi = self.row_ptr[r], self.row_ptr[r + 1]
        positions = np.concatenate([np.arange(s, s + n) for s, n in zip(self.seg_start[lo:hi], self.seg_len[lo:hi])])
        return np.asarray(tokens[positions]), np.searchsorted(doc_offsets, positions, side="right") - 1


def plan_rows(doc_offsets: np.ndarray, n_tokens: int, seq_len: int, policy: str) -> PackPlan:
    """Rows of ``seq_len + 1`` tokens over a shard whose documents start at ``doc_offsets``.

    Args:
        doc_offsets: (n_docs,) int64 start of each document (trailing EOS included) in the flat array.
        n_tokens: length of the flat array.
        seq_len: T, input tokens per row.
        policy: ``concat`` or ``best_fit`` (module docstring).

    Raises:
        ConfigError: unknown policy or seq_len < 1.
        DataError: offsets are not increasing from 0 within ``n_tokens``.
    """
    if policy not in POLICIES:
        raise ConfigError(f"packing policy {policy!r} is unknown; use one of {POLICIES}")
    if seq_len < 1:
        raise ConfigError(f"seq_len must be >= 1, got {seq_len}")
    raw = np.asarray(doc_offsets)
    if raw.ndim != 1 or (len(raw) and not np.issubdtype(raw.dtype, np.integer)):
        raise DataError(f"document offsets must be a 1-D integer array (n_docs,), got {raw.dtype} {raw.shape}")
    offsets = raw.astype(np.int64)
    if not len(offsets) and n_tokens:
        raise DataError(f"{n_tokens:,} tokens but no document offsets: every token must belong to a document")
    if len(offsets) and (offsets[0] != 0 or np.any(np.diff(offsets) <= 0) or offsets[-1] >= n_tokens):
        raise DataError(f"document offsets must rise strictly from 0 below n_tokens = {n_tokens:,}")
    lengths = np.diff(np.append(offsets, n_tokens))
    if policy == "concat":
        return _concat(offsets, lengths, n_tokens, seq_len)
    return _best_fit(offsets, lengths, seq_len + 1)


def _concat(offsets: np.ndarray, lengths: np.ndarray, n_tokens: int, seq_len: int) -> PackPlan:
    n_rows = max(0, (n_tokens - 1) // seq_len)
    starts = np.arange(n_rows, dtype=np.int64) * seq_len
    covered = n_rows * seq_len + 1 if n_rows else 0
    ends = offsets + lengths  # exclusive
    # A document is whole in one row when it lies inside one window [kT, kT + T]; windows share their edge token.
    first = offsets // seq_len
    whole = (ends - 1 <= first * seq_len + seq_len) & (ends <= covered)
    return PackPlan(row_ptr=np.arange(n_rows + 1, dtype=np.int64), seg_start=starts,
                    seg_len=np.full(n_rows, seq_len + 1, dtype=np.int64),
                    row_tokens=seq_len + 1, n_docs=len(offsets), docs_cut=int((~whole).sum()),
                    tokens_dropped=int(n_tokens - covered) if n_rows else int(n_tokens))


def _best_fit(offsets: np.ndarray, lengths: np.ndarray, capacity: int) -> PackPlan:
    # Cut documents longer than a row into row-sized pieces.
    n_pieces = -(-lengths // capacity)
    piece_doc = np.repeat(np.arange(len(lengths), dtype=np.int64), n_pieces)
    first_piece = np.repeat(np.cumsum(n_pieces) - n_pieces, n_pieces)
    piece_rank = np.arange(len(piece_doc), dtype=np.int64) - first_piece
    piece_start = offsets[piece_doc] + piece_rank * capacity
    piece_len = np.minimum(capacity, offsets[piece_doc] + lengths[piece_doc] - piece_start)
    order = np.lexsort((np.arange(len(piece_len)), -piece_len))  # largest first, ties in corpus order: deterministic
    rows = _best_fit_decreasing(piece_len[order], capacity)
    # Group pieces by row, keeping placement order inside each row.
    by_row = np.lexsort((np.arange(len(rows)), rows))
    placed = order[by_row]
    n_rows = int(rows.max()) + 1 if len(rows) else 0
    row_ptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=row_ptr[1:])
    return PackPlan(row_ptr=row_ptr, seg_start=piece_start[placed], seg_len=piece_len[placed], row_tokens=capacity, n_docs=len(lengths),
                    docs_cut=int((n_pieces > 1).sum()), tokens_dropped=0)


@numba.njit(cache=True)
def _best_fit_decreasing(sizes: np.ndarray, capacity: int) -> np.ndarray:  # pragma: no cover - compiled
    """Row index of each piece (sizes sorted descending, each ≤ capacity), best-fit decreasing.

    Open rows are kept in per-free-space stacks; a max segment tree over free space 0..capacity answers "smallest
    free space ≥ size that has an open row" in O(log capacity).
    """
    n_leaves = 1
    while n_leaves < capacity + 1:
        n_leaves *= 2
    tree = np.zeros(2 * n_leaves, dtype=np.int64)  # max of non-empty free-space values below each node, -1 if none
    tree[:] = -1
    head = np.full(capacity + 1, -1, dtype=np.int64)  # top open row with that free space
    below = np.full(len(sizes), -1, dtype=np.int64)  # next row in the same stack
    free = np.zeros(len(sizes), dtype=np.int64)
    out = np.empty(len(sizes), dtype=np.int64)
    n_rows = 0
    for i in range(len(sizes)):
        size = sizes[i]
        row = -1
        if tree[1] >= size:  # some open row fits: descend to the smallest free space >= size
            node = 1
            while node < n_leaves:
                left = 2 * node
                if tree[left] >= size:  # leftmost fitting leaf = smallest fitting free space
                    node = left
                else:
                    node = left + 1
            space = node - n_leaves
            row = head[space]
            head[space] = below[row]
            if head[space] == -1:
                _set(tree, n_leaves, space, -1)
        else:
            row = n_rows
            n_rows += 1
            free[row] = capacity
        out[i] = row
        free[row] -= size
        space = free[row]
        if space > 0:
            below[row] = head[space]
            head[space] = row
            if below[row] == -1:
                _set(tree, n_leaves, space, space)
    return out


@numba.njit(cache=True)
def _set(tree: np.ndarray, n_leaves: int, leaf: int, value: int) -> None:  # pragma: no cover - compiled
    node = n_leaves + leaf
    tree[node] = value
    node //= 2
    while node >= 1:
        tree[node] = max(tree[2 * node], tree[2 * node + 1])
        node //= 2
