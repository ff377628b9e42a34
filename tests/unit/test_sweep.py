"""Sweep mechanics on synthetic objectives: search, pruning, failure capture, resume after a kill, shared workers.

These test the study plumbing only, not any property of real training.
"""

import math
import multiprocessing as mp
import os
from pathlib import Path

import optuna
import pandas as pd
import pytest

from infra.errors import ConfigError, DataError
from tasks.sweep.config import SweepConfig
from tasks.sweep.study import grid_lrs, load_sweep, run_sweep, trial_seed

optuna.logging.set_verbosity(optuna.logging.ERROR)

BEST_LR = 1e-3
FINISHED = {"COMPLETE", "PRUNED", "FAIL"}


def bowl(peak_lr: float, seed: int, report) -> float:
    """A smooth function of log10(lr) with its minimum 1.0 at lr = 1e-3, falling slowly with steps."""
    final = (math.log10(peak_lr) - math.log10(BEST_LR)) ** 2 + 1.0
    for step in range(0, 50, 10):
        report(step, final + 1.0 / (step + 1))
    return final


def _cfg(**kwargs) -> SweepConfig:
    return SweepConfig(**{"lr_min": 1e-5, "lr_max": 1e-1, "report_every": 10, **kwargs})


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="lr_min"):
        _cfg(lr_min=1e-2, lr_max=1e-3)
    with pytest.raises(ConfigError, match="n_trials"):
        _cfg(n_trials=0)
    with pytest.raises(ConfigError, match="report_every"):
        _cfg(report_every=0)


def test_grid_finds_optimum(tmp_path: Path):
    """Nine log-spaced LRs over 1e-5..1e-1 include 1e-3 exactly, so the grid must return it."""
    cfg = _cfg(n_trials=9, sampler="grid")
    assert grid_lrs(cfg) == pytest.approx([10 ** (e / 2) for e in range(-10, -1)])
    result = run_sweep(bowl, cfg, storage_path=tmp_path, study_name="grid")
    assert result.best_lr == pytest.approx(BEST_LR)
    assert result.best_value == pytest.approx(1.0)
    assert sorted(result.trials["peak_lr"]) == pytest.approx(grid_lrs(cfg))
    assert set(result.trials["state"]) <= {"COMPLETE", "PRUNED"}


def test_tpe_finds_lr_near_optimum(tmp_path: Path):
    """Log-uniform TPE over four decades lands within a factor 2 (0.3 in log10) of the known optimum."""
    result = run_sweep(bowl, _cfg(n_trials=30, seed=3), storage_path=tmp_path, study_name="tpe")
    assert abs(math.log10(result.best_lr) - math.log10(BEST_LR)) < 0.3
    assert len(result.trials) == 30
    assert list(result.trials["seed"]) == [trial_seed(3, n) for n in range(30)]


def test_pruning_stops_an_obviously_bad_trial(tmp_path: Path):
    """Two good LRs run first; a third reporting loss 100 at step 0 must be pruned there, never reaching step 40."""
    calls = []

    def objective(peak_lr, seed, report):
        bad = len(calls) == 2
        calls.append(peak_lr)
        for step in range(0, 50, 10):
            report(step, 100.0 if bad else 1.0)
        return 100.0 if bad else 1.0

    result = run_sweep(objective, _cfg(n_trials=3, pruner_startup_trials=2), storage_path=tmp_path, study_name="p")
    third = result.trials.set_index("number").loc[2]
    assert third["state"] == "PRUNED"
    assert third["last_step"] == 0 and third["intermediate"] == {0: 100.0}
    assert math.isnan(third["value"])


def test_objective_error_is_recorded_and_sweep_continues(tmp_path: Path):
    def objective(peak_lr, seed, report):
        if peak_lr > 1e-3:
            raise RuntimeError("loss diverged")
        return 1.0

    result = run_sweep(objective, _cfg(n_trials=4, sampler="grid"), storage_path=tmp_path, study_name="e")
    failed = result.trials[result.trials["state"] == "FAIL"]
    assert len(result.trials) == 4 and len(failed) == 2
    assert set(failed["fail_reason"]) == {"RuntimeError: loss diverged"}


def test_no_completed_trial_raises(tmp_path: Path):
    def objective(peak_lr, seed, report):
        return math.nan

    with pytest.raises(DataError, match="no COMPLETE trial"):
        run_sweep(objective, _cfg(n_trials=2), storage_path=tmp_path, study_name="nan")


def _dies_on_third_trial(storage: str) -> None:
    calls = []

    def objective(peak_lr, seed, report):
        calls.append(peak_lr)
        if len(calls) == 3:
            os._exit(1)  # simulated kill: no cleanup, the trial stays RUNNING in the journal
        return bowl(peak_lr, seed, report)

    run_sweep(objective, _cfg(n_trials=5), storage_path=Path(storage), study_name="resume")


