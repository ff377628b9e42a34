"""Learning-rate schedules: warmup-cosine and warmup-stable-decay (WSD) (docs/methods.md §6).

Steps are counted from 1: the k-th optimiser update uses ``lr_at(k)``, so step ``warmup_steps`` is the
first at peak and step ``total_steps`` lands on the floor ``min_lr_ratio · peak_lr``.

WSD (Hu et al. 2024, MiniCPM; Hägele et al. 2024) holds the peak after warmup and decays only over the last
``decay_steps`` steps, so the weights at a step of the stable phase do not depend on the run's length: a longer run,
or a short decay branch from any stable step, continues from the same state (``branch_lr``).
"""

from __future__ import annotations

import math

from infra.errors import ConfigError

SCHEDULES = ("cosine", "wsd")
DECAY_SHAPES = ("linear", "cosine", "1-sqrt")


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


def decay_steps_of(total_steps: int, decay_fraction: float) -> int:
    """WSD decay length K = max(1, ⌊f·S + ½⌋) steps for ``total_steps`` S and ``decay_fraction`` f
    (docs/methods.md §6).

    Raises:
        ConfigError: f outside (0, 1] or S < 1.
    """
    if not 0.0 < decay_fraction <= 1.0:
        raise ConfigError(f"decay_fraction = {decay_fraction}: must be in (0, 1] (the share of steps spent decaying)")
    if total_steps < 1:
        raise ConfigError(f"total_steps = {total_steps}: must be ≥ 1")
    return max(1, math.floor(decay_fraction * total_steps + 0.5))


def decay_start(total_steps: int, decay_fraction: float) -> int:
    """The last stable step D = S − K of a WSD run (``decay_steps_of``): steps ≤ D are warmup or peak, so the
    state after D steps is the same for every run length with the same warmup, peak and data order."""
    return total_steps - decay_steps_of(total_steps, decay_fraction)


def decay_factor(progress: float, shape: str) -> float:
    """Share of (peak − floor) left at decay progress p ∈ [0, 1] (Hägele et al. 2024):
    ``linear`` 1 − p, ``cosine`` ½(1 + cos πp), ``1-sqrt`` 1 − √p; 1 at p = 0, 0 at p = 1.

    Raises:
        ConfigError: an unknown shape.
    """
    p = min(max(progress, 0.0), 1.0)
    if shape == "linear":
        return 1.0 - p
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * p))
    if shape == "1-sqrt":
        return 1.0 - math.sqrt(p)
    raise ConfigError(f"decay_shape = {shape!r}: use one of {', '.join(DECAY_SHAPES)}")


def wsd_lr(step: int, *, peak_lr: float, warmup_steps: int, total_steps: int, decay_steps: int,
           min_lr_ratio: float, decay_shape: str = "1-sqrt") -> float:
    """Learning rate at optimiser step ``step`` of a warmup-stable-decay run (docs/methods.md §6; Hu et al. 2024,
    MiniCPM; Hägele et al. 2024).

    With D = total − decay_steps and floor = min_lr_ratio·peak: peak·step/warmup for step < warmup; peak for
    warmup ≤ step ≤ D; floor + (peak − floor)·g((step − D)/decay_steps) for D < step ≤ total,
    g = ``decay_factor(·, decay_shape)``; the floor after total. ``decay_steps`` 0: no decay
    (the stable trunk: peak after warmup at every step).

    Raises:
        ConfigError: total_steps < 1, warmup_steps < 0, decay_steps < 0, or the decay starting inside the warmup
            (warmup_steps > total_steps − decay_steps); an unknown decay_shape.
    """
    if total_steps < 1 or warmup_steps < 0 or decay_steps < 0:
        raise ConfigError(f"schedule warmup_steps = {warmup_steps}, total_steps = {total_steps}, decay_steps = "
                          f"{decay_steps}: need total ≥ 1 and warmup, decay ≥ 0")
    start = total_steps - decay_steps
    if warmup_steps > start:
        raise ConfigError(f"schedule decay of {decay_steps} steps starts at step {start}, inside the warmup of "
                          f"{warmup_steps} steps: lower decay_fraction or warmup_steps")
    if decay_shape not in DECAY_SHAPES:
        decay_factor(0.0, decay_shape)  # raises, naming the shapes
    if step < warmup_steps:
        return peak_lr * max(step, 0) / warmup_steps
    if step <= start or decay_steps == 0:
        return peak_lr
    floor = min_lr_ratio * peak_lr
    return floor + (peak_lr - floor) * decay_factor((step - start) / decay_steps, decay_shape)


def branch_lr(step: int, *, branch_step: int, decay_steps: int, peak_lr: float, min_lr_ratio: float,
              decay_shape: str = "1-sqrt") -> float:
    """LR of a decay branch taken from the stable phase at step s = ``branch_step`` and decaying over k =
    ``decay_steps`` steps, at step t ∈ (s, s + k]: floor + (peak − floor)·g((t − s)/k); the floor after s + k.

    It equals ``wsd_lr(t, total_steps=s + k, decay_steps=k, ...)``: a branch is the WSD run of s + k steps whose
    decay starts at s (the "cooldown" of Hägele et al. 2024).

    Raises:
        ValueError: t ≤ s (the trunk's step, not the branch's), s < 0 or k < 1.
        ConfigError: an unknown decay_shape.
    """
    if branch_step < 0 or decay_steps < 1:
        raise ValueError(f"branch at step {branch_step} decaying over {decay_steps} steps: need s ≥ 0 and k ≥ 1")
    if step <= branch_step:
        raise ValueError(f"step {step} is not after the branch point {branch_step}: the trunk's LR applies there")
    floor = min_lr_ratio * peak_lr
    return floor + (peak_lr - floor) * decay_factor((step - branch_step) / decay_steps, decay_shape)


def lr_schedule(step: int, *, schedule: str, peak_lr: float, warmup_steps: int, total_steps: int,
                min_lr_ratio: float = 0.1, decay_fraction: float = 0.2, decay_shape: str = "1-sqrt",
                decay_steps: int | None = None) -> float:
    """The LR at ``step`` under ``schedule``: ``cosine`` is ``lr_at`` (the decay_* arguments unused); ``wsd`` is
    ``wsd_lr`` with decay length ``decay_steps`` when given, else ``decay_steps_of(total_steps, decay_fraction)``
    (docs/methods.md §6).

    Raises:
        ConfigError: an unknown schedule, or what ``lr_at`` / ``wsd_lr`` / ``decay_steps_of`` raise.
    """
    if schedule == "cosine":
        return lr_at(step, peak_lr=peak_lr, warmup_steps=warmup_steps, total_steps=total_steps,
                     min_lr_ratio=min_lr_ratio)
    if schedule == "wsd":
        k = decay_steps_of(total_steps, decay_fraction) if decay_steps is None else decay_steps
        return wsd_lr(step, peak_lr=peak_lr, warmup_steps=warmup_steps, total_steps=total_steps, decay_steps=k,
                      min_lr_ratio=min_lr_ratio, decay_shape=decay_shape)
    raise ConfigError(f"schedule = {schedule!r}: use one of {', '.join(SCHEDULES)}")
