"""The training loop: evaluate → checkpoint → stop? → one step → log, in that fixed order.

Everything optional (held-out evaluation, checkpoints, trackers, pruning) is a callback. Per step the loop
logs loss_nats (token-summed cross-entropy / target tokens), lr, grad_norm_preclip, clipped, clip_fraction,
tokens_seen, tokens_per_s and loss_nats/<source> (docs/methods.md §6, §9 monitoring).

Run a tiny model on random tokens::

    python -c "from tasks.train.loop import demo; demo()"
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn

from infra.errors import DataError
from tasks.train.config import OptimConfig
from models.arithmetic import flops_per_token
from tasks.train.data import IGNORE_INDEX
from tasks.train.instruments import device_peak_flops, peak_memory_mb
from tasks.train.optim import build_optimizer
from tasks.train.parallel import (all_finite, all_sum, clip_grad_norm, global_norm, gradient_sync, is_sharded,
                                  rank_rows, unwrap)
from tasks.train.schedule import lr_schedule


@dataclass
class TrainState:
    """Loop position, saved in every checkpoint: optimiser steps done, tokens consumed, clipped steps, and the last
    step's training loss (nats/token; None before the first step), so a run resumed at its last step reports it."""

    step: int = 0
    tokens_seen: int = 0
    clipped_steps: int = 0
    loss_nats: float | None = None

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
    events: list[dict] = field(default_factory=list)