def test_resume_after_kill_fails_orphan_and_runs_the_rest(tmp_path: Path):
    proc = mp.get_context("fork").Process(target=_dies_on_third_trial, args=(str(tmp_path),))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 1
    orphaned = load_sweep(tmp_path, "resume").trials
    assert list(orphaned["state"]) == ["COMPLETE", "COMPLETE", "RUNNING"]

    calls = []

    def objective(peak_lr, seed, report):
        calls.append(peak_lr)
        return bowl(peak_lr, seed, report)

    result = run_sweep(objective, _cfg(n_trials=5), storage_path=tmp_path, study_name="resume")
    trials = result.trials.set_index("number")
    assert len(calls) == 3 and len(trials) == 6  # the killed trial again, then the two never started
    assert trials.loc[2, "state"] == "FAIL" and "gone" in trials.loc[2, "fail_reason"]
    assert calls[0] == trials.loc[2, "peak_lr"] and trials.loc[3, "seed"] == trials.loc[2, "seed"]
    assert set(trials["state"]) <= FINISHED


def test_a_trial_that_keeps_killing_its_worker_counts_as_failed_after_three_retries(tmp_path: Path):
    for _ in range(4):
        proc = mp.get_context("fork").Process(target=_dies_in_the_best_trial, args=(str(tmp_path),))
        proc.start()
        proc.join(timeout=60)
        assert proc.exitcode == 1
    result = run_sweep(bowl, _cfg(n_trials=5, sampler="grid"), storage_path=tmp_path, study_name="killed-best")
    killed = result.trials[result.trials["fail_reason"].fillna("").str.contains("gone")]
    assert len(killed) == 4
    assert "redone" in killed["fail_reason"].iloc[0] and "not retried" in killed["fail_reason"].iloc[-1]
    assert result.best_lr != pytest.approx(BEST_LR)  # that grid point gave up on


@pytest.mark.parametrize("sampler", ["grid", "tpe"])
def test_ctrl_c_trial_is_recorded_and_redone_on_resume(tmp_path: Path, sampler: str):
    """Ctrl-C in the second trial: it keeps a reason, does not count, and the rerun redoes its LR and seed."""
    cfg = _cfg(n_trials=4, sampler=sampler)
    first_calls = []

    def interrupted(peak_lr, seed, report):
        first_calls.append((peak_lr, seed))
        if len(first_calls) == 2:
            report(10, 2.0)
            raise KeyboardInterrupt
        return bowl(peak_lr, seed, report)

    with pytest.raises(KeyboardInterrupt):
        run_sweep(interrupted, cfg, storage_path=tmp_path, study_name="ctrl-c")
    stopped = load_sweep(tmp_path, "ctrl-c").trials.set_index("number").loc[1]
    assert stopped["state"] == "FAIL"
    assert stopped["fail_reason"].startswith("interrupted (KeyboardInterrupt) after step 10")

    calls = []

    def objective(peak_lr, seed, report):
        calls.append((peak_lr, seed))
        return bowl(peak_lr, seed, report)

    result = run_sweep(objective, cfg, storage_path=tmp_path, study_name="ctrl-c")
    assert len(calls) == 3  # the interrupted trial again, plus the two never started
    assert calls[0] == first_calls[1]
    done = result.trials[result.trials["state"] != "FAIL"]
    assert len(done) == 4 and set(done["state"]) <= {"COMPLETE", "PRUNED"}
    if sampler == "grid":
        assert sorted(done["peak_lr"]) == pytest.approx(grid_lrs(cfg))  # every grid point once


def _worker(storage: str, worker: int) -> None:
    run_sweep(bowl, _cfg(n_trials=9), storage_path=Path(storage), study_name="shared", worker=worker)


def test_three_workers_share_one_study(tmp_path: Path):
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), i)) for i in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
    assert [proc.exitcode for proc in procs] == [0, 0, 0]
    trials = load_sweep(tmp_path, "shared").trials
    assert set(trials["state"]) <= FINISHED
    assert list(trials["number"][:9]) == list(range(9))
    surplus = trials[trials["number"] >= 9]  # only under a race between workers asking at once
    assert (surplus["state"] == "FAIL").all() and surplus["fail_reason"].str.startswith("surplus").all()
    assert (trials["state"] == "COMPLETE").sum() >= 3


def _dies_in_the_best_trial(storage: str) -> None:
    def objective(peak_lr, seed, report):
        if peak_lr == pytest.approx(BEST_LR):
            report(10, 2.0)
            os._exit(1)  # SIGKILL-like: the trial stays RUNNING in the journal
        return bowl(peak_lr, seed, report)

    run_sweep(objective, _cfg(n_trials=5, sampler="grid"), storage_path=Path(storage), study_name="killed-best")


