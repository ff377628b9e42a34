"""Self-describing, atomically written checkpoints (docs/methods.md §9; docs/methods.md §9).

Layout of one checkpoint directory::

    model.safetensors   weights (fp32 master copy; a tied embedding stored once)
    optimizer.pt        AdamW state_dict: moments, step counts, param groups
    state.json          step, tokens_seen, clipped_steps, loss_nats, RNG states (python, numpy, torch, cuda),
                        sampler position, model config, extra (tokenizer hash, manifest hash, ...)
    <name>.safetensors  optional companions of the run (e.g. ``ema``: the weight average, tasks.train.averaging)
    checksums.json      sha256 of the files above, written last: the completion record

Files are written into a hidden sibling temp directory (``.step_N.tmp-<pid>``), fsynced, then renamed into place
(``infra.atomic.publish_dir``), so a crash leaves either no checkpoint or a complete one; ``latest_checkpoint``
ignores directories without checksums.json.

Sharded layout (runs of several processes)::

    shards/             torch.distributed.checkpoint: one ``__<rank>_0.distcp`` per rank plus ``.metadata``
    state.json          as above, plus "format": "sharded" and the world size that wrote it
    checksums.json      sha256 of every file above

Weights-only layout (milestones and averaged weights, which nothing resumes from): model.safetensors, state.json
with "format": "weights", checksums.json; ``save_weights`` writes it, ``load_model`` and ``verify_checkpoint`` read it.

A sharded checkpoint loads on any world size (the tensors are stored by name and placement, and resharded on
load). Its ``.metadata`` is a pickle written by this run into its own scratch folder; artifacts that leave the run
(the stage's final checkpoint) are always consolidated into the single-file layout.

``Checkpointer`` is the writer and resumer of a run (one object for both layouts, picked by world size);
``verify_checkpoint``, ``load_model`` and ``latest_checkpoint`` are for readers of finished checkpoints.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import logging
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

from infra.atomic import publish_dir
from infra.errors import CheckpointError
from models.config import ModelConfig
from models.decoder import Decoder
from tasks.train.loop import TrainState

FILES = ("model.safetensors", "optimizer.pt", "state.json")
SHARDED_FILES = ("shards/.metadata", "state.json")
WEIGHTS_FILES = ("model.safetensors", "state.json")
COMPLETION = "checksums.json"

log = logging.getLogger(__name__)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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


def _record(model: nn.Module, state: TrainState, sampler_state: dict, extra: dict, rng: dict | None,
            **layout: Any) -> str:
    """state.json text; raises CheckpointError for a model without ModelConfig or state that is not JSON."""
    from tasks.train.parallel import unwrap

    cfg = getattr(unwrap(model), "cfg", None)
    if not isinstance(cfg, ModelConfig):
        raise CheckpointError(f"model {type(model).__name__} has no ModelConfig at .cfg; a checkpoint must record it")
    record = {**layout, "step": state.step, "tokens_seen": state.tokens_seen, "clipped_steps": state.clipped_steps,
              "loss_nats": state.loss_nats, "rng": rng_states() if rng is None else rng, "sampler": sampler_state, "model_config": cfg.model_dump(),
              "extra": extra}
    try:
        return json.dumps(record, indent=1)
    except TypeError as err:
        raise CheckpointError(f"checkpoint state is not JSON serialisable ({err}); pass plain values in extra") from err


def _seal(tmp: Path, directory: Path, files: list[str]) -> None:
    """Write the completion record (sha256 of ``files``) last, then publish ``tmp`` as ``directory`` (fsynced)."""
    (tmp / COMPLETION).write_text(json.dumps({name: _sha256(tmp / name) for name in files}, indent=1))
    publish_dir(tmp, directory, replace=True)


def _save_single(directory: Path, *, model: nn.Module, optimizer: Any, state: TrainState, sampler_state: dict,
                 extra: dict, rng: dict | None = None, companions: dict[str, dict] | None = None) -> Path:
    """The single-file layout at ``directory`` (replaced atomically); ``rng`` None records the states of now;
    ``companions``: name → tensors, each written as ``<name>.safetensors`` and sealed with the rest."""
    directory = Path(directory)
    text = _record(model, state, sampler_state, extra, rng)
    tmp = directory.parent / f".{directory.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    safetensors.torch.save_model(model, str(tmp / "model.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "state.json").write_text(text)
    files = list(FILES)
    for name, tensors in (companions or {}).items():
        safetensors.torch.save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()},
                                    str(tmp / f"{name}.safetensors"))
        files.append(f"{name}.safetensors")
    _seal(tmp, directory, files)
    return directory


def save_weights(directory: Path, *, model: nn.Module, state: TrainState, extra: dict | None = None) -> Path:
    """The weights-only layout at ``directory`` (replaced atomically): ``model``'s weights (a plain, unwrapped
    module carrying its ``ModelConfig`` as ``.cfg``), its config and ``state``'s step and tokens_seen. For
    checkpoints nothing resumes from: milestones and averaged weights.

    Raises:
        CheckpointError: the model has no ``cfg`` or ``extra`` is not JSON serialisable.
    """
    directory = Path(directory)
    text = _record(model, state, {}, dict(extra or {}), None, format="weights")
    tmp = directory.parent / f".{directory.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    safetensors.torch.save_model(model, str(tmp / "model.safetensors"))
    (tmp / "state.json").write_text(text)
    _seal(tmp, directory, list(WEIGHTS_FILES))
    return directory


def _save_sharded(directory: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainState,
                  sampler_state: dict, extra: dict, accelerator: Any) -> Path:
    """Collective sharded save: every rank writes its shard (torch.distributed.checkpoint); rank 0 writes
    state.json and the checksums and publishes the directory once all shards are down."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    directory = Path(directory)
    text = _record(model, state, sampler_state, extra, None, format="sharded", world_size=accelerator.num_processes)
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
        _seal(tmp, directory, sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file()))
    _barrier(accelerator)
    return directory