def seed_everything(seed: int, threads: int | None = None) -> None:
    """Seed python, numpy and torch (CPU and CUDA) generators; ``threads``: also set torch's intra-op CPU threads."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if threads:
        torch.set_num_threads(threads)


def local_accelerator() -> Accelerator:
    """A one-process ``Accelerator``: the GPU with bf16 autocast when one is visible, else the CPU in fp32.

    On the CPU accelerate changes no numerics: mixed precision "no" makes ``autocast()`` a no-op, there is no grad
    scaler, and ``backward`` is ``loss.backward()`` on loss / 1 (one accumulation step).
    """
    cuda = torch.cuda.is_available()
    return Accelerator(cpu=not cuda, mixed_precision="bf16" if cuda else "no")


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


@dataclass
class SpikeRule:
    """Loss-spike detector (docs/methods.md §6, after PaLM): a step's loss is a spike when it is not finite, or when at least
    ``min_history`` earlier losses exist and it exceeds ``factor`` × the median of the last ``window`` of them.

    ``policy`` says what the loop does with a spike: ``warn`` (record it and take the step; a non-finite loss is
    never applied, so it is skipped), ``skip`` (drop the step's update, keep going on the next batch) or ``rewind``
    (reload the last good checkpoint through the loop's ``rewind`` hook, keep the loader where it is so the
    offending data window is skipped, multiply the LR by ``lr_factor``, continue). Without a checkpoint to go back
    to, a rewind degrades to a skip (recorded as such).
    """

    window: int = 50
    factor: float = 2.0
    min_history: int = 10
    policy: str = "rewind"
    lr_factor: float = 1.0
    max_consecutive: int = 5  # this many events in a row means the weights themselves are broken: stop

    def __post_init__(self) -> None:
        if self.policy not in ("warn", "skip", "rewind"):
            raise ValueError(f"spike policy {self.policy!r}: use warn, skip or rewind")
        if not (isinstance(self.window, int) and 1 <= self.min_history <= self.window):
            raise ValueError(f"spike rule needs 1 <= min_history ({self.min_history}) <= window ({self.window}); "
                             "otherwise no loss could ever count as a spike")
        if not (self.factor > 1 and 0 < self.lr_factor <= 1 and self.max_consecutive >= 1):
            raise ValueError(f"spike rule needs factor > 1, 0 < lr_factor <= 1, max_consecutive >= 1; got "
                             f"{self.factor}, {self.lr_factor}, {self.max_consecutive}")

    def check(self, history: Sequence[float], loss: float) -> tuple[bool, float]:
        """(is_spike, median of the window) for ``loss`` given earlier losses (oldest first)."""
        recent = list(history)[-self.window:]
        median = float(np.median(recent)) if recent else float("nan")
        if not np.isfinite(loss):
            return True, median
        return len(recent) >= self.min_history and loss > self.factor * median, median


@dataclass
class Decision:
    """What the loop does with one step's gradients: ``apply`` them, ``skip`` the update, or ``rewind`` (weights,
    optimiser and loop ``state`` already reloaded from the last good checkpoint). ``event``: the record of a spike or
    skipped batch (None for an ordinary step). ``error``: raised by the loop once the event is reported."""

    action: str
    event: dict | None = None
    state: TrainState | None = None
    error: DataError | None = None


class SpikePolicy:
    """The loop's spike policy for one run: asked once per step, answers ``apply | skip | rewind``.

    Rule (``SpikeRule``): a step is a spike when its loss is not finite, or exceeds ``factor`` × the median of the
    previous ``window`` losses (after ``min_history`` of them); on a spike the run skips the batch or rewinds to
    the last checkpoint and moves past the offending data (PaLM, Chowdhery et al. 2022, §5.1; docs/methods.md §6).

    State: the window of applied losses (oldest first), the LR scale (× ``lr_factor`` per rewind), the rewinds
    taken and the count of events in a row. ``rule`` None: no detection, but a non-finite loss raises.
    ``rewind()`` reloads the last good checkpoint into the model/optimiser and returns its TrainState (None when
    there is none: the rewind degrades to a skip).
    """

    def __init__(self, rule: SpikeRule | None, rewind: Callable[[], TrainState | None] | None = None):
        self.rule, self._rewind = rule, rewind
        # Only the last ``window`` losses matter; a bounded deque keeps each check O(window) for any run length.
        self.history: deque[float] = deque(maxlen=rule.window if rule is not None else 1)
        self.lr_scale, self.rewinds, self.consecutive = 1.0, 0, 0

    def decide(self, step: int, metrics: dict, batches_drawn: int = -1) -> Decision:
        """The decision for optimiser step ``step`` (1-based) from ``forward_backward``'s ``metrics`` (loss_nats in
        nats/target token, finite, n_targets); ``batches_drawn``: the loader position, for the event record.

        Raises:
            DataError: the loss is not finite and there is no rule (the message names the step).
        """
        loss = metrics["loss_nats"]
        event = {"step": step, "batches_drawn": batches_drawn, "loss_nats": loss, "median": float("nan")}
        if metrics["n_targets"] == 0:  # all padding: nothing to learn from, and a 0.0 loss would poison the median
            return Decision("skip", {**event, "loss_nats": float("nan"), "action": "skip (no real targets)"})
        rule = self.rule
        if rule is None:
            if not metrics["finite"]:
                raise DataError(f"non-finite loss at step {step}; rewind to the last checkpoint and skip this "
                                "batch (docs/methods.md §6), or set a spike policy")
            self.history.append(loss)
            return Decision("apply")
        is_spike, median = rule.check(self.history, loss)
        if not is_spike:
            self.consecutive = 0
            self.history.append(loss)
            return Decision("apply")
        action = rule.policy if metrics["finite"] or rule.policy != "warn" else "skip"
        event.update(median=median, action=action)
        restored = None
        if action == "rewind":
            restored = self._rewind() if self._rewind is not None else None
            if restored is None:
                action, event["action"] = "skip", "skip (no checkpoint to rewind to)"
            else:
                event["rewound_to"] = restored.step
                self.lr_scale *= rule.lr_factor
                self.rewinds += 1
                self.history.clear()
        self.consecutive += 1  # a run of warned spikes counts towards the stop too
        error = None
        if self.consecutive >= rule.max_consecutive:
            error = DataError(f"{self.consecutive} loss spikes or non-finite losses in a row up to step {step} "
                              f"(last loss {loss}, median {median:.4g}): the weights or the data are broken beyond "
                              "what skipping or rewinding fixes")
        if action == "warn":
            self.history.append(loss)
            action = "apply"
        return Decision(action, event, restored, error)


def forward_backward(model: nn.Module, batch: tuple, *, accelerator: Accelerator, micro_batches: int = 1,
                     z_loss: float = 0.0) -> dict:
    """Forward and backward over one optimiser step's *global* batch: this rank's contiguous slice of rows
    (``parallel.rank_rows``), in ``micro_batches`` equal slices.

    Normalisation: every micro-batch's summed token cross-entropy is divided by the number of real target tokens
    of the whole step, counted over all micro-batches and all ranks (ignored padding targets count in neither sum),
    so the gradient equals that of the full batch in one pass whatever the split (not a mean of per-micro-batch
    means, which overweights short micro-batches). z-loss (docs/methods.md §6): ``z_loss`` · mean over real tokens of
    (log Z)², log Z = logsumexp of the logits, in fp32, added to the objective and reported separately.

    Returns global figures (summed over ranks): loss_nats, z_loss, mean_log_z, per-source loss_nats/<source>,
    n_targets and ``finite``. When any rank's micro-batch loss is not finite, every rank stops back-propagating
    (so no collective is left waiting) and ``finite`` is False: the caller must discard the gradients.

    Raises:
        DataError: the batch's rows do not split into world size × ``micro_batches`` equal slices.
    """
    x, y, sources, doc_ids = batch
    rows = rank_rows(x.shape[0], accelerator, micro_batches)
    n_global = int((y != IGNORE_INDEX).sum())  # every rank holds the global batch: no collective needed
    x, y, sources = x[rows], y[rows], list(sources)[rows]
    doc_ids = None if doc_ids is None else doc_ids[rows]
    local_rows = x.shape[0]
    real = (y != IGNORE_INDEX)
    # DDP and FSDP average gradients over ranks; multiplying by the world size turns that average into the sum.
    scale = accelerator.num_processes / max(n_global, 1)
    size = local_rows // micro_batches
    sum_nats, sum_z, sum_log_z = 0.0, 0.0, 0.0
    row_nats = torch.zeros(local_rows, dtype=torch.float64)
    finite = True
    for lo in range(0, local_rows, size):
        xs, ys = x[lo:lo + size].to(accelerator.device), y[lo:lo + size].to(accelerator.device)
        ds = None if doc_ids is None else doc_ids[lo:lo + size].to(accelerator.device)
        with gradient_sync(model, enabled=lo + size >= local_rows):
            with accelerator.autocast():
                logits = model(xs) if ds is None else model(xs, ds)  # (b, T, V)
            logits = logits.float()
            nats = F.cross_entropy(logits.flatten(0, 1), ys.flatten(), reduction="none",
                                   ignore_index=IGNORE_INDEX).view_as(ys)  # (b, T), 0 at ignored targets
            mask = (ys != IGNORE_INDEX).float()
            log_z = torch.logsumexp(logits, dim=-1)  # (b, T)
            z_term = (log_z.square() * mask).sum()
            objective = (nats.sum() + z_loss * z_term) * scale
            if not all_finite(bool(torch.isfinite(objective)), accelerator):
                finite = False
                break
            accelerator.backward(objective)
        sum_nats += float(nats.detach().sum())
        sum_z += float(z_term.detach())
        sum_log_z += float((log_z.detach() * mask).sum())
        row_nats[lo:lo + size] = nats.detach().sum(dim=1).double().cpu()
    # Per-source sums over the sources of the global batch, in one collective with the step's totals.
    names = sorted(set(batch[2]))
    row_targets = real.sum(dim=1)
    per_nats = [float(row_nats[[i for i, s in enumerate(sources) if s == name]].sum()) for name in names]
    per_targets = [int(row_targets[[i for i, s in enumerate(sources) if s == name]].sum()) for name in names]
    totals = all_sum([sum_nats, sum_z, sum_log_z, *per_nats, *per_targets], accelerator)
    sum_nats, sum_z, sum_log_z = totals[:3]
    per_source = {}
    if finite:
        for i, name in enumerate(names):
            per_source[f"loss_nats/{name}"] = totals[3 + i] / max(totals[3 + len(names) + i], 1)
    n = max(n_global, 1)
    return {"loss_nats": sum_nats / n if finite else float("nan"), "z_loss": z_loss * sum_z / n,
            "mean_log_z": sum_log_z / n, "n_targets": n_global, "finite": finite, **per_source}


def apply_update(model: nn.Module, optimizer: torch.optim.Optimizer, *, lr: float, grad_clip: float,
                 accelerator: Accelerator, measure_update: bool = False) -> dict:
    """Clip the global gradient norm at ``grad_clip`` and take the AdamW step at ``lr``; returns grad_norm_preclip,
    clipped and (when ``measure_update``) update_weight_ratio = ‖Δθ‖ / ‖θ‖ over all parameters (global norms,
    also under FSDP sharding)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    grad_norm = clip_grad_norm(model, grad_clip)
    sharded = is_sharded(model) if measure_update else False
    before = [p.detach().clone() for p in model.parameters()] if measure_update else None
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    out = {"grad_norm_preclip": grad_norm, "clipped": int(grad_norm > grad_clip)}
    if before is not None:
        with torch.no_grad():
            delta = global_norm([p.detach() - b for p, b in zip(model.parameters(), before)], accelerator, sharded)
            weight = global_norm(before, accelerator, sharded)
        out["update_weight_ratio"] = delta / max(weight, 1e-12)
    return out


