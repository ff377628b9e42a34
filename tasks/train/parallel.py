"""Data and model parallelism of the training loop: which rows a rank trains on, how the model is wrapped, the
collectives the loop needs to report global figures, and how a launched worker process ends (``run_worker``).

Every rank draws the same *global* batch from the (identically seeded) loader and trains on its own contiguous
slice of rows, so the loader position is global: a checkpoint resumes on any world size whose product with
``micro_batches`` divides the batch, and two processes follow the one-process trajectory up to float reduction
order.

Strategies (``[main.distributed] strategy``):

* ``ddp``: replicated weights, gradients all-reduced (``torch.nn.parallel.DistributedDataParallel`` through
  accelerate).
* ``fsdp``: FSDP2 full shard (``torch.distributed.fsdp.fully_shard``), one unit per transformer ``Block`` plus the
  root (embeddings, final norm); parameters, gradients and optimiser moments live as DTensor shards
  (ZeRO-3, docs/methods.md §3). bf16 compute with fp32 master weights and fp32 gradient reduction on CUDA.
* ``hybrid``: FSDP2 over a 2-D mesh (replicate × shard): sharded within ``shard_size`` ranks (a node), replicated
  across groups (hybrid shard, docs/methods.md §4: the all-gathers stay on NVLink).

The engine applies FSDP itself rather than through accelerate's FSDP plugin: that plugin falls back to plain DDP
when no GPU is visible, so the sharded path could never be exercised off a GPU. Applied here, the same code shards
a model on two CPU processes (gloo) in the tests and on eight H100s (NCCL).
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterable, Iterator, NoReturn, Sequence

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch import nn

from infra.errors import ConfigError, DataError

STRATEGIES = ("ddp", "fsdp", "hybrid")


def world(accelerator: Accelerator) -> tuple[int, int]:
    """(rank, world size) of this process."""
    return accelerator.process_index, accelerator.num_processes


def rank_rows(rows: int, accelerator: Accelerator, micro_batches: int = 1) -> slice:
    """This rank's contiguous slice of a global batch of ``rows`` rows.

    Raises:
        DataError: ``rows`` is not a multiple of world size × ``micro_batches`` (the fix names both).
    """
    rank, size = world(accelerator)
    if rows < 1 or micro_batches < 1 or rows % (size * micro_batches):
        raise DataError(f"a batch of {rows} rows does not split over {size} process(es) × {micro_batches} "
                        f"micro-batch(es); make batch_size a multiple of {size * max(micro_batches, 1)}")
    per = rows // size
    return slice(rank * per, (rank + 1) * per)


def check_layout(batch_size: int, micro_batches: int, processes: int) -> None:
    """Refuse, before any training, a global batch that does not split over the processes and micro-batches.

    Raises:
        ConfigError: ``batch_size`` is not a multiple of ``processes · micro_batches``.
    """
    if batch_size % (processes * micro_batches):
        raise ConfigError(f"budget.batch_size = {batch_size} does not split over {processes} process(es) × "
                          f"{micro_batches} micro-batch(es); use a multiple of {processes * micro_batches} or change "
                          "the process count")


def parallelize(model: nn.Module, accelerator: Accelerator, strategy: str = "ddp", *, shard_size: int = 0,
                activation_checkpointing: bool = False) -> nn.Module:
    """Wrap ``model`` (a ``Decoder``, on CPU, freshly initialised identically on every rank) for ``strategy``.

    One process: returned unwrapped on the accelerator's device (only activation checkpointing applies).
    ``shard_size`` (hybrid only): ranks per shard group; 0 = the processes of one node (``LOCAL_WORLD_SIZE``).
    Build the optimiser *after* this call: under FSDP its parameters are the DTensor shards.

    Raises:
        ConfigError: unknown strategy; accelerate itself was configured for FSDP (the sharding is declared in the
            pipeline config, not in the launch config); a hybrid shard size that does not divide the world size.
    """
    if strategy not in STRATEGIES:
        raise ConfigError(f"distributed strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    if accelerator.distributed_type == DistributedType.FSDP:
        raise ConfigError("the accelerate config enables FSDP itself; use a MULTI_GPU launch config from "
                          "infra/accelerate/ and set [main.distributed] strategy = \"fsdp\" instead")
    if hasattr(model, "activation_checkpointing"):
        model.activation_checkpointing = activation_checkpointing
    _, size = world(accelerator)
    if size == 1:
        return model.to(accelerator.device)
    if strategy == "ddp":
        return accelerator.prepare_model(model.to(accelerator.device))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if strategy == "hybrid":
        shard = shard_size or int(os.environ.get("LOCAL_WORLD_SIZE", size))
        if shard < 1 or size % shard:
            raise ConfigError(f"hybrid shard size {shard} does not divide the world size {size}")
        mesh = init_device_mesh(accelerator.device.type, (size // shard, shard), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(accelerator.device.type, (size,), mesh_dim_names=("shard",))
    bf16 = accelerator.device.type == "cuda" and accelerator.mixed_precision == "bf16"
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32)
    model.to(accelerator.device)
    blocks = list(getattr(model, "blocks", []))
    for i, block in enumerate(blocks):
        # The last block is gathered again at once by the root's backward: keeping it unsharded saves one gather.
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=i < len(blocks) - 1)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under a DDP wrapper (FSDP2 shards in place, so nothing to unwrap there)."""
    return getattr(model, "module", model) if isinstance(model, nn.parallel.DistributedDataParallel) else model


