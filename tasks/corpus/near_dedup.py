"""Near-duplicate decisions (docs/methods.md §7): candidate pairs from LSH band keys, exact-Jaccard verification,
leader clustering in corpus order, and near-duplicate families.

One implementation for every caller. The corpus build runs these steps out of core (band keys and pairs in DuckDB
tables that spill to disk, verification in the shard workers, see :mod:`tasks.corpus.build`); the audit, the tests
and ``benchmarks/near_dedup.py`` call :func:`near_duplicates`, which runs the same steps on in-memory texts.

Steps and shapes (``n`` documents at dense positions ``0..n-1`` in corpus order, ``b`` bands):

1. :func:`candidate_pairs`: from a DuckDB relation ``(pos BIGINT, grp BIGINT, band_0 … band_{b-1} UBIGINT)`` of the
   documents that may match, the unique pairs ``(i, j)``, ``i < j``, agreeing on at least one band key within one
   ``grp`` (the source for scope "source", and always the shingling mode: word and character shingles never meet).
   A bucket's members, in corpus order, are each paired with the bucket's first ``max_links`` members only, so a
   bucket of L documents yields at most ``max_links·L`` pairs instead of L(L−1)/2; buckets of up to
   ``max_links + 1`` members are complete. Leader clustering compares a document with earlier documents, which the
   first members of its buckets are.
2. :func:`shingle_sets` of the candidate documents (sorted unique shingle hashes, back to back) and
   :func:`verify_sets`: the exact Jaccard of each pair's two sets (a compiled merge, equal to
   :func:`tasks.corpus.minhash.jaccard_hashes`); pairs at or above ``jaccard_threshold`` are verified.
3. :func:`leaders`: in corpus order, a document is removed when it is verified against an earlier document that is
   kept; chains (A~B~C with A far from C) never remove C on B's account.
4. :func:`family_roots`: connected components of the verified pairs, each rooted at its first member in corpus order,
   for document-aware held-out splits (near copies stay on one side).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import duckdb
import numba
import numpy as np
import pyarrow as pa
from scipy import sparse
from scipy.sparse import csgraph

from tasks.corpus.config import MinHashConfig
from tasks.corpus.minhash import band_keys, shingle_hash_table, signatures

log = logging.getLogger(__name__)

MAX_LINKS = 32
# Pairs scanned in Python before the compiled leader scan takes over: ~0.15 s of Python at ~0.15 µs a pair, below
# the ~0.6 s the kernel takes to compile or load from numba's cache in a fresh process (measured on the build host).
COMPILED_SCAN_MIN_PAIRS = 1_000_000

__all__ = ["MAX_LINKS", "NearDuplicates", "ShingleSets", "bucket_pairs", "candidate_pairs", "cluster_pairs",
           "cluster_verified", "family_roots", "group_labels", "iter_leaders", "leaders", "near_duplicates", "shingle_sets",
           "unique_pairs", "verify", "verify_sets"]


def candidate_pairs(con: duckdb.DuckDBPyConnection, keys: str, bands: int, out: str,
                    max_links: int = MAX_LINKS) -> int:
    """Create table ``out (i BIGINT, j BIGINT)``: unique candidate pairs ``i < j`` of relation ``keys``.

    ``keys`` names a table or view with columns ``pos`` (BIGINT, corpus order), ``grp`` (BIGINT) and ``band_0`` …
    ``band_{bands-1}`` (UBIGINT, :func:`tasks.corpus.minhash.band_keys`). Each band is one grouped self-join, so
    DuckDB bounds memory by its ``memory_limit`` and spills to its ``temp_directory``. Returns the pair count.
    """
    con.execute("CREATE OR REPLACE TEMP TABLE _pairs_raw (i BIGINT, j BIGINT)")
    for band in range(bands):
        con.execute(f"""
            INSERT INTO _pairs_raw
            WITH m AS (SELECT pos, grp, band_{band} AS key FROM {keys}),
            hit AS (SELECT grp, key FROM m GROUP BY grp, key HAVING count(*) > 1),
            r AS (SELECT m.pos, m.grp, m.key,
                         row_number() OVER (PARTITION BY m.grp, m.key ORDER BY m.pos) - 1 AS rnk
                  FROM m SEMI JOIN hit ON m.grp = hit.grp AND m.key = hit.key),
            head AS (SELECT * FROM r WHERE rnk < {int(max_links)})
            SELECT a.pos AS i, b.pos AS j FROM head a JOIN r b
              ON a.grp = b.grp AND a.key = b.key AND a.rnk < b.rnk""")
    con.execute(f"CREATE OR REPLACE TABLE {out} AS SELECT DISTINCT i, j FROM _pairs_raw")
    con.execute("DROP TABLE _pairs_raw")
    return int(con.execute(f"SELECT count(*) FROM {out}").fetchone()[0])


def bucket_pairs(band: np.ndarray, grp: np.ndarray, key: np.ndarray, pos: np.ndarray,
                 max_links: int = MAX_LINKS) -> np.ndarray:
    """:func:`candidate_pairs` in numpy over one partition of the buckets: ``(m, 2)`` int64 pairs ``i < j`` (with
    repeats: a pair agreeing on several bands comes once per band), sorted by ``(i, j)`` and unique.

    Row ``r`` says document ``pos[r]`` has key ``key[r]`` in band ``band[r]`` of candidate group ``grp[r]``; a
    bucket is one (band, group, key). As in :func:`candidate_pairs`, each member of a bucket, in corpus order, is
    paired with the bucket's first ``max_links`` members before it. The build's candidate tasks call it on the
    buckets of their hash partition, so a bucket is never split between tasks.
    """
    pos = np.asarray(pos, dtype=np.int64)
    order = np.lexsort((pos, key, grp, band))
    cols = [np.asarray(c)[order] for c in (band, grp, key)]
    pos = pos[order]
    n = len(pos)
    if n < 2:
        return np.zeros((0, 2), np.int64)
    new = np.ones(n, dtype=bool)
    new[1:] = np.logical_or.reduce([c[1:] != c[:-1] for c in cols])
    start = np.maximum.accumulate(np.where(new, np.arange(n), 0))
    rank = np.arange(n) - start
    member = np.flatnonzero(rank > 0)
    links = np.minimum(rank[member], max_links)
    first = np.cumsum(links) - links
    head = np.repeat(start[member], links) + (np.arange(int(links.sum())) - np.repeat(first, links))
    pairs = np.stack([pos[head], np.repeat(pos[member], links)], axis=1)
    return unique_pairs(pairs)


def unique_pairs(pairs: np.ndarray) -> np.ndarray:
    """The distinct rows of ``pairs`` ((m, 2) int64), sorted by ``(i, j)``."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
    keep = np.ones(len(pairs), dtype=bool)
    keep[1:] = np.any(pairs[1:] != pairs[:-1], axis=1)
    return pairs[keep]