def train(model: nn.Module, sampler: Any, optim_cfg: OptimConfig, *, total_steps: int, eval_every: int = 0,
          callbacks: Sequence[Any] = (), state: TrainState | None = None, optimizer: torch.optim.Optimizer | None = None,
          accelerator: Accelerator | None = None, seed: int = 0, checkpoint_every: Any = 0,
          spike: SpikeRule | None = None, rewind: Any = None, instrument_every: int = 0) -> TrainResult:
    """Train ``model`` on ``sampler.next_batch()`` until ``total_steps`` optimiser steps (LR schedule
    ``optim_cfg.schedule``: warmup-cosine or WSD over ``total_steps``, docs/methods.md §6).

    A fresh run (``state`` None) seeds python/numpy/torch with ``seed``; a resumed run passes the restored
    ``state`` and ``optimizer`` (RNG and sampler already restored from the checkpoint). Without an
    ``accelerator``, ``local_accelerator()`` is used.

    ``spike``: detect loss spikes and non-finite losses and apply its policy (``SpikePolicy``); every event goes
    to callbacks' ``on_event(state, event)`` and ``TrainResult.events``. ``rewind()``: reloads the last good
    checkpoint into ``model``/``optimizer`` and returns its TrainState (None when there is none).
    ``instrument_every``: every N steps also measure the update/weight norm ratio and the max |attention logit|
    (a probe; the output is unchanged). ``checkpoint_every``: callbacks' ``on_checkpoint`` every N steps and at the
    end (0 = end only), or a schedule with ``due(step, start, total)`` and a ``saving(step)`` context around each
    save (``tasks.train.intervals.YoungInterval``).

    Raises:
        DataError: the loss is not finite and no spike rule is given (the message names the step).
        Whatever a callback raises (e.g. ``optuna.TrialPruned``) propagates unchanged.
    """
    if state is None:
        state = TrainState()
        seed_everything(seed)
    accelerator = local_accelerator() if accelerator is None else accelerator
    if accelerator.num_processes == 1:
        model.to(accelerator.device)
    model.train()
    optimizer = build_optimizer(model, optim_cfg) if optimizer is None else optimizer
    result, start, spikes = TrainResult(state=state, optimizer=optimizer), state.step, SpikePolicy(spike, rewind)
    utilisation = _Utilisation(model, accelerator) if instrument_every > 0 else None
    while True:
        if _due(state.step, eval_every, start, total_steps):
            _fire(callbacks, "on_eval", state, model)
        if isinstance(checkpoint_every, int):
            if _due(state.step, checkpoint_every, start, total_steps):
                _fire(callbacks, "on_checkpoint", state, model, optimizer, sampler)
        elif checkpoint_every.due(state.step, start, total_steps):  # a schedule, e.g. intervals.YoungInterval
            with checkpoint_every.saving(state.step):
                _fire(callbacks, "on_checkpoint", state, model, optimizer, sampler)
        if state.step >= total_steps:
            return result
        lr = spikes.lr_scale * lr_schedule(
            state.step + 1, schedule=optim_cfg.schedule, peak_lr=optim_cfg.peak_lr,
            warmup_steps=optim_cfg.warmup_steps, total_steps=total_steps, min_lr_ratio=optim_cfg.min_lr_ratio,
            decay_fraction=optim_cfg.decay_fraction, decay_shape=optim_cfg.decay_shape,
            decay_steps=optim_cfg.decay_steps)
        instrument = instrument_every > 0 and (state.step + 1) % instrument_every == 0
        t0, batch = time.perf_counter(), sampler.next_batch()
        with attention_probe(model, instrument) as probe:
            metrics = forward_backward(model, batch, accelerator=accelerator, micro_batches=optim_cfg.micro_batches,
                                       z_loss=optim_cfg.z_loss)
        decision = spikes.decide(state.step + 1, metrics, int(getattr(sampler, "batches_drawn", -1)))
        if decision.state is not None:
            result.state = state = decision.state
        if decision.event is not None:
            result.events.append(decision.event)
            _fire(callbacks, "on_event", state, decision.event)
        if decision.error is not None:
            raise decision.error
        if decision.action != "apply":
            optimizer.zero_grad(set_to_none=True)
            continue
        update = apply_update(model, optimizer, lr=lr, grad_clip=optim_cfg.grad_clip, accelerator=accelerator,
                              measure_update=instrument)
        _advance(state, metrics, update, lr=lr, seconds=time.perf_counter() - t0)
        if probe.max_logit is not None:
            metrics.update(max_attention_logit=probe.max_logit, **utilisation.measure(metrics["tokens_per_s"]))
        result.metrics.append(metrics)
        _fire(callbacks, "on_step_end", state, metrics)


