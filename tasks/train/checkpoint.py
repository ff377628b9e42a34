"""Self-describing, atomically written checkpoints (SPEC §9; STYLE §10).

Layout of one checkpoint directory::

    model.safetensors   weights (fp32 master copy; a tied embedding stored once)
    optimizer.pt        AdamW state_dict: moments, step counts, param groups
    state.json          step, tokens_seen, clipped_steps, RNG states (python, numpy, torch, cuda),
                        sampler position, model config, extra (tokenizer hash, manifest hash, ...)
    checksums.json      sha256 of the three files above, written last: the completion record

Files are written into a hidden sibling temp directory, fsynced, then renamed into place, so a crash leaves
either no checkpoint or a complete one; ``latest_checkpoint`` ignores directories without checksums.json.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import random
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch
from torch import nn

from infra.errors import CheckpointError
from models.config import ModelConfig
from models.decoder import Decoder
from tasks.train.loop import TrainState

FILES = ("model.safetensors", "optimizer.pt", "state.json")
COMPLETION = "checksums.json"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_states() -> dict:
    """JSON-serialisable RNG states of python, numpy (legacy global) and torch (CPU and every CUDA device)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    as_b64 = lambda t: base64.b64encode(t.numpy().tobytes()).decode()  # noqa: E731
    return {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": as_b64(torch.get_rng_state()),
        "cuda": [as_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }


def restore_rng_states(states: dict) -> None:
    """Inverse of ``rng_states``: the global generators continue exactly where the saved run was."""
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    as_tensor = lambda s: torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)  # noqa: E731
    torch.set_rng_state(as_tensor(states["torch"]))
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([as_tensor(s) for s in states["cuda"]])


