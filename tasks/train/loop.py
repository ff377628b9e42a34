"""The training loop: evaluate → checkpoint → stop? → one step → log (STYLE §4).

Everything optional (held-out evaluation, checkpoints, trackers, pruning) is a callback. Per step the loop
logs loss_nats (token-summed cross-entropy / target tokens), lr, grad_norm_preclip, clipped, clip_fraction,
tokens_seen, tokens_per_s and loss_nats/<source> (SPEC §6, §9 monitoring).

Run a tiny model on random tokens::

    python -c "from tasks.train.loop import demo; demo()"
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn

from infra.errors import DataError
from tasks.train.config import OptimConfig
from tasks.train.data import IGNORE_INDEX
from tasks.train.optim import build_optimizer
from tasks.train.schedule import lr_at


@dataclass
class TrainState:
    """Loop position, saved in every checkpoint: optimiser steps done, tokens consumed, clipped steps."""

    step: int = 0
    tokens_seen: int = 0
    clipped_steps: int = 0

    @property
    def clip_fraction(self) -> float:
        """Share of steps so far whose pre-clip gradient norm exceeded grad_clip."""
        return self.clipped_steps / self.step if self.step else 0.0


class Callback(Protocol):
    """Hooks into ``train``; every method is optional (a missing one is skipped) and may raise to stop the run."""

    def on_step_end(self, state: TrainState, metrics: dict) -> None:
        """After each optimiser step, with that step's metrics."""

    def on_eval(self, state: TrainState, model: nn.Module) -> None:
        """At step 0, every ``eval_every`` steps and at the end (model in train mode; restore it if changed)."""

    def on_checkpoint(self, state: TrainState, model: nn.Module, optimizer: torch.optim.Optimizer,
                      sampler: Any) -> None:
        """Every ``checkpoint_every`` steps and at the end."""


@dataclass
class TrainResult:
    """Final loop state, per-step metrics (one dict per step run here) and the optimiser (for a later resume)."""

    state: TrainState
    metrics: list[dict] = field(default_factory=list)
    optimizer: torch.optim.Optimizer | None = None


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _fire(callbacks: Sequence[Any], hook: str, *args: Any) -> None:
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if method is not None:
            method(*args)


def _due(step: int, every: int, start: int, total: int) -> bool:
    """Evaluate/checkpoint at multiples of ``every`` and at the end, never twice at a resumed start step."""
    if step == start and start > 0:
        return False
    return step == total or (every > 0 and step % every == 0)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple, *, lr: float, grad_clip: float,
               accelerator: Accelerator, step: int) -> dict:
    """Optimiser step number ``step`` on a :class:`~tasks.train.data.Batch`; returns loss_nats, per-source loss,
    grad_norm_preclip, clipped and n_targets.

    loss = Σ token cross-entropy / number of real target tokens (nats per predicted token; padding targets,
    ``IGNORE_INDEX``, count in neither sum), computed in fp32. With ``batch.doc_ids`` the model masks attention
    across documents.

    Raises:
        DataError: the loss is not finite; raised before backward, so weights and moments stay untouched.
    """
    x, y, sources, doc_ids = batch
    x, y = x.to(accelerator.device), y.to(accelerator.device)
    for group in optimizer.param_groups:
        group["lr"] = lr
    with accelerator.autocast():
        logits = model(x) if doc_ids is None else model(x, doc_ids.to(accelerator.device))  # (B, T, V)
    token_nats = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none",
                                 ignore_index=IGNORE_INDEX).view_as(y)  # (B, T), 0 at ignored targets
    real = (y != IGNORE_INDEX)  # (B, T)
    n_targets = int(real.sum())
    loss = token_nats.sum() / max(n_targets, 1)
    if not torch.isfinite(loss):
        raise DataError(f"non-finite loss {float(loss.detach())} at step {step}; "
                        "rewind to the last checkpoint and skip this batch (SPEC §6)")
    accelerator.backward(loss)
    grad_norm = float(accelerator.clip_grad_norm_(model.parameters(), grad_clip))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    row_nats, row_targets = token_nats.detach().sum(dim=1).cpu(), real.sum(dim=1).cpu()  # (B,), (B,)
    per_source = {}
    for source in sorted(set(sources)):
        rows = [i for i, s in enumerate(sources) if s == source]
        per_source[f"loss_nats/{source}"] = float(row_nats[rows].sum()) / max(int(row_targets[rows].sum()), 1)
    return {"loss_nats": float(loss.detach()), "grad_norm_preclip": grad_norm, "clipped": int(grad_norm > grad_clip),
            "n_targets": n_targets, **per_source}


