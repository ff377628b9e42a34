"""Held-out loss on fixed, non-overlapping windows, and its tokenizer-independent form, bits per byte (docs/methods.md §10, units).

Windows are deterministic (no sampling), so two checkpoints scored on the same split see the same windows and
the per-window sums support a paired bootstrap of their difference. :func:`heldout_windows` takes the first
``max_tokens`` of the split; :func:`spread_windows` takes the same number of windows of the same grid spread over
the split's documents, round-robin (the CPT gate's windows, docs/methods.md §11).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from infra.errors import DataError


@dataclass(frozen=True)
class HeldoutLoss:
    """Held-out cross-entropy.

    Attributes:
        loss_nats: mean nats per predicted token = sum_nats / n_tokens.
        sum_nats: total nats over all predicted tokens.
        n_tokens: predicted tokens scored (seq_len per window).
        window_nats: (n_windows,) float64, summed nats of each window, in window order.
        window_tokens: (n_windows,) int64, predicted tokens of each window.
    """

    loss_nats: float
    sum_nats: float
    n_tokens: int
    window_nats: np.ndarray
    window_tokens: np.ndarray

    @property
    def perplexity(self) -> float:
        """exp(loss_nats)."""
        return math.exp(self.loss_nats)


def heldout_windows(tokens: np.ndarray, seq_len: int, max_tokens: int | None = None) -> np.ndarray:
    """(n_windows, seq_len + 1) int64 windows starting at 0, stride seq_len: every token after the first is
    predicted exactly once; a tail shorter than a full window is dropped.

    Raises:
        DataError: fewer than seq_len + 1 tokens (after the ``max_tokens`` cut).
    """
    used = np.asarray(tokens[:max_tokens] if max_tokens is not None else tokens)
    n_windows = (len(used) - 1) // seq_len
    if n_windows < 1:
        raise DataError(f"held-out split has {len(used):,} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    starts = np.arange(n_windows) * seq_len
    return np.stack([used[s:s + seq_len + 1] for s in starts]).astype(np.int64)


def window_documents(doc_offsets: np.ndarray, n_windows: int, seq_len: int) -> np.ndarray:
    """(n_windows,) int64: the index of the document in which each held-out window of :func:`heldout_windows`
    starts, from the split's (n_docs,) document start offsets. Windows of one document share its content, so they
    are resampled together (``evals.stats.cluster_bootstrap_ci``).

    Raises:
        DataError: ``doc_offsets`` empty, not starting at 0 or not increasing.
    """
    return documents_at(doc_offsets, np.arange(n_windows, dtype=np.int64) * seq_len)


def spread_windows(doc_offsets: np.ndarray, n_tokens: int, seq_len: int,
                   max_tokens: int | None = None) -> np.ndarray:
    """(n_windows,) int64 start offsets (tokens into the split) of held-out windows of seq_len + 1 tokens, spread
    over the split's documents, in stream order.

    The windows are those of the stride-``seq_len`` grid of :func:`heldout_windows` over the whole split (starts
    0, T, 2T, …; every token is predicted at most once, and the selection is deterministic), each assigned to the
    document it starts in (:func:`documents_at`). They are taken round-robin across documents — every document's
    first grid window in document order, then every document's second, … — until as many are taken as the first
    ``max_tokens`` tokens hold, (max_tokens − 1) // T, the count :func:`heldout_windows` gives: as many tokens
    scored, from many more documents. The document-level interval of the gate treats documents as its
    independent units and needs at least ``evals.stats.MIN_UNITS["documents"]`` of them (the coverage study,
    docs/methods.md §16); the first ``max_tokens`` of a split of long pages come from one or two.

    Args:
        doc_offsets: (n_docs,) start offset of each document in the split, from 0, non-decreasing.
        n_tokens: tokens in the split.
        seq_len: T, predicted tokens per window.
        max_tokens: the token budget (None: every grid window, the whole split).

    Raises:
        DataError: ``doc_offsets`` empty, not starting at 0 or decreasing; the split (or the budget) is shorter
            than one window of seq_len + 1 tokens.
        ValueError: ``seq_len`` < 1.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    n_grid = (int(n_tokens) - 1) // seq_len
    n_take = n_grid if max_tokens is None else min(n_grid, (int(max_tokens) - 1) // seq_len)
    if n_take < 1:
        raise DataError(f"held-out split has {int(n_tokens):,} tokens (budget {max_tokens}), fewer than seq_len + 1 "
                        f"= {seq_len + 1}")
    starts = np.arange(n_grid, dtype=np.int64) * seq_len
    docs = documents_at(doc_offsets, starts)  # non-decreasing, as the starts are
    rank = np.arange(n_grid) - np.searchsorted(docs, docs, side="left")  # k: the document's k-th grid window
    chosen = np.lexsort((docs, rank))[:n_take]  # by round, then document
    return starts[np.sort(chosen)]


def windows_at(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> np.ndarray:
    """(n_windows, seq_len + 1) int64 windows of ``tokens`` beginning at ``starts`` (e.g. :func:`spread_windows`).

    Raises:
        DataError: no start, or a window that would run past the end of ``tokens``.
    """
    starts = np.asarray(starts, dtype=np.int64)
    if len(starts) == 0 or starts.min() < 0 or starts.max() + seq_len + 1 > len(tokens):
        raise DataError(f"{len(starts)} window start(s) up to {int(starts.max()) if len(starts) else None}: need at "
                        f"least one, each with seq_len + 1 = {seq_len + 1} tokens inside the {len(tokens):,}-token "
                        "split")
    return np.stack([np.asarray(tokens[s:s + seq_len + 1]) for s in starts]).astype(np.int64)


def documents_at(doc_offsets: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """(n_windows,) int64: the index of the document each window starting at ``starts`` (token offsets) begins in,
    from the split's (n_docs,) document start offsets.

    Raises:
        DataError: ``doc_offsets`` empty, not starting at 0 or not increasing.
    """
    offsets = np.asarray(doc_offsets, dtype=np.int64)
    if len(offsets) == 0 or offsets[0] != 0 or (np.diff(offsets) < 0).any():
        raise DataError(f"document offsets must start at 0 and not decrease, got {offsets[:5].tolist()}…")
    return np.searchsorted(offsets, np.asarray(starts, dtype=np.int64), side="right").astype(np.int64) - 1


def heldout_loss(model: nn.Module, tokens: np.ndarray, *, seq_len: int, batch_size: int = 8,
                 max_tokens: int | None = None, starts: np.ndarray | None = None) -> HeldoutLoss:
    """Cross-entropy of ``model`` on the first ``max_tokens`` tokens of a 1-D split, or with ``starts`` on the
    windows beginning there (:func:`spread_windows`; ``max_tokens`` is then unused), in nats per predicted token.

    Runs under ``torch.no_grad()`` in eval mode, fp32 loss, on the model's device; the model's train/eval
    mode is restored afterwards.

    Raises:
        DataError: the split is shorter than one window of seq_len + 1 tokens; a start whose window runs past it.
    """
    windows = torch.from_numpy(heldout_windows(tokens, seq_len, max_tokens) if starts is None
                               else windows_at(tokens, starts, seq_len))  # (N, T + 1)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    window_nats = []
    try:
        with torch.no_grad():
            for batch in windows.split(batch_size):
                batch = batch.to(device)
                logits = model(batch[:, :-1])  # (b, T, V)
                nats = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="none")
                window_nats.append(nats.view(len(batch), seq_len).double().sum(dim=1).cpu())  # (b,)
    finally:
        model.train(was_training)
    per_window = torch.cat(window_nats).numpy()
    per_window_tokens = np.full(len(per_window), seq_len, dtype=np.int64)
    total_nats, n_tokens = float(per_window.sum()), int(per_window_tokens.sum())
    return HeldoutLoss(loss_nats=total_nats / n_tokens, sum_nats=total_nats, n_tokens=n_tokens,
                       window_nats=per_window, window_tokens=per_window_tokens)


def keep_windows(loss: HeldoutLoss, keep: np.ndarray) -> HeldoutLoss:
    """``loss`` over the windows where ``keep`` (n_windows,) is True (e.g. after decontamination).

    Raises:
        DataError: the mask's length differs from the number of windows, or it keeps none.
    """
    keep = np.asarray(keep, dtype=bool)
    if len(keep) != len(loss.window_nats) or not keep.any():
        raise DataError(f"window mask keeps {int(keep.sum())} of {len(keep)} entries for {len(loss.window_nats)} "
                        "windows: it must match the windows and keep at least one")
    nats, tokens = loss.window_nats[keep], loss.window_tokens[keep]
    total, n = float(nats.sum()), int(tokens.sum())
    return HeldoutLoss(loss_nats=total / n, sum_nats=total, n_tokens=n, window_nats=nats, window_tokens=tokens)


def bits_per_byte(loss_nats: float, tokens_per_byte: float) -> float:
    """Bits per UTF-8 byte = loss_nats · tokens_per_byte / ln 2 (docs/methods.md units: Σ nats / (ln 2 · bytes)).

    ``tokens_per_byte`` is the held-out split's token count divided by its UTF-8 byte count (the same
    tokenizer and the same text the loss was measured on); e.g. 3.952 chars/token ASCII → 0.253.
    """
    return loss_nats * tokens_per_byte / math.log(2)