def verify(pairs: np.ndarray, similarity: Callable[[int, int], float],
           threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact similarity of each candidate pair; returns the verified pairs ``(m, 2)`` int64 and their similarities.

    ``similarity(i, j)`` is the exact Jaccard of two documents' shingle sets (any callable; the build and
    :func:`near_duplicates` call :func:`verify_sets` on shingle-hash sets instead). Similarities stay in numpy (one
    float per pair): a dict of tuples would cost ~200 bytes a pair at crawl scale.
    """
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    sims = np.fromiter((similarity(i, j) for i, j in pairs.tolist()),
                       dtype=np.float64, count=len(pairs))
    ok = sims >= threshold
    return pairs[ok], sims[ok]


class ShingleSets(NamedTuple):
    """Sorted unique shingle hashes (:func:`tasks.corpus.minhash.shingle_hashes`) of documents by corpus position:
    document ``pos[k]`` has ``hashes[starts[k]:starts[k + 1]]``. ``pos`` (m,) int64 ascending, ``starts`` (m + 1,)
    int64, ``hashes`` uint64: the arrays the build's shingle pass writes per shard."""

    pos: np.ndarray
    starts: np.ndarray
    hashes: np.ndarray


def shingle_sets(texts: Sequence[str], pos: np.ndarray, size: int, by_chars: bool | Sequence[bool]) -> ShingleSets:
    """The shingle sets of ``texts``, the documents at positions ``pos`` (ascending)."""
    starts, hashes = shingle_hash_table(texts, size, by_chars)
    return ShingleSets(np.asarray(pos, dtype=np.int64), starts, hashes)


