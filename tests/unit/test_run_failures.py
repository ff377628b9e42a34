"""How `pretrain run` reports a failure: one ``error:`` line, the traceback in the run's log file, and the first
error kept as the cause when recording the failure fails too (a full disk under the tracking store); a failure of the
stores on a full disk is a DiskFullError, and the libraries' records of the full disk stay off the terminal."""

import io
import logging
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import typer

import flows.cli as cli
from flows.pipeline import record_failure
from infra.errors import DiskFullError

ROOT = Path(__file__).resolve().parents[2]


def _disk_full_then_store_full() -> Exception:
    """A stage's DiskFullError, then the tracking store's own failure raised while handling it."""
    try:
        try:
            raise DiskFullError("stage main ran out of space writing its artifact")
        except DiskFullError:
            raise sqlite3.OperationalError("database or disk is full")
    except sqlite3.OperationalError as err:
        return err


def test_the_first_error_is_the_pretrain_error_a_later_failure_was_raised_while_handling():
    secondary = _disk_full_then_store_full()
    assert isinstance(cli.first_error(secondary), DiskFullError)
    wrapped = DiskFullError("out of space")
    wrapped.__cause__ = OSError(28, "No space left on device")
    assert cli.first_error(wrapped) is wrapped
    bug = RuntimeError("a bug")
    assert cli.first_error(bug) is bug


def _fail_run(err, log_path, monkeypatch) -> tuple[int, str]:
    out = io.StringIO()
    # The console of a log file or pipe, as a redirected run (CI, nohup, a Prefect worker) prints through.
    monkeypatch.setattr(cli, "console", cli.make_console(False, file=out))
    with pytest.raises(typer.Exit) as exit_:
        cli._fail_run(err, log_path)
    return exit_.value.exit_code, out.getvalue()


def test_a_failure_to_record_the_failure_leaves_the_first_error_the_reported_cause(tmp_path, monkeypatch, caplog):
    log_path = tmp_path / "logs" / "run.log"
    log_path.parent.mkdir()
    with caplog.at_level(logging.WARNING):
        code, printed = _fail_run(_disk_full_then_store_full(), log_path, monkeypatch)
    assert code == 2
    assert printed.splitlines() == ["error: DiskFullError: stage main ran out of space writing its artifact"]
    assert [r.getMessage() for r in caplog.records] == [
        "while handling DiskFullError, a second error: OperationalError: database or disk is full"]
    assert "DiskFullError" in log_path.read_text() and "OperationalError" in log_path.read_text()


def test_a_third_party_exception_is_one_error_line_and_its_traceback_goes_to_the_log(tmp_path, monkeypatch):
    try:
        {}["missing"]
    except KeyError as err:
        error = RuntimeError("the store answered:\n  something odd")
        error.__context__ = err
    log_path = tmp_path / "logs" / "run.log"
    code, printed = _fail_run(error, log_path, monkeypatch)
    assert code == 1
    assert printed.splitlines() == [f"error: RuntimeError: the store answered: something odd (traceback in "
                                    f"{log_path})"]
    logged = log_path.read_text()
    assert "Traceback" in logged and "KeyError: 'missing'" in logged and "something odd" in logged


def _store_full() -> Exception:
    """What MLflow raises when SQLite cannot write: its own exception around SQLAlchemy's around sqlite3's."""
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as low:
            raise RuntimeError("(sqlite3.OperationalError) database or disk is full\n[SQL: INSERT INTO tags ...]") \
                from low
    except RuntimeError as err:
        return err


