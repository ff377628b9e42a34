"""Held-out decontamination: training documents must not share long n-grams with the held-out documents.

The split keeps near-duplicate families on one side (tasks.tokenizer.split), but two different documents can still
share a passage (a quoted paragraph, a copied code sample). Every held-out document of every source becomes an
evaluation item; a training document holding one of its ``ngram``-grams that is not common phrasing is removed and
logged (docs/methods.md §7 decontamination, applied to the held-out splits the platform reports).

The n-grams are those of ``evals.contamination`` (lower-cased ``\\w+`` words, xxh3-64 per word, the polynomial window
hash; a held-out document of at least ``MIN_ITEM_TOKENS`` but fewer than ``ngram`` words contributes its whole word
sequence as one shorter n-gram), computed here for a whole batch of documents at once:

- the words of every document of the batch come from one regex pass over the texts joined by a separator word,
  each distinct word is hashed once (:func:`word_hashes`);
- every window hash of every length comes from one prefix sum: with A[i] = Σ_{j<i} h_j·Q^j (Q the inverse of the
  window multiplier P modulo 2^64) the window of L words at i is P^(i+L−1)·(A[i+L] − A[i]), the value
  ``evals.contamination.window_hashes`` gives, in two array operations per length (:func:`windows`);
- a training window is looked up in the sorted held-out n-grams by binary search after a bitmap of their top bits
  has ruled out most windows (:class:`HeldoutGrams`).

The tokenizer stage streams: the held-out n-grams of each kept part (:func:`index_part`, a shard-map call each) are
merged into one sorted index on disk, one bucket of hashes at a time (:func:`merge_index_files`); each part's training
documents are looked up in it (:func:`lookup_part`, a call each; the index is memory-mapped); the stage then sums
how many training documents hold each n-gram (one held by ``common_min_docs`` or more is common phrasing) and
decides the removals part by part (:func:`decide`), naming each by its first shared n-gram (:func:`describe_all`).
Memory: the index (8 bytes per distinct held-out n-gram, their owners read only for the removals), a 4-byte count per
n-gram and one part at a time. :func:`decontaminate_train` runs the same steps on one frame in memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from evals.contamination import _P, _TOKEN_RE, MIN_ITEM_TOKENS, tokens, window_hashes

REMOVAL_COLUMNS = ["doc_id", "source", "stage", "rule", "value", "threshold", "detail"]
STAGE, RULE = "decontam_heldout", "decontam.heldout_overlap"

_Q = np.uint64(pow(int(_P), -1, 2**64))  # P·Q ≡ 1 (mod 2^64): P is odd
# The word between two texts of a batch: U+01C5 (Dž, titlecase) is a \w character that str.lower() never leaves
# (it lowers to U+01C6), so it cannot be a word of a lower-cased text.
_SEP_WORD = "\u01c5"
_SEP = f"\n{_SEP_WORD}\n"
_CACHE_MAX = 1 << 20  # distinct words whose hash is kept (cleared when full: memory does not grow with the corpus)
BITMAP_BITS = 26  # the prefilter: one bit per value of a hash's top 26 bits (8 MiB)
BUCKET_BITS = 4  # the index is merged in 16 buckets of its hashes' top bits


class _WordHashes(dict):
    """word → xxh3-64 of its UTF-8 bytes, computed on first use."""

    def __missing__(self, word: str) -> int:
        value = self[word] = xxhash.xxh3_64_intdigest(word.encode("utf-8"))
        return value


_HASHES = _WordHashes()
_SEP_HASH = np.uint64(xxhash.xxh3_64_intdigest(_SEP_WORD.encode("utf-8")))


@dataclass
class Words:
    """The words of a batch of texts: ``hashes`` (M,) uint64 with one separator slot between texts, each text's
    words at ``hashes[starts[t]:ends[t]]``, and the prefix sums that give any window's hash (:func:`windows`)."""

    hashes: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    prefix: np.ndarray  # (M + 1,) A[i] = Σ_{j<i} h_j·Q^j
    powers: np.ndarray  # (M + 1,) P^i

    @property
    def counts(self) -> np.ndarray:
        return self.ends - self.starts


