"""MixtureSampler: exact apportionment, window contents, packing, document masks, epochs, resume, input errors."""

import json

import numpy as np
import pytest
import torch

from infra.errors import ConfigError, DataError
from tasks.train.data import IGNORE_INDEX, MixtureSampler, TokenStream


def streams(n=1_000):
    # Each source holds a distinct token range, so a row's source can be read off its tokens.
    return {"web": np.arange(0, n, dtype=np.uint16), "code": np.arange(10_000, 10_000 + n, dtype=np.uint16),
            "wiki": np.arange(20_000, 20_000 + n, dtype=np.uint32)}


WEIGHTS = {"web": 0.7, "code": 0.2, "wiki": 0.1}


def test_batch_shapes_and_shift():
    sampler = MixtureSampler(streams(), WEIGHTS, seq_len=16, batch_size=8, seed=0)
    x, y, sources, doc_ids = sampler.next_batch()
    assert doc_ids is None
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == torch.long
    torch.testing.assert_close(x[:, 1:], y[:, :-1])
    for row, source in zip(x, sources):
        base = {"web": 0, "code": 10_000, "wiki": 20_000}[source]
        assert base <= int(row.min()) and int(row.max()) < base + 1_000
        assert torch.equal(row, torch.arange(int(row[0]), int(row[0]) + 16))  # a contiguous window


def test_counts_follow_weights_exactly():
    weights = {"web": 0.55, "code": 0.3, "wiki": 0.15}
    sampler = MixtureSampler(streams(), weights, seq_len=4, batch_size=3, seed=1)
    counts = dict.fromkeys(weights, 0)
    for n in range(1, 301):
        for s in sampler.next_batch()[2]:
            counts[s] += 1
        for s, w in weights.items():  # cumulative rows within one row of w·n·B at every batch
            assert abs(counts[s] - w * n * 3) < 1.0
    assert sampler.realised_fractions() == pytest.approx(weights, abs=1 / 900)


def test_zero_weight_never_drawn():
    sampler = MixtureSampler(streams(), {"web": 0.5, "code": 0.5, "wiki": 0.0}, seq_len=4, batch_size=5, seed=0)
    drawn = {s for _ in range(50) for s in sampler.next_batch()[2]}
    assert drawn == {"web", "code"}


def test_resume_yields_identical_batches():
    a = MixtureSampler(streams(), WEIGHTS, seq_len=8, batch_size=7, seed=3)
    for _ in range(5):
        a.next_batch()
    saved = a.state_dict()
    expected = [a.next_batch() for _ in range(4)]
    b = MixtureSampler(streams(), WEIGHTS, seq_len=8, batch_size=7, seed=99)
    b.load_state_dict(saved)
    for (x1, y1, s1, _), (x2, y2, s2, _) in zip(expected, (b.next_batch() for _ in range(4))):
        assert torch.equal(x1, x2) and torch.equal(y1, y2) and s1 == s2


def test_same_seed_same_batches_different_seed_differs():
    def first(seed):
        return MixtureSampler(streams(), WEIGHTS, seq_len=8, batch_size=4, seed=seed).next_batch()[0]
    assert torch.equal(first(0), first(0)) and not torch.equal(first(0), first(1))


@pytest.mark.parametrize("weights, error", [
    ({"web": 0.7, "code": 0.2}, ConfigError),
    ({"web": 0.7, "code": 0.2, "wiki": 0.1, "books": 0.0}, ConfigError),
    ({"web": 0.7, "code": 0.2, "wiki": 0.2}, ConfigError),
    ({"web": 1.1, "code": -0.2, "wiki": 0.1}, ConfigError),
])
def test_bad_weights(weights, error):
    with pytest.raises(error):
        MixtureSampler(streams(), weights, seq_len=4, batch_size=2, seed=0)


def test_short_stream_names_source():
    data = {**streams(), "wiki": np.arange(5, dtype=np.uint16)}
    with pytest.raises(DataError, match="wiki"):
        MixtureSampler(data, WEIGHTS, seq_len=8, batch_size=2, seed=0)


def test_empty_stream_rejected():
    data = {**streams(), "wiki": np.zeros(0, dtype=np.uint16)}
    with pytest.raises(DataError, match="wiki"):
        MixtureSampler(data, {"web": 0.8, "code": 0.2, "wiki": 0.0}, seq_len=8, batch_size=2, seed=0)