def train(model: nn.Module, sampler: Any, optim_cfg: OptimConfig, *, total_steps: int, eval_every: int = 0,
          callbacks: Sequence[Any] = (), state: TrainState | None = None, optimizer: torch.optim.Optimizer | None = None,
          accelerator: Accelerator | None = None, seed: int = 0, checkpoint_every: int = 0) -> TrainResult:
    """Train ``model`` on ``sampler.next_batch()`` until ``total_steps`` optimiser steps (warmup-cosine LR, SPEC §6).

    A fresh run (``state`` None) seeds python/numpy/torch with ``seed``; a resumed run passes the restored
    ``state`` and ``optimizer`` (RNG and sampler already restored from the checkpoint). Without an
    ``accelerator`` one is made: CPU when no GPU is visible, else bf16 autocast on the GPU.

    Raises:
        DataError: the loss is not finite at some step (the message names the step).
        Whatever a callback raises (e.g. ``optuna.TrialPruned``) propagates unchanged.
    """
    if state is None:
        state = TrainState()
        seed_everything(seed)
    if accelerator is None:
        cuda = torch.cuda.is_available()
        accelerator = Accelerator(cpu=not cuda, mixed_precision="bf16" if cuda else "no")
    model.to(accelerator.device).train()
    optimizer = build_optimizer(model, optim_cfg) if optimizer is None else optimizer
    result, start = TrainResult(state=state, optimizer=optimizer), state.step
    while True:
        if _due(state.step, eval_every, start, total_steps):
            _fire(callbacks, "on_eval", state, model)
        if _due(state.step, checkpoint_every, start, total_steps):
            _fire(callbacks, "on_checkpoint", state, model, optimizer, sampler)
        if state.step >= total_steps:
            return result
        lr = lr_at(state.step + 1, peak_lr=optim_cfg.peak_lr, warmup_steps=optim_cfg.warmup_steps,
                   total_steps=total_steps, min_lr_ratio=optim_cfg.min_lr_ratio)
        t0, batch = time.perf_counter(), sampler.next_batch()
        metrics = train_step(model, optimizer, batch, lr=lr, grad_clip=optim_cfg.grad_clip, accelerator=accelerator,
                             step=state.step + 1)
        n_tokens = metrics.pop("n_targets")
        state.step, state.tokens_seen = state.step + 1, state.tokens_seen + n_tokens
        state.clipped_steps += metrics["clipped"]
        metrics.update(step=state.step, lr=lr, clip_fraction=state.clip_fraction, tokens_seen=state.tokens_seen,
                       tokens_per_s=n_tokens / (time.perf_counter() - t0))
        result.metrics.append(metrics)
        _fire(callbacks, "on_step_end", state, metrics)


def demo(steps: int = 20) -> TrainResult:
    """Train a 2-layer model on random tokens for ``steps`` steps and print loss and throughput."""
    from models.config import ModelConfig
    from models.decoder import Decoder
    from tasks.train.data import MixtureSampler

    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=4, d_ff=176, vocab_size=4096, seq_len=128)
    torch.manual_seed(0)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, 200_000).astype(np.uint16)
    sampler = MixtureSampler({"random": tokens}, {"random": 1.0}, seq_len=cfg.seq_len, batch_size=16, seed=0)
    result = train(Decoder(cfg), sampler, OptimConfig(peak_lr=3e-3, warmup_steps=5), total_steps=steps)
    last = result.metrics[-1]
    print(f"step {last['step']}: loss {last['loss_nats']:.4f} nats, {last['tokens_per_s']:,.0f} tokens/s")
    return result