def word_hashes(texts: Sequence[str]) -> Words:
    """The words (``evals.contamination.tokens``) of every text, hashed as ``window_hashes`` hashes them."""
    if _HASHES.__len__() > _CACHE_MAX:
        _HASHES.clear()
    words = _TOKEN_RE.findall(_SEP.join(t.lower() for t in texts))
    hashes = np.fromiter(map(_HASHES.__getitem__, words), dtype=np.uint64, count=len(words))
    candidates = np.flatnonzero(hashes == _SEP_HASH)
    seps = candidates[[words[i] == _SEP_WORD for i in candidates]].astype(np.int64)
    if len(seps) != max(len(texts) - 1, 0):
        raise AssertionError(f"{len(seps)} separators between {len(texts)} texts")
    starts = np.concatenate([[0], seps + 1]).astype(np.int64)
    ends = np.concatenate([seps, [len(words)]]).astype(np.int64)
    m = len(hashes)
    with np.errstate(over="ignore"):
        powers = np.cumprod(np.concatenate([[np.uint64(1)], np.full(m, _P, dtype=np.uint64)]), dtype=np.uint64)
        inverse = np.cumprod(np.concatenate([[np.uint64(1)], np.full(m - 1, _Q, dtype=np.uint64)]),
                             dtype=np.uint64) if m else np.zeros(0, np.uint64)
        prefix = np.concatenate([[np.uint64(0)], np.cumsum(hashes * inverse, dtype=np.uint64)])
    return Words(hashes, starts[:len(texts)], ends[:len(texts)], prefix, powers)


def window_at(words: Words, at: np.ndarray, length: np.ndarray | int) -> np.ndarray:
    """Hashes of the windows of ``length`` words starting at positions ``at`` of ``words.hashes``."""
    with np.errstate(over="ignore"):
        return words.powers[at + length - 1] * (words.prefix[at + length] - words.prefix[at])


def windows(words: Words, length: int, texts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every window of ``length`` words inside one text (of ``texts``, indices into the batch; None: all):
    (hashes, text index of each), in text order then position order."""
    texts = np.arange(len(words.starts)) if texts is None else np.asarray(texts, dtype=np.int64)
    n = np.maximum(words.counts[texts] - length + 1, 0)
    owner = np.repeat(texts, n)
    if not len(owner):
        return np.zeros(0, np.uint64), owner
    first = np.cumsum(n) - n
    at = words.starts[owner] + np.arange(len(owner)) - np.repeat(first, n)
    m = len(words.hashes)
    with np.errstate(over="ignore"):  # every window of the batch by slices, then the valid ones
        every = words.powers[length - 1:m] * (words.prefix[length:] - words.prefix[:m - length + 1])
    return every[at], owner


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` by sorting (NumPy 2's hash-based ``unique`` is ten times slower on large int arrays)."""
    values = np.sort(values)
    return values[np.concatenate([[True], values[1:] != values[:-1]])] if len(values) else values


def _unique_first(hashes: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    uniq, first = np.unique(hashes, return_index=True)  # stable: the first occurrence, the lowest owner
    return uniq, owner[first]


def heldout_grams(texts: Sequence[str], ngram: int) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], list[int], int]:
    """The n-grams of held-out ``texts`` as ``EvalIndex.build`` indexes them.

    Returns:
        ({length: (sorted unique hashes, index in ``texts`` of the first text holding each)}, the lengths in the
        order their first text comes, the number of texts too short to check (< ``MIN_ITEM_TOKENS`` words)).
    """
    words = word_hashes(texts)
    counts = words.counts
    lengths = np.where(counts >= MIN_ITEM_TOKENS, np.minimum(counts, ngram), 0)
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    full = np.flatnonzero(lengths == ngram)
    if len(full):
        out[ngram] = _unique_first(*windows(words, ngram, full))
    short = np.flatnonzero((lengths > 0) & (lengths < ngram))
    if len(short):
        hashes = window_at(words, words.starts[short], lengths[short])
        for length in np.unique(lengths[short]):
            mine = lengths[short] == length
            out[int(length)] = _unique_first(hashes[mine], short[mine])
    checked = lengths[lengths > 0]
    order = list(dict.fromkeys(int(x) for x in checked))  # first appearance, as EvalIndex.build's dict
    return {n: out[n] for n in order}, order, int((lengths == 0).sum())


