"""MinHash for near-duplicate detection (docs/methods.md §7): shingles, signatures and LSH band keys, vectorised over
many documents at once. What is done with the band keys (candidate pairs, verification, leader clustering,
families) is :mod:`tasks.corpus.near_dedup`.

Pipeline and the shapes that travel between its steps (``n`` documents, ``k = num_perm``, ``b`` bands × ``r`` rows):

1. :func:`shingle_hashes` / :func:`signatures`: word 5-grams of lower-cased whitespace tokens, or character 5-grams
   for languages written without spaces, each hashed to a uint64 by polynomial hashing of code points and
   XXH64's avalanche, vectorised over a batch of texts (one xxhash call per shingle costs more than the whole
   batch pass); word and character hashes never coincide: the top bit tells them apart. The signature is an
   ``(n, k)`` uint32 matrix of values below 2^31, from one of two families (``MinHashConfig.family``):

   * "oph" (default), one-permutation hashing with optimal densification (Li, Owen & Zhang, NIPS 2012;
     Shrivastava, ICML 2017): each shingle hash is mixed once with the seed; its top 32 bits pick one of ``k``
     bins, 31 other bits are its value, and a bin keeps its minimum. An empty bin ``i`` copies the value of the
     first non-empty bin among ``probe(i, 1), probe(i, 2), ...``, a 2-universal hash of (bin, attempt) shared by
     all documents, which keeps P(values agree) = Jaccard. One hash per shingle instead of ``k``.
   * "universal", docs/methods.md §7's family: a hash is reduced to ``x = hash mod p`` with ``p = 2^31 − 1`` and permutation
     ``i`` maps it to ``h_i(x) = (a_i·x + b_i) mod p``; the signature is the per-permutation minimum.

   Documents without shingles get the sentinel row ``EMPTY`` (2^32 − 1, above any value of either family).
2. :func:`band_keys`: one uint64 per band and document, ``(n, b)`` — what a sharded build stores per document.

A pair of Jaccard similarity ``s`` becomes a candidate with probability ``1 − (1 − s^r)^b`` (Leskovec, Rajaraman &
Ullman, "Mining of Massive Datasets", ch. 3). Signatures depend only on each document's text and the config's seed,
so they are the same whatever batch or shard a document is processed in.

Shingle hashes, "oph" signatures and band keys are computed by numba kernels (shingles and signatures in one pass
over each document's code points) when numba is importable (``HAVE_NUMBA``; set ``USE_NUMBA = False`` to force
numpy); the numpy functions are the reference, and the kernels' results equal theirs bit for bit. The kernels
compile on first use (seconds) and are cached on disk by numba afterwards.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from tasks.corpus.config import MinHashConfig, lsh_candidate_probability, lsh_threshold  # noqa: F401 (re-exported)

MERSENNE_P = (1 << 31) - 1
EMPTY = np.uint32((1 << 32) - 1)  # signature value of a document without shingles (every h_i(x) is < p)

_U64 = np.uint64
_MASK63 = _U64((1 << 63) - 1)
_CHAR_BIT = _U64(1 << 63)  # set on character-shingle hashes, clear on word-shingle hashes
# XXH64's avalanche constants (Collet, xxHash specification, "XXH64 avalanche").
_PRIME64_2 = _U64(0xC2B2AE3D27D4EB4F)
_PRIME64_3 = _U64(0x165667B19E3779F9)
_UNIT_BASE = 0x9E3779B97F4A7C15  # odd: multiplier of the byte polynomial inside a word
_NGRAM_BASE = _U64(0xD6E8FEB86659FD93)  # odd: multiplier combining unit hashes into an n-gram hash
_WORD_SEED = _U64(0x6A09E667F3BCC908)
_CHAR_SEED = _U64(0xBB67AE8584CAA73B)
_SHORT_TAG = _U64(0x3C6EF372FE94F82B)  # marks the single shingle of a text shorter than the shingle size
_BAND_SEED = _U64(0xA54FF53A5F1D36F1)
_OPH_SEED = _U64(0x510E527FADE682D1)  # mixed with cfg.seed into the one-permutation hash
_OPH_RANDOM_PROBES = 4  # random densification probes per bin, in multiples of k, before the cyclic sweep
_DELTA = 2.0**-33  # offset keeping a zero h_i(x) away from the float wrap-around, see _minhash_rows
# Shingles per matrix block: a (k × block) float64 block stays in the L2 cache; not a power of two, whose row
# stride would alias in the cache; small enough that OpenBLAS multiplies it on one thread (k <= 136).
_BLOCK = 640
_CHUNK_CHARS = 1 << 19  # characters of text hashed together: fewer numpy calls per document
_PIECE = 1 << 20  # characters per polynomial piece (bounds the cached power tables)

# Shingle hashing and "oph" signatures run in compiled kernels (numba, see "Compiled kernels") when numba is
# installed; the numpy functions are the reference they are tested against and the fallback. USE_NUMBA may be set
# to False to force the numpy path; it is read at each call.
HAVE_NUMBA = importlib.util.find_spec("numba") is not None
USE_NUMBA = HAVE_NUMBA


# ---------------------------------------------------------------------------------------------------------------
# Candidate probabilities: lsh_candidate_probability and lsh_threshold live beside the config they check


def s_curve(bands: int, rows: int, points: Sequence[float] = (0.5, 0.6, 0.7, 0.8, 0.9)) -> list[tuple[float, float]]:
    """``[(s, P(candidate | s)), ...]`` at the similarities ``points``, for logging a configuration's S-curve."""
    return [(float(s), lsh_candidate_probability(float(s), bands, rows)) for s in points]


