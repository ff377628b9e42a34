"""Long-context evaluation: loss by token position bucket and passkey retrieval (docs/methods.md §15).

Loss by position: each held-out long window (one document of T' + 1 tokens, ``tasks.cpt.long_docs``) is scored
token by token and the nats are summed per bucket of predicted position, so the loss at positions past the base's
window T is read apart from the loss inside it. The bucket edges are T/4, T/2, T, then doublings up to T'. The
interval of each bucket's token-weighted mean is a t interval over whole documents (``evals.stats.cluster_mean_ci``).

Passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention"; needle-in-a-haystack style): a random 5-digit key
is stated once inside held-out filler text at a set depth, and the prompt ends by asking for it. The model is not
sampled: the true key and ``n_choices − 1`` random distractor keys are scored by summed log-likelihood, as cloze
options are (``evals.cloze``), so the answer is correct when the true key scores strictly highest (chance
1 / n_choices). Accuracy per (length, depth) carries a Wilson interval (Wilson 1927).

Usage::

    pl = position_bucket_loss(model, windows, bucket_edges(1024, 4096))
    bucket_frame(pl, docs)                       # loss_nats and interval per position bucket
    items = passkey_items(filler, encode, lengths=[512, 1024, 4096], depths=[0.1, 0.5, 0.9], per_cell=16,
                          n_choices=4, seed=0)
    correct, margin = score_passkey(model, items)
    retrieval_frame(items, correct)              # accuracy per (length, depth) and per length
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy import stats
from torch import nn

from evals.stats import cluster_mean_ci
from infra.errors import ConfigError, DataError

NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = " What is the pass key? The pass key is"
OPTION = " {key}"
KEY_LOW, KEY_HIGH = 10_000, 100_000  # 5-digit keys: [10000, 99999]


def default_lengths(base_seq_len: int, target_seq_len: int) -> list[int]:
    """Passkey prompt lengths in tokens when none are given: the base window (retrieval the base should manage),
    then doublings, ending at the target window (docs/methods.md §15)."""
    lengths, n = [base_seq_len], base_seq_len * 2
    while n < target_seq_len:
        lengths.append(n)
        n *= 2
    return sorted(set(lengths + [target_seq_len]))


def min_prompt_length(encode: Callable[[str], list[int]], *, min_filler: int = 16, keys: int = 64) -> int:
    """The shortest passkey prompt, in tokens, that holds the needle, the question, an option and ``min_filler``
    filler tokens, under this tokenizer (the longest of ``keys`` seeded random keys; a key that encodes longer
    still is refused by :func:`passkey_items`)."""
    rng = np.random.Generator(np.random.PCG64(0))
    question = len(_ids(encode, QUESTION))
    worst = max(len(_ids(encode, NEEDLE.format(key=k))) + len(_ids(encode, OPTION.format(key=k)))
                for k in rng.integers(KEY_LOW, KEY_HIGH, size=keys).tolist())
    return question + worst + min_filler


def bucket_edges(base_seq_len: int, target_seq_len: int) -> np.ndarray:
    """(n_buckets + 1,) int64 position edges: 0, T/4, T/2, T, 2T, 4T, ... ending exactly at T' (docs/methods.md §15).

    64 → 256 gives [0, 16, 32, 64, 128, 256]; edges that coincide (tiny T) are kept once.

    Raises:
        ConfigError: base_seq_len < 1 or target_seq_len < base_seq_len.
    """
    if base_seq_len < 1 or target_seq_len < base_seq_len:
        raise ConfigError(f"base_seq_len = {base_seq_len}, target_seq_len = {target_seq_len}: need 1 ≤ base_seq_len "
                          "≤ target_seq_len")
    edges = [0, base_seq_len // 4, base_seq_len // 2, base_seq_len]
    n = 2 * base_seq_len
    while n < target_seq_len:
        edges.append(n)
        n *= 2
    edges.append(target_seq_len)
    return np.unique(np.asarray(edges, dtype=np.int64))


@dataclass(frozen=True)
class PositionLoss:
    """Summed nats per window and position bucket.

    Attributes:
        edges: (n_buckets + 1,) int64; bucket k holds predicted positions t with edges[k] ≤ t < edges[k + 1]
            (t the 0-based index of the input token).
        bucket_nats: (N, n_buckets) float64 summed nats of each window in each bucket.
        bucket_tokens: (N, n_buckets) int64 predicted tokens of each window in each bucket.
    """

    edges: np.ndarray
    bucket_nats: np.ndarray
    bucket_tokens: np.ndarray

    @property
    def n_buckets(self) -> int:
        return len(self.edges) - 1

    @property
    def loss_nats(self) -> np.ndarray:
        """(n_buckets,) token-weighted mean nats per predicted token in each bucket (NaN for an empty bucket)."""
        tokens = self.bucket_tokens.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.bucket_nats.sum(axis=0) / tokens

    @property
    def window_loss_nats(self) -> np.ndarray:
        """(N, n_buckets) mean nats per token of each window in each bucket (NaN where it has no token)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.bucket_nats / self.bucket_tokens


