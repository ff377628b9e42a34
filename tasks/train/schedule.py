"""Warmup-cosine learning-rate schedule (docs/methods.md §6).

Steps are counted from 1: the k-th optimiser update uses ``lr_at(k)``, so step ``warmup_steps`` is the
first at peak and step ``total_steps`` lands on the floor ``min_lr_ratio · peak_lr``.
"""

from __future__ import annotations

import math

from infra.errors import ConfigError


def lr_at(step: int, *, peak_lr: float, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.1) -> float:
    """Learning rate at optimiser step ``step`` (docs/methods.md §6 warmup-cosine).

    Linear warmup peak·step/warmup for step ≤ warmup, then
    floor + (peak − floor)·½(1 + cos(π·(step − warmup)/(total − warmup))), floor = min_lr_ratio·peak;
    steps past ``total_steps`` stay at the floor.

    Raises:
        ConfigError: total_steps < 1, warmup_steps < 0 or warmup_steps > total_steps.
    """
    if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
        raise ConfigError(
            f"schedule warmup_steps = {warmup_steps}, total_steps = {total_steps}: need 0 ≤ warmup ≤ total and total ≥ 1"
        )
    floor = min_lr_ratio * peak_lr
    if step < warmup_steps:
        return peak_lr * max(step, 0) / warmup_steps
    if step >= total_steps:
        return floor if total_steps > warmup_steps else peak_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return floor + (peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
