"""Peak-learning-rate sweep: an Optuna study that several worker processes can share and that resumes after a kill.

Storage is Optuna's journal (an append-only log file guarded by a file lock), so workers on one file system never hit
SQLite's "database is locked". Every trial is tagged with its worker (``host:pid``). A trial stopped by Ctrl-C
(KeyboardInterrupt), or left RUNNING by a worker process on this host that is gone (killed), is marked FAIL with
``interrupted`` and a ``fail_reason``, does not count towards ``n_trials``, and is queued again (same peak LR, seed and
grid point), so the next run redoes it and a kill does not change the study's result. A trial whose worker was killed
``MAX_RETRIES`` times is not retried again: it counts as failed.

Optuna numbers every attempt, so after a kill the redone trial and those after it have higher numbers than in an
uninterrupted study, and a resumed process starts its sampler afresh. Neither may change a trial's peak LR or seed,
so both follow the trial's *slot* (``trial_slot``: its place among the trials that count, what an uninterrupted study
numbers it), not its number or the draws made before in this process (``SlotSampler``).

Run from Python (several shells may run the same line at once on one study)::

    run_sweep(objective, SweepConfig(lr_min=1e-4, lr_max=1e-2, report_every=50), storage_path=Path("runs/sweep"),
              study_name="proxy-lr", worker=0)
"""

import datetime
import math
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.trial import FrozenTrial, Trial, TrialState

from infra.errors import ConfigError, DataError
from tasks.sweep.config import SweepConfig

JOURNAL_FILE = "optuna_journal.log"
FINISHED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
# A trial gets its worker tag right after it is created; one still untagged after this long was orphaned.
UNTAGGED_STALE_AFTER_S = 60.0
# A trial that kills its worker every time (out of memory, say) stops being retried after this many retries.
MAX_RETRIES = 3

Report = Callable[[int, float], None]
Objective = Callable[[float, int, Report], float]


@dataclass(frozen=True)
class SweepResult:
    """Outcome of a sweep.

    ``best_lr`` is the peak LR of the COMPLETE trial with the lowest final held-out loss ``best_value`` (nats/token).
    ``trials`` has one row per Optuna trial: number, state (name), peak_lr, seed, value (nats/token, NaN unless
    COMPLETE), last_step (last reported step or None), intermediate (dict step → held-out loss), fail_reason (or
    None), slot (``trial_slot``), retries (how often the trial was redone after a kill or Ctrl-C), interrupted (an
    attempt cut short by a kill or Ctrl-C, whose slot a later trial takes).

    ``sweep_trials`` is the sweep's own table, one row per trial in slot order, equal to an uninterrupted study's:
    ``trials`` without the interrupted attempts, ``number`` its slot, ``optuna_number`` its number in the study (a
    kill makes it higher than the slot), retries; built from those trials alone, so its column types do not depend
    on the attempts left out.
    """

    best_lr: float
    best_value: float
    study_name: str
    trials: pd.DataFrame
    sweep_trials: pd.DataFrame | None = None


def open_storage(storage_path: Path) -> JournalStorage:
    """The journal storage kept in directory ``storage_path`` (created if missing), shareable across processes.

    Raises:
        ConfigError: ``storage_path`` exists and is not a directory.
    """
    if storage_path.exists() and not storage_path.is_dir():
        raise ConfigError(f"storage_path {storage_path} is a file: give a directory for the sweep journal")
    storage_path.mkdir(parents=True, exist_ok=True)
    journal = str(storage_path / JOURNAL_FILE)
    return JournalStorage(JournalFileBackend(journal, lock_obj=JournalFileOpenLock(journal)))


def trial_seed(base_seed: int, trial_number: int) -> int:
    """Seed of one trial, a 32-bit integer derived from (base_seed, trial_number) by NumPy's ``SeedSequence``."""
    return _derived_seed(base_seed, 0, trial_number)


def _derived_seed(*keys: int) -> int:
    return int(np.random.SeedSequence(list(keys)).generate_state(1)[0])


def grid_lrs(cfg: SweepConfig) -> list[float]:
    """The ``n_trials`` log-spaced peak LRs of the grid sampler, lr_min to lr_max (one trial: their geometric mean)."""
    if cfg.n_trials == 1:
        return [math.sqrt(cfg.lr_min * cfg.lr_max)]
    return [float(x) for x in np.clip(np.geomspace(cfg.lr_min, cfg.lr_max, cfg.n_trials), cfg.lr_min, cfg.lr_max)]


