"""The run log's terminal filters and hooks (``flows.runlog``): Prefect's records of a failed run and records that
say a disk is full stay off the terminal; an uncaught exception in a thread reaches the log with its traceback."""

import logging
import threading

import pytest

from flows.runlog import _FullDiskRecords, _RunFailureRecords, capture, write_traceback


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
    root = logging.getLogger()
    saved = list(root.handlers), threading.excepthook
    yield
    for handler in root.handlers[:]:
        if handler not in saved[0]:
            root.removeHandler(handler)
            handler.close()
    threading.excepthook = saved[1]


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