def _check_edges(edges: np.ndarray, n_positions: int) -> np.ndarray:
    e = np.asarray(edges)
    if e.ndim != 1 or len(e) < 2 or not np.issubdtype(e.dtype, np.integer) or e[0] < 0 or np.any(np.diff(e) <= 0):
        raise DataError(f"bucket edges must be ≥ 2 strictly increasing integers from ≥ 0, got {e.tolist()}")
    if e[-1] > n_positions:
        raise DataError(f"last bucket edge {int(e[-1])} lies beyond the windows' {n_positions} predicted positions; "
                        "use windows of edges[-1] + 1 tokens")
    return e.astype(np.int64)


def position_bucket_loss(model: nn.Module, windows: np.ndarray, edges: np.ndarray, *,
                         batch_size: int = 4) -> PositionLoss:
    """Cross-entropy of ``model`` on ``windows`` (N, T' + 1) summed per window and position bucket.

    Input tokens ``windows[:, :-1]`` predict ``windows[:, 1:]``; the prediction made at input index t falls in bucket
    k when edges[k] ≤ t < edges[k + 1]. Plain causal attention (each window is one document, or one labelled
    concatenation). fp32 loss under ``torch.no_grad()`` in eval mode on the model's device, the train/eval mode
    restored afterwards (as ``evals.heldout.heldout_loss``).

    Raises:
        DataError: windows not a non-empty (N, T' + 1) integer array with T' ≥ 1; T' above ``model.cfg.seq_len``
            (extend the model first); edges not strictly increasing from ≥ 0 or past T'.
        ConfigError: batch_size < 1.
    """
    w = np.asarray(windows)
    if w.ndim != 2 or w.shape[0] < 1 or w.shape[1] < 2 or not np.issubdtype(w.dtype, np.integer):
        raise DataError(f"windows must be a non-empty (N, T' + 1) integer array, got {w.dtype} {w.shape}")
    if batch_size < 1:
        raise ConfigError(f"batch_size = {batch_size}: must be ≥ 1")
    n_positions = w.shape[1] - 1
    cfg = getattr(model, "cfg", None)
    if cfg is not None and n_positions > cfg.seq_len:
        raise DataError(f"windows of {n_positions} input tokens exceed model.seq_len = {cfg.seq_len}: extend the model "
                        "to the target window first (tasks.cpt.context.extend)")
    e = _check_edges(edges, n_positions)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    sums = []
    try:
        with torch.no_grad():
            for batch in torch.from_numpy(w.astype(np.int64)).split(batch_size):
                batch = batch.to(device)
                logits = model(batch[:, :-1])  # (b, T', V)
                nats = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="none")
                nats = nats.view(len(batch), n_positions).double().cpu().numpy()  # (b, T')
                sums.append(np.stack([nats[:, lo:hi].sum(axis=1) for lo, hi in zip(e[:-1], e[1:])], axis=1))
    finally:
        model.train(was_training)
    tokens = np.broadcast_to(np.diff(e), (len(w), len(e) - 1)).astype(np.int64)
    return PositionLoss(edges=e, bucket_nats=np.concatenate(sums), bucket_tokens=tokens)


