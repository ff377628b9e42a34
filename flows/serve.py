"""Scheduled runs: the pipeline served as a Prefect deployment by a long-running process.

    pretrain serve configs/demo.toml --cron "0 3 * * *"   # every night at 03:00 (UTC unless --timezone)
    pretrain serve configs/demo.toml --interval 21600     # every six hours

The deployment is ``pretrain-pipeline/<name>`` (``--name``, default the experiment's name); its parameters are the
config path, the runs folder and the flow's typed overrides (``refresh``, ``until``, ``seed``, ``launch``,
``processes``), editable per run in the Prefect UI or through the API. Runs are executed by this process, one at a
time by default (``--limit``), each in its own subprocess.

Where the API lives: with ``PREFECT_API_URL`` set, the deployment is registered on that server (a team's server,
or one started by ``prefect server start``). Without it, a local Prefect server (API, UI and scheduler) is started
on ``127.0.0.1:<port>`` with its database in the runs folder, and stopped when serving stops. It binds to loopback
only; docs/guide/security.md says how to reach it from another machine. Prefect's settings are pointed at that
server before the runner exists, so the runner and its flow runs talk to it (Prefect would otherwise start an
ephemeral API server of its own in this process, on the same database).

What the serving terminal shows: one line when serving starts (the deployment, its schedule, the UI and how to
trigger a run), each flow run's own output (its stage lines and progress lines: the run's subprocess writes to this
process's output), a line when a run starts and when it ends with its final state (``RunWatcher``, which follows
the deployment's runs through the API), and ``serving stopped`` when serving ends (Ctrl-C or SIGTERM). Prefect's
own records go to the serve log (``pretrain serve`` captures them, ``flows.runlog``), and each flow run's library
records to that run's log (``flows.pipeline.pipeline``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from infra.errors import ConfigError, PretrainError
from infra.lifetime import stop_process_group
from infra.runs import RunsLayout, ensure_folder
from flows.progress import duration

LOOPBACK = "127.0.0.1"


class ServerError(PretrainError):
    """The local Prefect server did not start."""


def start_local_server(layout: RunsLayout, port: int, *, timeout_s: float = 180.0) -> subprocess.Popen:
    """Start ``prefect server start`` on loopback with its database under ``layout.prefect_home``.

    Returns the server process (its own process group) once ``/api/health`` answers.

    Raises:
        ConfigError: ``port`` is already in use on 127.0.0.1.
        ServerError: the server exited or did not answer within ``timeout_s`` seconds (the end of its log is in
            the message; the full log is ``<runs>/prefect/server.log``).
    """
    with socket.socket() as probe:
        if probe.connect_ex((LOOPBACK, port)) == 0:
            raise ConfigError(f"--port {port}: something already listens on {LOOPBACK}:{port}; choose a free port, or "
                              f"point PREFECT_API_URL at that server if it is a Prefect server")
    ensure_folder(layout.prefect_home)
    log_path = layout.prefect_home / "server.log"
    env = {**os.environ, "PREFECT_HOME": str(layout.prefect_home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", LOOPBACK, "--port", str(port)],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://{LOOPBACK}:{port}/api/health"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"the Prefect server exited with code {proc.returncode}:\n{_tail(log_path)}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_local_server(proc)
    raise ServerError(f"the Prefect server did not answer {url} within {timeout_s:.0f} s:\n{_tail(log_path)}")


def stop_local_server(proc: subprocess.Popen) -> None:
    """Stop the server's whole process group (uvicorn and its services): SIGTERM, SIGKILL after 20 s."""
    stop_process_group(proc, grace_s=20.0)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def serve(config: Path, layout: RunsLayout, *, name: str, cron: str | None, interval: int | None,
          timezone: str | None, parameters: dict[str, Any], limit: int | None, port: int) -> None:
    """Serve the pipeline with a schedule until interrupted (Ctrl-C / SIGTERM); see the module's docstring for
    what the terminal shows.

    Must run after ``layout.prepare_environment()``. ``parameters`` are the flow's defaults for scheduled runs.

    Raises:
        ConfigError: both or neither of ``cron`` and ``interval``; an invalid cron string or time zone; a busy port.
        ServerError: the local Prefect server did not start.
    """
    if (cron is None) == (interval is None):
        raise ConfigError("give exactly one schedule: --cron 'MIN HOUR DOM MON DOW' or --interval SECONDS")
    if interval is not None and interval <= 0:
        raise ConfigError(f"--interval {interval}: must be a positive number of seconds")
    local = not os.environ.get("PREFECT_API_URL")
    api = f"http://{LOOPBACK}:{port}/api" if local else os.environ["PREFECT_API_URL"]
    from prefect.client.schemas.schedules import construct_schedule

    try:  # before any server starts: a bad cron or time zone is a one-line error, not a traceback
        schedule = construct_schedule(cron=cron, interval=interval, timezone=timezone or "UTC")
    except ValueError as err:
        reason = err.errors()[0]["msg"] if hasattr(err, "errors") else str(err)
        raise ConfigError(f"schedule --cron {cron!r} --timezone {timezone or 'UTC'!r}: {reason}; give a five-field "
                          "cron string such as '0 3 * * *' and an IANA time zone such as Europe/Paris") from None
    # SIGTERM (systemd, kill, a container stop) before the runner starts unwinds like Ctrl-C, so the local server is
    # stopped with us; once started, the runner's own SIGTERM handler stops it gracefully.
    signal.signal(signal.SIGTERM, _interrupt)
    server = None
    if local:
        print(f"starting a local Prefect server on http://{LOOPBACK}:{port} (database in {layout.prefect_home})",
              flush=True)
        server = start_local_server(layout, port)
        os.environ["PREFECT_API_URL"] = api  # for the processes started from here on
    deployment = f"pretrain-pipeline/{name}"
    watcher: RunWatcher | None = None
    try:
        from prefect.deployments.runner import EntrypointType
        from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

        from flows.pipeline import pipeline

        # The URL in the settings Prefect reads now (they may have been loaded before it was exported), so the
        # runner registers, polls and hands its flow runs this server, never an ephemeral one.
        with temporary_settings(updates={PREFECT_API_URL: api}):
            ui = PREFECT_UI_URL.value() or api.removesuffix("/api")

            def started(deployment_id: Any) -> None:
                nonlocal watcher
                print(serving_line(deployment, describe_schedule(cron, interval, timezone), ui, api, deployment_id),
                      flush=True)
                watcher = RunWatcher(api, str(deployment_id), deployment)
                watcher.start()

            # Module entrypoint: runs load ``flows.pipeline`` from the installed package, whatever the directory.
            run_runner(pipeline, name=name, schedule=schedule, limit=limit, tags=["pretrain", name],
                       parameters={"config_path": str(config.resolve()), "runs_dir": str(layout.root), **parameters},
                       description=f"pretrain pipeline for {config} (runs folder {layout.root})",
                       entrypoint_type=EntrypointType.MODULE_PATH, on_registered=started)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM before the runner took over
        pass
    finally:
        if watcher is not None:
            watcher.stop()
        if server is not None:
            stop_local_server(server)
    print(f"serving stopped: {deployment} no longer runs on its schedule"
          + ("; the local Prefect server is stopped" if server is not None else ""), flush=True)