# ---------------------------------------------------------------------------------------------------------------
# Shingles


def shingles(text: str, size: int, by_chars: bool) -> set[str]:
    """Shingle set of ``text``: word ``size``-grams, or character ``size``-grams when ``by_chars``.

    Words are the whitespace tokens of the lower-cased text; characters are those of the lower-cased text with
    whitespace removed. A text shorter than ``size`` units is one shingle of all its units (so only an identical
    text can match it); an empty text has no shingles.
    """
    if by_chars:
        chars = "".join(text.lower().split())
        return {chars[i:i + size] for i in range(max(len(chars) - size, 0) + 1)} if chars else set()
    words = text.lower().split()
    if len(words) < size:
        return {" ".join(words)} if words else set()
    return set(map(" ".join, zip(*(words[i:] for i in range(size)))))


def jaccard(a: set, b: set) -> float:
    """|a ∩ b| / |a ∪ b|; 0 when both are empty (empty documents are never duplicates of each other)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def jaccard_hashes(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two shingle sets given as sorted unique hash arrays (:func:`shingle_hashes`).

    Equal to :func:`jaccard` on the string sets unless two distinct shingles share a 64-bit hash.
    """
    if len(a) == 0 and len(b) == 0:
        return 0.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)


def _fmix64(h: np.ndarray) -> np.ndarray:
    """XXH64's avalanche, in place on a uint64 array (a bijection, so it adds no collisions)."""
    h ^= h >> _U64(33)
    h *= _PRIME64_2
    h ^= h >> _U64(29)
    h *= _PRIME64_3
    h ^= h >> _U64(32)
    return h


class _Powers:
    """``base^m`` and ``base^-m`` modulo 2^64 for m < length, grown on demand."""

    def __init__(self, base: int):
        self.base, self.inverse = base, pow(base, -1, 1 << 64)
        self.up = self.down = np.ones(0, dtype=np.uint64)

    def get(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.up) < length:
            size = 1 << max(length - 1, 1).bit_length()
            steps = np.full((2, size), 1, dtype=np.uint64)
            steps[0, 1:], steps[1, 1:] = self.base, self.inverse
            self.up, self.down = np.cumprod(steps, axis=1)  # wraps modulo 2^64
        return self.up[:length], self.down[:length]


_UNIT_POWERS = _Powers(_UNIT_BASE)
# str.split()'s whitespace (str.isspace); none lies above U+3000, which stands for every higher code point.
_WHITESPACE = np.array([chr(c).isspace() for c in range(0x3001)] + [False])


_CONTEXTUAL = np.uint32(0xFFFFFFFF)  # lower-case table entry of Σ (final-sigma rule) and İ (two characters)


@functools.lru_cache(maxsize=1)
def _lower_table() -> np.ndarray:
    """(65536,) uint32: ``ord(chr(c).lower())`` for each BMP code point c, 0x20 for every whitespace code point
    (str.isspace), ``_CONTEXTUAL`` for U+03A3 and U+0130.

    str.lower() maps every code point to one code point independently of its neighbours except capital sigma
    (σ or final ς by context) and U+0130 (two code points); the astral code points map one to one as well and none
    is whitespace. Shingles never contain whitespace, so folding it into one code point loses nothing.
    """
    table = np.array([ord(low) if len(low := chr(c).lower()) == 1 else c for c in range(1 << 16)], dtype=np.uint32)
    table[np.flatnonzero(_WHITESPACE[:-1])] = 0x20
    table[[0x3A3, 0x130]] = _CONTEXTUAL
    return table


