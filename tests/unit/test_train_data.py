"""MixtureSampler: exact apportionment, window contents, resume, and input errors."""

import numpy as np
import pytest
import torch

from infra.errors import ConfigError, DataError
from tasks.train.data import MixtureSampler


def streams(n=1_000):
    # Each source holds a distinct token range, so a row's source can be read off its tokens.
    return {"web": np.arange(0, n, dtype=np.uint16), "code": np.arange(10_000, 10_000 + n, dtype=np.uint16),
            "wiki": np.arange(20_000, 20_000 + n, dtype=np.uint32)}


WEIGHTS = {"web": 0.7, "code": 0.2, "wiki": 0.1}


def test_batch_shapes_and_shift():
    sampler = MixtureSampler(streams(), WEIGHTS, seq_len=16, batch_size=8, seed=0)
    x, y, sources = sampler.next_batch()
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
    for (x1, y1, s1), (x2, y2, s2) in zip(expected, (b.next_batch() for _ in range(4))):
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
