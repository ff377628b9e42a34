"""Near-duplicate decisions (docs/methods.md §7): the candidate pairs, verification, leader clustering and families
the corpus build runs, exercised in memory through the same functions."""

import logging
import random

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from tasks.corpus import near_dedup
from tasks.corpus.config import MinHashConfig
from tasks.corpus.minhash import EMPTY, band_keys, jaccard, jaccard_hashes, shingle_hash_sets, shingles, signatures
from tasks.corpus.near_dedup import (MAX_LINKS, candidate_pairs, family_roots, iter_leaders, leaders, near_duplicates,
                                     shingle_sets, verify, verify_sets)

FAMILIES = ["oph", "universal"]


def _random_words(rng: random.Random, n: int, prefix: str = "w") -> list[str]:
    return [f"{prefix}{rng.randrange(10**6)}" for _ in range(n)]


def _pairs(keys: np.ndarray, valid: np.ndarray, groups: np.ndarray | None = None,
           max_links: int = MAX_LINKS) -> np.ndarray:
    """Candidate pairs of in-memory band keys through the build's SQL, as an (m, 2) array sorted by (i, j)."""
    keys = np.asarray(keys, dtype=np.uint64)
    idx = np.flatnonzero(valid)
    grp = np.zeros(len(keys), np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    table = pa.table({"pos": idx.astype(np.int64), "grp": grp[idx],
                      **{f"band_{b}": keys[idx, b] for b in range(keys.shape[1])}})
    with duckdb.connect() as con:
        con.register("k", table)
        candidate_pairs(con, "k", keys.shape[1], "pairs", max_links=max_links)
        got = con.execute("SELECT i, j FROM pairs ORDER BY i, j").fetchall()
    return np.array(got, dtype=np.int64).reshape(-1, 2)


def test_candidate_pairs_skip_invalid_documents_and_respect_groups():
    keys = np.array([[1, 10], [1, 11], [2, 10], [1, 12], [3, 13]], dtype=np.uint64)
    valid = np.array([True, True, True, False, True])
    assert _pairs(keys, valid).tolist() == [[0, 1], [0, 2]]
    assert _pairs(keys, np.ones(5, dtype=bool)).tolist() == [[0, 1], [0, 2], [0, 3], [1, 3]]
    groups = np.array([7, 7, 8, 7, 8])
    assert _pairs(keys, valid, groups).tolist() == [[0, 1]]
    assert _pairs(keys[:1], valid[:1]).shape == (0, 2)


def test_huge_buckets_link_each_member_to_the_first_members_only():
    n, cap = 100, 3
    keys = np.zeros((n, 2), dtype=np.uint64)
    pairs = _pairs(keys, np.ones(n, dtype=bool), max_links=cap)
    assert len(pairs) == sum(min(t, cap) for t in range(n))
    assert set(pairs[:, 0].tolist()) == {0, 1, 2} and np.all(pairs[:, 0] < pairs[:, 1])
    small = _pairs(keys[:cap + 1], np.ones(cap + 1, dtype=bool), max_links=cap)
    assert len(small) == (cap + 1) * cap // 2  # buckets up to cap + 1 members are complete
    found = near_duplicates(["the same five words here"] * n, False, MinHashConfig(scope="global"))
    assert found.representative == [0] * n and found.largest_cluster == n and found.num_clusters == 1


@pytest.mark.parametrize("family", FAMILIES)
def test_empty_documents_are_never_paired(family):
    texts = ["", "   ", "\n\t", "\u3000", "", "one two three four five six"]
    sigs, has = signatures(texts, [False, False, True, True, False, False], MinHashConfig(family=family))
    assert has.tolist() == [False] * 5 + [True]
    assert np.all(sigs[:5] == EMPTY)
    keys = band_keys(sigs, 14, 8)
    assert _pairs(keys, has).shape == (0, 2)
    found = near_duplicates(texts, False, MinHashConfig(family=family))
    assert found.representative == list(range(6)) and found.num_candidates == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_identical_and_edited_copies_are_found_with_exact_jaccard(family):
    rng = random.Random(1)
    words = _random_words(rng, 400)
    edited = list(words)
    edited[200] = "changed"
    texts = [" ".join(words), " ".join(_random_words(rng, 400, "o")), " ".join(edited), " ".join(words)]
    found = near_duplicates(texts, False, MinHashConfig(family=family))
    assert found.representative == [0, 1, 0, 0]
    exact = jaccard(shingles(texts[0], 5, False), shingles(texts[2], 5, False))
    assert found.jaccard_to_rep == [1.0, 1.0, pytest.approx(exact), 1.0]
    assert exact >= 0.8 and found.num_verified == 3 and found.removed == [2, 3]  # every pair among 0, 2, 3
    assert found.family == [0, 1, 0, 0]
    assert found.num_clusters == 1 and found.largest_cluster == 3


@pytest.mark.parametrize("family", FAMILIES)
def test_character_shingled_texts_match_each_other_but_never_word_shingled_ones(family):
    poem = "床前明月光疑是地上霜举头望明月低头思故乡" * 4
    near = poem[:30] + "夜" + poem[31:]
    found = near_duplicates([poem, near, poem], [True, True, False], MinHashConfig(family=family))
    assert found.representative == [0, 0, 2]


@pytest.mark.parametrize("family", FAMILIES)
def test_distinct_short_documents_never_match(family):
    texts = ["Hello world.", "Hello there world.", "Good morning", "", "  "]
    found = near_duplicates(texts, [False, False, False, False, True], MinHashConfig(shingle_size=5, family=family))
    assert found.representative == [0, 1, 2, 3, 4]
    assert found.num_candidates == 0


def _edit(words: list[str], positions: range, tag: str) -> list[str]:
    out = list(words)
    for p in positions:
        out[p] = f"{tag}{p}"
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_leader_clustering_does_not_chain(family):
    rng = random.Random(7)
    a = _random_words(rng, 400)
    b = _edit(a, range(10, 400, 60), "b")  # 7 edits, spaced: J(A, B) ≈ 0.84
    c = _edit(b, range(40, 400, 60), "c")  # 7 more: J(B, C) ≈ 0.84, J(A, C) ≈ 0.70
    texts = [" ".join(t) for t in (a, b, c)]
    sets = [shingles(t, 5, False) for t in texts]
    assert jaccard(sets[0], sets[1]) >= 0.8 and jaccard(sets[1], sets[2]) >= 0.8 and jaccard(sets[0], sets[2]) < 0.8
    order = [(0, 1, jaccard(sets[0], sets[1])), (1, 2, jaccard(sets[1], sets[2]))]  # the verified pairs
    removed, leader, _ = leaders([tuple(np.array(col) for col in zip(*order))], 3)
    assert removed.tolist() == [1] and leader.tolist() == [0]  # C stays: it only resembles B, which was removed
    assert near_duplicates(texts, False, MinHashConfig(family=family)).representative == [0, 0, 2]


@pytest.mark.parametrize("family", FAMILIES)
def test_scope_source_keeps_copies_in_other_sources(family):
    text = " ".join(_random_words(random.Random(8), 100))
    texts = [text, text, text]
    found = near_duplicates(texts, False, MinHashConfig(family=family), groups=["a", "b", "a"])
    assert found.representative == [0, 1, 0]
    assert near_duplicates(texts, False, MinHashConfig(scope="global", family=family)).representative == [0, 0, 0]


def test_large_removal_share_is_logged(caplog):
    text = " ".join(_random_words(random.Random(9), 50))
    other = " ".join(_random_words(random.Random(10), 50))
    with caplog.at_level(logging.WARNING, logger="tasks.corpus.near_dedup"):
        near_duplicates([text, text, text, other], False, MinHashConfig(max_removal_share=0.5),
                        groups=["web", "web", "web", "books"])
    assert "web" in caplog.text and "books" not in caplog.text


def test_disabled_near_dedup_keeps_everything_and_progress_reaches_the_end():
    assert near_duplicates(["a b c d e"] * 3, False, MinHashConfig(enabled=False)).representative == [0, 1, 2]
    seen = []
    signatures(["a b c d e f"] * 5, False, MinHashConfig(), progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (5, 5)
    with pytest.raises(ValueError, match="by_chars"):
        signatures(["a", "b"], [True], MinHashConfig())


def test_leaders_refuse_unsorted_pairs_and_keep_the_first_kept_leader():
    i, j, s = np.array([0, 1, 0]), np.array([1, 2, 3]), np.array([0.9, 0.9, 0.95])
    removed, leader, sim = leaders([(i, j, s)], 4)
    assert removed.tolist() == [1, 3] and leader.tolist() == [0, 0] and sim.tolist() == [0.9, 0.95]
    with pytest.raises(ValueError, match="sorted"):
        leaders([(np.array([0, 0]), np.array([3, 1]), np.array([0.9, 0.9]))], 4)


def test_families_are_connected_components_rooted_at_their_first_member():
    roots = family_roots([(np.array([5, 1]), np.array([9, 5])), (np.array([7]), np.array([8]))], 11)
    assert roots.tolist() == [0, 1, 2, 3, 4, 1, 6, 7, 7, 1, 10]
    assert family_roots([], 3).tolist() == [0, 1, 2]


def test_family_roots_match_scipy_components_in_any_batch_order():
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    rng = np.random.default_rng(3)
    n = 2_000
    i = rng.integers(0, n, 1_500)
    j = rng.integers(0, n, 1_500)
    _, labels = connected_components(coo_matrix((np.ones(len(i)), (i, j)), shape=(n, n)), directed=False)
    lowest = np.full(labels.max() + 1, n)
    np.minimum.at(lowest, labels, np.arange(n))
    expected = lowest[labels]
    order = rng.permutation(len(i))
    batches = [(i[order[k:k + 97]], j[order[k:k + 97]]) for k in range(0, len(i), 97)]
    assert np.array_equal(family_roots(batches, n), expected)
    assert np.array_equal(family_roots([(j, i)], n), expected)


def test_iter_leaders_streams_the_same_decisions_as_one_batch():
    rng = np.random.default_rng(5)
    j = np.sort(rng.integers(1, 500, 800))
    i = np.array([rng.integers(0, x) for x in j])
    order = np.lexsort((i, j))
    i, j = i[order], j[order]
    keep = np.ones(len(i), bool)
    keep[1:] = (np.diff(j) != 0) | (np.diff(i) != 0)
    i, j = i[keep], j[keep]
    s = rng.random(len(i))
    whole = leaders([(i, j, s)], 500)
    parts = list(iter_leaders([(i[k:k + 50], j[k:k + 50], s[k:k + 50]) for k in range(0, len(i), 50)], 500))
    for got, want in zip((np.concatenate(c) for c in zip(*parts)), whole):
        assert np.array_equal(got, want)
    assert len(whole[0]) > 50




def _reference_pairs(keys: np.ndarray, valid: np.ndarray, groups: np.ndarray, max_links: int) -> set:
    """Candidate pairs by their definition: per band, each bucket's members in corpus order, each paired with the
    bucket's first ``max_links`` members."""
    pairs = set()
    for band in range(keys.shape[1]):
        buckets: dict = {}
        for pos in np.flatnonzero(valid).tolist():
            buckets.setdefault((int(groups[pos]), int(keys[pos, band])), []).append(pos)
        for members in buckets.values():
            for rank, j in enumerate(members):
                pairs.update((i, j) for i in members[:min(rank, max_links)])
    return pairs


@pytest.mark.parametrize("max_links", [1, 3, MAX_LINKS])
def test_candidate_pairs_equal_their_definition_on_crowded_buckets(max_links):
    rng = np.random.default_rng(5)
    n, bands = 400, 4
    keys = rng.integers(0, [30, 60, 200, 2**63], size=(n, bands), dtype=np.uint64)  # buckets of every size
    keys[:, 3] = np.where(rng.random(n) < 0.5, keys[:, 3], 7)  # one bucket of about 200 members
    valid = rng.random(n) < 0.9
    groups = rng.integers(0, 3, n)
    got = _pairs(keys, valid, groups, max_links=max_links)
    assert {tuple(p) for p in got.tolist()} == _reference_pairs(keys, valid, groups, max_links)
    assert len(got) == len({tuple(p) for p in got.tolist()})  # unique
    no_hits = np.arange(n * bands, dtype=np.uint64).reshape(n, bands)
    assert _pairs(no_hits, valid, groups).shape == (0, 2)


def test_verify_sets_equals_jaccard_hashes_and_names_a_missing_document():
    rng = random.Random(12)
    texts = ["", "one two", "中文文本"] + [" ".join(rng.choice(["a", "b", "c", "d", "e", "f"])
                                                   for _ in range(rng.randint(0, 60))) for _ in range(60)]
    texts += [texts[5], texts[6] + " g"]
    flags = [i == 2 for i in range(len(texts))]
    pos = np.arange(10, 10 + len(texts), dtype=np.int64)  # positions need not start at 0
    sets = shingle_sets(texts, pos, 3, flags)
    assert sets.starts[0] == 0 and sets.starts[-1] == len(sets.hashes) and len(sets.starts) == len(texts) + 1
    hashes = shingle_hash_sets(texts, 3, flags)
    for k, h in enumerate(hashes):
        np.testing.assert_array_equal(sets.hashes[sets.starts[k]:sets.starts[k + 1]], h)
    pairs = np.array([(a, b) for a in range(len(texts)) for b in range(a + 1, len(texts))], dtype=np.int64) + 10
    for threshold in (0.0, 0.5, 0.8, 1.0):
        got, got_sims = verify_sets(pairs, sets, sets, threshold)
        want, want_sims = verify(pairs, lambda i, j: jaccard_hashes(hashes[i - 10], hashes[j - 10]), threshold)
        np.testing.assert_array_equal(got, want)
        assert got_sims.tolist() == want_sims.tolist()  # bit for bit
    left = shingle_sets(texts[:5], pos[:5], 3, flags[:5])
    got, _ = verify_sets(pairs[:4], left, sets, 0.0)  # i from one table, j from another
    np.testing.assert_array_equal(got, verify(pairs[:4], lambda i, j: jaccard_hashes(hashes[i - 10],
                                                                                         hashes[j - 10]), 0.0)[0])
    with pytest.raises(KeyError, match="position 9"):
        verify_sets(np.array([[9, 11]]), sets, sets, 0.5)
    empty = verify_sets(np.zeros((0, 2), np.int64), sets, sets, 0.5)
    assert empty[0].shape == (0, 2) and empty[1].shape == (0,)


def _random_graph(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Unique pairs (i < j) sorted by (j, i): random pairs plus a chain and a cycle over random documents."""
    m = int(rng.integers(0, 3 * n))
    a, b = rng.integers(0, n, m), rng.integers(0, n, m)
    chain = rng.permutation(n)[: int(rng.integers(2, n + 1))]
    cycle = rng.permutation(n)[: int(rng.integers(3, n + 1))]
    a = np.concatenate([a, chain[:-1], cycle])
    b = np.concatenate([b, chain[1:], np.roll(cycle, 1)])
    pairs = np.unique(np.stack([np.minimum(a, b), np.maximum(a, b)], axis=1)[a != b], axis=0)
    order = np.lexsort((pairs[:, 0], pairs[:, 1]))
    return pairs[order, 0], pairs[order, 1]


def _leaders_oracle(i: np.ndarray, j: np.ndarray, n: int) -> dict[int, int]:
    """Removed document -> leader, by definition: in corpus order, a document is removed when an earlier document
    it is verified against is kept, and its leader is the lowest such document."""
    earlier: dict[int, list[int]] = {}
    for a, b in zip(i.tolist(), j.tolist()):
        earlier.setdefault(b, []).append(a)
    removed: dict[int, int] = {}
    for doc in range(n):
        kept = [a for a in earlier.get(doc, []) if a not in removed]
        if kept:
            removed[doc] = min(kept)
    return removed


def _components_oracle(i: np.ndarray, j: np.ndarray, n: int) -> list[int]:
    """Lowest member of each document's component, by breadth-first search."""
    links: dict[int, set[int]] = {}
    for a, b in zip(i.tolist(), j.tolist()):
        links.setdefault(a, set()).add(b)
        links.setdefault(b, set()).add(a)
    root = list(range(n))
    for start in range(n):
        if root[start] != start:
            continue
        frontier = [start]
        while frontier:
            x = frontier.pop()
            for y in links.get(x, ()):
                if y > start and root[y] == y:
                    root[y] = start
                    frontier.append(y)
    return root


@pytest.mark.parametrize("seed", range(200))
def test_leader_scans_and_families_match_their_definitions_on_random_graphs(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 60))
    i, j = _random_graph(rng, n)
    s = rng.random(len(i))
    want = _leaders_oracle(i, j, n)
    gone_py, gone_jit = np.zeros(n, bool), np.zeros(n, bool)
    taken = near_dedup._leader_scan_python(i, j, gone_py)
    assert np.array_equal(taken, near_dedup._leader_scan(i, j, gone_jit)) and np.array_equal(gone_py, gone_jit)
    batches = [(i[k:k + 7], j[k:k + 7], s[k:k + 7]) for k in range(0, len(i), 7)]
    for switch in (0, int(rng.integers(0, len(i) + 1)), len(i) + 1):  # compiled, switching mid-stream, Python
        monkeypatch.setattr(near_dedup, "COMPILED_SCAN_MIN_PAIRS", switch)
        removed, leader, _ = leaders(batches, n)
        assert dict(zip(removed.tolist(), leader.tolist())) == want
        assert removed.tolist() == sorted(want)
    assert family_roots([(j, i)], n).tolist() == _components_oracle(i, j, n)