def is_sharded(model: nn.Module) -> bool:
    """True when parameters are DTensor shards (FSDP2)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


@contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient reduction of a micro-batch that is not the step's last (accumulation): DDP ``no_sync``,
    FSDP2 ``set_requires_gradient_sync``; a plain module needs neither."""
    if enabled:
        yield
        return
    if isinstance(model, nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
        return
    setter = getattr(model, "set_requires_gradient_sync", None)
    if setter is None:
        with nullcontext():
            yield
        return
    setter(False)
    try:
        yield
    finally:
        setter(True)


def all_sum(values: Sequence[float], accelerator: Accelerator) -> list[float]:
    """Element-wise sum of ``values`` over ranks (float64; identity on one process)."""
    if accelerator.num_processes == 1:
        return [float(v) for v in values]
    tensor = torch.tensor(list(values), dtype=torch.float64, device=accelerator.device)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
    return tensor.tolist()


def all_finite(finite: bool, accelerator: Accelerator) -> bool:
    """True only when every rank's value is finite, so every rank takes the same branch (no collective hangs)."""
    if accelerator.num_processes == 1:
        return finite
    flag = torch.tensor([1.0 if finite else 0.0], device=accelerator.device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return bool(flag.item() > 0)


def _local_square_sum(t: torch.Tensor) -> torch.Tensor:
    """Σ t² of this rank's part, divided by the number of replicas holding that part (hybrid shard), so a sum
    over all ranks counts every element once."""
    if not hasattr(t, "to_local"):
        return t.float().square().sum()
    from torch.distributed.tensor import Replicate

    replicas = 1
    for dim, placement in enumerate(t.placements):
        if isinstance(placement, Replicate):
            replicas *= t.device_mesh.size(dim)
    return t.to_local().float().square().sum() / replicas


def global_norm(tensors: Iterable[torch.Tensor], accelerator: Accelerator, sharded: bool) -> float:
    """L2 norm over all ``tensors`` (fp32). Sharded (DTensor) tensors sum their local shards over ranks;
    replicated ones (one process, DDP) are complete on every rank."""
    local = sum((_local_square_sum(t) for t in tensors), torch.tensor(0.0, device=accelerator.device))
    total = all_sum([float(local)], accelerator)[0] if sharded else float(local)
    return total ** 0.5


def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    """Clip the global gradient norm at ``max_norm`` and return the pre-clip norm (DTensor-aware under FSDP2)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def exit_worker(code: int = 0) -> NoReturn:
    """End this launched worker process now with exit status ``code``, without interpreter finalisation.

    On ``code`` 0 the process groups are destroyed first (a failed rank leaves them: a peer may be stuck in a
    collective); if that fails, the status is 1. Logging handlers, stdout and stderr are flushed; atexit handlers
    do not run and Python threads still running are stopped with the process, so finish them first
    (``Checkpointer.wait``).

    Why not a plain return: gloo runs each collective on C++ worker threads that live as long as their process
    group, and torch keeps the groups referenced until the process ends (``destroy_process_group`` joins none of
    those threads). After the caller of a collective is woken, its worker thread still drops the collective's
    tensors, and that takes the GIL; if the main thread has begun interpreter finalisation meanwhile, CPython ends
    that thread inside a destructor and the process aborts (``terminate called without an active exception``,
    SIGABRT), failing a run that had finished. ``os._exit`` ends those threads with the process instead, as
    ``multiprocessing`` ends its child processes.
    """
    if code == 0 and torch.distributed.is_available() and torch.distributed.is_initialized():
        try:
            torch.distributed.destroy_process_group()
        except BaseException:  # the process ends either way; the status says it did not end cleanly
            traceback.print_exc()
            code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # closed or replaced stream: nothing left to flush
            pass
    os._exit(code)


def run_worker(entry: Callable[[], object]) -> NoReturn:
    """Run ``entry()`` as the whole life of a launched worker process, then leave through ``exit_worker``.

    Exit status: 0 when ``entry`` returns; a ``SystemExit``'s code (its message printed, status 1, when it is not
    an int); 1 after printing the traceback of any other exception.
    """
    try:
        entry()
        code = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # a worker's traceback is its only report to the launcher
        traceback.print_exc()
        code = 1
    exit_worker(code)
