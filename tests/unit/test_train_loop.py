"""Training loop: metrics, determinism, clipping, callback order and propagation, non-finite loss."""

import math

import numpy as np
import pytest
import torch

from infra.errors import DataError
from models.config import ModelConfig
from models.decoder import Decoder
from tasks.train.config import OptimConfig
from tasks.train.data import MixtureSampler
from tasks.train.loop import train

CFG = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=64, seq_len=16)
OPTIM = OptimConfig(peak_lr=3e-3, warmup_steps=2)


def make(seed=0):
    torch.manual_seed(seed)
    # A repeating pattern is learnable, so the loss must fall quickly.
    data = {"a": np.tile(np.arange(64, dtype=np.uint16), 50), "b": np.tile(np.arange(63, -1, -1, dtype=np.uint16), 50)}
    return Decoder(CFG), MixtureSampler(data, {"a": 0.75, "b": 0.25}, seq_len=16, batch_size=4, seed=seed)


def test_metrics_and_learning():
    model, sampler = make()
    result = train(model, sampler, OptimConfig(peak_lr=1e-2, warmup_steps=2), total_steps=30)
    first, last = result.metrics[0], result.metrics[-1]
    assert first["loss_nats"] == pytest.approx(math.log(64), abs=0.1)
    assert last["loss_nats"] < first["loss_nats"] - 1.0
    assert {"loss_nats", "lr", "grad_norm_preclip", "clipped", "clip_fraction", "tokens_seen", "tokens_per_s",
            "loss_nats/a", "loss_nats/b"} <= set(last)
    assert result.state.step == 30 and last["tokens_seen"] == 30 * 4 * 16
    assert first["lr"] == pytest.approx(5e-3) and last["lr"] == pytest.approx(1e-3)  # warmup, floor 0.1·peak
    # Per-source means weighted by rows (3 of a, 1 of b) recombine to the batch mean.
    assert 0.75 * last["loss_nats/a"] + 0.25 * last["loss_nats/b"] == pytest.approx(last["loss_nats"], rel=1e-5)


def test_deterministic_on_cpu():
    losses = [[m["loss_nats"] for m in train(*make(), OPTIM, total_steps=5).metrics] for _ in range(2)]
    assert losses[0] == losses[1]


def test_clipping_counts():
    model, sampler = make()
    tight = OptimConfig(peak_lr=3e-3, warmup_steps=2, grad_clip=1e-6)
    metrics = train(model, sampler, tight, total_steps=4).metrics
    assert all(m["clipped"] == 1 and m["grad_norm_preclip"] > 1e-6 for m in metrics)
    assert metrics[-1]["clip_fraction"] == 1.0


class Recorder:
    def __init__(self):
        self.events = []

    def on_eval(self, state, model):
        self.events.append(("eval", state.step))

    def on_step_end(self, state, metrics):
        self.events.append(("step", state.step))


def test_eval_schedule_and_order():
    recorder = Recorder()
    train(*make(), OPTIM, total_steps=5, eval_every=2, callbacks=[recorder])
    assert recorder.events == [("eval", 0), ("step", 1), ("step", 2), ("eval", 2), ("step", 3), ("step", 4),
                               ("eval", 4), ("step", 5), ("eval", 5)]


class Pruned(Exception):
    pass


def test_callback_exception_propagates():
    class Pruner:
        def on_eval(self, state, model):
            if state.step == 2:
                raise Pruned()

    with pytest.raises(Pruned):
        train(*make(), OPTIM, total_steps=10, eval_every=2, callbacks=[Pruner()])


def test_non_finite_loss_names_step():
    model, sampler = make()

    class Poison:
        def on_step_end(self, state, metrics):
            if state.step == 2:
                with torch.no_grad():
                    model.tok_embeddings.weight.fill_(float("nan"))

    with pytest.raises(DataError, match="step 3"):
        train(model, sampler, OPTIM, total_steps=5, callbacks=[Poison()])
