"""Checkpoint intervals derived at run time: Young's interval from the measured save time and step time
(Young 1974; docs/methods.md §4, ``models.planning.young_interval``).

With a save taking δ seconds and failures arriving at a mean interval of M seconds, saving every τ = √(2·δ·M)
seconds of work minimises the expected time lost to saving and to recomputing after a failure (overhead
δ/τ + τ/(2M) to first order). ``[main] checkpoint_every = "young"`` with ``mtbf_hours`` = M / 3600 asks for it:
the run saves first after a short probe; at each save it measures δ and the seconds per optimiser step so far and
puts the next save max(1, ⌊τ / step_s + ½⌋) steps later (the end is always saved). When a checkpoint is written
changes no result, so the interval is not part of any key.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Iterator

from models.planning import young_interval

PROBE_STEPS = 10  # steps before the first save: enough to average away the first step's allocations


def young_steps(save_s: float, step_s: float, mtbf_hours: float) -> tuple[float, int]:
    """Young's interval for a save of ``save_s`` seconds, optimiser steps of ``step_s`` seconds and a mean time
    between failures of ``mtbf_hours``: (τ in seconds, τ in steps), τ = √(2·δ·M) (Young 1974) and
    steps = max(1, ⌊τ / step_s + ½⌋).

    Raises:
        ValueError: ``step_s`` or ``mtbf_hours`` not > 0, or ``save_s`` < 0.
    """
    if not (step_s > 0 and mtbf_hours > 0 and save_s >= 0):
        raise ValueError(f"young_steps needs step_s > 0, mtbf_hours > 0 and save_s ≥ 0; got step_s = {step_s}, "
                         f"mtbf_hours = {mtbf_hours}, save_s = {save_s}")
    tau = young_interval(save_s, mtbf_hours * 3600.0)[0] if save_s > 0 else 0.0  # a free save: every step
    return tau, max(1, int(tau / step_s + 0.5))


class YoungInterval:
    """The loop's checkpoint schedule for ``checkpoint_every = "young"`` (``train(checkpoint_every=...)``).

    Saves first at step start + ``probe_steps`` (or at the end, if sooner). At every save it measures that save's
    wall time δ and the wall seconds per optimiser step since the run (segment) started, the saves' own time left
    out and evaluations kept in (a failure loses them too), and puts the next save k = ``young_steps`` steps later;
    the end is always saved. Re-deriving at every save matters for ``async_checkpoints``: the first snapshot
    allocates its CPU buffers and stalls several times longer than the later ones. Never saves at a resumed run's
    first step; a resumed run probes again from where it starts.

    Args:
        mtbf_hours: the declared mean time between failures M, > 0.
        probe_steps: steps before the first save, ≥ 1.
        clock: seconds, monotonic (``time.perf_counter``; a test may pass its own).
        agree: maps [δ, step_s] to the values every rank uses (e.g. their mean over ranks), so that every process
            of a launched run saves at the same steps (saves are collective); identity by default.
        report: called after every save with ``record`` and the step (e.g. the MLflow log).

    ``record``, from the latest save: checkpoint_save_s (δ), step_s, mtbf_hours, young_interval_s (τ),
    checkpoint_interval_steps (k), next_checkpoint_step, and probe_step (the first save's step); {} before it.
    """

    def __init__(self, mtbf_hours: float, *, probe_steps: int = PROBE_STEPS,
                 clock: Callable[[], float] = time.perf_counter,
                 agree: Callable[[Sequence[float]], Sequence[float]] | None = None,
                 report: Callable[[dict, int], None] | None = None):
        if not mtbf_hours > 0 or probe_steps < 1:
            raise ValueError(f"YoungInterval needs mtbf_hours > 0 and probe_steps ≥ 1; got {mtbf_hours}, {probe_steps}")
        self.mtbf_hours, self.probe_steps, self.clock = float(mtbf_hours), int(probe_steps), clock
        self.agree, self.report = agree, report
        self.record: dict = {}
        self.saved_at: list[int] = []
        self._start: tuple[int, float] | None = None  # (step, clock) where this run segment began
        self._next: int | None = None  # the step of the next save
        self._save_total_s = 0.0  # time spent saving since the start, left out of the step time
        self._now = 0.0  # the clock at the latest ``due``: the top of the step about to be saved

    def due(self, step: int, start: int, total: int) -> bool:
        """Whether the loop saves at the top of step ``step`` (steps done) of a run from ``start`` to ``total``."""
        now = self.clock()
        if self._start is None:
            self._start, self._next = (step, now), start + self.probe_steps
        self._now = now
        if step == start:
            return False  # nothing done yet: a fresh start has nothing to save, a resumed one has just loaded it
        return step == total or step == self._next

    @contextmanager
    def saving(self, step: int) -> Iterator[None]:
        """Around the loop's ``on_checkpoint`` at ``step``: times the save and sets the step of the next one."""
        began = self.clock()
        yield
        save_s = self.clock() - began
        self.saved_at.append(step)
        if self._start is None or step <= self._start[0]:
            return
        first, t0 = self._start
        values = [save_s, (self._now - t0 - self._save_total_s) / (step - first)]
        self._save_total_s += save_s
        save_s, step_s = (float(v) for v in (self.agree(values) if self.agree is not None else values))
        tau, interval = young_steps(save_s, step_s, self.mtbf_hours)
        self._next = step + interval
        self.record = {"checkpoint_save_s": save_s, "step_s": step_s, "mtbf_hours": self.mtbf_hours,
                       "young_interval_s": tau, "checkpoint_interval_steps": interval,
                       "next_checkpoint_step": self._next, "probe_step": self.record.get("probe_step", step)}
        if self.report is not None:
            self.report(dict(self.record), step)


def checkpoint_schedule(every: int | str, mtbf_hours: float | None, **young) -> int | YoungInterval:
    """``[main] checkpoint_every`` as ``train`` takes it: the number of steps as is, ``"young"`` as a
    ``YoungInterval`` for ``mtbf_hours`` (``young``: its keyword arguments).

    Raises:
        ValueError: ``"young"`` without ``mtbf_hours``, or another string.
    """
    if every == "young":
        if mtbf_hours is None:
            raise ValueError('checkpoint_every = "young" needs mtbf_hours')
        return YoungInterval(mtbf_hours, **young)
    if isinstance(every, str):
        raise ValueError(f"checkpoint_every = {every!r}: give a number of steps or \"young\"")
    return every
