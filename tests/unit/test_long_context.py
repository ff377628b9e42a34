"""Long-context evaluation: position buckets against a direct per-token loss, passkey items and their scoring
against a direct log-likelihood, Wilson intervals against scipy."""

import re
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from evals.long_context import (NEEDLE, bucket_edges, bucket_frame, passkey_items, position_bucket_loss,
                                retrieval_frame, score_passkey)
from infra.errors import ConfigError, DataError
from models.config import ModelConfig
from models.decoder import Decoder

V = 64


def encode(text: str) -> list[int]:
    """Digits are tokens 2..11; every other word (with its leading space) or lone space one token in [12, 64)."""
    pieces = re.findall(r" ?[^\s\d]+|\d| ", text)
    return [2 + int(p) if p.isdigit() else 12 + zlib.crc32(p.encode()) % (V - 12) for p in pieces]


def digits(ids) -> str:
    return "".join(str(i - 2) for i in ids if 2 <= i < 12)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Decoder(ModelConfig(n_layers=1, d_model=32, n_heads=2, n_kv_heads=2, d_ff=64, vocab_size=V, seq_len=64))


@pytest.fixture(scope="module")
def filler():
    return np.random.default_rng(7).integers(12, V, 500).astype(np.uint16)


def test_bucket_edges():
    assert bucket_edges(64, 256).tolist() == [0, 16, 32, 64, 128, 256]
    assert bucket_edges(64, 200).tolist() == [0, 16, 32, 64, 128, 200]
    assert bucket_edges(64, 64).tolist() == [0, 16, 32, 64]
    assert bucket_edges(2, 8).tolist() == [0, 1, 2, 4, 8]  # T/4 = 0 kept once
    assert bucket_edges(64, 256).dtype == np.int64
    with pytest.raises(ConfigError):
        bucket_edges(64, 32)


def test_position_bucket_loss_matches_direct_per_token_loss(model):
    windows = np.random.default_rng(1).integers(0, V, (3, 65))
    edges = bucket_edges(16, 64)  # [0, 4, 8, 16, 32, 64]
    model.train()
    pl = position_bucket_loss(model, windows, edges, batch_size=2)
    assert model.training
    assert pl.bucket_nats.shape == (3, 5) and pl.bucket_nats.dtype == np.float64
    assert pl.bucket_tokens.tolist() == [[4, 4, 8, 16, 32]] * 3
    model.eval()
    with torch.no_grad():
        w = torch.from_numpy(windows)
        nats = F.cross_entropy(model(w[:, :-1]).transpose(1, 2), w[:, 1:], reduction="none").double().numpy()
    model.train()
    direct = np.stack([nats[:, lo:hi].sum(axis=1) for lo, hi in zip(edges[:-1], edges[1:])], axis=1)
    np.testing.assert_allclose(pl.bucket_nats, direct, rtol=1e-5)
    np.testing.assert_allclose(pl.loss_nats, direct.sum(axis=0) / np.array([12, 12, 24, 48, 96]), rtol=1e-5)
    again = position_bucket_loss(model, windows, edges, batch_size=2)
    assert np.array_equal(pl.bucket_nats, again.bucket_nats)


def test_position_bucket_loss_refuses_windows_past_the_model(model):
    with pytest.raises(DataError, match="exceed model.seq_len"):
        position_bucket_loss(model, np.zeros((2, 66), np.int64), bucket_edges(16, 65))
    with pytest.raises(DataError, match="beyond the windows"):
        position_bucket_loss(model, np.zeros((2, 33), np.int64), bucket_edges(16, 64))


def test_bucket_frame_weighted_mean_and_interval(model):
    windows = np.random.default_rng(2).integers(0, V, (6, 65))
    pl = position_bucket_loss(model, windows, bucket_edges(16, 64))
    df = bucket_frame(pl, np.arange(6), seed=3)
    assert df["bucket_start"].tolist() == [0, 4, 8, 16, 32] and df["bucket_end"].tolist() == [4, 8, 16, 32, 64]
    assert df["tokens"].tolist() == [24, 24, 48, 96, 192] and df["windows"].tolist() == [6] * 5
    np.testing.assert_allclose(df["loss_nats"], pl.loss_nats)
    assert (df["ci_low"] <= df["loss_nats"]).all() and (df["loss_nats"] <= df["ci_high"]).all()
    assert (df["ci_low"] < df["ci_high"]).all()
    assert df.equals(bucket_frame(pl, np.arange(6), seed=3))
    with pytest.raises(DataError, match="one document per window"):
        bucket_frame(pl, np.arange(5))