def run_sweep(
    objective: Objective, cfg: SweepConfig, *, storage_path: Path, study_name: str, worker: int = 0
) -> SweepResult:
    """Run (or resume, or join) the study until it holds ``cfg.n_trials`` trials, and return its result.

    Args:
        objective: ``objective(peak_lr, trial_seed, report) -> final held-out loss`` (nats/token). It should call
            ``report(step, held_out_loss)`` every ``cfg.report_every`` steps and let ``optuna.TrialPruned`` propagate.
            Any other exception, or a non-finite loss, marks the trial FAIL with ``fail_reason`` and the sweep goes on.
            A KeyboardInterrupt marks it FAIL and ``interrupted``, queues it again and stops the sweep (re-raised).
        cfg: the sweep section.
        storage_path: directory holding the journal shared by all workers of the study.
        study_name: the study; loaded if it exists.
        worker: distinct per concurrent process, so that workers' samplers do not draw the same LRs.

    Trials already in the study (finished, or running in another live worker) count towards ``n_trials``, except
    interrupted ones and those whose worker was killed, which are queued again (``counts_towards_n_trials``); under a race between workers a trial that already has ``n_trials``
    counted or queued trials before it is closed at once as FAIL ("surplus"). When other workers still run trials,
    the returned table shows them RUNNING.

    Raises:
        ConfigError: ``worker`` < 0.
        DataError: no trial of the study is COMPLETE.
    """
    if worker < 0:
        raise ConfigError(f"worker = {worker}: must be ≥ 0 (one distinct number per concurrent process)")
    sampler = SlotSampler(cfg, worker)
    pruner = optuna.pruners.MedianPruner(
        n_startup_trials=cfg.pruner_startup_trials, n_warmup_steps=cfg.pruner_warmup_steps
    )
    study = optuna.create_study(
        storage=open_storage(storage_path), sampler=sampler, pruner=pruner, study_name=study_name,
        direction="minimize", load_if_exists=True,
    )
    fail_stale_trials(study)
    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
    if done:
        print(f"sweep: resuming study {study_name}: {done} of {cfg.n_trials} trial(s) already complete or pruned")
    run_trial = _trial_runner(objective, cfg)
    # A queued retry (WAITING) is not counted, so the loop goes on until it has run (optimize takes it first).
    while sum(counts_towards_n_trials(t) for t in study.get_trials(deepcopy=False)) < cfg.n_trials:
        study.optimize(run_trial, n_trials=1, catch=(Exception,))
    return sweep_result(study)


def finished_trials(storage_path: Path, study_name: str) -> int:
    """How many trials of the study ``study_name`` are finished and count towards ``n_trials`` (0 without one):
    what a resumed sweep need not run again."""
    try:
        study = optuna.load_study(study_name=study_name, storage=open_storage(storage_path))
    except KeyError:  # no such study yet
        return 0
    return sum(t.state.is_finished() and counts_towards_n_trials(t) for t in study.get_trials(deepcopy=False))


def drop_study(storage_path: Path, study_name: str) -> bool:
    """Delete the study ``study_name`` from the journal in ``storage_path`` (a sweep run again from its first trial);
    False when there was none."""
    try:
        optuna.delete_study(study_name=study_name, storage=open_storage(storage_path))
    except KeyError:  # Optuna's answer for a study the storage does not hold
        return False
    return True


def counts_towards_n_trials(trial: FrozenTrial) -> bool:
    """Finished trials (an interrupted one excepted) and running ones count; queued and interrupted ones do not."""
    if trial.state == TrialState.WAITING:
        return False
    return not (trial.state == TrialState.FAIL and trial.user_attrs.get("interrupted"))


def load_sweep(storage_path: Path, study_name: str) -> SweepResult:
    """The result of an existing study, without running anything.

    Raises:
        DataError: no trial of the study is COMPLETE.
    """
    return sweep_result(optuna.load_study(study_name=study_name, storage=open_storage(storage_path)))


def trial_slot(study: optuna.Study, trial: FrozenTrial) -> int:
    """The trial's place in the sweep, 0 for the first: what an uninterrupted study numbers it.

    A retry keeps the slot of the trial it redoes (copied when queued). A new trial takes the slot after the earlier
    trials that count towards ``n_trials`` or wait to be redone, so an attempt cut short by a kill takes none and the
    trials after it get the slots, LRs and seeds they would have had without the kill. Fixed on the first call (user
    attr ``slot``), so that a later change of an earlier trial's state does not move it.
    """
    if "slot" in trial.user_attrs:
        return int(trial.user_attrs["slot"])
    slot = sum(1 for t in study.get_trials(deepcopy=False)
               if t.number < trial.number and (counts_towards_n_trials(t) or t.state == TrialState.WAITING))
    study._storage.set_trial_user_attr(trial._trial_id, "slot", slot)
    return slot


