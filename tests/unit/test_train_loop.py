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


# --- gradient accumulation, z-loss, instruments, spike policies -------------------------------------------------

from accelerate import Accelerator  # noqa: E402

from tasks.train.checkpoint import Checkpointer  # noqa: E402
from tasks.train.data import IGNORE_INDEX, Batch  # noqa: E402
from tasks.train.loop import SpikeRule, forward_backward  # noqa: E402

LONG = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=64, seq_len=200)


def ragged_batch():
    """Four rows with 3, 10, 50 and 200 real target tokens; the rest is padding (ignored targets)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 64, (4, 200), generator=g)
    y = torch.randint(0, 64, (4, 200), generator=g)
    for row, n in enumerate((3, 10, 50, 200)):
        y[row, n:] = IGNORE_INDEX
    return Batch(x, y, ["a", "a", "b", "b"])


def grads(micro_batches):
    torch.manual_seed(0)
    model = Decoder(LONG)
    out = forward_backward(model, ragged_batch(), accelerator=Accelerator(cpu=True), micro_batches=micro_batches)
    return out, [p.grad.clone() for p in model.parameters()]


def test_accumulated_gradient_equals_the_full_batch_gradient():
    full, g_full = grads(1)
    for k in (2, 4):
        split, g_split = grads(k)
        assert split["n_targets"] == full["n_targets"] == 263
        assert split["loss_nats"] == pytest.approx(full["loss_nats"], rel=1e-6)
        for a, b in zip(g_full, g_split):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    # A mean of per-micro-batch means would weight the 3-token row like the 200-token row: a different gradient.
    torch.manual_seed(0)
    model = Decoder(LONG)
    batch = ragged_batch()
    for i in range(4):
        logits = model(batch.x[i:i + 1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.y[i:i + 1].flatten(),
                                          ignore_index=IGNORE_INDEX).div(4).backward()
    assert not torch.allclose(g_full[0], model.tok_embeddings.weight.grad, rtol=1e-3)


def test_micro_batches_must_divide_the_batch():
    with pytest.raises(DataError, match="micro-batch"):
        forward_backward(Decoder(LONG), ragged_batch(), accelerator=Accelerator(cpu=True), micro_batches=3)


def test_z_loss_is_reported_and_added_to_the_objective():
    plain = train(*make(), OPTIM, total_steps=3).metrics[-1]
    with_z = train(*make(), OPTIM.model_copy(update={"z_loss": 1e-2}), total_steps=3).metrics[-1]
    assert plain["z_loss"] == 0.0 and with_z["z_loss"] > 0
    assert with_z["z_loss"] == pytest.approx(1e-2 * with_z["mean_log_z"] ** 2, rel=0.2)  # log Z varies little


def test_instruments_do_not_change_training():
    bare = train(*make(), OPTIM, total_steps=6).metrics
    probed = train(*make(), OPTIM, total_steps=6, instrument_every=2).metrics
    assert [m["loss_nats"] for m in bare] == [m["loss_nats"] for m in probed]
    assert "max_attention_logit" in probed[1] and "max_attention_logit" not in probed[0]
    assert probed[1]["max_attention_logit"] > 0 and 0 < probed[1]["update_weight_ratio"] < 1
    assert 0 < probed[1]["utilisation_proxy"] < 1.5 and probed[1]["peak_memory_mb"] > 0


class CorruptAt:
    """Wraps a sampler: batches number ``bad`` (1-based) are replaced by random tokens, a loss spike."""

    def __init__(self, sampler, bad):
        self.sampler, self.bad = sampler, set(bad)

    def __getattr__(self, name):
        return getattr(self.sampler, name)

    def next_batch(self):
        batch = self.sampler.next_batch()
        if self.sampler.batches_drawn in self.bad:
            g = torch.Generator().manual_seed(self.sampler.batches_drawn)
            noise = torch.randint(0, 64, batch.x.shape, generator=g)
            return batch._replace(x=noise, y=torch.roll(noise, -1, dims=1))
        return batch


def test_spike_rewinds_to_the_last_checkpoint_and_skips_the_data(tmp_path):
    model, sampler = make()
    optim = OptimConfig(peak_lr=1e-2, warmup_steps=2)
    corrupt = CorruptAt(sampler, bad={25})
    optimizer = None
    holder = {}
    checkpointer = Checkpointer(tmp_path)

    def rewind():
        return checkpointer.rewind(model, holder["optimizer"])

    class Keep:
        def on_checkpoint(self, state, model_, optimizer_, sampler_):
            holder["optimizer"] = optimizer_

    events = []

    class Events:
        def on_event(self, state, event):
            events.append(event)

    result = train(model, corrupt, optim, total_steps=30, checkpoint_every=10, optimizer=optimizer,
                   callbacks=[Keep(), checkpointer, Events()],
                   spike=SpikeRule(window=10, factor=2.0, min_history=5, policy="rewind", lr_factor=0.5),
                   rewind=rewind)
    assert len(events) == 1 and events[0]["step"] == 25 and events[0]["action"] == "rewind"
    assert events[0]["rewound_to"] == 20 and events[0]["batches_drawn"] == 25
    assert events[0]["loss_nats"] > 2 * events[0]["median"]
    assert result.state.step == 30 and result.events == events
    # The loader was not rewound: the offending batch and those after the checkpoint are never replayed.
    assert sampler.batches_drawn == 35
    assert result.metrics[-1]["lr"] < 0.5 * 1e-2  # the LR after the rewind carries the 0.5 factor
    assert result.metrics[-1]["loss_nats"] < events[0]["loss_nats"] / 2


def test_skip_policy_drops_the_update_and_warn_keeps_it():
    for policy, steps_with_spike in (("skip", 0), ("warn", 1)):
        model, sampler = make()
        result = train(model, CorruptAt(sampler, bad={25}), OptimConfig(peak_lr=1e-2, warmup_steps=2),
                       total_steps=30, spike=SpikeRule(window=10, min_history=5, policy=policy))
        assert [e["action"] for e in result.events] == [policy]
        assert result.state.step == 30 and sampler.batches_drawn == 30 + (policy == "skip")
        spiky = [m for m in result.metrics if m["loss_nats"] > 2 * result.events[0]["median"] and m["step"] > 20]
        assert len(spiky) == steps_with_spike


def test_non_finite_loss_rewinds_and_never_reaches_metrics():
    model, sampler = make()
    saved = {}

    class PoisonOnce:
        def on_step_end(self, state, metrics):
            if state.step == 2 and not saved:
                saved.update({k: v.clone() for k, v in model.state_dict().items()})
                with torch.no_grad():
                    model.tok_embeddings.weight[0, 0] = float("nan")

    def rewind():
        model.load_state_dict(saved)
        from tasks.train.loop import TrainState
        return TrainState(step=2, tokens_seen=2 * 4 * 16)

    result = train(model, sampler, OPTIM, total_steps=4, callbacks=[PoisonOnce()],
                   spike=SpikeRule(policy="rewind"), rewind=rewind)
    assert [e["action"] for e in result.events] == ["rewind"]
    assert not math.isfinite(result.events[0]["loss_nats"]) and result.events[0]["rewound_to"] == 2
    assert result.state.step == 4 and all(math.isfinite(m["loss_nats"]) for m in result.metrics)


def test_persistent_non_finite_loss_stops_after_max_consecutive_events():
    model, sampler = make()

    class Poison:
        def on_step_end(self, state, metrics):
            with torch.no_grad():
                model.tok_embeddings.weight[0, 0] = float("nan")

    with pytest.raises(DataError, match="3 loss spikes or non-finite losses in a row"):
        train(model, sampler, OPTIM, total_steps=10, callbacks=[Poison()],
              spike=SpikeRule(policy="warn", max_consecutive=3))


def test_warned_spikes_in_a_row_also_stop_the_run():
    model, sampler = make()
    with pytest.raises(DataError, match="3 loss spikes"):
        train(model, CorruptAt(sampler, bad=set(range(25, 40))), OptimConfig(peak_lr=1e-2, warmup_steps=2),
              total_steps=40, spike=SpikeRule(window=10, min_history=5, policy="warn", max_consecutive=3))


@pytest.mark.parametrize("kwargs", [dict(window=5, min_history=10), dict(factor=1.0), dict(lr_factor=0.0),
                                    dict(max_consecutive=0)])
def test_spike_rule_refuses_settings_that_disable_it(kwargs):
    with pytest.raises(ValueError):
        SpikeRule(**kwargs)


def test_a_batch_without_real_targets_is_skipped_not_scored_as_zero():
    model, sampler = make()

    class Padded:
        def __getattr__(self, name):
            return getattr(sampler, name)

        def next_batch(self):
            batch = sampler.next_batch()
            if sampler.batches_drawn == 3:
                return batch._replace(y=torch.full_like(batch.y, IGNORE_INDEX))
            return batch

    result = train(model, Padded(), OPTIM, total_steps=4, spike=SpikeRule(policy="warn"))
    assert [e["action"] for e in result.events] == ["skip (no real targets)"]
    assert result.state.step == 4 and all(m["loss_nats"] > 0 for m in result.metrics)


def test_spike_policy_answers_apply_skip_or_rewind():
    from tasks.train.loop import SpikePolicy, TrainState

    def step(loss, finite=True):
        return {"loss_nats": loss, "finite": finite, "n_targets": 10}

    rewound = []
    policy = SpikePolicy(SpikeRule(window=4, factor=2.0, min_history=2, policy="rewind", lr_factor=0.5),
                         rewind=lambda: rewound.append(1) or TrainState(step=2))
    assert [policy.decide(i, step(1.0)).action for i in (1, 2, 3)] == ["apply"] * 3
    decision = policy.decide(4, step(5.0))  # 5 > 2 × median(1, 1, 1)
    assert decision.action == "rewind" and decision.state.step == 2 and decision.event["rewound_to"] == 2
    assert policy.lr_scale == 0.5 and policy.rewinds == 1 and not policy.history and rewound == [1]
    assert policy.decide(3, step(float("nan"), finite=False)).action == "rewind"
    skip = SpikePolicy(SpikeRule(window=4, min_history=2, policy="skip"))
    assert skip.decide(1, {**step(0.0), "n_targets": 0}).event["action"] == "skip (no real targets)"
    assert skip.decide(2, step(float("nan"), finite=False)).action == "skip"
    with pytest.raises(DataError, match="non-finite loss at step 7"):
        SpikePolicy(None).decide(7, step(float("nan"), finite=False))