def documents(lengths, start=0):
    """A stream of documents with distinct token values; document k ends in EOS id 0."""
    lengths = np.asarray(lengths)
    tokens = np.arange(start + 1, start + 1 + lengths.sum(), dtype=np.uint32)
    ends = np.cumsum(lengths) - 1
    tokens[ends] = 0
    return TokenStream(tokens, np.concatenate([[0], ends[:-1] + 1]).astype(np.int64))


def test_each_row_read_once_per_epoch_then_a_new_order():
    stream = documents([40] * 10)  # 400 tokens → 49 concat rows at T = 8
    sampler = MixtureSampler({"a": stream}, {"a": 1.0}, seq_len=8, batch_size=7, seed=0)
    n_rows = sampler.plans["a"].n_rows
    first_epoch = [tuple(row.tolist()) for _ in range(n_rows // 7) for row in sampler.next_batch().x]
    assert len(set(first_epoch)) == n_rows == 49  # no row twice within an epoch
    assert sampler.epochs_completed()["a"] == 1.0
    second = [tuple(row.tolist()) for _ in range(n_rows // 7) for row in sampler.next_batch().x]
    assert set(second) == set(first_epoch) and second != first_epoch  # same rows, new order


def test_best_fit_pads_with_ignored_targets_and_cuts_no_short_document():
    stream = documents([5, 9, 3, 7, 6, 2, 8])
    sampler = MixtureSampler({"a": stream}, {"a": 1.0}, seq_len=9, batch_size=4, seed=0, packing="best_fit",
                             document_mask=True, pad_id=7)
    batch = sampler.next_batch()
    real = batch.doc_ids >= 0
    assert torch.all(batch.x[~real] == 7)  # padding input id
    # A target is ignored exactly when the next position is padding; real targets are the next real token.
    assert torch.equal((batch.y == IGNORE_INDEX)[:, :-1], ~real[:, 1:])
    assert torch.all(batch.y[~real] == IGNORE_INDEX)
    assert sampler.packing_stats()["a"]["cut_share"] == 0.0
    # Each document's tokens are contiguous inside one row.
    for x, docs in zip(batch.x, batch.doc_ids):
        for d in docs[docs >= 0].unique():
            values = x[docs == d]
            assert torch.all(values[:-1] + 1 == values[1:]) or values[-1] == 0


def test_resume_across_epochs_and_sources_reproduces_batches():
    streams_ = {"a": documents([13] * 20), "b": documents([7] * 30, start=10_000)}
    weights = {"a": 0.6, "b": 0.4}
    kwargs = dict(seq_len=8, batch_size=5, packing="best_fit", document_mask=True)
    a = MixtureSampler(streams_, weights, seed=4, **kwargs)
    for _ in range(37):  # several epochs of both sources
        a.next_batch()
    saved = json.loads(json.dumps(a.state_dict()))  # the state travels as JSON in a checkpoint
    expected = [a.next_batch() for _ in range(20)]
    b = MixtureSampler(streams_, weights, seed=4, **kwargs)
    b.load_state_dict(saved)
    for want, got in zip(expected, (b.next_batch() for _ in range(20))):
        assert torch.equal(want.x, got.x) and torch.equal(want.y, got.y) and want.sources == got.sources
        assert torch.equal(want.doc_ids, got.doc_ids)
    assert min(a.epochs_completed().values()) > 1


@pytest.mark.parametrize("change, match", [
    (dict(packing="concat"), "packing"), (dict(seq_len=6), "seq_len"), (dict(batch_size=4), "batch_size")])
def test_resume_refuses_a_different_loader(change, match):
    streams_ = {"a": documents([13] * 20)}
    base = dict(seq_len=8, batch_size=5, seed=4, packing="best_fit")
    saved = MixtureSampler(streams_, {"a": 1.0}, **base).state_dict()
    other = MixtureSampler(streams_, {"a": 1.0}, **{**base, **change})
    with pytest.raises(DataError, match=match):
        other.load_state_dict(saved)


def test_resume_refuses_a_changed_shard():
    saved = MixtureSampler({"a": documents([13] * 20)}, {"a": 1.0}, seq_len=8, batch_size=2, seed=0).state_dict()
    grown = MixtureSampler({"a": documents([13] * 30)}, {"a": 1.0}, seq_len=8, batch_size=2, seed=0)
    with pytest.raises(DataError, match="changed"):
        grown.load_state_dict(saved)