def cell_items(filler, seed=0, lengths=(48, 64), per_cell=3):
    return passkey_items(filler, encode, lengths=list(lengths), depths=[0.0, 0.5, 1.0], per_cell=per_cell,
                         n_choices=4, seed=seed)


def test_passkey_items_deterministic_exact_and_needle_at_depth(filler):
    items = cell_items(filler)
    assert len(items) == 2 * 3 * 3
    again, other = cell_items(filler), cell_items(filler, seed=1)
    for a, b in zip(items, again):
        assert a.item_id == b.item_id and a.answer == b.answer and np.array_equal(a.context, b.context)
        assert all(np.array_equal(x, y) for x, y in zip(a.options, b.options))
    assert any(not np.array_equal(a.context, b.context) for a, b in zip(items, other))
    for item in items:
        assert len(item.context) + max(len(o) for o in item.options) == item.length
        keys = [digits(o) for o in item.options]
        assert len(keys) == 4 and len(set(keys)) == 4 and all(len(k) == 5 and k[0] != "0" for k in keys)
        key = keys[item.answer]
        needle = encode(NEEDLE.format(key=key))
        n_filler = len(item.context) - len(needle) - len(encode(" What is the pass key? The pass key is"))
        at = round(item.depth * n_filler)
        assert item.context[at:at + len(needle)].tolist() == needle
        assert digits(item.context) == key + key  # the key, twice, and no other digit
    assert {it.item_id for it in items} >= {"passkey_L48_d0.5_2", "passkey_L64_d1_0"}


def test_passkey_items_refuse_what_does_not_fit(filler):
    with pytest.raises(DataError, match="do not fit"):
        passkey_items(filler, encode, lengths=[20], depths=[0.5], per_cell=1, n_choices=4, seed=0)
    with pytest.raises(DataError, match="filler has 10"):
        passkey_items(filler[:10], encode, lengths=[64], depths=[0.5], per_cell=1, n_choices=4, seed=0)
    with pytest.raises(ConfigError):
        passkey_items(filler, encode, lengths=[64], depths=[1.5], per_cell=1, n_choices=4, seed=0)


def test_score_passkey_matches_direct_log_likelihood(model, filler):
    items = cell_items(filler, per_cell=2)
    correct, margin = score_passkey(model, items, batch_size=5)
    model.eval()
    with torch.no_grad():
        for item, ok, m in zip(items, correct, margin):
            scores = []
            for option in item.options:
                seq = torch.from_numpy(np.concatenate([item.context, option]))
                logp = model(seq[None, :-1])[0].log_softmax(-1)  # (len - 1, V)
                n = len(item.context)
                scores.append(sum(float(logp[n - 1 + k, option[k]]) for k in range(len(option))))
            best_other = max(s for i, s in enumerate(scores) if i != item.answer)
            assert m == pytest.approx(scores[item.answer] - best_other, abs=1e-4)
            assert ok == (m > 0)
    model.train()
    one_by_one, _ = score_passkey(model, items, batch_size=1)
    assert np.array_equal(correct, one_by_one)


def test_score_passkey_refuses_prompts_past_the_window(filler):
    torch.manual_seed(0)
    short = Decoder(ModelConfig(n_layers=1, d_model=16, n_heads=2, n_kv_heads=2, d_ff=32, vocab_size=V, seq_len=32))
    with pytest.raises(DataError, match="more than model.seq_len = 32"):
        score_passkey(short, cell_items(filler, lengths=(48,), per_cell=1))


def test_retrieval_frame_counts_and_wilson_bounds(filler):
    items = cell_items(filler, lengths=(48, 64), per_cell=4)  # 24 items: (48, 64) × depths 0, 0.5, 1 × 4
    correct = np.zeros(len(items), dtype=bool)
    correct[[0, 1, 2, 4, 12, 13, 14, 15]] = True
    df = retrieval_frame(items, correct)
    assert df["length"].tolist() == [48] * 4 + [64] * 4
    assert df["depth"].tolist() == ["0", "0.5", "1", "all"] * 2
    assert df["n"].tolist() == [4, 4, 4, 12] * 2
    assert df["correct"].tolist() == [3, 1, 0, 4, 4, 0, 0, 4]
    assert df["chance"].tolist() == [0.25] * 8
    for _, row in df.iterrows():
        ci = stats.binomtest(row["correct"], row["n"]).proportion_ci(method="wilson")
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((ci.low, ci.high))
        assert row["accuracy"] == row["correct"] / row["n"]
    with pytest.raises(DataError):
        retrieval_frame(items, correct[:-1])