def save_checkpoint(directory: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainState,
                    sampler_state: dict, extra: dict, rng: dict | None = None) -> Path:
    """Write a complete checkpoint at ``directory`` atomically and return its path.

    ``model`` must carry its ``ModelConfig`` as ``model.cfg`` (``Decoder`` does). ``rng``: generator states to
    record (default: taken now; an asynchronous save passes the states of the moment it snapshotted). ``extra`` must be JSON
    serialisable (e.g. ``{"tokenizer_sha256": ..., "manifest_sha256": ...}``). An existing checkpoint at
    ``directory`` is replaced.

    Raises:
        CheckpointError: the model has no ``cfg`` or ``extra``/``sampler_state`` is not JSON serialisable.
    """
    directory = Path(directory)
    cfg = getattr(model, "cfg", None)
    if not isinstance(cfg, ModelConfig):
        raise CheckpointError(f"model {type(model).__name__} has no ModelConfig at .cfg; a checkpoint must record it")
    tmp = directory.parent / f".{directory.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    record = {"step": state.step, "tokens_seen": state.tokens_seen, "clipped_steps": state.clipped_steps,
              "rng": rng_states() if rng is None else rng, "sampler": sampler_state, "model_config": cfg.model_dump(), "extra": extra}
    try:
        text = json.dumps(record, indent=1)
    except TypeError as err:
        shutil.rmtree(tmp)
        raise CheckpointError(f"checkpoint state is not JSON serialisable ({err}); pass plain values in extra") from err
    safetensors.torch.save_model(model, str(tmp / "model.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "state.json").write_text(text)
    for name in FILES:
        _fsync(tmp / name)
    (tmp / COMPLETION).write_text(json.dumps({name: _sha256(tmp / name) for name in FILES}, indent=1))
    _fsync(tmp / COMPLETION)
    _replace_dir(tmp, directory)
    return directory


def _replace_dir(tmp: Path, directory: Path) -> None:
    """Rename ``tmp`` onto ``directory``; an old checkpoint there is moved aside first and then deleted."""
    old = directory.parent / f".{directory.name}.old-{os.getpid()}"
    if directory.exists():
        os.replace(directory, old)
    os.replace(tmp, directory)
    _fsync(directory.parent)
    shutil.rmtree(old, ignore_errors=True)


def verify_checkpoint(directory: Path) -> dict:
    """Check completeness and sha256 of every file; return the parsed state.json.

    Raises:
        CheckpointError: the directory, a file or the completion record is missing, or a checksum differs.
    """
    directory = Path(directory)
    if not (directory / COMPLETION).is_file():
        raise CheckpointError(f"{directory} has no {COMPLETION}: missing or unfinished checkpoint; use an earlier one")
    expected = json.loads((directory / COMPLETION).read_text())
    for name in FILES:
        if not (directory / name).is_file():
            raise CheckpointError(f"{directory / name} is missing; the checkpoint is incomplete")
        if _sha256(directory / name) != expected.get(name):
            raise CheckpointError(f"{directory / name} fails its sha256 check: the file is corrupt; use an earlier checkpoint")
    return json.loads((directory / "state.json").read_text())


def load_checkpoint(directory: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    restore_rng: bool = True) -> dict[str, Any]:
    """Verify and load a checkpoint into ``model`` (and ``optimizer``); restore global RNG states by default.

    Returns:
        {"state": TrainState, "sampler_state": dict, "extra": dict, "model_config": ModelConfig, "rng": dict}.

    Raises:
        CheckpointError: missing/corrupt files, or the saved model config differs from ``model.cfg``.
    """
    record = verify_checkpoint(directory)
    saved_cfg = ModelConfig(**record["model_config"])
    if getattr(model, "cfg", saved_cfg) != saved_cfg:
        raise CheckpointError(f"checkpoint {directory} was saved for {saved_cfg!r}, not the model given ({model.cfg!r})")
    try:
        safetensors.torch.load_model(model, str(Path(directory) / "model.safetensors"), device=_device(model))
        if optimizer is not None:
            optimizer.load_state_dict(torch.load(Path(directory) / "optimizer.pt", weights_only=True,
                                                 map_location=_device(model)))
    except (RuntimeError, ValueError, KeyError) as err:
        raise CheckpointError(f"checkpoint {directory} does not fit the model/optimizer given: {err}") from err
    if restore_rng:
        restore_rng_states(record["rng"])
    state = TrainState(step=record["step"], tokens_seen=record["tokens_seen"], clipped_steps=record["clipped_steps"])
    return {"state": state, "sampler_state": record["sampler"], "extra": record["extra"],
            "model_config": saved_cfg, "rng": record["rng"]}


def _device(model: nn.Module) -> str:
    return str(next(model.parameters()).device)


def load_model(directory: Path) -> Decoder:
    """Build a ``Decoder`` from the checkpoint's saved config and load its verified weights (RNG untouched)."""
    record = verify_checkpoint(directory)
    model = Decoder(ModelConfig(**record["model_config"]))
    load_checkpoint(directory, model=model, restore_rng=False)
    return model


def latest_checkpoint(root: Path) -> Path | None:
    """The complete checkpoint under ``root`` with the highest step (unfinished/hidden directories ignored)."""
    complete = [d for d in Path(root).glob("*") if not d.name.startswith(".") and (d / COMPLETION).is_file()]
    if not complete:
        return None
    return max(complete, key=lambda d: json.loads((d / "state.json").read_text())["step"])


class _FrozenOptimizer:
    """Stands in for an optimiser whose ``state_dict()`` was snapshotted (asynchronous saves)."""

    def __init__(self, state: dict):
        self._state = state

    def state_dict(self) -> dict:
        return self._state


def _same_layout(a: Any, b: Any) -> bool:
    """Same nesting, keys and tensor shapes (so ``b`` can be copied into ``a`` in place)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_layout(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_layout(x, y) for x, y in zip(a, b))
    return not isinstance(a, (torch.Tensor, dict, list)) and not isinstance(b, (torch.Tensor, dict, list))


def _copy_into(mine: dict, theirs: dict) -> None:
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            mine[key].copy_(value)
        elif isinstance(value, dict):
            _copy_into(mine[key], value)
        else:
            mine[key] = copy.deepcopy(value)


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu")
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value


class CheckpointCallback:
    """Loop callback: save to ``root/step_{step:08d}`` on every ``on_checkpoint`` (see ``train(checkpoint_every=)``).

    Retention: after each save, complete checkpoints beyond the newest ``keep_last`` are deleted, except milestones
    (steps divisible by ``milestone_every``; 0 = none). ``keep_last`` None keeps everything. Only complete
    checkpoints count, so a torn newer one never causes the last good one to be deleted.
    """

    def __init__(self, root: Path, *, extra: dict | None = None, keep_last: int | None = 3, milestone_every: int = 0,
                 asynchronous: bool = False):
        self.root, self.extra = Path(root), dict(extra or {})
        self.keep_last, self.milestone_every = keep_last, milestone_every
        self.asynchronous = asynchronous
        self._writer: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self.stall_seconds: list[float] = []  # time the training thread spent in each on_checkpoint

    def on_checkpoint(self, state: TrainState, model: nn.Module, optimizer: torch.optim.Optimizer, sampler: Any) -> None:
        started = time.perf_counter()
        directory = self.root / f"step_{state.step:08d}"
        if not self.asynchronous:
            self._write(directory, model, optimizer, state, sampler.state_dict(), None)
        else:
            self.wait()  # one write in flight at a time, so the snapshot buffers are free to reuse
            # Snapshot on the CPU now (weights, optimiser moments, loop state, RNG); write in the background. The
            # buffers are allocated at the first save and overwritten in place after: a memcpy, no page faults.
            snapshot_model, snapshot_optimizer = self._snapshot(model, optimizer)
            args = (directory, snapshot_model, snapshot_optimizer, copy.copy(state), copy.deepcopy(sampler.state_dict()),
                    rng_states())
            self._writer = self._writer or ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
            self._pending = self._writer.submit(self._write, *args)
        self.stall_seconds.append(time.perf_counter() - started)

    def _snapshot(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, "_FrozenOptimizer"]:
        state = optimizer.state_dict()
        if getattr(self, "_model_copy", None) is None or not _same_layout(self._optim_copy, state):
            self._model_copy = copy.deepcopy(model).to("cpu")
            self._optim_copy = _to_cpu(copy.deepcopy(state))
        else:
            with torch.no_grad():
                for mine, theirs in zip(self._model_copy.state_dict().values(), model.state_dict().values()):
                    mine.copy_(theirs)
            _copy_into(self._optim_copy, state)
        return self._model_copy, _FrozenOptimizer(self._optim_copy)

    def wait(self) -> None:
        """Block until the background write (if any) is complete; re-raises its error."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def _write(self, directory: Path, model: nn.Module, optimizer: Any, state: TrainState, sampler_state: dict,
               rng: dict | None) -> None:
        save_checkpoint(directory, model=model, optimizer=optimizer, state=state, sampler_state=sampler_state,
                        extra=self.extra, rng=rng)
        if self.keep_last is not None:
            self._prune()

    def _prune(self) -> None:
        complete = sorted((d for d in self.root.glob("step_*") if (d / COMPLETION).is_file()),
                          key=lambda d: json.loads((d / "state.json").read_text())["step"])
        for old in complete[:-self.keep_last] if self.keep_last > 0 else complete:
            step = json.loads((old / "state.json").read_text())["step"]
            if self.milestone_every and step % self.milestone_every == 0:
                continue
            shutil.rmtree(old, ignore_errors=True)