class SlotSampler(optuna.samplers.BaseSampler):
    """The study's sampler (grid or TPE), by slot (``trial_slot``) instead of Optuna's trial number and process state.

    Optuna's GridSampler gives trial number i the i-th point of its seeded shuffle of the grid; here slot i gets it,
    so a kill (which numbers the retry and every later trial one higher) leaves each point with the seed it has in an
    uninterrupted study. TPE (and its random startup trials) draws from generators seeded by (seed, worker, slot), made
    afresh for each trial: a resumed process would otherwise restart the draws of the killed one from its first.
    Given the same earlier trials, a slot thus gets the same peak LR whether or not the sweep was interrupted.
    """

    def __init__(self, cfg: SweepConfig, worker: int):
        self._seed = (cfg.seed, 1, worker)  # key 1: sampler seeds; key 0: trial seeds
        self._grid = {"peak_lr": grid_lrs(cfg)} if cfg.sampler == "grid" else None
        self._inner = self._for_slot(None)

    def _for_slot(self, slot: int | None) -> optuna.samplers.BaseSampler:
        if self._grid is not None:
            return optuna.samplers.GridSampler(self._grid, seed=_derived_seed(*self._seed))
        # Optuna's default of 10 random (log-uniform) startup trials: a sweep of ≤ 10 trials is a random search.
        return optuna.samplers.TPESampler(seed=_derived_seed(*self._seed, *(() if slot is None else (slot,))))

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        slot = trial_slot(study, trial)
        if self._grid is None:
            self._inner = self._for_slot(slot)
        elif (slot < len(self._grid["peak_lr"])
              and "grid_id" not in trial.system_attrs and "fixed_params" not in trial.system_attrs):
            # GridSampler keeps a grid_id set before it (a retry's); past the grid it picks an unvisited point.
            study._storage.set_trial_system_attr(trial._trial_id, "search_space", self._grid)
            study._storage.set_trial_system_attr(trial._trial_id, "grid_id", slot)
            trial = study._storage.get_trial(trial._trial_id)
        self._inner.before_trial(study, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict:
        return self._inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: dict) -> dict:
        return self._inner.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution):
        return self._inner.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values) -> None:
        self._inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._inner.reseed_rng()


def _worker_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _trial_runner(objective: Objective, cfg: SweepConfig) -> Callable[[Trial], float]:
    def run(trial: Trial) -> float:
        try:
            return _run_trial(trial, objective, cfg)
        except KeyboardInterrupt:
            _requeue_interrupted(trial)
            raise

    return run


def _run_trial(trial: Trial, objective: Objective, cfg: SweepConfig) -> float:
    trial.set_user_attr("worker", _worker_tag())
    slot = trial_slot(trial.study, trial.study._storage.get_trial(trial._trial_id))  # set by the sampler
    if slot >= cfg.n_trials:  # several workers asked for the last trial at once
        trial.set_user_attr("fail_reason", f"surplus: the study already had {cfg.n_trials} trials")
        raise DataError(f"trial {trial.number} is surplus to n_trials = {cfg.n_trials}")
    # A retry keeps the seed of the trial it redoes (copied into its user attrs when queued); a new trial's seed
    # follows its slot, so that a kill before it does not change it.
    seed = trial.user_attrs.get("seed", trial_seed(cfg.seed, slot))
    trial.set_user_attr("seed", seed)
    peak_lr = trial.suggest_float("peak_lr", cfg.lr_min, cfg.lr_max, log=True)
    try:
        value = float(objective(peak_lr, seed, _reporter(trial)))
        if not math.isfinite(value):
            raise DataError(f"objective returned a non-finite held-out loss {value} at peak_lr {peak_lr:.3g}")
    except optuna.TrialPruned:
        raise
    except Exception as err:
        trial.set_user_attr("fail_reason", f"{type(err).__name__}: {err}")
        raise
    return value


def _requeue_interrupted(trial: Trial) -> None:
    """Record why ``trial`` stopped and queue a copy (same peak LR, seed and grid point) for the next run.

    Optuna then marks the trial FAIL; ``counts_towards_n_trials`` leaves it out, so the copy takes its place.
    A trial interrupted before its LR was drawn has nothing to copy: the next run draws a fresh one instead.
    """
    frozen = trial.study._storage.get_trial(trial._trial_id)
    last = max(frozen.intermediate_values, default=None)
    at = f" after step {last:,}" if last is not None else ""
    trial.set_user_attr("interrupted", True)
    trial.set_user_attr("fail_reason", f"interrupted (KeyboardInterrupt){at}; not counted, redone on the next run")
    _queue_copy(trial.study, frozen)


def _queue_copy(study: optuna.Study, frozen: FrozenTrial) -> None:
    """Queue a copy of ``frozen`` (same peak LR, seed and grid point); nothing when its LR was never drawn."""
    if "peak_lr" not in frozen.params:
        return
    user_attrs = {"retry_of": frozen.number, "retries": frozen.user_attrs.get("retries", 0) + 1,
                  **{k: v for k, v in frozen.user_attrs.items() if k in ("seed", "slot")}}
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.WAITING, params=frozen.params, distributions=frozen.distributions, user_attrs=user_attrs,
        system_attrs={k: v for k, v in frozen.system_attrs.items() if k in ("grid_id", "search_space")}))


