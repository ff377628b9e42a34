"""Self-describing, atomically written checkpoints (docs/methods.md §9; docs/methods.md §9).

Layout of one checkpoint directory::

    model.safetensors   weights (fp32 master copy; a tied embedding stored once)
    optimizer.pt        AdamW state_dict: moments, step counts, param groups
    state.json          step, tokens_seen, clipped_steps, RNG states (python, numpy, torch, cuda),
                        sampler position, model config, extra (tokenizer hash, manifest hash, ...)
    checksums.json      sha256 of the three files above, written last: the completion record

Files are written into a hidden sibling temp directory, fsynced, then renamed into place, so a crash leaves
either no checkpoint or a complete one; ``latest_checkpoint`` ignores directories without checksums.json.

Sharded layout (runs of several processes, ``save_sharded_checkpoint``)::

    shards/             torch.distributed.checkpoint: one ``__<rank>_0.distcp`` per rank plus ``.metadata``
    state.json          as above, plus "format": "sharded" and the world size that wrote it
    checksums.json      sha256 of every file above

A sharded checkpoint loads on any world size (the tensors are stored by name and placement, and resharded on
load). Its ``.metadata`` is a pickle written by this run into its own scratch folder; artifacts that leave the run
(the stage's final checkpoint) are always consolidated into the single-file layout.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import pickle
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
SHARDED_FILES = ("shards/.metadata", "state.json")
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
    required = SHARDED_FILES if "shards/.metadata" in expected else FILES
    for name in sorted(set(required) | set(expected)):
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
        CheckpointError: missing/corrupt files, the saved model config differs from ``model.cfg``, or
            ``optimizer.pt`` holds anything but tensors and plain data (never unpickled).
    """
    record = verify_checkpoint(directory)
    if record.get("format") == "sharded":
        raise CheckpointError(f"{directory} is a sharded checkpoint written by {record.get('world_size')} processes; "
                              "load it with load_sharded_checkpoint (run main with [main.distributed] launch = "
                              "\"accelerate\")")
    saved_cfg = ModelConfig(**record["model_config"])
    if getattr(model, "cfg", saved_cfg) != saved_cfg:
        raise CheckpointError(f"checkpoint {directory} was saved for {saved_cfg!r}, not the model given ({model.cfg!r})")
    try:
        safetensors.torch.load_model(model, str(Path(directory) / "model.safetensors"), device=_device(model))
        if optimizer is not None:
            saved = torch.load(Path(directory) / "optimizer.pt", weights_only=True, map_location=_device(model))
            if any(isinstance(k, str) for k in saved.get("state", {})):  # keyed by parameter name (consolidated)
                from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

                set_optimizer_state_dict(model, optimizer, saved)
            else:
                optimizer.load_state_dict(saved)
    except pickle.UnpicklingError as err:  # weights_only refused a pickle that holds more than tensors and numbers
        raise CheckpointError(f"checkpoint {directory}: optimizer.pt holds objects other than tensors, so it is not "
                              f"loaded (it could run code); use a checkpoint this platform wrote: {err}") from err
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


def _barrier(accelerator: Any) -> None:
    if accelerator.num_processes > 1:
        accelerator.wait_for_everyone()


