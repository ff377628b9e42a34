"""Optimiser section of a training run: AdamW and its LR schedule, warmup-cosine or WSD (docs/methods.md §6)."""

from __future__ import annotations

import math

from pydantic import model_validator

from infra.errors import ConfigError
from infra.section import Section
from tasks.train.schedule import DECAY_SHAPES, SCHEDULES


class OptimConfig(Section):
    """AdamW with decoupled weight decay on weight matrices, warmup-cosine or WSD LR, global-norm clipping
    (docs/methods.md §6).

    Fields:
        peak_lr: LR reached at the end of warmup, > 0.
        beta1, beta2: Adam moment decay rates, in [0, 1) (docs/methods.md §6: 0.9, 0.95).
        eps: Adam ε, > 0 (1e-8).
        weight_decay: λ on 2-D weights only, ≥ 0 (0.1); decay timescale 1/(η·λ) steps.
        warmup_steps: linear warmup length in optimiser steps, ≥ 0.
        min_lr_ratio: the schedule's floor as a fraction of peak_lr, in [0, 1] (0.1).
        schedule: ``cosine`` (warmup-cosine) or ``wsd`` (warmup-stable-decay, ``tasks.train.schedule.wsd_lr``).
        decay_fraction: WSD: share of the run's steps spent decaying, in (0, 1] (0.2).
        decay_shape: WSD: ``linear``, ``cosine`` or ``1-sqrt`` (Hägele et al. 2024).
        decay_steps: WSD: decay length in steps, ≥ 0, instead of ``decay_fraction`` (a decay branch; 0 = no decay,
            the stable trunk); None: from ``decay_fraction``.
        grad_clip: global gradient-norm threshold, > 0 (1.0).
        z_loss: coefficient of the z-loss term mean((log Z)²), ≥ 0 (docs/methods.md §6 suggests 1e-4; 0 = off).
        micro_batches: gradient-accumulation slices per optimiser step, ≥ 1; the batch must divide evenly.

    Raises:
        ConfigError: naming the field and the valid range.
    """

    peak_lr: float
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    z_loss: float = 0.0
    micro_batches: int = 1
    schedule: str = "cosine"
    decay_fraction: float = 0.2
    decay_shape: str = "1-sqrt"
    decay_steps: int | None = None

    @model_validator(mode="after")
    def _check(self) -> "OptimConfig":
        if not (math.isfinite(self.peak_lr) and self.peak_lr > 0):
            raise ConfigError(f"optim.peak_lr = {self.peak_lr}: must be a finite number > 0")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"optim.{name} = {getattr(self, name)}: must be in [0, 1)")
        if not self.eps > 0:
            raise ConfigError(f"optim.eps = {self.eps}: must be > 0")
        if not self.weight_decay >= 0:
            raise ConfigError(f"optim.weight_decay = {self.weight_decay}: must be ≥ 0")
        if self.warmup_steps < 0:
            raise ConfigError(f"optim.warmup_steps = {self.warmup_steps}: must be ≥ 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"optim.min_lr_ratio = {self.min_lr_ratio}: must be in [0, 1]")
        if not self.grad_clip > 0:
            raise ConfigError(f"optim.grad_clip = {self.grad_clip}: must be > 0 (clipping at 1.0 is the default)")
        if not (math.isfinite(self.z_loss) and self.z_loss >= 0):
            raise ConfigError(f"optim.z_loss = {self.z_loss}: must be ≥ 0 (docs/methods.md §6: 1e-4)")
        if self.micro_batches < 1:
            raise ConfigError(f"optim.micro_batches = {self.micro_batches}: must be ≥ 1")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"optim.schedule = {self.schedule!r}: use one of {', '.join(SCHEDULES)}")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ConfigError(f"optim.decay_fraction = {self.decay_fraction}: must be in (0, 1]")
        if self.decay_shape not in DECAY_SHAPES:
            raise ConfigError(f"optim.decay_shape = {self.decay_shape!r}: use one of {', '.join(DECAY_SHAPES)}")
        if self.decay_steps is not None and self.decay_steps < 0:
            raise ConfigError(f"optim.decay_steps = {self.decay_steps}: must be ≥ 0 (0 = no decay)")
        return self