def run_runner(flow: Any, *, name: str, on_registered: Callable[[Any], None], limit: int | None,
               **deployment: Any) -> None:
    """What ``flow.serve`` does, with ``on_registered(deployment_id)`` called once the deployment exists and before
    the runner polls, in place of Prefect's starting message; returns when the runner stops (Ctrl-C, SIGTERM)."""
    import asyncio

    from prefect.exceptions import TerminationSignal
    from prefect.runner import Runner

    runner = Runner(name=name, pause_on_shutdown=True, limit=limit)
    deployment_id = runner.add_flow(flow, name=name, **deployment)
    on_registered(deployment_id)
    try:
        asyncio.run(runner.start())
    except (KeyboardInterrupt, TerminationSignal):
        pass


def describe_schedule(cron: str | None, interval: int | None, timezone: str | None) -> str:
    """``cron '0 3 * * *' (UTC)`` or ``every 86400 s``."""
    if cron is not None:
        return f"cron {cron!r} ({timezone or 'UTC'})"
    return f"every {interval} s"


def serving_line(deployment: str, schedule: str, ui: str, api: str, deployment_id: Any) -> str:
    """The one line printed when serving starts."""
    return (f"serving {deployment} ({schedule}); Prefect UI {ui}/deployments/deployment/{deployment_id}; trigger a "
            f"run there or with: PREFECT_API_URL={api} prefect deployment run '{deployment}'; Ctrl-C stops serving")


TERMINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


class RunWatcher:
    """Follows the deployment's flow runs through the API (a thread polling every ``every_s`` seconds) and prints a
    line when one starts running and when it ends: its final state, how long it ran, and the state's message when
    it did not complete. Runs that existed before serving started are not reported; an API that does not answer
    (a busy server) is asked again at the next poll."""

    def __init__(self, api: str, deployment_id: str, deployment: str, every_s: float = 3.0,
                 write: Callable[[str], None] | None = None):
        self.api, self.deployment_id, self.deployment, self.every_s = api, deployment_id, deployment, every_s
        self._write = write or (lambda line: print(line, flush=True))
        self._seen: dict[str, str] | None = None  # run id → state type reported; None until the first poll
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="served-runs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling, after one last poll (a run that ended as serving stopped is still reported)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.poll()

    def _loop(self) -> None:
        while True:
            self.poll()
            if self._stop.wait(self.every_s):
                return

    def poll(self) -> None:
        """Report the changes since the last poll (the first poll only takes note of the runs that exist)."""
        runs = self._runs()
        if runs is None:
            return
        first = self._seen is None
        seen = self._seen if self._seen is not None else {}
        for run in sorted(runs, key=lambda r: r.get("expected_start_time") or ""):
            state = (run.get("state") or {}).get("type") or ""
            before = seen.get(run["id"])
            if before == state:
                continue
            seen[run["id"]] = state
            if first or before in TERMINAL:
                continue
            label = f"{self.deployment} run '{run.get('name')}'"
            if state == "RUNNING":
                self._write(f"{label}: started")
            elif state in TERMINAL:
                self._write(self._ended(label, run))
        self._seen = seen

    def _ended(self, label: str, run: dict[str, Any]) -> str:
        state = run.get("state") or {}
        line = f"{label}: {state.get('name') or state.get('type', '').title()}"
        if run.get("total_run_time"):
            line += f" after {duration(float(run['total_run_time']))}"
        message = " ".join(str(state.get("message") or "").split())
        if state.get("type") != "COMPLETED" and message:
            line += f": {message[:500]}"
        return line

    def _runs(self) -> list[dict[str, Any]] | None:
        try:
            response = httpx.post(f"{self.api}/flow_runs/filter", timeout=10.0, json={
                "deployments": {"id": {"any_": [self.deployment_id]}}, "sort": "EXPECTED_START_TIME_DESC",
                "limit": 50})
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        return response.json()