def _advance(state: TrainState, metrics: dict, update: dict, *, lr: float, seconds: float) -> None:
    """Count the applied step into ``state`` and turn ``metrics`` into the step's log record (in place)."""
    n_tokens = metrics.pop("n_targets")
    metrics.pop("finite")
    state.step, state.tokens_seen = state.step + 1, state.tokens_seen + n_tokens
    state.clipped_steps += update["clipped"]
    state.loss_nats = float(metrics["loss_nats"])
    metrics.update(update, step=state.step, lr=lr, clip_fraction=state.clip_fraction,
                   tokens_seen=state.tokens_seen, tokens_per_s=n_tokens / seconds)


class _Utilisation:
    """Peak memory and model-FLOPs utilisation of a step, against the device's bf16 peak (MFU) or a measured
    matmul rate (CPU proxy), measured once per run."""

    def __init__(self, model: nn.Module, accelerator: Accelerator):
        self.device = accelerator.device
        self.reference = device_peak_flops(self.device)
        core = unwrap(model)
        self.flops_per_token = flops_per_token(core.cfg) if hasattr(core, "cfg") else None

    def measure(self, tokens_per_s: float) -> dict:
        out = {"peak_memory_mb": peak_memory_mb(self.device)}
        if self.reference is not None and self.flops_per_token is not None:
            peak, kind = self.reference
            out[kind] = self.flops_per_token * tokens_per_s / peak
        return out


class _Probe:
    max_logit: float | None = None


@contextmanager
def attention_probe(model: nn.Module, enabled: bool):
    """While enabled, every attention layer also computes max |q·k|/√d_h of its forward; yields an object whose
    ``max_logit`` holds the maximum over layers afterwards (None when disabled). Outputs are unchanged."""
    probe = _Probe()
    layers = [m for m in model.modules() if hasattr(m, "probe_logits")]
    if not enabled or not layers:
        yield probe
        return
    for layer in layers:
        layer.probe_logits, layer.max_logit = True, 0.0
    try:
        yield probe
    finally:
        for layer in layers:
            layer.probe_logits = False
        probe.max_logit = max(float(layer.max_logit) for layer in layers)


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