def test_a_trial_killed_with_its_worker_is_redone_so_the_result_matches_an_uninterrupted_study(tmp_path: Path):
    """A kill must not change the outcome: the killed trial (here the best grid point) is run again, with its
    LR and seed, instead of counting as a failure that leaves a grid point never evaluated."""
    cfg = _cfg(n_trials=5, sampler="grid")
    uninterrupted = run_sweep(bowl, cfg, storage_path=tmp_path / "clean", study_name="killed-best")
    proc = mp.get_context("fork").Process(target=_dies_in_the_best_trial, args=(str(tmp_path / "killed"),))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 1
    calls = []

    def objective(peak_lr, seed, report):
        calls.append((peak_lr, seed))
        return bowl(peak_lr, seed, report)

    resumed = run_sweep(objective, cfg, storage_path=tmp_path / "killed", study_name="killed-best")
    assert resumed.best_lr == uninterrupted.best_lr == pytest.approx(BEST_LR)
    assert resumed.best_value == uninterrupted.best_value
    killed = resumed.trials[resumed.trials["fail_reason"].fillna("").str.contains("gone")]
    assert len(killed) == 1 and killed["state"].item() == "FAIL"
    assert calls[0] == (pytest.approx(BEST_LR), killed["seed"].item())  # redone first, same LR and seed
    done = resumed.trials[resumed.trials["state"] != "FAIL"]
    assert sorted(done["peak_lr"]) == pytest.approx(grid_lrs(cfg))  # every grid point once


def _dies_in_trial(storage: str, cfg: SweepConfig, killed: int) -> None:
    calls = []

    def objective(peak_lr, seed, report):
        calls.append(peak_lr)
        if len(calls) == killed + 1:
            report(10, 0.5)  # below every curve: not pruned
            os._exit(1)  # SIGKILL-like: the trial stays RUNNING in the journal
        return bowl(peak_lr, seed, report)

    run_sweep(objective, cfg, storage_path=Path(storage), study_name="exact")


def _by_slot(result):
    """The sweep's table without how it got there (the Optuna numbers and retry counts a kill changes)."""
    return result.sweep_trials.drop(columns=["optuna_number", "retries"])


@pytest.mark.parametrize(("sampler", "n_trials", "killed"), [("grid", 5, 1), ("tpe", 5, 1), ("tpe", 12, 10)])
def test_a_kill_changes_no_trial_of_the_sweep(tmp_path: Path, sampler: str, n_trials: int, killed: int):
    """Killed in trial ``killed`` and resumed, every slot gets the LR, seed and result it has without the kill: the
    trials after the retry are numbered one higher by Optuna and the resumed process starts its sampler afresh,
    yet neither moves a grid point, a seed or a TPE draw (12 trials: past TPE's 10 random startup trials)."""
    cfg = _cfg(n_trials=n_trials, sampler=sampler, seed=5)
    clean = run_sweep(bowl, cfg, storage_path=tmp_path / "clean", study_name="exact")
    proc = mp.get_context("fork").Process(target=_dies_in_trial, args=(str(tmp_path / "killed"), cfg, killed))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 1
    resumed = run_sweep(bowl, cfg, storage_path=tmp_path / "killed", study_name="exact")
    assert len(resumed.trials) == n_trials + 1 and resumed.trials["interrupted"].sum() == 1  # the journal's
    # The sweep's table (trials.parquet) has one row per trial, numbered by slot, the cut-short attempt left out.
    pd.testing.assert_frame_equal(_by_slot(resumed), _by_slot(clean))
    assert (resumed.best_lr, resumed.best_value) == (clean.best_lr, clean.best_value)
    assert list(clean.sweep_trials["number"]) == list(clean.sweep_trials["optuna_number"]) == list(range(n_trials))
    assert list(resumed.sweep_trials["retries"]) == [int(n == killed) for n in range(n_trials)]
    assert list(resumed.sweep_trials["optuna_number"]) == [n + (n >= killed) for n in range(n_trials)]


def _dies_before_drawing_an_lr(storage: str, cfg: SweepConfig) -> None:
    draw, draws = optuna.trial.Trial.suggest_float, []

    def suggest_float(self, *args, **kwargs):
        draws.append(1)
        if len(draws) == 3:
            os._exit(1)  # the third trial is created and tagged, its LR not drawn yet
        return draw(self, *args, **kwargs)

    optuna.trial.Trial.suggest_float = suggest_float  # in this forked child only
    run_sweep(bowl, cfg, storage_path=Path(storage), study_name="undrawn")


@pytest.mark.parametrize("sampler", ["grid", "tpe"])
def test_a_trial_killed_before_its_lr_was_drawn_is_not_counted_and_its_slot_is_redrawn(tmp_path: Path, sampler):
    """Nothing to redo, but it must not count as a failed trial either: the next trial takes its slot and LR."""
    cfg = _cfg(n_trials=4, sampler=sampler)
    clean = run_sweep(bowl, cfg, storage_path=tmp_path / "clean", study_name="undrawn")
    proc = mp.get_context("fork").Process(target=_dies_before_drawing_an_lr, args=(str(tmp_path / "killed"), cfg))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 1
    resumed = run_sweep(bowl, cfg, storage_path=tmp_path / "killed", study_name="undrawn")
    stale = resumed.trials.set_index("number").loc[2]
    assert stale["state"] == "FAIL" and stale["interrupted"] and "never drawn" in stale["fail_reason"]
    pd.testing.assert_frame_equal(_by_slot(resumed), _by_slot(clean))
