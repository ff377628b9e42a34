"""The run log's terminal filters and hooks (``flows.runlog``): Prefect's records of a failed run and records that
say a disk is full stay off the terminal; an uncaught exception in a thread reaches the log with its traceback."""

import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from flows.runlog import _FullDiskRecords, _PlatformOnly, _RunFailureRecords, capture, release, write_traceback


def _record(name: str, message: str, *args, exc: BaseException | None = None, **extra) -> logging.LogRecord:
    record = logging.LogRecord(name, logging.ERROR, __file__, 1, message, args,
                               (type(exc), exc, exc.__traceback__) if exc else None)
    record.__dict__.update(extra)
    return record


def test_a_failed_prefect_run_shows_neither_its_traceback_nor_its_final_state_but_other_runs_do():
    keep = _RunFailureRecords()
    assert keep.filter(_record("pretrain", "a line of ours", exc=ValueError("x")))  # not Prefect's: kept
    assert not keep.filter(_record("prefect.task_runs", "Task run failed", exc=ValueError("x"), task_run_id="r1"))
    assert not keep.filter(_record("prefect.task_runs", "Finished in state Failed('boom')", task_run_id="r1"))
    # the state is dropped once; a run that did not fail keeps its final state, and other records pass
    assert keep.filter(_record("prefect.task_runs", "Finished in state Failed('boom')", task_run_id="r1"))
    assert keep.filter(_record("prefect.flow_runs", "Finished in state Completed()", flow_run_id="r2"))
    assert not keep.filter(_record("prefect.flow_runs", "Crashed", exc=RuntimeError("y")))  # no run id: dropped


def test_prefect_s_records_of_a_crashed_run_stay_off_the_terminal():
    # What Prefect's engines log when Ctrl-C or SIGTERM leaves a task or flow run (handle_crash); the command says it
    # in its own `interrupted` line.
    keep = _RunFailureRecords()
    for name, run in (("prefect.task_runs", {"task_run_id": "t"}), ("prefect.flow_runs", {"flow_run_id": "f"})):
        assert not keep.filter(_record(name, "Crash detected! Execution was aborted by an interrupt signal.", **run))
        assert not keep.filter(_record(name, "Finished in state Crashed('Execution was aborted by a termination "
                                             "signal.')", **run))
    assert keep.filter(_record("pretrain", "Crash detected! (not Prefect's)"))


def test_a_record_whose_arguments_do_not_format_is_left_to_logging():
    bad = _record("mlflow", "%d rows", "not a number")
    assert _FullDiskRecords().filter(bad)
    assert not _FullDiskRecords().filter(_record("mlflow", "database or disk is full"))
    assert _FullDiskRecords().filter(_record("mlflow", "all well"))


@pytest.fixture
def restored_logging():
    saved = threading.excepthook
    yield
    release()
    assert threading.excepthook is saved


def test_an_uncaught_exception_in_a_thread_reaches_the_run_log_with_its_traceback(tmp_path, restored_logging):
    log = capture(tmp_path / "logs" / "run.log")

    def fail():
        raise RuntimeError("the writer thread broke")

    thread = threading.Thread(target=fail, name="writer")
    thread.start()
    thread.join()
    text = log.read_text()
    assert "uncaught exception in thread writer" in text
    assert "RuntimeError: the writer thread broke" in text and "Traceback (most recent call last)" in text


def test_a_traceback_that_cannot_be_written_is_reported_as_not_written(tmp_path):
    (tmp_path / "file").write_text("in the way of the log's folder")
    try:
        raise ValueError("cause")
    except ValueError as err:
        assert not write_traceback(tmp_path / "file" / "run.log", err)
        assert write_traceback(tmp_path / "logs" / "run.log", err)
    assert "ValueError: cause" in (tmp_path / "logs" / "run.log").read_text()


def test_only_the_platforms_records_and_warnings_pass_to_the_terminal():
    keep = _PlatformOnly()
    for name in ("pretrain", "flows.pipeline", "tasks.corpus.build", "infra.stores", "evals.gate", "models.hf"):
        assert keep.filter(_record(name, "ours"))
    for name in ("great_expectations.data_context.types.base", "optuna.study", "prefect.flow_runs", "transformers",
                 "mlflow.store", "flowsheet", "tasksmith"):
        assert not keep.filter(_record(name, "theirs"))
    assert keep.filter(_record("py.warnings", "config.toml:1: ConfigWarning: near_dedup is off"))
    assert not keep.filter(_record("py.warnings", "x.py:3: DeprecationWarning: old API"))


# A run's process as the CLI leaves it: a terminal handler on stdout (as Prefect installs one), then capture().
CHILD = r"""
import logging, sys, warnings
from pathlib import Path
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(name)s: %(message)s", force=True)
from flows.runlog import adopt_library_loggers, capture
from infra.errors import ConfigWarning
capture(Path(sys.argv[1]), verbose=sys.argv[2] == "verbose")
logging.getLogger("great_expectations.data_context.types.base").info("Created temporary directory for docs")
import optuna
optuna.logging.get_logger("optuna.study").info("Trial 3 finished with value: 5.9")
late = logging.getLogger("late_library")  # a library imported by a stage after capture, with its own handler
late.propagate = False
late.addHandler(logging.StreamHandler(sys.stdout))
late.setLevel(logging.INFO)
adopt_library_loggers()
late.info("late library line")
logging.getLogger("tasks.corpus").warning("our own warning")
warnings.warn("an old API", DeprecationWarning)
warnings.warn("near_dedup is off", ConfigWarning)
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_other_libraries_records_reach_the_run_log_and_the_terminal_only_when_verbose(tmp_path, verbose):
    log = tmp_path / "run.log"
    proc = subprocess.run([sys.executable, "-W", "always", "-c", CHILD, str(log), "verbose" if verbose else "quiet"],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = ("Created temporary directory for docs", "Trial 3 finished", "late library line", "an old API")
    ours = ("our own warning", "near_dedup is off")
    text = log.read_text()
    for line in theirs + ours:
        assert line in text, f"{line!r} not in the run log"
    shown = proc.stdout + proc.stderr
    for line in ours:
        assert line in shown
    for line in theirs:
        assert (line in shown) == verbose, f"{line!r} on the terminal: {shown}"
