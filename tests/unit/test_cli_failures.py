"""The CLI prints an expected failure (a ``PretrainError``) once: Prefect's records that repeat it are dropped, by
the failed run's id, and every other failure is still logged."""

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flows.cli import _ExpectedFailures
from infra.errors import DataError

ROOT = Path(__file__).resolve().parents[2]


def _logger(name: str) -> tuple[logging.Logger, list[logging.LogRecord]]:
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append
    logger = logging.getLogger(name)
    logger.addFilter(_ExpectedFailures())
    logger.addHandler(handler)
    logger.propagate = False
    return logger, seen


def test_the_finished_state_record_of_a_run_that_failed_expectedly_is_dropped_and_others_kept():
    logger, seen = _logger("test.cli_failures.task_runs")
    for run, err in (("run-a", DataError("budget over")), ("run-b", RuntimeError("a bug"))):
        try:
            raise err
        except Exception:
            logger.error("Task run failed with exception: %r", err, exc_info=True, extra={"task_run_id": run})
        logger.error("Finished in state Failed('Task run encountered an exception %s: %s')", type(err).__name__, err,
                     extra={"task_run_id": run})
    logger.error("Finished in state Failed('Task run encountered an exception DataError: x')",
                 extra={"task_run_id": "run-c"})  # its traceback record was not a PretrainError's: kept
    logger.warning("stage corpus: another run is computing it", extra={"task_run_id": "run-a"})
    assert [r.getMessage() for r in seen] == [
        "Task run failed with exception: RuntimeError('a bug')",
        "Finished in state Failed('Task run encountered an exception RuntimeError: a bug')",
        "Finished in state Failed('Task run encountered an exception DataError: x')",
        "stage corpus: another run is computing it"]


@pytest.mark.e2e
def test_a_prefect_task_that_raises_a_pretrain_error_is_printed_by_nobody_but_the_cli(tmp_path):
    """Real Prefect (an ephemeral server in a fresh home): with the CLI's filters installed, the DataError's message
    is in no log record, while a RuntimeError in another task keeps its traceback and its failed state."""
    script = textwrap.dedent("""
        import os, sys
        os.environ["PREFECT_HOME"] = sys.argv[1]
        os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
        # As infra.runs sets for every run: on a busy 2-core machine the local API server can take > 20 s to start.
        os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
        os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
        from prefect import flow, task
        from flows.cli import _quiet_expected_failures
        from infra.errors import DataError

        _quiet_expected_failures()

        @task
        def fails(kind):
            raise (DataError if kind == "expected" else RuntimeError)(f"MESSAGE-{kind}")

        @flow
        def pipeline():
            for kind in ("expected", "bug"):
                try:
                    fails(kind)
                except Exception:
                    pass

        pipeline()
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "prefect")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = proc.stdout + proc.stderr
    assert "MESSAGE-expected" not in logged
    assert "Finished in state Failed('Task run encountered an exception RuntimeError: MESSAGE-bug')" in logged
    assert "Traceback" in logged and "RuntimeError: MESSAGE-bug" in logged
