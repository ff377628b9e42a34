"""Long documents for context extension: the supply, what packing makes of it, and the held-out long windows
(docs/methods.md §15).

Extending a window from the base's T to T' only teaches long-range use where a token's own document reaches past
position T. Rows are packed by best fit (Ding et al. 2024; :mod:`tasks.train.packing`) at T' with a document mask,
so a token's context is its own document piece and nothing else; the figures here count how many tokens that
gives beyond the old window.

Two constructions of a source's long documents:

- ``natural``: the source's own documents, unchanged.
- ``concatenate``: consecutive documents in shard order (the recorded manifest order) are joined greedily into long
  documents of at least T' + 1 tokens; the last, shorter group is kept as it is. The EOS tokens between members
  stay, since they are real document ends. Joined unrelated documents are not one coherent long document, so every
  figure and table carries the label ``concatenated``, and ``members`` records which documents each one holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import pandas as pd

from infra.errors import ConfigError, DataError
from tasks.train.data import TokenStream
from tasks.train.packing import plan_rows

CONSTRUCTIONS: tuple[str, ...] = ("natural", "concatenate")
LABELS = {"natural": "natural", "concatenate": "concatenated"}
MEMBER_COLUMNS = ["source", "long_doc", "first_doc", "n_docs", "tokens"]


@dataclass(frozen=True)
class LongStream:
    """One long source's training stream and its figures.

    Attributes:
        source: the source name.
        stream: what the trainer samples: the source's own documents (``natural``) or the joined ones; the token
            array is the source's, only the document offsets differ.
        construction: ``natural`` or ``concatenated``.
        members: one row per document of ``stream``: ``source``, ``long_doc`` (its index in ``stream``),
            ``first_doc`` (index of its first member in the source's shard), ``n_docs`` (members), ``tokens``.
        report: JSON-able figures (:func:`long_stream`).
    """

    source: str
    stream: TokenStream
    construction: str
    members: pd.DataFrame
    report: dict


@dataclass(frozen=True)
class LongWindows:
    """Held-out long windows of one source, one per (joined) document.

    Attributes:
        source: the source name.
        windows: (N, T' + 1) int64, the first T' + 1 tokens of each chosen document, in document order.
        docs: (N,) int64, the document index of each window in the held-out split (for a joined document, its
            first member's), the cluster of the bootstrap.
        construction: ``natural`` or ``concatenated``.
        members: one row per window, columns as :attr:`LongStream.members` (``long_doc`` indexes the joined
            documents).
    """

    source: str
    windows: np.ndarray
    docs: np.ndarray
    construction: str
    members: pd.DataFrame


def _check_construction(construction: str) -> str:
    if construction not in CONSTRUCTIONS:
        raise ConfigError(f"construction = {construction!r}: use 'natural' (the sources' own documents) or "
                          "'concatenate' (consecutive documents joined into long ones)")
    return LABELS[construction]


def _doc_lengths(stream: TokenStream) -> tuple[np.ndarray, np.ndarray]:
    """(offsets (n_docs,), lengths (n_docs,)) int64, checked as the packer checks them."""
    offsets = np.asarray(stream.doc_offsets).astype(np.int64)
    n_tokens = len(stream.tokens)
    if len(offsets) and (offsets[0] != 0 or np.any(np.diff(offsets) <= 0) or offsets[-1] >= n_tokens):
        raise DataError(f"document offsets must rise strictly from 0 below n_tokens = {n_tokens:,}")
    return offsets, np.diff(np.append(offsets, n_tokens))


def join_documents(lengths: np.ndarray, min_tokens: int) -> np.ndarray:
    """(n_groups,) int64 index of the first document of each group when consecutive documents of ``lengths``
    (n_docs,) are joined greedily into groups of at least ``min_tokens`` tokens; the last group may be shorter.

    A document already that long is a group of its own.
    """
    return _join(np.asarray(lengths, dtype=np.int64), int(min_tokens))


@numba.njit(cache=True)
def _join(lengths: np.ndarray, min_tokens: int) -> np.ndarray:  # pragma: no cover - compiled
    firsts = np.empty(len(lengths), dtype=np.int64)
    n_groups, filled = 0, min_tokens  # a full group is pending closure: the next document opens one
    for i in range(len(lengths)):
        if filled >= min_tokens:
            firsts[n_groups] = i
            n_groups += 1
            filled = 0
        filled += lengths[i]
    return firsts[:n_groups]


def _members(source: str, firsts: np.ndarray, n_docs: int, lengths: np.ndarray) -> pd.DataFrame:
    """Members frame of the groups starting at ``firsts`` over ``n_docs`` documents of ``lengths``."""
    counts = np.diff(np.append(firsts, n_docs))
    tokens = np.add.reduceat(lengths, firsts) if len(firsts) else np.zeros(0, np.int64)
    return pd.DataFrame({"source": source, "long_doc": np.arange(len(firsts), dtype=np.int64),
                         "first_doc": firsts.astype(np.int64), "n_docs": counts.astype(np.int64),
                         "tokens": np.asarray(tokens, dtype=np.int64)}, columns=MEMBER_COLUMNS)


def long_stream(source: str, stream: TokenStream, *, base_seq_len: int, target_seq_len: int,
                construction: str) -> LongStream:
    """The stream a long source trains on at ``target_seq_len`` and its figures (docs/methods.md §15).

    Args:
        source: source name (recorded in ``members``).
        stream: the source's training shard: tokens (n_tokens,), doc_offsets (n_docs,), each document ending in EOS.
        base_seq_len: T, the base model's window.
        target_seq_len: T' > T, the extended window.
        construction: ``natural`` or ``concatenate`` (module docstring).

    ``report`` holds ``documents``, ``tokens``; ``long_documents`` (documents longer than T + 1 tokens, i.e. longer
    than a base row) and ``long_document_tokens`` (their tokens), ``long_token_share`` (of ``tokens``); then, after
    packing into rows of T' + 1 by best fit (documents whole up to T' + 1 tokens, longer ones cut into pieces of
    T' + 1), ``beyond_window_tokens``: tokens at 0-based position ≥ T inside their own document piece, a piece of p
    tokens giving max(0, p − T) (with a document mask no other token's context can exceed T tokens),
    ``beyond_window_share`` (of ``tokens``), ``rows``, ``docs_cut``, ``padding_share``; and ``construction``,
    ``base_seq_len``, ``target_seq_len``. Shares are 0.0 for an empty stream.

    Raises:
        ConfigError: unknown construction, base_seq_len < 1 or target_seq_len ≤ base_seq_len.
        DataError: document offsets not rising strictly from 0 below the token count.
    """
    label = _check_construction(construction)
    if base_seq_len < 1 or target_seq_len <= base_seq_len:
        raise ConfigError(f"base_seq_len = {base_seq_len}, target_seq_len = {target_seq_len}: need 1 ≤ base_seq_len "
                          "< target_seq_len")
    offsets, lengths = _doc_lengths(stream)
    n_docs, n_tokens = len(offsets), len(stream.tokens)
    if construction == "concatenate":
        firsts = join_documents(lengths, target_seq_len + 1)
    else:
        firsts = np.arange(n_docs, dtype=np.int64)
    members = _members(source, firsts, n_docs, lengths)
    out = TokenStream(stream.tokens, offsets[firsts]) if construction == "concatenate" else stream
    long_lengths = members["tokens"].to_numpy()
    long = long_lengths > base_seq_len + 1
    plan = plan_rows(offsets[firsts], n_tokens, target_seq_len, "best_fit")
    beyond = int(np.maximum(plan.seg_len - base_seq_len, 0).sum())
    long_tokens = int(long_lengths[long].sum())
    report = {
        "documents": int(len(firsts)), "tokens": int(n_tokens),
        "long_documents": int(long.sum()), "long_document_tokens": long_tokens,
        "long_token_share": long_tokens / n_tokens if n_tokens else 0.0,
        "beyond_window_tokens": beyond, "beyond_window_share": beyond / n_tokens if n_tokens else 0.0,
        "rows": int(plan.n_rows), "docs_cut": int(plan.docs_cut), "padding_share": float(plan.padding_share),
        "construction": label, "base_seq_len": int(base_seq_len), "target_seq_len": int(target_seq_len),
    }
    return LongStream(source=source, stream=out, construction=label, members=members, report=report)


def check_supply(streams: list[LongStream], *, min_long_token_share: float, base_seq_len: int,
                 target_seq_len: int) -> None:
    """Refuse long streams that cannot teach the extended window (docs/methods.md §15).

    Each long source is sampled as its own stream, so each is checked: it is refused when its tokens in documents
    longer than T + 1 tokens are below ``min_long_token_share`` of its tokens, or when none of its tokens lies at
    position ≥ T of its own document piece in rows of T' + 1.

    Raises:
        ConfigError: no streams, or a stream's report was built for another base_seq_len / target_seq_len.
        DataError: some stream is refused; the message gives, per source, the documents, long documents, tokens,
            the long-token share and the tokens beyond the base window, and the fix: ``construction =
            "concatenate"`` in ``[cpt.context]`` (joined documents, labelled ``concatenated``), or other
            ``long_sources``.
    """
    if not streams:
        raise ConfigError("check_supply got no long streams: name at least one of cpt.context.long_sources")
    for ls in streams:
        built = (ls.report["base_seq_len"], ls.report["target_seq_len"])
        if built != (base_seq_len, target_seq_len):
            raise ConfigError(f"long stream of {ls.source!r} was built for base/target seq_len {built}, checked for "
                              f"{(base_seq_len, target_seq_len)}: build it with the lengths it is checked against")
    refused = [ls for ls in streams if ls.report["long_token_share"] < min_long_token_share
               or ls.report["beyond_window_tokens"] == 0]
    if not refused:
        return
    lines = []
    for ls in streams:
        r = ls.report
        verdict = "refused" if ls in refused else "ok"
        lines.append(f"  {ls.source} ({r['construction']}): {r['documents']:,} documents, {r['long_documents']:,} "
                     f"longer than {base_seq_len + 1} tokens; {r['long_document_tokens']:,} of {r['tokens']:,} tokens "
                     f"in them ({r['long_token_share']:.1%}); {r['beyond_window_tokens']:,} tokens at position "
                     f"≥ {base_seq_len} of their own document in rows of {target_seq_len + 1} [{verdict}]")
    if any(ls.construction == "natural" for ls in refused):
        fix = (f"set construction = \"concatenate\" in [cpt.context] to join consecutive documents into long ones of "
               f"at least {target_seq_len + 1} tokens (labelled \"concatenated\" in every table: joined documents are "
               "not one coherent document), or name other long_sources whose documents are longer")
    else:
        fix = ("the joined documents still fall short (too few tokens in the source): other long_sources are needed, "
               "or a lower min_long_token_share")
    raise DataError(f"cpt.context: the long stream must hold ≥ {min_long_token_share:.0%} of its tokens in documents "
                    f"longer than the base window of {base_seq_len} tokens and some tokens beyond it:\n"
                    + "\n".join(lines) + f"\n{fix}")


def _spread(n: int, k: int) -> np.ndarray:
    """(min(n, k),) int64 indices into range(n), evenly spread (index ⌊i·n/k⌋), all of them when n ≤ k."""
    if n <= k:
        return np.arange(n, dtype=np.int64)
    return (np.arange(k, dtype=np.int64) * n) // k


def long_windows(source: str, stream: TokenStream, *, target_seq_len: int, max_windows: int,
                 construction: str) -> LongWindows:
    """Held-out windows of T' + 1 tokens, one per document that long, for the loss by position (docs/methods.md §15).

    ``natural``: every held-out document with ≥ T' + 1 tokens gives its first T' + 1 tokens; ``concatenate``: the
    same over the documents of the held-out split joined as :func:`long_stream` joins them. Windows are in document
    order; when more than ``max_windows`` documents qualify, those at qualifying index ⌊i·n/max_windows⌋ are taken,
    evenly spread and deterministic.

    Raises:
        ConfigError: unknown construction, target_seq_len < 1 or max_windows < 2.
        DataError: fewer than 2 windows (one gives no interval); the message gives the documents, the longest and
            how many reach T' + 1 tokens.
    """
    label = _check_construction(construction)
    if target_seq_len < 1 or max_windows < 2:
        raise ConfigError(f"target_seq_len = {target_seq_len}, max_windows = {max_windows}: need target_seq_len ≥ 1 "
                          "and max_windows ≥ 2 (an interval needs two windows)")
    width = target_seq_len + 1
    offsets, lengths = _doc_lengths(stream)
    if construction == "concatenate":
        firsts = join_documents(lengths, width)
    else:
        firsts = np.arange(len(offsets), dtype=np.int64)
    members = _members(source, firsts, len(offsets), lengths)
    qualifying = np.flatnonzero(members["tokens"].to_numpy() >= width)
    if len(qualifying) < 2:
        longest = int(members["tokens"].max()) if len(members) else 0
        hint = ("construction = \"concatenate\" in [cpt.context] joins documents (labelled \"concatenated\")"
                if construction == "natural" else "the held-out split needs more tokens")
        raise DataError(f"{source} held-out ({label}): {len(qualifying)} of {len(members):,} documents reach "
                        f"target_seq_len + 1 = {width} tokens (longest {longest:,}); the loss by position needs ≥ 2 "
                        f"long windows: {hint}, or name other long_sources")
    chosen = qualifying[_spread(len(qualifying), max_windows)]
    starts = offsets[firsts[chosen]]
    windows = np.stack([np.asarray(stream.tokens[s:s + width]) for s in starts]).astype(np.int64)
    return LongWindows(source=source, windows=windows, docs=firsts[chosen].astype(np.int64), construction=label,
                       members=members.iloc[chosen].reset_index(drop=True))
