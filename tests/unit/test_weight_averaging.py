"""Weight averaging (tasks/train/averaging.py): the EMA against its closed form on recorded iterates, the last-K
mean against the mean of the saved tensors, the EMA as a checkpoint companion (saved, resumed, refused when absent),
and the [main] fields' keys and errors."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from infra.errors import CheckpointError
from infra.section import key_dump
from models.config import ModelConfig
from models.decoder import Decoder
from tasks.train.averaging import EMA, averaged_parameters, ema_update, uniform_average, with_weights
from tasks.train.checkpoint import Checkpointer, load_model, save_weights, verify_checkpoint
from tasks.train.config import OptimConfig
from tasks.train.data import MixtureSampler
from tasks.train.loop import TrainState, train
from tasks.train.sections import DistributedConfig, MainConfig, ModelShape, RunBudget

ROOT = Path(__file__).resolve().parents[2]
TINY = ModelConfig(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, vocab_size=64, seq_len=8)


def _sampler(seed: int = 0) -> MixtureSampler:
    tokens = np.random.default_rng(seed).integers(1, TINY.vocab_size, 4_000).astype(np.uint16)
    return MixtureSampler({"a": tokens}, {"a": 1.0}, seq_len=TINY.seq_len, batch_size=2, seed=seed)


class _Recorder:
    """The float64 parameters after every applied step (the iterates w_1..w_n)."""

    def __init__(self, model):
        self.model, self.iterates = model, []

    def on_step_end(self, state, metrics):
        self.iterates.append({k: v.double() for k, v in averaged_parameters(self.model).items()})


def test_ema_after_n_steps_equals_the_closed_form_on_the_recorded_iterates():
    """ŵ_n = Σ_{i=1..n} (1−β) β^{n−i} w_i + β^n w_0 (Polyak & Juditsky 1992 with exponential weights)."""
    torch.manual_seed(0)
    model, beta, n = Decoder(TINY), 0.8, 12
    w0 = {k: v.double() for k, v in averaged_parameters(model).items()}
    ema, recorder = EMA(model, beta), _Recorder(model)
    train(model, _sampler(), OptimConfig(peak_lr=3e-3, warmup_steps=1), total_steps=n, callbacks=[ema, recorder],
          seed=0)
    assert ema.updates == n and len(recorder.iterates) == n
    for name, value in ema.state_dict().items():
        assert value.dtype == torch.float32
        expected = beta ** n * w0[name] + sum((1 - beta) * beta ** (n - i) * recorder.iterates[i - 1][name]
                                              for i in range(1, n + 1))
        assert torch.allclose(value.double(), expected, rtol=0, atol=1e-6), name
        assert not torch.allclose(value.double(), recorder.iterates[-1][name], atol=1e-6)  # it does lag the weights


def test_ema_update_is_one_convex_step_and_refuses_a_decay_of_one():
    avg, w = {"x": torch.tensor([1.0, 2.0])}, {"x": torch.tensor([3.0, -2.0], dtype=torch.bfloat16)}
    ema_update(avg, w, 0.75)
    assert torch.equal(avg["x"], torch.tensor([0.75 * 1 + 0.25 * 3, 0.75 * 2 - 0.25 * 2]))
    with pytest.raises(ValueError, match=r"β = 1.0 must lie in \[0, 1\)"):
        ema_update(avg, w, 1.0)
    with pytest.raises(ValueError, match="lack"):
        ema_update({"y": torch.zeros(1)}, w, 0.5)


def test_last_k_average_equals_the_mean_of_the_saved_tensors(tmp_path):
    saved = []
    for k in range(3):
        torch.manual_seed(k)
        model = Decoder(TINY)
        saved.append(save_weights(tmp_path / f"step_{k}", model=model, state=TrainState(step=k)))
    mean = uniform_average(averaged_parameters(load_model(d)) for d in saved)
    loaded = [dict(load_model(d).named_parameters()) for d in saved]
    for name, value in mean.items():
        reference = torch.stack([sd[name].detach().double() for sd in loaded]).mean(dim=0).float()
        assert torch.allclose(value, reference, rtol=0, atol=1e-7), name
    merged = with_weights(load_model(saved[0]), mean)
    assert merged.cfg == TINY
    for name, value in merged.named_parameters():
        assert torch.equal(value.detach(), mean[name]), name
    with pytest.raises(ValueError, match="at least one"):
        uniform_average([])
    with pytest.raises(ValueError, match="shape"):
        uniform_average([{"x": torch.zeros(2)}, {"x": torch.zeros(3)}])


@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_ema_is_saved_in_every_checkpoint_and_restored_on_resume(tmp_path, asynchronous):
    """An interrupted run (checkpoint at step 4, resumed to 8) ends with the EMA and weights of an uninterrupted one,
    also when checkpoints are snapshotted and written in the background."""
    optim = OptimConfig(peak_lr=3e-3, warmup_steps=1)

    class Crash:
        def on_step_end(self, state, metrics):
            if state.step == 5:
                raise KeyboardInterrupt  # after the step-4 checkpoint was written

    def run(root: Path, resume: bool, crash: bool = False):
        torch.manual_seed(0)
        model, sampler = Decoder(TINY), _sampler()
        ema = EMA(model, 0.9)
        checkpointer = Checkpointer(root, extra={}, keep_last=None, companions={"ema": ema},
                                    asynchronous=asynchronous)
        state = optimizer = None
        if resume:
            from tasks.train.optim import build_optimizer

            optimizer = build_optimizer(model, optim)
            state = checkpointer.resume(model, optimizer, sampler)["state"]
        try:
            train(model, sampler, optim, total_steps=8, callbacks=[ema, checkpointer, *([Crash()] if crash else [])],
                  checkpoint_every=4, state=state, optimizer=optimizer, seed=0)
        finally:
            checkpointer.wait()
        return model, ema

    full_model, full_ema = run(tmp_path / "full", False)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut", False, crash=True)
    assert (tmp_path / "cut/step_00000004/ema.safetensors").is_file()
    verify_checkpoint(tmp_path / "cut/step_00000004")
    assert "ema.safetensors" in json.loads((tmp_path / "cut/step_00000004/checksums.json").read_text())
    resumed_model, resumed_ema = run(tmp_path / "cut", True)
    for name, value in full_ema.state_dict().items():
        assert torch.equal(value, resumed_ema.state_dict()[name]), name
    for (name, a), (_, b) in zip(full_model.state_dict().items(), resumed_model.state_dict().items()):
        assert torch.equal(a, b), name

    plain = Checkpointer(tmp_path / "plain", extra={}, keep_last=None)
    plain.save(tmp_path / "plain/step_00000001", model=Decoder(TINY), optimizer=torch.optim.AdamW(
        Decoder(TINY).parameters()), state=TrainState(step=1), sampler_state={})
    with pytest.raises(CheckpointError, match="no ema.safetensors"):
        Checkpointer(tmp_path / "plain", companions={"ema": EMA(Decoder(TINY), 0.9)}).load(
            tmp_path / "plain/step_00000001", model=Decoder(TINY))


def test_a_weights_only_checkpoint_is_verified_and_never_resumed(tmp_path):
    model = Decoder(TINY)
    directory = save_weights(tmp_path / "w", model=model, state=TrainState(step=3, tokens_seen=48))
    record = verify_checkpoint(directory)
    assert record["format"] == "weights" and record["step"] == 3
    assert sorted(p.name for p in directory.iterdir()) == ["checksums.json", "model.safetensors", "state.json"]
    for (name, a), (_, b) in zip(model.state_dict().items(), load_model(directory).state_dict().items()):
        assert torch.equal(a, b), name
    with pytest.raises(CheckpointError, match="weights only"):
        Checkpointer(tmp_path).load(directory, model=Decoder(TINY), optimizer=torch.optim.AdamW(model.parameters()))
    (directory / "model.safetensors").write_bytes(b"corrupt")
    with pytest.raises(CheckpointError, match="sha256"):
        verify_checkpoint(directory)


BASE = dict(model=ModelShape(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, seq_len=8),
            budget=RunBudget(steps=10, batch_size=2, warmup_steps=1))


def test_main_fields_stay_out_of_dumps_at_their_defaults_and_enter_the_key_when_set():
    default = MainConfig(**BASE)
    for name in ("milestone_every", "milestones", "ema_decay", "average_last"):
        assert name not in default.model_dump() and name not in key_dump(default)
    on = MainConfig(**BASE, milestone_every=4, milestones=[5], ema_decay=0.99, average_last=3)
    assert {k: key_dump(on)[k] for k in ("milestone_every", "milestones", "ema_decay", "average_last")} == \
        {"milestone_every": 4, "milestones": [5], "ema_decay": 0.99, "average_last": 3}
    assert on.milestone_steps == [4, 5, 8] and on.averaged_steps_pool == [4, 5, 8, 10]
    assert MainConfig(**on.model_dump()) == on


@pytest.mark.parametrize("fields, message", [
    ({"milestones": [0, 11]}, r"milestones \[0, 11\]: give distinct steps in \[1, budget.steps = 10\]"),
    ({"milestones": [3, 3]}, "distinct"),
    ({"average_last": 3, "milestones": [5]}, r"average_last = 3 needs 2 ≤ K ≤ 2"),
    ({"average_last": 1, "milestone_every": 5}, "average_last = 1 needs 2 ≤ K"),
    ({"ema_decay": 1.0}, "ema_decay"),
    ({"ema_decay": 0.9, "distributed": DistributedConfig(launch="accelerate", processes=2)}, "in-process runs only"),
])
def test_bad_kept_weight_settings_are_refused_naming_the_field(fields, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        MainConfig(**BASE, **fields)
