"""Checkpoints: docs/methods.md §9 resume exactness, fresh-optimiser control, integrity checks, atomic layout."""

import json
import os
import stat

import numpy as np
import pytest
import torch

from infra.errors import CheckpointError
from models.config import ModelConfig
from models.decoder import Decoder
from tasks.train.checkpoint import Checkpointer, latest_checkpoint, load_model, save_weights
from tasks.train.config import OptimConfig
from tasks.train.data import MixtureSampler
from tasks.train.loop import TrainState, train
from tasks.train.optim import build_optimizer

CFG = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=128, seq_len=16,
                  tied_embeddings=False)
OPTIM = OptimConfig(peak_lr=3e-3, warmup_steps=2)
TOTAL, SAVED_AT = 9, 6


def sampler(seed=5):
    rng = np.random.default_rng(0)
    data = {"a": rng.integers(0, 128, 4_000).astype(np.uint16), "b": rng.integers(0, 128, 3_000).astype(np.uint32)}
    return MixtureSampler(data, {"a": 0.6, "b": 0.4}, seq_len=16, batch_size=4, seed=seed)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    result = train(Decoder(CFG), sampler(), OPTIM, total_steps=TOTAL, checkpoint_every=SAVED_AT,
                   callbacks=[Checkpointer(root, extra={"tokenizer_sha256": "abc"})])
    return root, [m["loss_nats"] for m in result.metrics]


def resume(directory, *, fresh_optimizer=False):
    model = Decoder(CFG)
    optimizer = build_optimizer(model, OPTIM)
    loaded = Checkpointer(directory.parent).load(directory, model=model, optimizer=None if fresh_optimizer else optimizer)
    data = sampler(seed=123)
    data.load_state_dict(loaded["sampler_state"])
    result = train(model, data, OPTIM, total_steps=TOTAL, state=loaded["state"], optimizer=optimizer)
    return [m["loss_nats"] for m in result.metrics]


def test_resume_next_three_losses_equal(uninterrupted):
    root, losses = uninterrupted
    resumed = resume(root / f"step_{SAVED_AT:08d}")
    assert len(resumed) == TOTAL - SAVED_AT
    assert max(abs(a - b) for a, b in zip(resumed, losses[SAVED_AT:])) < 1e-5


def test_fresh_optimizer_control_differs(uninterrupted):
    root, losses = uninterrupted
    resumed = resume(root / f"step_{SAVED_AT:08d}", fresh_optimizer=True)
    assert max(abs(a - b) for a, b in zip(resumed, losses[SAVED_AT:])) > 1e-4


def test_contents_and_latest(uninterrupted):
    root, _ = uninterrupted
    directory = latest_checkpoint(root)
    assert directory == root / f"step_{TOTAL:08d}"
    assert sorted(p.name for p in directory.iterdir()) == [
        "checksums.json", "model.safetensors", "optimizer.pt", "state.json"]
    state = json.loads((directory / "state.json").read_text())
    assert (state["step"], state["tokens_seen"]) == (TOTAL, TOTAL * 4 * 16)
    assert state["extra"] == {"tokenizer_sha256": "abc"} and ModelConfig(**state["model_config"]) == CFG
    assert {"python", "numpy", "torch"} <= set(state["rng"])
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temp dirs left behind


def test_load_model_roundtrip(uninterrupted):
    root, _ = uninterrupted
    model = load_model(root / f"step_{TOTAL:08d}")
    assert model.cfg == CFG
    idx = torch.randint(0, 128, (1, 16))
    again = load_model(root / f"step_{TOTAL:08d}")
    torch.testing.assert_close(model(idx), again(idx))


def small_checkpoint(path):
    torch.manual_seed(0)
    model = Decoder(CFG)
    return Checkpointer(path.parent).save(path, model=model, optimizer=build_optimizer(model, OPTIM),
                                          state=TrainState(step=1), sampler_state={})


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_checkpoint_files_get_the_mode_a_plain_open_gives(tmp_path, umask):
    # safetensors creates its file owner-only (0o600); every file of a checkpoint reads like the others
    old = os.umask(umask)
    try:
        directory = small_checkpoint(tmp_path / "c")
        weights = save_weights(tmp_path / "w", model=Decoder(CFG), state=TrainState(step=1))
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for d in (directory, weights) for p in d.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o666 & ~umask}, modes


