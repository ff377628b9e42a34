"""Optimiser section of a training run: AdamW and the warmup-cosine schedule (docs/methods.md §6)."""

from __future__ import annotations

import math

from pydantic import model_validator

from infra.errors import ConfigError
from infra.section import Section


class OptimConfig(Section):
    """AdamW with decoupled weight decay on weight matrices, warmup-cosine LR, global-norm clipping (docs/methods.md §6).

    Fields:
        peak_lr: LR reached at the end of warmup, > 0.
        beta1, beta2: Adam moment decay rates, in [0, 1) (docs/methods.md §6: 0.9, 0.95).
        eps: Adam ε, > 0 (1e-8).
        weight_decay: λ on 2-D weights only, ≥ 0 (0.1); decay timescale 1/(η·λ) steps.
        warmup_steps: linear warmup length in optimiser steps, ≥ 0.
        min_lr_ratio: cosine floor as a fraction of peak_lr, in [0, 1] (0.1).
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
        return self