def test_a_store_that_fails_on_a_full_disk_is_one_disk_full_error_line(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    log_path = runs / "logs" / "run.log"
    log_path.parent.mkdir(parents=True)
    code, printed = _fail_run_in(_store_full(), log_path, runs, monkeypatch)
    assert code == 2
    lines = printed.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: DiskFullError: the disk of the runs folder {runs} is full (")
    assert "OperationalError: database or disk is full)" in lines[0] and "[SQL" not in lines[0]
    assert "run the same command again" in lines[0]
    assert "Traceback" in log_path.read_text() and "database or disk is full" in log_path.read_text()
    # the same failure on a disk with room, not saying it is full, stays what it is
    code, printed = _fail_run_in(RuntimeError("no such table: runs"), log_path, runs, monkeypatch)
    assert code == 1 and printed.startswith("error: RuntimeError: no such table: runs (traceback in")


def test_a_stage_on_a_full_disk_quotes_the_error_that_says_so_on_one_line(tmp_path):
    from infra.artifacts import disk_full_error

    tmp = tmp_path / "artifacts" / "main" / ".tmp-k1"
    tmp.mkdir(parents=True)
    full = disk_full_error(_store_full(), tmp, "main")
    assert isinstance(full, DiskFullError) and "\n" not in str(full)
    assert "(sqlite3" not in str(full) and "OperationalError: database or disk is full)" in str(full)


def _fail_run_in(err, log_path, runs, monkeypatch) -> tuple[int, str]:
    out = io.StringIO()
    monkeypatch.setattr(cli, "console", cli.make_console(False, file=out))
    with pytest.raises(typer.Exit) as exit_:
        cli._fail_run(err, log_path, runs)
    return exit_.value.exit_code, out.getvalue()


# capture() changes the process's logging for good: in a child process, with a terminal handler on stdout.
FULL_DISK_RECORDS = textwrap.dedent("""
    import logging, sqlite3, sys
    from pathlib import Path
    from flows.runlog import capture

    logger = logging.getLogger("pretrain.quiet")  # the platform's own: its other records reach the terminal
    logger.propagate = False
    logger.addHandler(logging.StreamHandler(sys.stdout))
    capture(Path(sys.argv[1]))
    logger.warning("Failed to write result: [Errno 28] No space left on device Execution will continue")
    logger.warning("stage main failed (DiskFullError); recording that in MLflow failed too: OperationalError: "
                   "database or disk is full")
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as low:
            raise RuntimeError("(sqlite3.OperationalError) [SQL: INSERT INTO tags ...]") from low
    except RuntimeError:
        logger.exception("a flush failed")
    logger.warning("stage main: another run is computing artifact k1; waiting for it")
""")


def test_records_that_say_the_disk_is_full_stay_off_the_terminal_and_reach_the_log(tmp_path):
    log_path = tmp_path / "logs" / "run.log"
    proc = subprocess.run([sys.executable, "-c", FULL_DISK_RECORDS, str(log_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["stage main: another run is computing artifact k1; waiting for it"]
    logged = log_path.read_text()
    assert "Failed to write result" in logged and "recording that in MLflow failed too" in logged
    assert "a flush failed" in logged and "Traceback" in logged and "database or disk is full" in logged


class _StoreGone:
    def end_run(self, run_id, status="FINISHED"):
        raise sqlite3.OperationalError("no such table: runs")


def test_recording_a_failure_that_cannot_be_recorded_is_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        record_failure(_StoreGone(), "run-1", DiskFullError("full"), "stage main")  # does not raise
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "stage main failed (DiskFullError); recording that in MLflow failed too: OperationalError: no such " \
           "table: runs" == caplog.records[0].getMessage()


# On a real full disk: the MLflow run cannot be ended, the failure stays the cause; once the process has ended and
# space is back, the next command marks the run FAILED.
ON_FULL_DISK = textwrap.dedent("""
    import sys
    from pathlib import Path
    from flows.pipeline import record_failure
    from flows.runlog import capture
    from infra.errors import DiskFullError
    from infra.tracking import Tracker

    folder = Path(sys.argv[1])
    tracker = Tracker(f"sqlite:///{folder / 'mlflow.db'}", folder / "mlartifacts", "exp")
    capture(folder / "logs" / "run.log")  # as `pretrain run` does: on the same disk
    run_id = tracker.start_run("main")
    print(run_id, flush=True)
    with open(folder / "filler", "wb") as filler:  # fill the disk
        try:
            while True:
                filler.write(b"\\0" * (1 << 20))
                filler.flush()
        except OSError:
            pass
    record_failure(tracker, run_id, DiskFullError("stage main ran out of space"), "stage main")
""")


def test_on_a_really_full_disk_the_run_stays_running_until_the_next_command_marks_it_failed(tmp_path):
    folder = tmp_path / "tmpfs"
    folder.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=30m", "tmpfs", str(folder)],
                                                        capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here (needs root): the real full disk cannot be made")
    try:
        proc = subprocess.run([sys.executable, "-c", ON_FULL_DISK, str(folder)], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        run_id = proc.stdout.split()[0]
        # The note that the run could not be marked FAILED says the disk is full: it is left to the run's one error:
        # line (and to the run log, which has no room here), never shown with SQLite's words or a traceback.
        assert "recording that in MLflow failed too" not in proc.stderr and "disk is full" not in proc.stderr
        assert "Traceback" not in proc.stderr
        (folder / "filler").unlink()
        from infra.tracking import Tracker

        tracker = Tracker(f"sqlite:///{folder / 'mlflow.db'}", folder / "mlartifacts", "exp")
        assert tracker.client.get_run(run_id).info.status == "RUNNING"
        assert tracker.fail_abandoned_runs() == [run_id]
        assert tracker.client.get_run(run_id).info.status == "FAILED"
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=False)
