"""Create the runs folder's stores one command at a time.

MLflow migrates a new SQLite file when it first opens it, and Prefect's API server migrates its database when it
starts; two first runs on one fresh folder would run the same Alembic migration at once, and the second fails
(``Online migration expected to match one row ... 'alembic_version'``). ``open_stores`` does every creation and
migration under the file lock ``RunsLayout.stores_lock``, so a second run waits for the first and then shares the
stores. The stores need no lock once they exist: SQLite and DuckDB serialise writers themselves (``Warehouse``
retries while another process holds the file), and Optuna's journal is created and appended to under Optuna's own
lock file beside it (``tasks.sweep.study.open_storage``).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from infra.leases import hold
from infra.runs import RunsLayout, ensure_folder


@contextmanager
def stores_lock(layout: RunsLayout,
                on_wait: Callable[[dict[str, Any] | None], None] = lambda who: None) -> Iterator[None]:
    """Hold the runs folder's stores lock (``infra.leases.hold``: an OS file lock, released with its process if
    that is killed); ``on_wait`` is called once when another process holds it, with its record (pid, host, since;
    None when unknown).

    Raises:
        RunsFolderError: a file is in the way of the lock's folder.
    """
    with hold(layout.stores_lock, on_wait):
        yield


def open_stores(layout: RunsLayout, experiment: str, *, server_log: Path,
                on_wait: Callable[[dict[str, Any] | None], None] = lambda who: None) -> list[str]:
    """Create (or migrate) MLflow's store with the experiment, the DuckDB file and, when Prefect runs without
    ``PREFECT_API_URL``, its local API server with its database, all under the stores lock. Marks FAILED the MLflow
    runs left RUNNING by a process of this host that has ended (``Tracker.fail_abandoned_runs``); returns their
    ids. Must run after ``layout.prepare_environment()``.

    The local API server is Prefect's own (``SubprocessASGIServer``, the one its client would start on first use);
    its output goes to ``server_log``, not to the terminal, and the terminal's Ctrl-C does not reach it
    (``infra.lifetime.shielded_from_terminal_interrupts``): the run still records how it ended when interrupted,
    and the server ends with the run.

    Raises:
        RunsFolderError: a file is in the way of the lock's folder.
        RuntimeError: Prefect's local API server did not start (Prefect's message).
    """
    from infra.tracking import Tracker
    from infra.warehouse import Warehouse

    with stores_lock(layout, on_wait):
        tracker = Tracker(layout.tracking_uri, layout.mlflow_artifacts, experiment)
        abandoned = tracker.fail_abandoned_runs()
        with Warehouse(layout.duckdb).connect():
            pass
        _start_prefect_server(server_log)
    return abandoned


def _start_prefect_server(server_log: Path) -> None:
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return
    from prefect.server.api.server import SubprocessASGIServer

    from infra.lifetime import shielded_from_terminal_interrupts

    # Prefect's client reuses this instance (one per port; None = any free port).
    server = SubprocessASGIServer()
    if server.running:
        return
    ensure_folder(server_log.parent)
    # The server inherits stdout and stderr: point them at the log while it is spawned, so its tracebacks (a full
    # disk makes hundreds) stay off the terminal.
    with open(server_log, "ab") as out:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            with shielded_from_terminal_interrupts():  # Ctrl-C stops the run, which then stops the server
                server.start()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