def save_sharded_checkpoint(directory: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer,
                            state: TrainState, sampler_state: dict, extra: dict, accelerator: Any) -> Path:
    """Collective: every rank writes its own shard of weights and optimiser moments (torch.distributed.checkpoint);
    rank 0 writes state.json and the checksums, and renames the directory into place once all shards are down.

    ``model`` may be DDP-wrapped or FSDP2-sharded (state is taken by parameter name, so the checkpoint loads on
    any world size). The loader state is global (``parallel``), so rank 0's copy is the run's. Call it after the
    first optimiser step: taking the state of an optimiser that never stepped initialises its moments with a step.

    Raises:
        CheckpointError: the model carries no ModelConfig, or ``extra``/``sampler_state`` is not JSON serialisable.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from tasks.train.parallel import unwrap

    directory = Path(directory)
    cfg = getattr(unwrap(model), "cfg", None)
    if not isinstance(cfg, ModelConfig):
        raise CheckpointError(f"model {type(model).__name__} has no ModelConfig at .cfg; a checkpoint must record it")
    record = {"format": "sharded", "world_size": accelerator.num_processes, "step": state.step,
              "tokens_seen": state.tokens_seen, "clipped_steps": state.clipped_steps, "rng": rng_states(),
              "sampler": sampler_state, "model_config": cfg.model_dump(), "extra": extra}
    try:
        text = json.dumps(record, indent=1)
    except TypeError as err:
        raise CheckpointError(f"checkpoint state is not JSON serialisable ({err}); pass plain values in extra") from err
    tmp = directory.parent / f".{directory.name}.tmp"  # one name for every rank
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier(accelerator)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / "shards"))
    _barrier(accelerator)
    if accelerator.is_main_process:
        (tmp / "state.json").write_text(text)
        files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
        for name in files:
            _fsync(tmp / name)
        _fsync(tmp / "shards")
        (tmp / COMPLETION).write_text(json.dumps({name: _sha256(tmp / name) for name in files}, indent=1))
        _fsync(tmp / COMPLETION)
        _replace_dir(tmp, directory)
    _barrier(accelerator)
    return directory


def load_sharded_checkpoint(directory: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer,
                            accelerator: Any, restore_rng: bool = True) -> dict[str, Any]:
    """Collective inverse of ``save_sharded_checkpoint`` onto a model already wrapped for this world size.

    Rank 0 verifies the checksums and tells the others (every rank gets the same verdict, so none is left waiting).
    Returns the same dict as ``load_checkpoint`` plus "world_size" (of the run that wrote it).

    Raises:
        CheckpointError: missing/corrupt files, a single-file checkpoint (written in-process), or a model config
            different from the one saved.
    """
    import torch.distributed.checkpoint as dcp
    from accelerate.utils import broadcast_object_list
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from tasks.train.parallel import unwrap

    verdict = [None]
    if accelerator.is_main_process:
        try:
            verify_checkpoint(directory)
        except CheckpointError as err:
            verdict = [str(err)]
    if accelerator.num_processes > 1:
        verdict = broadcast_object_list(verdict)
    if verdict[0] is not None:
        raise CheckpointError(verdict[0])
    record = json.loads((Path(directory) / "state.json").read_text())
    if record.get("format") != "sharded":
        raise CheckpointError(f"{directory} was written by an in-process run (single-file layout); resume it with "
                              "[main.distributed] launch = \"inprocess\", or remove the scratch folder to start over")
    saved_cfg = ModelConfig(**record["model_config"])
    if unwrap(model).cfg != saved_cfg:
        raise CheckpointError(f"checkpoint {directory} was saved for {saved_cfg!r}, not the model given")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    try:
        dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(Path(directory) / "shards"))
    except Exception as err:  # DCP raises CheckpointException and others for a layout that does not fit
        raise CheckpointError(f"checkpoint {directory} does not fit the model/optimizer given: {err}") from err
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    if restore_rng:
        restore_rng_states(record["rng"])
    state = TrainState(step=record["step"], tokens_seen=record["tokens_seen"], clipped_steps=record["clipped_steps"])
    return {"state": state, "sampler_state": record["sampler"], "extra": record["extra"],
            "model_config": saved_cfg, "rng": record["rng"], "world_size": record["world_size"]}


def save_consolidated_checkpoint(directory: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer,
                                 state: TrainState, sampler_state: dict, extra: dict, accelerator: Any) -> Path | None:
    """Collective: gather full weights and optimiser state to rank 0 (on CPU) and write the single-file layout
    there (optimiser state keyed by parameter name; ``load_checkpoint`` accepts both). Returns the path on rank
    0, None elsewhere."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from tasks.train.parallel import unwrap

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    path = None
    if accelerator.is_main_process:
        plain = Decoder(unwrap(model).cfg)
        plain.load_state_dict(model_sd)
        path = save_checkpoint(directory, model=plain, optimizer=_FrozenOptimizer(optim_sd), state=state,
                               sampler_state=sampler_state, extra={**extra, "world_size": accelerator.num_processes})
    _barrier(accelerator)
    return path


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
                 asynchronous: bool = False, accelerator: Any = None):
        if asynchronous and accelerator is not None:
            raise CheckpointError("asynchronous checkpoints are written by one process; a sharded (launched) run "
                                  "saves synchronously: set async_checkpoints = false")
        self.accelerator = accelerator  # given: sharded, collective saves (every rank calls on_checkpoint)
        self.root, self.extra = Path(root), dict(extra or {})
        self.keep_last, self.milestone_every = keep_last, milestone_every
        self.asynchronous = asynchronous
        self._writer: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self.stall_seconds: list[float] = []  # time the training thread spent in each on_checkpoint

    def on_checkpoint(self, state: TrainState, model: nn.Module, optimizer: torch.optim.Optimizer, sampler: Any) -> None:
        started = time.perf_counter()
        directory = self.root / f"step_{state.step:08d}"
        if self.accelerator is not None:
            if state.step == 0:
                # Nothing a fresh start lacks; and taking the sharded state of an untouched optimiser would
                # initialise it with a zero step, shifting Adam's bias correction by one.
                return
            save_sharded_checkpoint(directory, model=model, optimizer=optimizer, state=state,
                                    sampler_state=sampler.state_dict(), extra=self.extra, accelerator=self.accelerator)
            if self.keep_last is not None and self.accelerator.is_main_process:
                self._prune()
            _barrier(self.accelerator)
        elif not self.asynchronous:
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