def bitmap_add(bitmap: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """Set the bits of ``hashes``' top ``BITMAP_BITS`` bits in ``bitmap`` (uint8, 2^BITMAP_BITS / 8 bytes)."""
    top = (hashes >> np.uint64(64 - BITMAP_BITS)).astype(np.intp)
    np.bitwise_or.at(bitmap, top >> 3, (1 << (top & 7)).astype(np.uint8))
    return bitmap


def bitmap_has(bitmap: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """Whether each hash's top bits are set in ``bitmap``: False means surely not a held-out n-gram."""
    top = (hashes >> np.uint64(64 - BITMAP_BITS)).astype(np.intp)
    return (bitmap[top >> 3] >> (top & 7).astype(np.uint8)) & 1 == 1


@dataclass
class HeldoutGrams:
    """The held-out n-grams: ``grams`` (n,) uint64, sorted within each length, the lengths one after the other in
    ``lengths`` order (``bounds[k]:bounds[k+1]`` holds ``lengths[k]``); ``owners`` (n,) int64 the first held-out
    document holding each (its row in the corpus, or in the frame given to :func:`decontaminate_train`); ``bitmap``
    one bit per value of the top ``BITMAP_BITS`` bits, set for those of the held-out n-grams (:func:`bitmap_add`).
    A hit is named by its position in ``grams``: ordered by length, then hash, as ``EvalIndex.hits`` orders
    them."""

    lengths: list[int]
    bounds: np.ndarray
    grams: np.ndarray
    owners: np.ndarray | None = None
    bitmap: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.grams)

    @classmethod
    def load(cls, folder: Path, owners: bool = False) -> "HeldoutGrams":
        """The index :func:`merge_index_files` wrote, memory-mapped (read-only, shared between the processes that
        map it); ``owners`` only when asked for."""
        meta = json.loads((folder / "lengths.json").read_text())
        return cls(meta["lengths"], np.asarray(meta["bounds"], dtype=np.int64),
                   np.asarray(np.load(folder / "grams.npy", mmap_mode="r")),  # a plain view: no memmap per slice
                   np.asarray(np.load(folder / "owners.npy", mmap_mode="r")) if owners else None,
                   np.load(folder / "bitmap.npy"))

    def lookup(self, words: Words, texts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Distinct (text index, n-gram position) pairs of held-out n-grams found in the batch's ``texts``; the
        pairs sorted by text, then position."""
        found_texts, found_grams = [], []
        for k, length in enumerate(self.lengths):
            lo, hi = int(self.bounds[k]), int(self.bounds[k + 1])
            hashes, owner = windows(words, length, texts)
            if not len(hashes) or hi == lo:
                continue
            maybe = np.flatnonzero(bitmap_has(self.bitmap, hashes))
            hashes, owner = hashes[maybe], owner[maybe]
            grams = self.grams[lo:hi]
            at = np.searchsorted(grams, hashes)
            at[at == len(grams)] = 0
            hit = grams[at] == hashes
            found_texts.append(owner[hit])
            found_grams.append(at[hit] + lo)
        if not found_texts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        pairs = sorted_unique(np.concatenate(found_texts) * (len(self.grams) + 1) + np.concatenate(found_grams))
        return pairs // (len(self.grams) + 1), pairs % (len(self.grams) + 1)


def merge_index(parts: Sequence[tuple[dict[int, tuple[np.ndarray, np.ndarray]], dict[int, int]]]) -> HeldoutGrams:
    """One index from the held-out n-grams of every part, in corpus order: ``parts`` holds, per part, {length:
    (sorted unique hashes, first owner's corpus row)} and {length: corpus row of the part's first text of that
    length}. A hash in several parts keeps the owner of the earliest."""
    first: dict[int, int] = {}
    for _, firsts in parts:
        for length, row in firsts.items():
            first[length] = min(first.get(length, row), row)
    lengths = sorted(first, key=first.__getitem__)
    grams, owners, bounds = [], [], [0]
    for length in lengths:
        chunks = [p[length] for p, _ in parts if length in p]
        uniq, at = np.unique(np.concatenate([h for h, _ in chunks]), return_index=True)
        grams.append(uniq)
        owners.append(np.concatenate([o for _, o in chunks])[at])
        bounds.append(bounds[-1] + len(uniq))
    grams_all = np.concatenate(grams) if grams else np.zeros(0, np.uint64)
    bitmap = bitmap_add(np.zeros(1 << (BITMAP_BITS - 3), dtype=np.uint8), grams_all)
    return HeldoutGrams(lengths, np.asarray(bounds, dtype=np.int64), grams_all,
                        np.concatenate(owners) if owners else np.zeros(0, np.int64), bitmap)


def count_hits(docs: np.ndarray, grams: np.ndarray, n_grams: int, common_min_docs: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Of distinct (document, n-gram) hit pairs: the n-grams hit and how many documents hold each, and the pairs
    whose n-gram is held by fewer than ``common_min_docs`` of these documents (the others are common phrasing
    whatever the rest of the corpus holds)."""
    hit, n_docs = np.unique(grams, return_counts=True)
    rare = np.zeros(n_grams, dtype=bool)
    rare[hit[n_docs < common_min_docs]] = True
    keep = rare[grams]
    return hit, n_docs, docs[keep], grams[keep]


def decide(docs: np.ndarray, grams: np.ndarray, docs_per_gram: np.ndarray, common_min_docs: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The documents removed: (document, distinct uncommon n-grams shared, the first of them by position), in
    document order, from distinct hit pairs sorted by document then position."""
    keep = docs_per_gram[grams] < common_min_docs
    docs, grams = docs[keep], grams[keep]
    removed, first, n = np.unique(docs, return_index=True, return_counts=True)
    return removed, n, grams[first]


def describe_all(index: HeldoutGrams, positions: np.ndarray, texts: Sequence[str]) -> list[str]:
    """The words of the n-gram at each of ``positions`` in ``index``, found in the matching text of ``texts`` (a
    held-out document holding it, its owner), as ``EvalIndex.describe`` shows them; each text's words are hashed
    once."""
    words_of: dict[tuple[str, int], tuple[list[str], np.ndarray]] = {}
    shown = []
    for position, text in zip(positions, texts):
        length = length_of(index, int(position))
        if (text, length) not in words_of:
            words = tokens(text)
            words_of[text, length] = words, window_hashes(words, length)
        words, hashes = words_of[text, length]
        at = np.flatnonzero(hashes == index.grams[int(position)])
        shown.append(" ".join(words[int(at[0]):int(at[0]) + length]) if len(at) else "")
    return shown


def removal_rows(doc_ids: Sequence, sources: Sequence, n_shared: np.ndarray, ngram: int,
                 shown: Sequence[tuple[str, str]]) -> pd.DataFrame:
    """The removal ledger's rows (``REMOVAL_COLUMNS``) for removed training documents: ``shown`` is each one's
    first shared n-gram's words and the held-out document holding it."""
    rows = [dict(doc_id=d, source=s, stage=STAGE, rule=RULE, value=float(n), threshold=1.0,
                 detail=f"shares {ngram}-gram {text!r} with held-out document {item} ({int(n)} n-grams)")
            for d, s, n, (text, item) in zip(doc_ids, sources, n_shared, shown)]
    return pd.DataFrame(rows, columns=REMOVAL_COLUMNS)


def length_of(index: HeldoutGrams, position: int) -> int:
    """The length of the n-gram at ``position`` of ``index.grams``."""
    return index.lengths[int(np.searchsorted(index.bounds, position, side="right")) - 1]


def decontam_documents(kept: pd.DataFrame) -> int:
    """The documents :func:`decontaminate_train` goes through: the held-out ones it indexes and the training ones it
    looks up."""
    return int(kept["split"].isin(("heldout", "train")).sum())


def decontaminate_train(kept: pd.DataFrame, *, ngram: int, common_min_docs: int,
                        advance: Callable[[int], None] = lambda n: None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Drop training rows of ``kept`` (columns doc_id, source, text, split) that overlap a held-out document.

    ``advance(n)`` is called as the held-out documents are indexed and the training ones looked up: a progress bar
    over ``decontam_documents(kept)`` documents (none when ``ngram`` is 0).

    Returns:
        (``kept`` without those rows, one removal row per dropped document: ``value`` = distinct shared n-grams,
        ``threshold`` = 1, the first shared n-gram and the held-out document in ``detail``).
    """
    if ngram == 0:
        return kept, pd.DataFrame(columns=REMOVAL_COLUMNS)
    heldout = kept[(kept["split"] == "heldout").to_numpy()]
    grams, order, _ = heldout_grams(heldout["text"].astype(str).tolist(), ngram)
    advance(len(heldout))
    index = merge_index([(grams, {n: int(grams[n][1].min()) for n in order})])
    train = kept[(kept["split"] == "train").to_numpy()]
    docs, hit_grams = index.lookup(word_hashes(train["text"].astype(str).tolist()))
    advance(len(train))
    if not len(docs):
        return kept, pd.DataFrame(columns=REMOVAL_COLUMNS)
    hit, n_docs, docs, hit_grams = count_hits(docs, hit_grams, len(index), common_min_docs)
    per_gram = np.zeros(len(index), dtype=np.int64)
    per_gram[hit] = n_docs
    removed, n_shared, first = decide(docs, hit_grams, per_gram, common_min_docs)
    if not len(removed):
        return kept, pd.DataFrame(columns=REMOVAL_COLUMNS)
    owners = index.owners[first]
    texts = dict(zip(np.unique(owners).tolist(), heldout["text"].iloc[np.unique(owners)].astype(str)))
    ids = dict(zip(np.unique(owners).tolist(), heldout["doc_id"].iloc[np.unique(owners)]))
    shown = [(text, ids[int(o)]) for text, o in zip(describe_all(index, first, [texts[int(o)] for o in owners]),
                                                     owners)]
    rows = removal_rows(train["doc_id"].iloc[removed].tolist(), train["source"].iloc[removed].tolist(), n_shared,
                        ngram, shown)
    return kept[~kept["doc_id"].isin(set(rows["doc_id"])).to_numpy()], rows


# --------------------------------------------------------------------------- the stage's passes, one kept part each
#
# Labels (one byte per row of a kept part, ``.npy``): 0 training, 1 held-out, 2 removed (``tasks.tokenizer.encode``).

def _texts(part_path: str, rows: np.ndarray) -> list[str]:
    texts = pq.read_table(part_path, columns=["text"]).column("text").take(rows).to_pylist()
    pa.default_memory_pool().release_unused()  # Arrow's allocator keeps freed memory otherwise
    return texts


def index_part(part_path: str, labels_path: str, out_path: str, ngram: int, first_row: int) -> dict:
    """The held-out n-grams of one kept part (rows labelled 1 in ``labels_path``), written to ``out_path``
    (``.npz``: ``grams_<n>_<b>`` the sorted unique hashes of each length n whose top ``BUCKET_BITS`` bits are b,
    ``owners_<n>_<b>`` the corpus row of the first document holding each, the part's first row being
    ``first_row``).

    Returns:
        {"docs": held-out documents, "unchecked": of them too short to check, "firsts": {length: corpus row of the
        part's first document of that length}}.
    """
    rows = np.flatnonzero(np.load(labels_path) == 1)
    grams, order, unchecked = heldout_grams(_texts(part_path, rows), ngram) if len(rows) else ({}, [], 0)
    arrays = {}
    for length, (hashes, owners) in grams.items():
        bounds = _bucket_bounds(hashes)
        for b in range(1 << BUCKET_BITS):
            arrays[f"grams_{length}_{b}"] = hashes[bounds[b]:bounds[b + 1]]
            arrays[f"owners_{length}_{b}"] = rows[owners[bounds[b]:bounds[b + 1]]] + first_row
    with open(out_path, "wb") as f:
        np.savez(f, **arrays)
    return {"docs": int(len(rows)), "unchecked": unchecked,
            "firsts": {str(n): int(rows[grams[n][1].min()] + first_row) for n in order}}


def _bucket_bounds(sorted_hashes: np.ndarray) -> np.ndarray:
    """Where each value of the top ``BUCKET_BITS`` bits starts in sorted hashes, and the end: (2^bits + 1,)."""
    edges = np.arange(1 << BUCKET_BITS, dtype=np.uint64) << np.uint64(64 - BUCKET_BITS)
    return np.append(np.searchsorted(sorted_hashes, edges), len(sorted_hashes))


def merge_index_files(paths: Sequence[str], firsts: Sequence[dict[str, int]], folder: Path) -> int:
    """Merge the held-out n-grams :func:`index_part` wrote for every part (in corpus order) into the index at
    ``folder`` (``grams.npy``, ``owners.npy``, ``bitmap.npy``, ``lengths.json``; :meth:`HeldoutGrams.load`), one
    (length, top-bits bucket) at a time: memory holds one
    bucket of the index, never all of it. A hash in several parts keeps the owner of the earliest.

    Returns:
        the n-grams in the index.
    """
    first: dict[int, int] = {}
    for part in firsts:
        for length, row in part.items():
            first[int(length)] = min(first.get(int(length), row), row)
    lengths = sorted(first, key=first.__getitem__)
    folder.mkdir(parents=True, exist_ok=True)
    bitmap = np.zeros(1 << (BITMAP_BITS - 3), dtype=np.uint8)
    pieces, sizes, bounds = [], [], [0]
    for length in lengths:
        holding = [np.load(path) for path, part in zip(paths, firsts) if str(length) in part]
        for b in range(1 << BUCKET_BITS):
            hashes = [data[f"grams_{length}_{b}"] for data in holding]
            owners = [data[f"owners_{length}_{b}"] for data in holding]
            uniq, at = np.unique(np.concatenate(hashes), return_index=True)  # stable: the earliest part's owner
            bitmap_add(bitmap, uniq)
            piece = folder / f"piece-{len(pieces):05d}.npz"
            with open(piece, "wb") as f:
                np.savez(f, grams=uniq, owners=np.concatenate(owners)[at])
            pieces.append(piece)
            sizes.append(len(uniq))
        for data in holding:
            data.close()
        bounds.append(sum(sizes))
    n = bounds[-1]
    grams = np.lib.format.open_memmap(folder / "grams.npy", mode="w+", dtype=np.uint64, shape=(n,))
    owners = np.lib.format.open_memmap(folder / "owners.npy", mode="w+", dtype=np.int64, shape=(n,))
    at = 0
    for piece, size in zip(pieces, sizes):
        with np.load(piece) as data:
            grams[at:at + size], owners[at:at + size] = data["grams"], data["owners"]
        at += size
        piece.unlink()
    grams.flush()
    owners.flush()
    del grams, owners
    np.save(folder / "bitmap.npy", bitmap)
    (folder / "lengths.json").write_text(json.dumps({"lengths": lengths, "bounds": bounds}))
    return n


def lookup_part(part_path: str, labels_path: str, index_dir: str, out_path: str, common_min_docs: int) -> dict:
    """Look the training documents of one kept part (rows labelled 0) up in the held-out index at ``index_dir``
    (:func:`merge_index_files`); write to ``out_path`` (``.npz``) the n-grams hit with how many of the part's
    documents hold each (``hit``, ``n_docs``) and the distinct (row, n-gram position) pairs (``rows``, ``grams``)
    of the n-grams held by fewer than ``common_min_docs`` of them (the others are common phrasing anyway).

    Returns:
        {"docs": training documents looked up, "pairs": pairs written}.
    """
    rows = np.flatnonzero(np.load(labels_path) == 0)
    index = HeldoutGrams.load(Path(index_dir))
    docs, grams = (index.lookup(word_hashes(_texts(part_path, rows))) if len(rows) and len(index)
                   else (np.zeros(0, np.int64), np.zeros(0, np.int64)))
    hit, n_docs, docs, grams = count_hits(docs, grams, len(index), common_min_docs)
    with open(out_path, "wb") as f:
        np.savez(f, hit=hit, n_docs=n_docs, rows=rows[docs], grams=grams)
    return {"docs": int(len(rows)), "pairs": int(len(docs))}
