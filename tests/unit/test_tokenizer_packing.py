"""Packing plans: every token placed once, rows within capacity, best-fit cuts fewer documents than concat."""

import numpy as np
import pytest

from infra.errors import ConfigError, DataError
from tasks.train.packing import plan_rows


def offsets_of(lengths):
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]), int(lengths.sum())


def covered_positions(plan):
    return np.concatenate([np.arange(s, s + n) for s, n in zip(plan.seg_start, plan.seg_len)])


def test_best_fit_places_every_token_exactly_once_within_capacity():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 300, size=500)
    offsets, n = offsets_of(lengths)
    plan = plan_rows(offsets, n, seq_len=127, policy="best_fit")
    assert np.array_equal(np.sort(covered_positions(plan)), np.arange(n))
    per_row = np.add.reduceat(plan.seg_len, plan.row_ptr[:-1])
    assert per_row.max() <= 128 and plan.tokens_dropped == 0
    # Only documents longer than a row are cut.
    assert plan.docs_cut == int((lengths > 128).sum())


def test_best_fit_matches_brute_force_best_fit_decreasing():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 60, size=200)
    offsets, n = offsets_of(lengths)
    plan = plan_rows(offsets, n, seq_len=63, policy="best_fit")
    # Reference: the textbook O(n · rows) best-fit decreasing on the same order (largest first, ties by index).
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    free = []
    for i in order:
        fits = [r for r, f in enumerate(free) if f >= lengths[i]]
        if fits:
            best = min(fits, key=lambda r: (free[r], r))
            free[best] -= lengths[i]
        else:
            free.append(64 - lengths[i])
    assert plan.n_rows == len(free)
    assert sorted(64 - np.add.reduceat(plan.seg_len, plan.row_ptr[:-1])) == sorted(free)


def test_concat_windows_share_edges_and_count_cut_documents():
    offsets, n = offsets_of([5, 3, 9, 2, 4])  # 23 tokens
    plan = plan_rows(offsets, n, seq_len=4, policy="concat")
    assert plan.n_rows == 5  # windows [0,5) [4,9) [8,13) [12,17) [16,21)
    assert plan.seg_start.tolist() == [0, 4, 8, 12, 16] and set(plan.seg_len.tolist()) == {5}
    # Whole in one window: doc 0 [0,5) fits [0,5); doc 1 [5,8) fits [4,9); doc 3 [17,19) fits [16,21).
    # Cut: doc 2 [8,17) spans windows; doc 4 [19,23) runs into the dropped tail.
    assert plan.docs_cut == 2 and plan.tokens_dropped == 2


def test_best_fit_cuts_fewer_documents_than_concat():
    rng = np.random.default_rng(2)
    lengths = rng.lognormal(4.0, 1.0, size=2_000).astype(np.int64) + 1
    offsets, n = offsets_of(lengths)
    concat = plan_rows(offsets, n, seq_len=255, policy="concat")
    best = plan_rows(offsets, n, seq_len=255, policy="best_fit")
    assert best.cut_share < concat.cut_share / 3
    assert 0.0 < best.padding_share < 0.2 and concat.padding_share == 0.0


def test_row_returns_ids_and_document_index():
    tokens = np.arange(100, 110)
    offsets = np.array([0, 3, 7])
    plan = plan_rows(offsets, 10, seq_len=4, policy="best_fit")
    rows = [plan.row(tokens, offsets, r) for r in range(plan.n_rows)]
    seen = sorted(int(t) for ids, _ in rows for t in ids)
    assert seen == list(range(100, 110))
    for ids, docs in rows:
        assert np.array_equal(docs, np.searchsorted(offsets, ids - 100, side="right") - 1)


@pytest.mark.parametrize("offsets, n, error", [
    ([1, 5], 10, DataError), ([0, 5, 5], 10, DataError), ([0, 10], 10, DataError), ([], 10, DataError),
    ([0.0, 2.5], 10, DataError), ([[0, 2]], 10, DataError)])
def test_bad_offsets(offsets, n, error):
    with pytest.raises(error):
        plan_rows(np.array(offsets), n, seq_len=4, policy="concat")


def test_bad_policy_and_seq_len():
    with pytest.raises(ConfigError, match="policy"):
        plan_rows(np.array([0]), 10, seq_len=4, policy="greedy")
    with pytest.raises(ConfigError, match="seq_len"):
        plan_rows(np.array([0]), 10, seq_len=0, policy="concat")