def verify_checkpoint(directory: Path) -> dict:
    """Check completeness and sha256 of every file; return the parsed state.json.

    Raises:
        CheckpointError: the directory, a file or the completion record is missing, or a checksum differs.
    """
    directory = Path(directory)
    if not (directory / COMPLETION).is_file():
        raise CheckpointError(f"{directory} has no {COMPLETION}: missing or unfinished checkpoint; use an earlier one")
    expected = json.loads((directory / COMPLETION).read_text())
    required = (SHARDED_FILES if "shards/.metadata" in expected else
                WEIGHTS_FILES if "optimizer.pt" not in expected and "model.safetensors" in expected else FILES)
    for name in sorted(set(required) | set(expected)):
        if not (directory / name).is_file():
            raise CheckpointError(f"{directory / name} is missing; the checkpoint is incomplete")
        if _sha256(directory / name) != expected.get(name):
            raise CheckpointError(f"{directory / name} fails its sha256 check: the file is corrupt; use an earlier checkpoint")
    return json.loads((directory / "state.json").read_text())


def _loaded(record: dict, saved_cfg: ModelConfig, restore_rng: bool) -> dict[str, Any]:
    if restore_rng:
        restore_rng_states(record["rng"])
    state = TrainState(step=record["step"], tokens_seen=record["tokens_seen"], clipped_steps=record["clipped_steps"],
                       loss_nats=record.get("loss_nats"))  # absent from checkpoints written before it was kept
    return {"state": state, "sampler_state": record["sampler"], "extra": record["extra"],
            "model_config": saved_cfg, "rng": record["rng"]}