def test_corrupt_byte_rejected(tmp_path):
    directory = small_checkpoint(tmp_path / "c")
    weights = directory / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    weights.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="sha256"):
        load_model(directory)


def test_incomplete_and_missing_rejected(tmp_path):
    directory = small_checkpoint(tmp_path / "c")
    (directory / "checksums.json").unlink()
    with pytest.raises(CheckpointError, match="unfinished"):
        load_model(directory)
    assert latest_checkpoint(tmp_path) is None
    with pytest.raises(CheckpointError):
        load_model(tmp_path / "nowhere")


def test_config_mismatch_rejected(tmp_path):
    directory = small_checkpoint(tmp_path / "c")
    other = Decoder(CFG.model_copy(update={"tied_embeddings": True}))
    with pytest.raises(CheckpointError, match="saved for"):
        Checkpointer(tmp_path).load(directory, model=other)


def test_retention_keeps_the_last_k_and_milestones(tmp_path):
    torch.manual_seed(0)
    model = Decoder(CFG)
    callback = Checkpointer(tmp_path, keep_last=2, milestone_every=4)
    train(model, sampler(0), OPTIM, total_steps=10, checkpoint_every=1, callbacks=[callback])
    kept = sorted(int(d.name.split("_")[1]) for d in tmp_path.glob("step_*"))
    assert kept == [0, 4, 8, 9, 10]  # step 0 is divisible by 4: a milestone too
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000010"


def test_asynchronous_save_writes_the_same_checkpoint_as_a_synchronous_one(tmp_path):
    results = {}
    for mode in ("sync", "async"):
        torch.manual_seed(0)
        model = Decoder(CFG)
        callback = Checkpointer(tmp_path / mode, keep_last=None, asynchronous=mode == "async")
        train(model, sampler(0), OPTIM, total_steps=6, checkpoint_every=3, callbacks=[callback], seed=0)
        callback.wait()
        results[mode] = callback
    for step in (3, 6):
        a, b = (tmp_path / m / f"step_{step:08d}" for m in ("sync", "async"))
        assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
        sa, sb = (json.loads((d / "state.json").read_text()) for d in (a, b))
        assert sa == sb  # step, tokens, RNG states and loader position of the moment of the snapshot
        oa, ob = (torch.load(d / "optimizer.pt", weights_only=True) for d in (a, b))
        for (ka, va), (kb, vb) in zip(oa["state"].items(), ob["state"].items()):
            assert ka == kb and all(torch.equal(va[n], vb[n]) for n in va)
    assert len(results["async"].stall_seconds) == 3  # steps 0, 3, 6


class _RunsCode:
    """Unpickling this calls ``Path.touch`` on the marker: what a hostile optimizer.pt could do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        from pathlib import Path

        return Path.touch, (Path(self.marker),)


def test_a_checkpoint_whose_optimizer_pickle_runs_code_is_refused_without_running_it(tmp_path):
    import hashlib
    import pickle

    directory = small_checkpoint(tmp_path / "c")
    marker = tmp_path / "code_ran"
    (directory / "optimizer.pt").write_bytes(pickle.dumps({"state": {}, "hook": _RunsCode(str(marker))}, protocol=2))
    sums = json.loads((directory / "checksums.json").read_text())  # a forger rewrites the checksums too
    sums["optimizer.pt"] = hashlib.sha256((directory / "optimizer.pt").read_bytes()).hexdigest()
    (directory / "checksums.json").write_text(json.dumps(sums))
    model = Decoder(CFG)
    with pytest.raises(CheckpointError, match="not loaded"):
        Checkpointer(tmp_path).load(directory, model=model, optimizer=build_optimizer(model, OPTIM))
    assert not marker.exists()
