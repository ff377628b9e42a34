"""Held-out loss on fixed windows, against a brute-force per-window computation, and bits per byte."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from evals.heldout import bits_per_byte, heldout_loss
from infra.errors import DataError
from models.config import ModelConfig
from models.decoder import Decoder


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Decoder(ModelConfig(n_layers=1, d_model=32, n_heads=2, n_kv_heads=2, d_ff=64, vocab_size=97, seq_len=16))


def test_matches_brute_force_and_restores_mode(model):
    tokens = np.random.default_rng(0).integers(0, 97, 16 * 5 + 7).astype(np.uint16)
    model.train()
    result = heldout_loss(model, tokens, seq_len=16, batch_size=2)
    assert model.training
    assert result.n_tokens == 5 * 16 and len(result.window_nats) == 5
    with torch.no_grad():
        model.eval()
        for i in range(5):
            window = torch.from_numpy(tokens[i * 16:i * 16 + 17].astype(np.int64))
            nats = F.cross_entropy(model(window[None, :-1])[0], window[1:], reduction="sum").item()
            assert result.window_nats[i] == pytest.approx(nats, rel=1e-5)
        model.train()
    assert result.loss_nats == pytest.approx(result.sum_nats / result.n_tokens)
    assert result.window_tokens.sum() == result.n_tokens


def test_max_tokens_and_batch_size_do_not_change_windows(model):
    tokens = np.random.default_rng(1).integers(0, 97, 500).astype(np.uint16)
    a = heldout_loss(model, tokens, seq_len=16, batch_size=3, max_tokens=161)
    b = heldout_loss(model, tokens[:161], seq_len=16, batch_size=8)
    assert a.n_tokens == 160
    np.testing.assert_allclose(a.window_nats, b.window_nats, rtol=1e-6)


def test_too_short_split(model):
    with pytest.raises(DataError):
        heldout_loss(model, np.arange(10, dtype=np.uint16), seq_len=16)


def test_bits_per_byte():
    # One token per byte at ln 2 nats per token is exactly one bit per byte.
    assert bits_per_byte(math.log(2), 1.0) == pytest.approx(1.0)
    # docs/methods.md §8: 3.952 chars/token (ASCII: bytes) → a 2.8327-nat loss is 2.8327/(3.952·ln 2) bits per byte.
    assert bits_per_byte(2.8327, 1 / 3.952) == pytest.approx(1.0341, abs=1e-4)