def _load_single(directory: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 restore_rng: bool = True, record: dict | None = None,
                 companions: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load the single-file layout into an unwrapped ``model`` (and ``optimizer``, and each companion's
    ``load_state_dict`` from ``<name>.safetensors``); see ``Checkpointer.load``."""
    record = verify_checkpoint(directory) if record is None else record
    if record.get("format") == "sharded":
        raise CheckpointError(f"{directory} is a sharded checkpoint written by {record.get('world_size')} processes; "
                              "load it with a Checkpointer (run main with [main.distributed] launch = "
                              "\"accelerate\")")
    if record.get("format") == "weights" and (optimizer is not None or companions):
        raise CheckpointError(f"{directory} holds weights only (a milestone or averaged weights): it has no "
                              "optimiser state to resume a run from; load it with load_model")
    missing = [name for name in (companions or {}) if not (Path(directory) / f"{name}.safetensors").is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {directory} has no {', '.join(f'{n}.safetensors' for n in missing)}: it "
                              "was written by a run without that state (e.g. without [main] ema_decay)")
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
        for name, companion in (companions or {}).items():
            companion.load_state_dict(safetensors.torch.load_file(str(Path(directory) / f"{name}.safetensors"),
                                                                  device=_device(model)))
    except pickle.UnpicklingError as err:  # weights_only refused a pickle that holds more than tensors and numbers
        raise CheckpointError(f"checkpoint {directory}: optimizer.pt holds objects other than tensors, so it is not "
                              f"loaded (it could run code); use a checkpoint this platform wrote: {err}") from err
    except (RuntimeError, ValueError, KeyError) as err:
        raise CheckpointError(f"checkpoint {directory} does not fit the model/optimizer given: {err}") from err
    return _loaded(record, saved_cfg, restore_rng)


def _load_sharded(directory: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, accelerator: Any,
                  restore_rng: bool = True) -> dict[str, Any]:
    """Collective sharded load onto a model already wrapped for this world size (any world size). Rank 0
    verifies the checksums and tells the others, so every rank gets the same verdict and none is left waiting."""
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
    return {**_loaded(record, saved_cfg, restore_rng), "world_size": record["world_size"]}


def _device(model: nn.Module) -> str:
    return str(next(model.parameters()).device)


def load_model(directory: Path) -> Decoder:
    """Build a ``Decoder`` from a single-file checkpoint's saved config and load its verified weights (RNG
    untouched).

    Raises:
        CheckpointError: missing/corrupt files, or a sharded checkpoint (readers take consolidated ones).
    """
    record = verify_checkpoint(directory)
    model = Decoder(ModelConfig(**record["model_config"]))
    _load_single(directory, model=model, restore_rng=False, record=record)
    return model


def _barrier(accelerator: Any) -> None:
    if accelerator.num_processes > 1:
        accelerator.wait_for_everyone()


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


class Checkpointer:
    """The checkpoints of one run under ``root``: save, load, latest, resume; also the loop's checkpoint callback.

    Layout by world size: one process writes the single-file layout, several processes the sharded one (every rank
    calls every method: they are collective then). ``load`` reads either layout on any world size where it can: a
    sharded checkpoint loads on one process or many; a single-file one only on one process.

    Saves from the loop (``on_checkpoint``, see ``train(checkpoint_every=)``) go to ``root/step_{step:08d}``.
    Retention: after each save, complete checkpoints beyond the newest ``keep_last`` are deleted, except milestones
    (steps divisible by ``milestone_every``; 0 = none). ``keep_last`` None keeps everything. Only complete
    checkpoints count, so a torn newer one never causes the last good one to be deleted. ``asynchronous``: the
    loop's saves are snapshotted to CPU memory and written by a background thread (one process only).

    ``extra`` (JSON values, e.g. tokenizer and manifest hashes) is recorded in every state.json. ``companions``:
    name → an object with ``state_dict()`` (name → tensor) and ``load_state_dict``, e.g. the run's weight average
    (``tasks.train.averaging.EMA``); saved as ``<name>.safetensors`` in every checkpoint of the single-file layout
    (the final one included) and loaded back by ``load``/``resume``/``rewind``, so a resumed run continues it.

    Raises:
        CheckpointError: ``asynchronous`` or ``companions`` on several processes.
    """

    def __init__(self, root: Path, *, accelerator: Any = None, extra: dict | None = None, keep_last: int | None = 3,
                 milestone_every: int = 0, asynchronous: bool = False, companions: dict[str, Any] | None = None):
        self.accelerator = accelerator
        self.sharded = accelerator is not None and accelerator.num_processes > 1
        if asynchronous and self.sharded:
            raise CheckpointError("asynchronous checkpoints are written by one process; a sharded (launched) run "
                                  "saves synchronously: set async_checkpoints = false")
        if companions and self.sharded:
            raise CheckpointError(f"checkpoint companions {sorted(companions)} (e.g. [main] ema_decay) are saved by "
                                  "in-process runs only; use [main.distributed] launch = \"inprocess\"")
        self.companions = dict(companions or {})
        self.main_process = accelerator is None or accelerator.is_main_process
        self.root, self.extra = Path(root), dict(extra or {})
        self.keep_last, self.milestone_every = keep_last, milestone_every
        self.asynchronous = asynchronous
        self._writer: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self.stall_seconds: list[float] = []  # time the training thread spent in each on_checkpoint

    def save(self, directory: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainState,
             sampler_state: dict, rng: dict | None = None) -> Path:
        """Write a complete checkpoint at ``directory`` atomically (an existing one is replaced) and return its
        path. ``model`` (or the module it wraps) must carry its ``ModelConfig`` as ``.cfg``. ``rng``: generator
        states to record (default: taken now). Sharded: call it after the first optimiser step (taking the state
        of an optimiser that never stepped initialises its moments with a step).

        Raises:
            CheckpointError: the model has no ``cfg`` or ``extra``/``sampler_state`` is not JSON serialisable.
        """
        if self.sharded:
            return _save_sharded(directory, model=model, optimizer=optimizer, state=state,
                                 sampler_state=sampler_state, extra=self.extra, accelerator=self.accelerator)
        return _save_single(directory, model=model, optimizer=optimizer, state=state, sampler_state=sampler_state,
                            extra=self.extra, rng=rng, companions=self._companion_tensors())

    def _companion_tensors(self, snapshot: bool = False) -> dict[str, dict]:
        """Each companion's tensors now (``snapshot``: copied to CPU memory, for a background write)."""
        out = {}
        for name, companion in self.companions.items():
            tensors = companion.state_dict()
            out[name] = {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()} if snapshot else tensors
        return out

    def save_final(self, directory: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainState,
                   sampler_state: dict) -> Path | None:
        """The single-file layout at ``directory`` whatever the world size, for artifacts that leave the run.

        Several processes: collective; full weights and optimiser state are gathered to rank 0 on CPU and written
        there (optimiser state keyed by parameter name, ``extra`` gains ``world_size``). Returns the path on the
        main process, None elsewhere.
        """
        if not self.sharded:
            return _save_single(directory, model=model, optimizer=optimizer, state=state,
                                sampler_state=sampler_state, extra=self.extra, companions=self._companion_tensors())
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        from tasks.train.parallel import unwrap

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
        path = None
        if self.main_process:
            plain = Decoder(unwrap(model).cfg)
            plain.load_state_dict(model_sd)
            path = _save_single(directory, model=plain, optimizer=_FrozenOptimizer(optim_sd), state=state,
                                sampler_state=sampler_state,
                                extra={**self.extra, "world_size": self.accelerator.num_processes})
        _barrier(self.accelerator)
        return path

    def load(self, directory: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
             restore_rng: bool = True) -> dict[str, Any]:
        """Verify and load the checkpoint at ``directory`` into ``model`` (and ``optimizer``; required for a sharded
        one), wrapped for this world size; restores the global RNG states by default.

        Returns:
            {"state": TrainState, "sampler_state": dict, "extra": dict, "model_config": ModelConfig, "rng": dict},
            plus "world_size" (of the run that wrote it) for a sharded checkpoint.

        Raises:
            CheckpointError: missing/corrupt files, a saved model config different from the model's, a single-file
                checkpoint on several processes, or an ``optimizer.pt`` holding anything but tensors and plain data
                (never unpickled).
        """
        if self.sharded or _format(directory) == "sharded":
            return _load_sharded(directory, model=model, optimizer=optimizer, accelerator=self.accelerator or _one(),
                                 restore_rng=restore_rng)
        return _load_single(directory, model=model, optimizer=optimizer, restore_rng=restore_rng,
                            companions=self.companions)

    def latest(self) -> Path | None:
        """The complete checkpoint under ``root`` with the highest step, or None."""
        return latest_checkpoint(self.root)

    def resume(self, model: nn.Module, optimizer: torch.optim.Optimizer, sampler: Any) -> dict[str, Any] | None:
        """Load the newest usable ``root/step_*`` checkpoint into ``model``, ``optimizer`` and ``sampler`` (RNG
        restored); a torn or corrupt one is skipped with a logged warning in favour of the one before. Returns
        ``load``'s dict plus "directory", or None when there is none."""
        for candidate in sorted(self.root.glob("step_*"), reverse=True):
            try:
                saved = self.load(candidate, model=model, optimizer=optimizer)
            except CheckpointError as err:
                if self.main_process:  # logged, not printed: the pipeline logs prints at INFO, below what it shows
                    log.warning("skipping unusable checkpoint %s: %s", candidate.name, err)
                continue
            sampler.load_state_dict(saved["sampler_state"])
            return {**saved, "directory": candidate}
        return None

    def rewind(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> TrainState | None:
        """Reload the newest complete checkpoint's weights, optimiser and RNG; returns its TrainState (None when
        there is none). The loader is left where it is, so the data since that checkpoint is skipped."""
        self.wait()
        latest = self.latest()
        return None if latest is None else self.load(latest, model=model, optimizer=optimizer)["state"]

    def on_checkpoint(self, state: TrainState, model: nn.Module, optimizer: torch.optim.Optimizer, sampler: Any) -> None:
        started = time.perf_counter()
        directory = self.root / f"step_{state.step:08d}"
        if self.sharded:
            if state.step == 0:
                # Nothing a fresh start lacks; and taking the sharded state of an untouched optimiser would
                # initialise it with a zero step, shifting Adam's bias correction by one.
                return
            self.save(directory, model=model, optimizer=optimizer, state=state, sampler_state=sampler.state_dict())
            if self.keep_last is not None and self.main_process:
                self._prune()
            _barrier(self.accelerator)
        elif not self.asynchronous:
            self._write(directory, model, optimizer, state, sampler.state_dict(), None, self._companion_tensors())
        else:
            self.wait()  # one write in flight at a time, so the snapshot buffers are free to reuse
            # Snapshot on the CPU now (weights, optimiser moments, loop state, RNG); write in the background. The
            # buffers are allocated at the first save and overwritten in place after: a memcpy, no page faults.
            snapshot_model, snapshot_optimizer = self._snapshot(model, optimizer)
            args = (directory, snapshot_model, snapshot_optimizer, copy.copy(state), copy.deepcopy(sampler.state_dict()),
                    rng_states(), self._companion_tensors(snapshot=True))
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
               rng: dict | None, companions: dict[str, dict] | None = None) -> None:
        _save_single(directory, model=model, optimizer=optimizer, state=state, sampler_state=sampler_state,
                     extra=self.extra, rng=rng, companions=companions)
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


def _format(directory: Path) -> str:
    """"sharded" or "single" from state.json; "single" when it cannot be read (the loader then names the fault)."""
    try:
        return json.loads((Path(directory) / "state.json").read_text()).get("format", "single")
    except (OSError, ValueError):
        return "single"


def _one() -> Any:
    """A stand-in for a one-process accelerator (rank 0 of 1) when a Checkpointer was made without one."""
    from types import SimpleNamespace

    return SimpleNamespace(is_main_process=True, num_processes=1)