def bucket_frame(pl: PositionLoss, docs: np.ndarray, confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """One row per position bucket: ``bucket_start``, ``bucket_end`` (positions, end exclusive), ``tokens``,
    ``windows`` (windows with a token in it), ``loss_nats`` (token-weighted mean nats per token), ``ci_low``,
    ``ci_high``.

    The interval treats whole documents as the units: ``docs`` (N,) names each window's document, and the
    one-sample mean Σnats / Σtokens is ``evals.stats.cluster_mean_ci`` with a = 0, b = window mean, weights =
    window tokens (t interval over documents with the delete-one-document jackknife variance; docs/methods.md §16).

    Raises:
        DataError: docs not of shape (N,), or fewer than 2 documents with tokens in a bucket (no interval).
        ConfigError: confidence outside (0, 1).
    """
    ids = np.asarray(docs)
    if ids.shape != (pl.bucket_nats.shape[0],):
        raise DataError(f"docs has shape {ids.shape}, the loss {pl.bucket_nats.shape[0]} windows: give one document "
                        "per window")
    rows = []
    for k in range(pl.n_buckets):
        nats, tokens = pl.bucket_nats[:, k], pl.bucket_tokens[:, k]
        mean = np.divide(nats, tokens, out=np.zeros_like(nats), where=tokens > 0)  # weight 0 where no token
        ci = cluster_mean_ci(np.zeros_like(mean), mean, ids, weights=tokens, confidence=confidence)
        rows.append({"bucket_start": int(pl.edges[k]), "bucket_end": int(pl.edges[k + 1]),
                     "tokens": int(tokens.sum()), "windows": int((tokens > 0).sum()),
                     "loss_nats": float(nats.sum() / tokens.sum()), "ci_low": ci.low, "ci_high": ci.high})
    return pd.DataFrame(rows, columns=["bucket_start", "bucket_end", "tokens", "windows", "loss_nats", "ci_low",
                                       "ci_high"])


@dataclass(frozen=True)
class PasskeyItem:
    """One passkey prompt: ``options[answer]`` (the true key's tokens) follows ``context``.

    Attributes:
        item_id: ``passkey_L<length>_d<depth>_<i>``.
        length: tokens in all: len(context) + the longest option's tokens.
        depth: where the needle sits, as a fraction of the filler (0 = start, 1 = end).
        context: (n,) int64 ids: filler head, needle, filler tail, question.
        options: int64 id arrays, the true key and the distractors (each " <5 digits>"), shuffled.
        answer: index of the true key in ``options``.
    """

    item_id: str
    length: int
    depth: float
    context: np.ndarray
    options: list[np.ndarray]
    answer: int


def _ids(encode: Callable[[str], list[int]], text: str) -> np.ndarray:
    ids = np.asarray(list(encode(text)), dtype=np.int64)
    if ids.ndim != 1 or len(ids) == 0:
        raise DataError(f"encode({text!r}) gave no tokens")
    return ids


def passkey_items(filler: np.ndarray, encode: Callable[[str], list[int]], *, lengths: Sequence[int],
                  depths: Sequence[float], per_cell: int, n_choices: int, seed: int) -> list[PasskeyItem]:
    """``per_cell`` passkey prompts for every (length, depth), in that order (Mohtashami & Jaggi 2023).

    Item i of (length L, depth index j) draws from numpy PCG64 seeded with (seed, L, j, i), in this order: the
    5-digit key, ``n_choices − 1`` distinct distractor keys, the filler offset, the option order. The needle
    (``NEEDLE``), question (``QUESTION``) and options (``OPTION``) are encoded on their own and joined as ids, so
    no token merges across a splice. The filler is ``filler[offset:offset + f]`` with f = L − needle − question −
    the longest option (so len(context) + longest option = L exactly), and the needle is spliced in at token
    position round(depth · f) (ties to even).

    Args:
        filler: (n,) held-out token ids to cut filler from.
        encode: text → token ids, the model's tokenizer.
        lengths: prompt lengths in tokens.
        depths: needle depths, fractions in [0, 1].
        per_cell: prompts per (length, depth), ≥ 1.
        n_choices: the key and its distractors, in [2, 90000].
        seed: ≥ 0.

    Raises:
        ConfigError: empty lengths or depths, a depth outside [0, 1], per_cell < 1, n_choices out of range, or
            seed < 0.
        DataError: filler not 1-D integer, a length too small to hold needle + question + option, or filler
            shorter than a prompt needs (the message gives the figures).
    """
    if not lengths or not depths or per_cell < 1 or not 2 <= n_choices <= KEY_HIGH - KEY_LOW or seed < 0:
        raise ConfigError(f"passkey lengths {list(lengths)}, depths {list(depths)}, per_cell {per_cell}, n_choices "
                          f"{n_choices}, seed {seed}: need lengths and depths, per_cell ≥ 1, 2 ≤ n_choices ≤ "
                          f"{KEY_HIGH - KEY_LOW}, seed ≥ 0")
    if any(not 0.0 <= d <= 1.0 for d in depths):
        raise ConfigError(f"passkey depths {list(depths)}: each must be a fraction in [0, 1]")
    source = np.asarray(filler)
    if source.ndim != 1 or not np.issubdtype(source.dtype, np.integer):
        raise DataError(f"filler must be a 1-D integer token array, got {source.dtype} {source.shape}")
    question = _ids(encode, QUESTION)
    items = []
    for length in lengths:
        for j, depth in enumerate(depths):
            for i in range(per_cell):
                rng = np.random.Generator(np.random.PCG64([seed, int(length), j, i]))
                key = int(rng.integers(KEY_LOW, KEY_HIGH))
                wrong: list[int] = []
                while len(wrong) < n_choices - 1:
                    k = int(rng.integers(KEY_LOW, KEY_HIGH))
                    if k != key and k not in wrong:
                        wrong.append(k)
                needle = _ids(encode, NEEDLE.format(key=key))
                keys = [key, *wrong]
                options = [_ids(encode, OPTION.format(key=k)) for k in keys]
                n_filler = int(length) - len(needle) - len(question) - max(len(o) for o in options)
                if n_filler < 0:
                    raise DataError(f"passkey length {length}: needle ({len(needle)}) + question ({len(question)}) + "
                                    f"option ({max(len(o) for o in options)}) tokens do not fit; use lengths ≥ "
                                    f"{int(length) - n_filler}")
                if len(source) < n_filler:
                    raise DataError(f"passkey length {length} needs {n_filler:,} filler tokens, the filler has "
                                    f"{len(source):,}: give more held-out text or shorter lengths")
                offset = int(rng.integers(0, len(source) - n_filler + 1))
                order = rng.permutation(n_choices)
                text = source[offset:offset + n_filler].astype(np.int64)
                at = int(round(float(depth) * n_filler))
                context = np.concatenate([text[:at], needle, text[at:], question])
                items.append(PasskeyItem(item_id=f"passkey_L{int(length)}_d{depth:g}_{i}", length=int(length),
                                         depth=float(depth), context=context, options=[options[o] for o in order],
                                         answer=int(np.flatnonzero(order == 0)[0])))
    return items


def score_passkey(model: nn.Module, items: Sequence[PasskeyItem], *,
                  batch_size: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(correct (M,) bool, margin (M,) float64 nats) of ``model`` on ``items``.

    An option's score is the summed log-probability (fp32 log-softmax, summed in float64) of its tokens given the
    context, as ``evals.cloze`` scores options; margin = the true key's score minus the best distractor's, and an
    item is correct iff margin > 0 (ties are wrong). Every (item, option) sequence is one right-padded row,
    ``batch_size`` rows per forward, under ``torch.no_grad()`` in eval mode (mode restored).

    Raises:
        DataError: no items, or a context + option longer than ``model.cfg.seq_len`` tokens.
        ConfigError: batch_size < 1.
    """
    if not items:
        raise DataError("score_passkey got no items")
    if batch_size < 1:
        raise ConfigError(f"batch_size = {batch_size}: must be ≥ 1")
    cfg = getattr(model, "cfg", None)
    rows = [(m, item.context, opt) for m, item in enumerate(items) for opt in item.options]
    longest = max(len(c) + len(o) for _, c, o in rows)
    if cfg is not None and longest > cfg.seq_len:
        raise DataError(f"a passkey prompt has {longest} tokens, more than model.seq_len = {cfg.seq_len}: extend the "
                        "model or use shorter lengths")
    device = next(model.parameters()).device
    scores = np.empty(len(rows), dtype=np.float64)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for lo in range(0, len(rows), batch_size):
                chunk = rows[lo:lo + batch_size]
                width = max(len(c) + len(o) for _, c, o in chunk) - 1
                x = torch.zeros(len(chunk), width, dtype=torch.long)
                n_opt = max(len(o) for _, _, o in chunk)
                pos = torch.zeros(len(chunk), n_opt, dtype=torch.long)  # input index predicting each option token
                target = torch.zeros(len(chunk), n_opt, dtype=torch.long)
                live = torch.zeros(len(chunk), n_opt, dtype=torch.bool)
                for r, (_, context, option) in enumerate(chunk):
                    seq = torch.from_numpy(np.concatenate([context, option]))
                    x[r, :len(seq) - 1] = seq[:-1]
                    pos[r, :len(option)] = len(context) - 1 + torch.arange(len(option))
                    target[r, :len(option)] = torch.from_numpy(option)
                    live[r, :len(option)] = True
                out = model(x.to(device))
                logits = out[0] if isinstance(out, tuple) else out  # (b, width, V)
                picked = logits[torch.arange(len(chunk))[:, None].to(device), pos.to(device)]  # (b, n_opt, V)
                logp = picked.float().log_softmax(dim=-1).gather(-1, target.to(device)[..., None])[..., 0]
                logp = logp.double().cpu().masked_fill(~live, 0.0)
                scores[lo:lo + len(chunk)] = logp.sum(dim=1).numpy()
    finally:
        model.train(was_training)
    correct, margin = np.zeros(len(items), dtype=bool), np.zeros(len(items), dtype=np.float64)
    start = 0
    for m, item in enumerate(items):
        s = scores[start:start + len(item.options)]
        start += len(item.options)
        margin[m] = s[item.answer] - np.delete(s, item.answer).max()
        correct[m] = margin[m] > 0
    return correct, margin


def retrieval_frame(items: Sequence[PasskeyItem], correct: np.ndarray, confidence: float = 0.95) -> pd.DataFrame:
    """Passkey accuracy per (length, depth) and per length over all depths.

    Columns: ``length`` (int), ``depth`` (str: the depth as ``f"{depth:g}"``, or ``"all"`` for the row pooling every
    depth of that length), ``n``, ``correct``, ``accuracy`` (fraction), ``ci_low``, ``ci_high`` (Wilson score
    interval at ``confidence``, Wilson 1927: ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")``),
    ``chance`` (mean of 1 / options over the items). Rows by length, then depth ascending, then ``"all"``.

    Raises:
        DataError: no items, or ``correct`` not of shape (M,).
        ConfigError: confidence outside (0, 1).
    """
    hit = np.asarray(correct, dtype=bool)
    if not items or hit.shape != (len(items),):
        raise DataError(f"retrieval_frame needs ≥ 1 item and one correctness per item, got {len(items)} items and "
                        f"correct of shape {hit.shape}")
    if not 0.0 < confidence < 1.0:
        raise ConfigError(f"confidence must lie in (0, 1), got {confidence}")
    frame = pd.DataFrame({"length": [it.length for it in items], "depth": [it.depth for it in items],
                          "chance": [1.0 / len(it.options) for it in items], "hit": hit})

    def row(length: int, depth: str, part: pd.DataFrame) -> dict:
        k, n = int(part["hit"].sum()), len(part)
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
        return {"length": int(length), "depth": depth, "n": n, "correct": k, "accuracy": k / n,
                "ci_low": float(ci.low), "ci_high": float(ci.high), "chance": float(part["chance"].mean())}

    rows = []
    for length, by_length in frame.groupby("length", sort=True):
        rows += [row(length, f"{depth:g}", cell) for depth, cell in by_length.groupby("depth", sort=True)]
        rows.append(row(length, "all", by_length))
    return pd.DataFrame(rows, columns=["length", "depth", "n", "correct", "accuracy", "ci_low", "ci_high", "chance"])
