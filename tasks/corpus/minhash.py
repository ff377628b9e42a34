"""Near-duplicate detection: MinHash signatures, LSH banding, exact-Jaccard verification, union-find (SPEC §7).

Shingles are word 5-grams (lower-cased whitespace tokens) or, for languages written without spaces, character
5-grams. Each shingle is hashed to x in [0, p) with xxh64, and permutation i maps it to h_i(x) = (a_i·x + b_i) mod p
with p = 2^31 − 1; since x, a_i < 2^31 the product stays below 2^62 and int64 arithmetic is exact. The signature
is the per-permutation minimum. With b bands of r rows, a pair of Jaccard similarity s becomes a candidate with
probability 1 − (1 − s^r)^b (Leskovec, Rajaraman & Ullman, "Mining of Massive Datasets", ch. 3).
"""

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import xxhash

from tasks.corpus.config import MinHashConfig

MERSENNE_P = (1 << 31) - 1


def lsh_candidate_probability(s: float, bands: int, rows: int) -> float:
    """P(pair with Jaccard ``s`` shares at least one band) = 1 − (1 − s^rows)^bands (SPEC §7)."""
    return 1.0 - (1.0 - s**rows) ** bands


def lsh_threshold(bands: int, rows: int) -> float:
    """Similarity where the candidate S-curve is steepest, ≈ (1/bands)^(1/rows) (SPEC §7)."""
    return (1.0 / bands) ** (1.0 / rows)


def shingles(text: str, size: int, by_chars: bool) -> set[str]:
    """Shingle set of ``text``: word ``size``-grams, or character ``size``-grams when ``by_chars``.

    A text shorter than ``size`` units is one shingle of all its units (so only an identical text can match it);
    an empty text has no shingles.
    """
    units: Sequence[str] = "".join(text.lower().split()) if by_chars else text.lower().split()
    if len(units) == 0:
        return set()
    sep = "" if by_chars else " "
    if len(units) < size:
        return {sep.join(units)}
    return {sep.join(units[i:i + size]) for i in range(len(units) - size + 1)}


def jaccard(a: set, b: set) -> float:
    """|a ∩ b| / |a ∪ b|; 0 when both are empty (empty documents are never duplicates of each other)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


class MinHasher:
    """Signatures of shape (num_perm,) int64 for shingle sets, one fixed family of permutations per seed."""

    def __init__(self, num_perm: int, seed: int):
        rng = np.random.default_rng(seed)
        self.a = rng.integers(1, MERSENNE_P, size=num_perm, dtype=np.int64)
        self.b = rng.integers(0, MERSENNE_P, size=num_perm, dtype=np.int64)

    def signature(self, shingle_set: set[str]) -> np.ndarray | None:
        """Per-permutation minimum of h_i over the set; None for an empty set (it gets no LSH buckets)."""
        if not shingle_set:
            return None
        x = np.fromiter((xxhash.xxh64_intdigest(s.encode("utf-8")) % MERSENNE_P for s in shingle_set), dtype=np.int64,
                        count=len(shingle_set))
        return ((x[:, None] * self.a[None, :] + self.b[None, :]) % MERSENNE_P).min(axis=0)  # (n_shingles, k) → (k,)


def lsh_candidates(signatures: list[np.ndarray | None], bands: int, rows: int) -> set[tuple[int, int]]:
    """Index pairs (i < j) that agree on all ``rows`` values of at least one of ``bands`` bands."""
    buckets: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    for idx, sig in enumerate(signatures):
        if sig is None:
            continue
        for band in range(bands):
            buckets[(band, sig[band * rows:(band + 1) * rows].tobytes())].append(idx)
    return {pair for members in buckets.values() if len(members) > 1 for pair in combinations(members, 2)}


class UnionFind:
    """Disjoint sets over 0..n-1 whose root is always the lowest index of the set."""

    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, i: int, j: int) -> None:
        ri, rj = self.find(i), self.find(j)
        if ri != rj:
            self.parent[max(ri, rj)] = min(ri, rj)


@dataclass
class NearDuplicates:
    """``representative[i]``: lowest index of i's cluster (i itself if alone); ``jaccard_to_rep[i]``: exact
    Jaccard between i and its representative (1.0 for representatives); candidate/verified pair counts."""

    representative: list[int]
    jaccard_to_rep: list[float]
    num_candidates: int
    num_verified: int


def near_duplicates(texts: Sequence[str], by_chars: Sequence[bool], cfg: MinHashConfig,
                    progress: Callable[[int, int], None] | None = None) -> NearDuplicates:
    """Cluster near-duplicate ``texts`` (SPEC §7): LSH candidates verified by exact Jaccard >= threshold.

    ``by_chars[i]`` selects character shingles for text i. Two texts shingled differently never match.
    """
    hasher = MinHasher(cfg.num_perm, cfg.seed)
    sets = [shingles(t, cfg.shingle_size, c) for t, c in zip(texts, by_chars)]
    sigs = []
    for i, s in enumerate(sets):
        sigs.append(hasher.signature({f"{int(by_chars[i])}|{x}" for x in s}))  # char and word shingles never collide
        if progress and (i % 1000 == 0 or i == len(sets) - 1):
            progress(i + 1, len(sets))
    candidates = lsh_candidates(sigs, cfg.bands, cfg.rows)
    uf, verified = UnionFind(len(texts)), 0
    for i, j in sorted(candidates):
        if by_chars[i] == by_chars[j] and jaccard(sets[i], sets[j]) >= cfg.jaccard_threshold:
            uf.union(i, j)
            verified += 1
    reps = [uf.find(i) for i in range(len(texts))]
    sims = [1.0 if r == i else jaccard(sets[i], sets[r]) for i, r in enumerate(reps)]
    return NearDuplicates(reps, sims, len(candidates), verified)