def _reporter(trial: Trial) -> Report:
    def report(step: int, value: float) -> None:
        trial.report(value, step)
        if trial.should_prune():
            raise optuna.TrialPruned(f"held-out loss {value:.4f} at step {step:,} is above the earlier trials' median")

    return report


def fail_stale_trials(study: optuna.Study) -> list[int]:
    """Mark FAIL (with ``fail_reason``) the RUNNING trials whose worker is gone, queue each again unless it was
    retried ``MAX_RETRIES`` times already (then it counts as failed); return their numbers. One killed before its
    LR was drawn has nothing to redo: it does not count, and the next new trial takes its slot (and so its LR).

    A trial is stale when its ``host:pid`` tag names this host and a process that no longer exists (or this very
    process, which runs no trial yet), or when it has stayed untagged for over ``UNTAGGED_STALE_AFTER_S``. Trials of
    other hosts are left alone: their liveness cannot be checked from here.
    """
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        reason = _stale_reason(trial)
        if reason is None:
            continue
        drawn = "peak_lr" in trial.params
        retry = drawn and trial.user_attrs.get("retries", 0) < MAX_RETRIES
        reason += ("; not counted, redone on this run" if retry else
                   "; not counted, its LR never drawn" if not drawn else
                   f"; not retried (killed {MAX_RETRIES + 1} times)")
        try:
            study._storage.set_trial_user_attr(trial._trial_id, "fail_reason", reason)
            if retry or not drawn:
                study._storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        except UpdateFinishedTrialError:
            continue  # another worker resolved it first
        if retry:
            _queue_copy(study, study._storage.get_trial(trial._trial_id))
        failed.append(trial.number)
    return failed


def _stale_reason(trial: FrozenTrial) -> str | None:
    tag = trial.user_attrs.get("worker")
    if tag is None:
        age_s = (datetime.datetime.now() - trial.datetime_start).total_seconds()
        if age_s > UNTAGGED_STALE_AFTER_S:
            return f"left RUNNING untagged for {age_s:,.0f} s (worker died before starting it); marked FAIL on resume"
        return None
    host, pid = tag.rsplit(":", 1)
    if host != socket.gethostname():
        return None
    if int(pid) == os.getpid() or not _process_alive(int(pid)):
        return f"left RUNNING by worker {tag}, which is gone (killed?); marked FAIL on resume"
    return None


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_result(study: optuna.Study) -> SweepResult:
    """Tabulate a study's trials and pick its best LR (see ``SweepResult``).

    Raises:
        DataError: no trial is COMPLETE.
    """
    trials = study.get_trials(deepcopy=False)
    table = pd.DataFrame([_trial_row(t) for t in trials], columns=[*TRIAL_COLUMNS, "slot", "retries", "interrupted"])
    kept = sorted((r for r in map(_trial_row, trials) if not r["interrupted"]),
                  key=lambda r: (r["slot"] is None, r["slot"] or 0, r["number"]))
    sweep = pd.DataFrame([{**{c: r[c] for c in TRIAL_COLUMNS}, "number": r["slot"], "optuna_number": r["number"],
                           "retries": r["retries"]} for r in kept],
                         columns=[*TRIAL_COLUMNS, "optuna_number", "retries"])
    completed = [t for t in trials if t.state == TrialState.COMPLETE]
    if not completed:
        states = table["state"].value_counts().to_dict()
        raise DataError(f"sweep {study.study_name!r} has no COMPLETE trial (states {states}): check the fail_reasons")
    best = min(completed, key=lambda t: t.value)
    return SweepResult(float(best.params["peak_lr"]), float(best.value), study.study_name, table, sweep)


TRIAL_COLUMNS = ("number", "state", "peak_lr", "seed", "value", "last_step", "intermediate", "fail_reason")


def _trial_row(trial: FrozenTrial) -> dict:
    steps = trial.intermediate_values
    return {
        "number": trial.number,
        "state": trial.state.name,
        "peak_lr": trial.params.get("peak_lr", math.nan),
        "seed": trial.user_attrs.get("seed"),
        "value": trial.value if trial.state == TrialState.COMPLETE else math.nan,
        "last_step": max(steps) if steps else None,
        "intermediate": dict(steps),
        "fail_reason": trial.user_attrs.get("fail_reason"),
        "slot": trial.user_attrs.get("slot"),
        "retries": int(trial.user_attrs.get("retries", 0)),
        "interrupted": trial.state == TrialState.FAIL and bool(trial.user_attrs.get("interrupted")),
    }