def _code_points(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Code points of the lower-cased ``texts`` joined by spaces, every whitespace code point as U+0020 (uint32),
    and the start of each text (n + 1).

    Lower-cases by a table lookup on the code points (str.lower() on millions of non-ASCII characters costs
    several times as much); a batch with Σ or İ, whose lower case depends on context or changes the length, goes
    through str.lower() itself.
    """
    lens = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    raw = np.frombuffer("\n".join(texts).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    astral = raw.size and int(raw.max()) > 0xFFFF
    cps = _lower_table()[np.minimum(raw, np.uint32(0xFFFF)) if astral else raw]
    if astral:
        pos = np.flatnonzero(raw > 0xFFFF)
        uniq, inv = np.unique(raw[pos], return_inverse=True)
        cps[pos] = np.array([ord(chr(c).lower()) for c in uniq.tolist()], dtype=np.uint32)[inv]
    if cps.size and (cps == _CONTEXTUAL).any():
        lows = [t.lower() for t in texts]
        lens = np.fromiter(map(len, lows), dtype=np.int64, count=len(lows))
        cps = np.frombuffer("\n".join(lows).encode("utf-32-le", "surrogatepass"), dtype=np.uint32).copy()
        cps[_is_space(cps)] = 0x20
    return cps, np.concatenate([[0], np.cumsum(lens + 1)])


def _unit_hashes(cps: np.ndarray, starts: np.ndarray, by_chars: bool) -> tuple[np.ndarray, np.ndarray]:
    """Hashes (uint64) of the shingling units of the texts in ``cps`` (from :func:`_code_points`) and the number
    of units per text.

    Units are the non-whitespace characters (``by_chars``) or the maximal runs of them (words), exactly the units
    of :func:`shingles`. A character hashes to the avalanche of its code point; a word spanning positions
    ``s..e`` to ``fmix64(Σ_m (cp_m + 1)·R^(m − s) mod 2^64)``, a polynomial hash evaluated for all words at once
    from one product with a power table and a segmented sum.
    """
    space = cps == np.uint32(0x20)  # _code_points folds all whitespace into U+0020
    if by_chars:
        pos = np.flatnonzero(~space)
        units = cps[pos].astype(np.uint64)
        units += _U64(1)
        units *= _PRIME64_2
    else:
        edge = np.flatnonzero(np.diff(space, prepend=True, append=True))
        pos, ends = edge[0::2], edge[1::2]  # word i spans pos[i]..ends[i] - 1
        units = np.empty(len(pos), dtype=np.uint64)
        # Pieces of about _PIECE characters, cut at word starts, bound the power tables.
        cuts = np.unique(np.concatenate([[0], np.searchsorted(pos, np.arange(_PIECE, len(cps), _PIECE)),
                                         [len(pos)]]))
        for w0, w1 in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            lo, hi = int(pos[w0]), int(ends[w1 - 1])
            up, down = _UNIT_POWERS.get(hi - lo)
            prefix = np.empty(hi - lo + 1, dtype=np.uint64)
            prefix[0] = 0
            v = np.multiply(cps[lo:hi], up, dtype=np.uint64)  # (cp + 1)·R^m as cp·R^m + R^m: no cast pass
            v += up
            np.cumsum(v, out=prefix[1:])
            s0 = pos[w0:w1] - lo
            sums = prefix[ends[w0:w1] - lo]
            sums -= prefix[s0]
            sums *= down[s0]
            units[w0:w1] = sums
    units ^= _CHAR_SEED if by_chars else _WORD_SEED
    counts = np.diff(np.searchsorted(pos, starts))
    return _fmix64(units), counts.astype(np.int64)


def _is_space(cps: np.ndarray) -> np.ndarray:
    """str.isspace() of each code point: arithmetic for ASCII, a table lookup for the few code points >= U+0085."""
    space = (cps - np.uint32(9) <= 4) | (cps - np.uint32(28) <= 4)  # \t..\r and \x1c..' ' (wrapping compare)
    high = np.flatnonzero(cps >= 0x85)
    if len(high):
        space[high] = _WHITESPACE[np.minimum(cps[high], len(_WHITESPACE) - 1)]
    return space


def _ngram_hashes(units: np.ndarray, counts: np.ndarray, size: int, by_chars: bool) -> tuple[np.ndarray, np.ndarray]:
    """Shingle hashes of consecutive documents whose unit hashes are concatenated in ``units``.

    ``counts[d]`` units belong to document d. Returns (hashes, per-document shingle counts): ``counts[d] − size + 1``
    n-grams, one shingle of all units when ``0 < counts[d] < size``, none when it is 0. An n-gram hashes to
    ``fmix64(Σ_t u_t·M^(size−1−t) mod 2^64 ⊕ seed)`` (ordered: a permutation of the same words differs).
    """
    counts = np.asarray(counts, dtype=np.int64)
    offs = np.concatenate([[0], np.cumsum(counts)])
    n_sh = np.where(counts >= size, counts - size + 1, np.minimum(counts, 1))
    out_offs = np.concatenate([[0], np.cumsum(n_sh)])
    out = np.empty(int(out_offs[-1]), dtype=np.uint64)
    full = np.flatnonzero(counts >= size)
    if len(full):
        span = len(units) - size + 1
        g = units[:span].copy()
        for t in range(1, size):
            g *= _NGRAM_BASE
            g += units[t:t + span]
        # Boolean compaction instead of per-shingle index arithmetic: a window is dropped when it starts in the
        # last size − 1 units of its document (it would cross into the next), which covers every short document.
        keep = np.ones(span, dtype=bool)
        tail = offs[1:, None] - np.arange(1, size)[None, :]
        tail = tail[(tail >= offs[:-1, None]) & (tail < span)]
        keep[tail] = False
        slots = np.ones(len(out), dtype=bool)
        slots[out_offs[:-1][(counts > 0) & (counts < size)]] = False  # the one shingle of each short document
        out[slots] = g[keep]
    for length in range(1, size):
        short = np.flatnonzero(counts == length)
        if len(short):
            g = units[offs[short]].copy()
            for t in range(1, length):
                g *= _NGRAM_BASE
                g += units[offs[short] + t]
            g += _U64(int(_SHORT_TAG) * length % (1 << 64))
            out[out_offs[short]] = g
    out ^= _CHAR_SEED if by_chars else _WORD_SEED
    _fmix64(out)
    if by_chars:
        out |= _CHAR_BIT
    else:
        out &= _MASK63
    return out, n_sh


def _batch_shingle_hashes(texts: Sequence[str], size: int, by_chars: bool) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated shingle hashes (with repeats) of ``texts``, all shingled the same way, and per-text counts."""
    if not len(texts):
        return np.empty(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    kernels = _kernels()
    if kernels is not None:
        out, counts = kernels.shingles(texts, by_chars, size)
        return out[:int(counts.sum())], counts
    cps, starts = _code_points(texts)
    units, counts = _unit_hashes(cps, starts, by_chars)
    return _ngram_hashes(units, counts, size, by_chars)


def shingle_hash_table(texts: Sequence[str], size: int, by_chars: bool | Sequence[bool]
                       ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`shingle_hashes` of each of ``texts`` back to back, computed batch-wise: ``(starts, hashes)``, text d's
    sorted unique hashes being ``hashes[starts[d]:starts[d + 1]]`` (``starts`` (n + 1,) int64, ``hashes`` uint64)."""
    n = len(texts)
    flags = _as_flags(by_chars, n)
    counts = np.zeros(n, dtype=np.int64)
    parts = []
    for mode in (False, True):
        mine = np.flatnonzero(flags == mode)
        if not len(mine):
            continue
        hashes, per_text = _batch_shingle_hashes([texts[i] for i in mine], size, mode)
        # Sort each text's run in place, then drop repeats for the whole batch at once: np.unique per text costs
        # several times as much in call overhead.
        ends = np.cumsum(per_text)
        for part in np.split(hashes, ends[:-1]):
            part.sort()
        first = np.ones(len(hashes), dtype=bool)
        first[1:] = hashes[1:] != hashes[:-1]
        first[ends[:-1][per_text[1:] > 0]] = True  # a text's first hash is kept even if it equals the last one
        kept = np.concatenate([[0], np.cumsum(first)])[np.concatenate([[0], ends])]  # kept hashes before each text
        counts[mine] = np.diff(kept)
        parts.append((mine, hashes[first], kept[:-1]))
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    if len(parts) == 1 and len(parts[0][0]) == n:  # one shingling mode: already in text order
        return starts, parts[0][1]
    table = np.empty(int(starts[-1]), dtype=np.uint64)
    for mine, kept_hashes, local in parts:
        table[np.repeat(starts[mine] - local, counts[mine]) + np.arange(len(kept_hashes))] = kept_hashes
    return starts, table


def shingle_hash_sets(texts: Sequence[str], size: int, by_chars: bool | Sequence[bool]) -> list[np.ndarray]:
    """:func:`shingle_hashes` of each of ``texts``, computed batch-wise (:func:`shingle_hash_table`, split)."""
    starts, table = shingle_hash_table(texts, size, by_chars)
    return [table[a:b] for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]


def shingle_hashes(text: str, size: int, by_chars: bool) -> np.ndarray:
    """Sorted unique uint64 hashes of ``shingles(text, size, by_chars)``; an empty array when it has none.

    Word-shingle hashes have the top bit clear and character-shingle hashes have it set, so the two never collide.
    Hashing is vectorised over a batch of texts: units (words or characters) get a 64-bit polynomial hash of their
    code points mixed by XXH64's avalanche, and an n-gram combines its units' hashes with another polynomial and
    the same avalanche (see ``_unit_hashes`` and ``_ngram_hashes``).
    """
    hashes, _ = _batch_shingle_hashes([text], size, by_chars)
    return np.unique(hashes)


# ---------------------------------------------------------------------------------------------------------------
# Signatures


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``num_perm`` permutations h_i(x) = (a_i·x + b_i) mod p as int64 arrays (a in [1, p), b in [0, p))."""
    rng = np.random.default_rng(seed)
    a = rng.integers(1, MERSENNE_P, size=num_perm, dtype=np.int64)
    b = rng.integers(0, MERSENNE_P, size=num_perm, dtype=np.int64)
    return a, b


class Signatures(NamedTuple):
    """``signatures``: (n, num_perm) uint32, rows of documents without shingles all ``EMPTY``;
    ``has_shingles``: (n,) bool."""

    signatures: np.ndarray
    has_shingles: np.ndarray


def _coefficients(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(k, 3) float64 C with C·(x >> 16, x & 0xffff, 1) = (a'·x_hi + a·x_lo + b)/p + δ, a' = a·2^16 mod p."""
    a_shift = (a << 16) % MERSENNE_P
    coef = np.stack([a_shift / MERSENNE_P, a / MERSENNE_P, b / MERSENNE_P + _DELTA], axis=1)
    return np.ascontiguousarray(coef)


def _minhash_rows(x: np.ndarray, counts: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """Per-document minimum of h_i over consecutive runs of ``x`` (``counts[d] >= 1`` values for document d).

    Returns (len(counts), k) uint32. Exact, evaluated in float64 without any integer product: since 2^31 ≡ 1
    (mod p), a·x ≡ a'·x_hi + a·x_lo with a' = a·2^16 mod p, x = x_hi·2^16 + x_lo, so
    h/p = frac(x_hi·a'/p + x_lo·a/p + b/p). One small matrix product gives F = that sum + δ for a block of
    shingles and all permutations; F < 2^17, so its rounding error is below 2^-34, less than δ = 2^-33 (a zero h
    cannot wrap to 1) and less than half the gap 1/p > 2^-31 between distinct values (the order of frac(F) is the
    order of h). The block minimum of frac(F) is then converted back: h = round((f − δ)·p), error < 2^-3.
    """
    k, n_docs = coef.shape[0], len(counts)
    offs = np.concatenate([[0], np.cumsum(counts)])
    xs = np.empty((3, len(x)), dtype=np.float64)
    xs[0] = x >> _U64(16)
    xs[1] = x & _U64(0xFFFF)
    xs[2] = 1.0
    best = np.full((k, n_docs), 2.0)
    f = np.empty((k, _BLOCK))
    floor = np.empty((k, _BLOCK))
    for lo in range(0, len(x), _BLOCK):
        hi = min(lo + _BLOCK, len(x))
        d0 = int(np.searchsorted(offs, lo, side="right")) - 1
        d1 = int(np.searchsorted(offs, hi, side="left"))
        fb, fl = f[:, :hi - lo], floor[:, :hi - lo]
        np.matmul(coef, xs[:, lo:hi], out=fb)
        np.floor(fb, out=fl)
        fb -= fl
        seg = np.maximum(offs[d0:d1], lo) - lo
        mins = np.minimum.reduceat(fb, seg, axis=1)
        np.minimum(best[:, d0:d1], mins, out=best[:, d0:d1])
    return np.rint((best.T - _DELTA) * MERSENNE_P).astype(np.uint32)


def _oph_seed(seed: int) -> np.uint64:
    """64-bit key of the one-permutation hash for ``seed`` (any int, reduced modulo 2^64)."""
    return _fmix64(np.array([seed % (1 << 64)], dtype=np.uint64) ^ _OPH_SEED)[0]


@functools.lru_cache(maxsize=16)
def oph_probes(num_perm: int, seed: int) -> np.ndarray:
    """Densification probe table, (k, 4k + k − 1) int64 with k = ``num_perm``: row i lists the bins an empty bin i
    tries, in order (Shrivastava 2017, "optimal densification").

    Columns t < 4k: ``((a·(i·4k + t mod p) + b) mod p) mod k`` with p = 2^31 − 1 and a in [1, p), b in [0, p) drawn
    from ``seed`` — a 2-universal (Carter–Wegman) hash of (bin, attempt). The remaining k − 1 columns are
    i + 1, i + 2, ... (mod k): a document with at least one non-empty bin resolves every bin by the end of the row,
    while random probes miss the single non-empty bin of a one-bin document 4k times in a row with probability
    ≈ e^-4 only. The table is read-only (shared by callers).
    """
    k, attempts = num_perm, _OPH_RANDOM_PROBES * num_perm
    rng = np.random.default_rng([seed % (1 << 64), 0x0F0F])
    a = int(rng.integers(1, MERSENNE_P))
    b = int(rng.integers(0, MERSENNE_P))
    i = np.arange(k, dtype=np.int64)[:, None]
    key = (i * attempts + np.arange(attempts, dtype=np.int64)[None, :]) % MERSENNE_P  # injective for k < 23,000
    random_part = ((a * key + b) % MERSENNE_P) % k  # a·key < 2^62: no int64 overflow
    sweep = (i + np.arange(1, k, dtype=np.int64)[None, :]) % k
    table = np.concatenate([random_part, sweep], axis=1)
    table.flags.writeable = False
    return table


def _oph_rows(h: np.ndarray, counts: np.ndarray, k: int, seed: int) -> np.ndarray:
    """One-permutation MinHash rows of consecutive runs of shingle hashes ``h`` (uint64, repeats allowed).

    ``counts[d] >= 1`` hashes belong to document d. Returns (len(counts), k) uint32, values below 2^31.
    Each hash is mixed once, ``g = fmix64(h ⊕ seed key)``; bin ``(g_hi32 · k) >> 32`` (Lemire's multiply-shift
    range reduction on the top 32 bits), value bits 1..31 of g. Bin minima for the whole batch at once:
    ``np.minimum.at`` on the flat (document, bin) index. Empty bins are then densified with :func:`oph_probes`.
    """
    n = len(counts)
    g = h ^ _oph_seed(seed)
    _fmix64(g)
    flat = np.repeat(np.arange(n, dtype=np.uint64) * _U64(k), counts)
    flat += ((g >> _U64(32)) * _U64(k)) >> _U64(32)
    vals = (g & _U64(0xFFFFFFFF)).astype(np.uint32)
    vals >>= np.uint32(1)
    sig = np.full(n * k, EMPTY, dtype=np.uint32)
    np.minimum.at(sig, flat.astype(np.intp), vals)
    sig = sig.reshape(n, k)
    return _densify(sig, oph_probes(k, seed))


def _densify(sig: np.ndarray, probes: np.ndarray) -> np.ndarray:
    """Fill the ``EMPTY`` entries of ``sig`` ((n, k) uint32, C order, each row with a non-empty bin) in place,
    and return it.

    Entry (d, i) takes ``sig[d, probes[i, t]]`` for the first t where that bin of d was non-empty before filling
    (Shrivastava 2017). Vectorised over all empty entries with flat indices, a doubling window of attempts per
    step (most entries resolve at the first probe).
    """
    k = sig.shape[1]
    out = sig.reshape(-1)
    base = out.copy()  # probes read the bins as hashed, never values copied in this pass
    empty = np.flatnonzero(base == EMPTY)
    cols = empty % k
    row_start = empty - cols
    t0, step = 0, 1
    while len(empty):
        if t0 >= probes.shape[1]:
            raise AssertionError("densification found no non-empty bin: a row without shingles was passed")
        src = base[row_start[:, None] + probes[cols, t0:t0 + step]]  # (m, step)
        ok = src != EMPTY
        hit = ok.any(axis=1)
        out[empty[hit]] = src[hit, ok[hit].argmax(axis=1)]
        miss = ~hit
        empty, cols, row_start = empty[miss], cols[miss], row_start[miss]
        t0, step = t0 + step, step * 2
    return sig


# ---------------------------------------------------------------------------------------------------------------
# Compiled kernels
#
# The same hashes as _unit_hashes → _ngram_hashes → _oph_rows → _densify, bit for bit, computed per document: one
# branch-free pass over its code points sums each word's polynomial directly (the numpy path gets the same sum from
# prefix sums and inverse powers), then the n-gram polynomial rolls over the unit hashes, and each shingle's bin
# keeps its minimum by a store, not a branch (whether a value is a new minimum is a coin toss the branch predictor
# loses).
# All arithmetic is on uint64 operands (an int64 operand would promote the product to float64).

@functools.lru_cache(maxsize=16)
def _ngram_top(size: int) -> np.uint64:
    """M^(size − 1) mod 2^64: the weight of the oldest unit in an n-gram window."""
    return _U64(pow(int(_NGRAM_BASE), size - 1, 1 << 64))


class _Kernels(NamedTuple):
    shingles: Callable  # (texts, by_chars, size) -> (hashes with slack at the end, (n,) counts)
    oph: Callable  # (texts, by_chars, size, k, seed[, lens, out]) -> ((n, k) uint32 signatures, (n,) has shingles)
    band_keys: Callable  # ((n, k) uint32 signatures, bands, rows) -> (n, bands) uint64 keys


# The _k_* functions are plain Python until _compiled() rebinds each name to its numba dispatcher (callees first,
# so callers compile against the dispatchers). Module-level functions, not closures: numba's on-disk cache keys a
# closure by its cells, which would differ in every process.
_SPACE = np.uint32(0x20)
_ONE = _U64(1)
_UNIT_BASE_U64 = _U64(_UNIT_BASE)
_LOW32 = _U64(0xFFFFFFFF)
# R^m mod 2^64 for the character at offset m < _WORD_POWERS of its word (a table lookup, not a chain of products);
# a longer word's character multiplies in R^_WORD_POWERS once per _WORD_POWERS characters before it.
_WORD_POWERS = 64
_WORD_UP = np.array([pow(_UNIT_BASE, m, 1 << 64) for m in range(_WORD_POWERS)], dtype=np.uint64)
_WORD_UP_WRAP = _U64(pow(_UNIT_BASE, _WORD_POWERS, 1 << 64))


def _k_fmix64(h):
    h ^= h >> _U64(33)
    h *= _PRIME64_2
    h ^= h >> _U64(29)
    h *= _PRIME64_3
    return h ^ (h >> _U64(32))


def _k_units(cps, lo, hi, by_chars, table, mapped, units):
    """Writes the raw hashes of the shingling units of the text at cps[lo:hi] (before the seed and the avalanche)
    to units[0:] and returns how many: ``(c + 1)·PRIME64_2`` per non-space character, or ``Σ_m (c_m + 1)·R^m``
    per word.

    No branch depends on the text (a word boundary would be a mispredicted branch every few characters): every
    character's running value is stored at the current unit's slot, and the slot advances when a space ends a word.
    """
    nw = 0
    if by_chars:
        for j in range(lo, hi):
            c = np.uint32(cps[j]) if mapped else table[cps[j]]
            units[nw] = (_U64(c) + _ONE) * _PRIME64_2
            nw += c != _SPACE
        return nw
    u = _U64(0)
    length = 0  # characters of the current word before this one
    inword = 0
    for j in range(lo, hi):
        c = np.uint32(cps[j]) if mapped else table[cps[j]]
        space = c == _SPACE
        nw += space & (inword == 1)  # a space after a word: the next unit
        if length < _WORD_POWERS:
            power = _WORD_UP[length]
        else:
            power = _WORD_UP[length & (_WORD_POWERS - 1)]
            for _ in range(length // _WORD_POWERS):
                power *= _WORD_UP_WRAP
        inword = 1 - np.int64(space)
        u = (u + (_U64(c) + _ONE) * power) & (_U64(0) - _U64(inword))  # 0 on a space
        length = (length + 1) & (-inword)
        units[nw] = u
    return nw + inword


def _k_doc_shingles(cps, lo, hi, by_chars, size, top, units, out, o, table, mapped):
    """Writes the shingle hashes of the text at cps[lo:hi] to out[o:] and returns how many (``units``: scratch of at
    least hi − lo + 1 entries)."""
    seed = _CHAR_SEED if by_chars else _WORD_SEED
    count = _k_units(cps, lo, hi, by_chars, table, mapped, units)
    first = o
    g = _U64(0)
    for t in range(count):
        u = _k_fmix64(units[t] ^ seed)
        units[t] = u
        if t >= size:
            g -= units[t - size] * top  # the unit leaving the window
        g = g * _NGRAM_BASE + u
        if t >= size - 1:
            out[o] = g
            o += 1
    if 0 < count < size:
        out[o] = g + _SHORT_TAG * _U64(count)
        o += 1
    for t in range(first, o):
        h = _k_fmix64(out[t] ^ seed)
        out[t] = (h | _CHAR_BIT) if by_chars else (h & _MASK63)
    return o - first


def _k_longest(starts):
    longest = 0
    for d in range(len(starts) - 1):
        longest = max(longest, starts[d + 1] - 1 - starts[d])
    return longest


def _k_shingles(cps, starts, by_chars, size, top, table, mapped):
    n = len(starts) - 1
    out = np.empty(len(cps) + 1, dtype=np.uint64)  # a text of c characters has at most c shingles
    counts = np.zeros(n, dtype=np.int64)
    units = np.empty(_k_longest(starts) + 1, dtype=np.uint64)
    o = 0
    for d in range(n):
        m = _k_doc_shingles(cps, starts[d], starts[d + 1] - 1, by_chars, size, top, units, out, o, table, mapped)
        counts[d] = m
        o += m
    return out, counts


def _k_oph(cps, starts, by_chars, size, top, key, probes, table, mapped, sig, has):
    """Fills ``sig`` ((n, k) uint32) and ``has`` ((n,) bool) for the n texts of ``starts``."""
    n, k = len(starts) - 1, probes.shape[0]
    kk = _U64(k)
    longest = _k_longest(starts)
    buf = np.empty(longest + 1, dtype=np.uint64)
    units = np.empty(longest + 1, dtype=np.uint64)
    base = np.empty(k, dtype=np.uint32)
    for d in range(n):
        row = sig[d]
        row[:] = EMPTY
        m = _k_doc_shingles(cps, starts[d], starts[d + 1] - 1, by_chars, size, top, units, buf, 0, table, mapped)
        has[d] = m > 0
        if m == 0:
            continue
        for t in range(m):
            g = _k_fmix64(buf[t] ^ key)
            row_bin = ((g >> _U64(32)) * kk) >> _U64(32)
            row[row_bin] = min(np.uint32((g & _LOW32) >> _ONE), row[row_bin])  # a store, not a branch
        base[:] = row  # densification reads the bins as hashed, never values copied from them
        for i in range(k):
            if base[i] == EMPTY:
                for t in range(probes.shape[1]):
                    v = base[probes[i, t]]
                    if v != EMPTY:
                        row[i] = v
                        break


def _k_band_keys(sigs, bands, rows):
    """:func:`band_keys` of uint32 signatures, row by row."""
    n = sigs.shape[0]
    keys = np.empty((n, bands), dtype=np.uint64)
    for d in range(n):
        for b in range(bands):
            key = _U64(b) + _BAND_SEED
            col = b * rows
            for w in range(0, rows, 2):
                word = _U64(sigs[d, col + w]) << _U64(32)
                if w + 1 < rows:
                    word |= _U64(sigs[d, col + w + 1])
                key = _k_fmix64(key ^ word)
            keys[d, b] = key
    return keys


def _kernel_input(texts: Sequence[str], lens: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(code units, text starts, lower-case table, already mapped) for the kernels; ``lens``: the texts' lengths
    when the caller has them.

    Text without Σ, İ or astral code points goes to the kernel raw — uint8 when ASCII, else uint16 — and is
    lower-cased through ``_lower_table`` inside it, saving a pass over a four-times-wider array; anything else is
    mapped first by :func:`_code_points`. Both give the kernel the same code points.
    """
    joined = "\n".join(texts)
    if "\u03a3" not in joined and "\u0130" not in joined:
        if joined.isascii():
            raw = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
        else:
            raw = np.frombuffer(joined.encode("utf-16-le", "surrogatepass"), dtype=np.uint16)
        if len(raw) == len(joined):  # no astral code point (those take two UTF-16 units)
            if lens is None:
                lens = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
            starts = np.empty(len(lens) + 1, dtype=np.int64)
            starts[0] = 0
            np.cumsum(lens + 1, out=starts[1:])
            return raw, starts, _lower_table(), False
    cps, starts = _code_points(texts)
    return cps, starts, _lower_table(), True


@functools.lru_cache(maxsize=1)
def _compiled() -> _Kernels | None:
    """The numba kernels, compiled on first use (and cached on disk by numba); None when numba cannot be imported.

    Outputs: ``shingles`` returns all texts' shingle hashes back to back (uint64, followed by unused slack) and the
    (n,) int64 count per text, as ``_batch_shingle_hashes``; ``oph`` returns the (n, k) uint32 signatures of
    ``_oph_rows`` (``EMPTY`` rows for texts without shingles) and the (n,) bool "has shingles", written into
    ``out`` (two such arrays) when given; ``band_keys`` returns :func:`band_keys` of uint32 signatures.
    """
    try:
        import numba
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    jit = numba.njit(cache=True, nogil=True)
    module = globals()
    for name in ("_k_fmix64", "_k_units", "_k_doc_shingles", "_k_longest", "_k_shingles", "_k_oph",
                 "_k_band_keys"):
        if not isinstance(module[name], numba.core.registry.CPUDispatcher):
            module[name] = jit(module[name])
    shingles_kernel, oph_kernel, band_kernel = module["_k_shingles"], module["_k_oph"], module["_k_band_keys"]

    def shingles(texts, by_chars, size):
        cps, starts, table, mapped = _kernel_input(texts)
        return shingles_kernel(cps, starts, bool(by_chars), size, _ngram_top(size), table, mapped)

    def oph(texts, by_chars, size, k, seed, lens=None, out=None):
        cps, starts, table, mapped = _kernel_input(texts, lens)
        sig, has = out if out is not None else (np.empty((len(texts), k), np.uint32), np.empty(len(texts), bool))
        oph_kernel(cps, starts, bool(by_chars), size, _ngram_top(size), _oph_seed(seed), oph_probes(k, seed),
                   table, mapped, sig, has)
        return sig, has

    def band_keys(sigs, bands, rows):
        return band_kernel(sigs, bands, rows)

    return _Kernels(shingles, oph, band_keys)


def _kernels() -> _Kernels | None:
    """The compiled kernels when ``USE_NUMBA`` is set and numba is importable, else None (numpy path)."""
    return _compiled() if USE_NUMBA else None


def _as_flags(by_chars: bool | Sequence[bool], n: int) -> np.ndarray:
    if isinstance(by_chars, (bool, np.bool_)):
        return np.full(n, bool(by_chars))
    flags = np.asarray(by_chars, dtype=bool)
    if flags.shape != (n,):
        raise ValueError(f"by_chars has {flags.size} entries for {n} texts; pass one flag per text or a single bool")
    return flags


def signatures(texts: Sequence[str], by_chars: bool | Sequence[bool], cfg: MinHashConfig,
               progress: Callable[[int, int], None] | None = None) -> Signatures:
    """MinHash signatures of ``texts``: (n, ``cfg.num_perm``) values of family ``cfg.family`` with seed
    ``cfg.seed`` (docs/methods.md §7; see the module docstring for "oph" and "universal").

    ``by_chars``: one flag per text (character shingles when true) or one flag for all. Texts are processed in
    chunks of about 500,000 characters; within a chunk, all shingle hashes are concatenated: "universal" evaluates
    them as (k × block) matrices with per-document minima (``np.minimum.reduceat``), "oph" bins them once
    (:func:`_oph_rows`, or the compiled kernel, which hashes, bins and densifies a document in one pass). ``progress(done, total)`` is called about every 1,000 texts and at the end. Raises
    ValueError when ``by_chars`` does not match ``texts``.
    """
    n = len(texts)
    flags = _as_flags(by_chars, n)
    oph = cfg.family == "oph"
    coef = None if oph else _coefficients(*permutations(cfg.num_perm, cfg.seed))
    kernels = _kernels() if oph else None
    # The kernel writes every row it is given (EMPTY rows for texts without shingles); the numpy path only those
    # with shingles.
    sigs = np.full((n, cfg.num_perm), EMPTY, dtype=np.uint32) if kernels is None else \
        np.empty((n, cfg.num_perm), dtype=np.uint32)
    has = np.zeros(n, dtype=bool)
    lens = np.fromiter(map(len, texts), dtype=np.int64, count=n)
    through = np.cumsum(lens)  # characters of texts 0..i
    sliceable = isinstance(texts, (list, tuple))
    start = reported = 0
    while start < n:
        # The chunk runs to the first text that brings it to _CHUNK_CHARS characters (at least one text).
        before = int(through[start - 1]) if start else 0
        end = min(max(int(np.searchsorted(through, before + _CHUNK_CHARS, side="left")) + 1, start + 1), n)
        chunk = flags[start:end]
        for mode in (False, True):
            sel = chunk == mode
            if not sel.any():
                continue
            whole = bool(sel.all())
            idx = np.arange(start, end) if whole else np.flatnonzero(sel) + start
            batch = texts[start:end] if whole and sliceable else [texts[i] for i in idx]
            if kernels is not None:
                if whole:  # the kernel writes straight into the result
                    kernels.oph(batch, mode, cfg.shingle_size, cfg.num_perm, cfg.seed, lens[start:end],
                                (sigs[start:end], has[start:end]))
                else:
                    sigs[idx], has[idx] = kernels.oph(batch, mode, cfg.shingle_size, cfg.num_perm, cfg.seed,
                                                      lens[idx])
                continue
            hashes, counts = _batch_shingle_hashes(batch, cfg.shingle_size, mode)
            nonempty = counts > 0
            if hashes.size:
                rows = idx[nonempty]
                if oph:
                    sigs[rows] = _oph_rows(hashes, counts[nonempty], cfg.num_perm, cfg.seed)
                else:
                    sigs[rows] = _minhash_rows(hashes % _U64(MERSENNE_P), counts[nonempty], coef)
                has[rows] = True
        start = end
        if progress and (end == n or end - reported >= 1000):
            progress(end, n)
            reported = end
    return Signatures(sigs, has)


# ---------------------------------------------------------------------------------------------------------------
# LSH


def band_keys(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n, bands) uint64: a 64-bit hash of each band's ``rows`` signature values (band j = columns j·rows ...).

    Two documents agree on a band key exactly when they agree on the band's rows (up to 64-bit hash collisions).
    The band index is mixed in, so equal rows in different bands give different keys. Pairs of uint32 rows are
    packed losslessly into uint64 words and chained through XXH64's avalanche (row by row in a compiled kernel
    for uint32 signatures when numba is used, else vectorised in numpy; the same keys bit for bit).
    Raises ValueError when the signatures have fewer than ``bands * rows`` columns.
    """
    sigs = np.asarray(sigs)
    if sigs.ndim != 2 or sigs.shape[1] < bands * rows:
        raise ValueError(f"signatures of shape {sigs.shape} have fewer than bands*rows = {bands * rows} columns")
    kernels = _kernels()
    if kernels is not None and sigs.dtype == np.uint32:
        return kernels.band_keys(sigs, bands, rows)
    n = sigs.shape[0]
    vals = sigs[:, :bands * rows].astype(np.uint64).reshape(n, bands, rows)
    if rows % 2:
        vals = np.concatenate([vals, np.zeros((n, bands, 1), dtype=np.uint64)], axis=2)
    words = (vals[:, :, 0::2] << _U64(32)) | vals[:, :, 1::2]
    key = np.broadcast_to(np.arange(bands, dtype=np.uint64) + _BAND_SEED, (n, bands)).copy()
    for w in range(words.shape[2]):
        key ^= words[:, :, w]
        _fmix64(key)
    return key