def verify_sets(pairs: np.ndarray, left: ShingleSets, right: ShingleSets,
                threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`verify` with the exact Jaccard of ``i``'s shingle set in ``left`` and ``j``'s in ``right`` (which may
    be the same): a compiled merge of the two sorted hash runs per pair, equal to
    :func:`tasks.corpus.minhash.jaccard_hashes` bit for bit. Returns the verified pairs ``(m, 2)`` int64 and their
    similarities, in the order of ``pairs``.

    Raises:
        KeyError: a pair's document has no set in ``left`` (``i``) or ``right`` (``j``).
    """
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    at_i, at_j = _rank(left.pos, pairs[:, 0]), _rank(right.pos, pairs[:, 1])
    sims = _jaccard_runs(at_i, left.starts, left.hashes, at_j, right.starts, right.hashes)
    ok = sims >= threshold
    return pairs[ok], sims[ok]


def _rank(pos: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    at = np.searchsorted(pos, wanted)
    bad = (at >= len(pos)) | (pos[np.minimum(at, len(pos) - 1)] != wanted) if len(pos) else np.ones(len(wanted), bool)
    if len(wanted) and bad.any():
        raise KeyError(f"no shingle set for position {int(wanted[np.argmax(bad)])}")
    return at.astype(np.int64)


@numba.njit(cache=True, nogil=True)
def _jaccard_runs(at_i: np.ndarray, starts_i: np.ndarray, hashes_i: np.ndarray, at_j: np.ndarray,
                  starts_j: np.ndarray, hashes_j: np.ndarray) -> np.ndarray:
    """|A ∩ B| / |A ∪ B| of sorted unique runs, pair by pair; 0 when both are empty (as jaccard_hashes)."""
    sims = np.empty(len(at_i), dtype=np.float64)
    for p in range(len(at_i)):
        a, a_end = starts_i[at_i[p]], starts_i[at_i[p] + 1]
        b, b_end = starts_j[at_j[p]], starts_j[at_j[p] + 1]
        size_a, size_b = a_end - a, b_end - b
        if size_a == 0 and size_b == 0:
            sims[p] = 0.0
            continue
        inter = 0
        while a < a_end and b < b_end:
            x, y = hashes_i[a], hashes_j[b]
            if x == y:
                inter += 1
                a += 1
                b += 1
            elif x < y:
                a += 1
            else:
                b += 1
        sims[p] = inter / (size_a + size_b - inter)
    return sims


def iter_leaders(batches: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], n: int
                 ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Leader clustering over verified pairs given in ``(j, i)`` order (batches of ``i``, ``j``, similarity arrays).

    Yields, per input batch, ``(removed, leader, similarity)`` ascending by ``removed``: document ``j`` is removed as
    a near duplicate of the first (lowest) ``i`` it is verified against among the documents kept so far. Memory: one
    byte per position (``n``) plus the batch in flight. The first ``COMPILED_SCAN_MIN_PAIRS`` pairs are scanned in
    Python, the rest by a compiled loop (numba), so a small build never pays the kernel's compilation; both scans
    take the same decisions.

    Raises:
        ValueError: the pairs are not sorted by ``(j, i)`` (the decision would depend on their order).
    """
    gone = np.zeros(n, dtype=np.bool_)
    last = (-1, -1)
    num_scanned = 0
    for i_arr, j_arr, s_arr in batches:
        i_arr, j_arr = np.asarray(i_arr, dtype=np.int64), np.asarray(j_arr, dtype=np.int64)
        if not len(i_arr):
            continue
        step_j, step_i = np.diff(j_arr), np.diff(i_arr)
        if (j_arr[0], i_arr[0]) < last or np.any((step_j < 0) | ((step_j == 0) & (step_i < 0))):
            raise ValueError("verified pairs must come sorted by (j, i)")
        last = (int(j_arr[-1]), int(i_arr[-1]))
        scan = _leader_scan if num_scanned >= COMPILED_SCAN_MIN_PAIRS else _leader_scan_python
        taken = scan(i_arr, j_arr, gone)
        num_scanned += len(i_arr)
        yield j_arr[taken], i_arr[taken], np.asarray(s_arr, dtype=np.float64)[taken]


def leaders(batches: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], n: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`iter_leaders` collected into three arrays (int64, int64, float64; 24 bytes per removed document)."""
    parts = list(iter_leaders(batches, n))
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
    return tuple(np.concatenate(cols) for cols in zip(*parts))  # type: ignore[return-value]


@numba.njit(cache=True)
def _leader_scan(i: np.ndarray, j: np.ndarray, gone: np.ndarray) -> np.ndarray:
    """Marks, in order, each pair whose two documents are both still kept; removes its ``j`` (in place)."""
    taken = np.zeros(len(i), dtype=np.bool_)
    for k in range(len(i)):
        if not gone[j[k]] and not gone[i[k]]:
            gone[j[k]] = True
            taken[k] = True
    return taken


def _leader_scan_python(i: np.ndarray, j: np.ndarray, gone: np.ndarray) -> np.ndarray:
    """:func:`_leader_scan` in plain Python (about 0.15 µs per pair, no compilation)."""
    taken = bytearray(len(i))
    flags = memoryview(gone).cast("B")  # writes through to ``gone``
    for k, (a, b) in enumerate(zip(i.tolist(), j.tolist())):
        if not flags[b] and not flags[a]:
            flags[b] = 1
            taken[k] = 1
    return np.frombuffer(taken, dtype=np.bool_)


def family_roots(batches: Iterable[tuple[np.ndarray, np.ndarray]], n: int) -> np.ndarray:
    """Connected components of the verified pairs (batches of ``i``, ``j`` position arrays, any order): an ``(n,)``
    array whose entry ``k`` is the lowest position of ``k``'s component (``k`` itself for a document in no pair).

    Components by ``scipy.sparse.csgraph.connected_components``, each relabelled by its lowest position. Memory:
    about 16 bytes per pair and 8 per position; the result does not depend on the batches' order.
    """
    dtype = np.int32 if n < 2**31 else np.int64
    pairs = [(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)) for a, b in batches]
    if n == 0 or not any(len(a) for a, _ in pairs):
        return np.arange(n, dtype=dtype)
    i, j = (np.concatenate(cols) for cols in zip(*pairs))
    graph = sparse.coo_array((np.ones(len(i), dtype=np.int8), (i, j)), shape=(n, n)).tocsr()
    _, labels = csgraph.connected_components(graph, directed=False)
    _, lowest = np.unique(labels, return_index=True)  # positions ascend, so each label's first index is its lowest
    return lowest[labels].astype(dtype)


def group_labels(by_chars: np.ndarray, groups: Sequence | np.ndarray | None) -> np.ndarray:
    """(n,) int64 candidate groups: ``2·group + by_chars`` (one group when ``groups`` is None)."""
    flags = np.asarray(by_chars, dtype=np.int64)
    base = np.zeros(len(flags), np.int64) if groups is None else \
        np.unique(np.asarray(groups), return_inverse=True)[1].reshape(-1).astype(np.int64)
    return base * 2 + flags


@dataclass
class NearDuplicates:
    """Outcome of near-duplicate detection over ``n`` in-memory documents.

    ``representative[i]``: the kept document i is a near duplicate of (i itself when kept); ``jaccard_to_rep[i]``:
    exact Jaccard between i and its representative (1.0 when kept); ``family[i]``: the first document of i's
    family; ``num_candidates``: LSH candidate pairs (each verified exactly); ``num_verified``: pairs at or above
    the threshold; ``num_clusters``: kept documents with at least one near duplicate removed; ``largest_cluster``:
    members of the largest such cluster, its representative included (1 when nothing was removed).
    """

    representative: list[int]
    jaccard_to_rep: list[float]
    num_candidates: int
    num_verified: int
    num_clusters: int = 0
    largest_cluster: int = 1
    family: list[int] = field(default_factory=list)

    @property
    def removed(self) -> list[int]:
        """Indices of the documents removed as near duplicates, ascending."""
        return [i for i, r in enumerate(self.representative) if r != i]


def near_duplicates(texts: Sequence[str], by_chars: bool | Sequence[bool], cfg: MinHashConfig,
                    groups: Sequence | np.ndarray | None = None) -> NearDuplicates:
    """Near duplicates among in-memory ``texts``, by the steps the corpus build runs (module docstring).

    ``by_chars``: one flag for all texts or one per text (character shingles for languages written without
    spaces); ``groups`` (one label per text, e.g. the source) restricts pairs to the same label; None compares
    all texts (scope "global"). A group losing more than ``cfg.max_removal_share`` of its documents is logged as a
    warning. With ``cfg.enabled`` false every document is kept.
    """
    n = len(texts)
    if not cfg.enabled or n == 0:
        return NearDuplicates(list(range(n)), [1.0] * n, 0, 0, family=list(range(n)))
    flags = np.broadcast_to(np.asarray(by_chars, dtype=bool), (n,)).copy()
    sigs, has = signatures(list(texts), flags, cfg)
    keys = band_keys(sigs, cfg.bands, cfg.rows)
    labels = group_labels(flags, groups)
    valid = np.flatnonzero(has)
    table = pa.table({"pos": valid.astype(np.int64), "grp": labels[valid],
                      **{f"band_{b}": keys[valid, b] for b in range(cfg.bands)}})
    with duckdb.connect() as con:
        con.register("valid_keys", table)
        n_pairs = candidate_pairs(con, "valid_keys", cfg.bands, "pairs")
        pairs = con.execute("SELECT i, j FROM pairs ORDER BY i, j").fetchnumpy()
    pairs = np.stack([pairs["i"], pairs["j"]], axis=1).astype(np.int64) if n_pairs else np.zeros((0, 2), np.int64)
    docs = np.unique(pairs)
    sets = shingle_sets([texts[i] for i in docs.tolist()], docs, cfg.shingle_size, flags[docs])
    verified, sims = verify_sets(pairs, sets, sets, cfg.jaccard_threshold)
    found = cluster_verified(n, len(pairs), verified, sims)
    _warn_removal_share(found, labels // 2, groups, cfg.max_removal_share)
    return found


def cluster_pairs(n: int, pairs: np.ndarray, similarity: Callable[[int, int], float],
                  threshold: float) -> NearDuplicates:
    """Steps 2–4 over ``n`` documents and their candidate ``pairs`` ((m, 2), i < j) with any ``similarity``:
    :func:`verify`, then :func:`cluster_verified`."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    verified, sims = verify(pairs, similarity, threshold)
    return cluster_verified(n, len(pairs), verified, sims)


def cluster_verified(n: int, num_candidates: int, verified: np.ndarray, sims: np.ndarray) -> NearDuplicates:
    """Steps 3–4 in memory over ``n`` documents, of whose ``num_candidates`` candidate pairs ``verified`` ((m, 2),
    i < j) reached the threshold with similarities ``sims``: :func:`leaders` and :func:`family_roots`."""
    verified = np.asarray(verified, dtype=np.int64).reshape(-1, 2)
    order = np.lexsort((verified[:, 0], verified[:, 1]))
    removed, leader, sim = leaders([(verified[order, 0], verified[order, 1], sims[order])], n)
    rep, to_rep = list(range(n)), [1.0] * n
    for j, i, s in zip(removed.tolist(), leader.tolist(), sim.tolist()):
        rep[j], to_rep[j] = i, s
    family = family_roots([(verified[:, 0], verified[:, 1])], n).astype(np.int64)
    sizes = np.bincount(np.asarray(rep, dtype=np.int64), minlength=n) if n else np.zeros(1, np.int64)
    return NearDuplicates(rep, to_rep, num_candidates, len(verified), int((sizes > 1).sum()),
                          int(max(sizes.max(), 1)), family.tolist())


def _warn_removal_share(found: NearDuplicates, labels: np.ndarray, groups, limit: float) -> None:
    removed = np.asarray(found.representative) != np.arange(len(found.representative))
    total, gone = np.bincount(labels), np.bincount(labels, weights=removed, minlength=len(np.bincount(labels)))
    names = np.unique(np.asarray(groups)) if groups is not None else ["all documents"]
    for g in np.flatnonzero(gone > limit * total):
        log.warning("near dedup removed %d of %d documents (%.1f%%) of %s, above max_removal_share %.0f%%",
                    int(gone[g]), int(total[g]), 100 * gone[g] / total[g], names[g], 100 * limit)
