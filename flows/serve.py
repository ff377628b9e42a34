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
only; docs/guide/security.md says how to reach it from another machine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from infra.errors import ConfigError, PretrainError
from infra.runs import RunsLayout, ensure_folder

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
    """Stop the server's whole process group (uvicorn and its services), politely first."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def serve(config: Path, layout: RunsLayout, *, name: str, cron: str | None, interval: int | None,
          timezone: str | None, parameters: dict[str, Any], limit: int | None, port: int) -> None:
    """Serve the pipeline with a schedule until interrupted (Ctrl-C / SIGTERM).

    Must run after ``layout.prepare_environment()``. ``parameters`` are the flow's defaults for scheduled runs.

    Raises:
        ConfigError: both or neither of ``cron`` and ``interval``; an invalid cron string or time zone; a busy port.
        ServerError: the local Prefect server did not start.
    """
    if (cron is None) == (interval is None):
        raise ConfigError("give exactly one schedule: --cron 'MIN HOUR DOM MON DOW' or --interval SECONDS")
    if interval is not None and interval <= 0:
        raise ConfigError(f"--interval {interval}: must be a positive number of seconds")
    from prefect.client.schemas.schedules import construct_schedule

    try:  # before any server starts: a bad cron or time zone is a one-line error, not a traceback
        schedule = construct_schedule(cron=cron, interval=interval, timezone=timezone or "UTC")
    except ValueError as err:
        reason = err.errors()[0]["msg"] if hasattr(err, "errors") else str(err)
        raise ConfigError(f"schedule --cron {cron!r} --timezone {timezone or 'UTC'!r}: {reason}; give a five-field "
                          "cron string such as '0 3 * * *' and an IANA time zone such as Europe/Paris") from None
    # SIGTERM (systemd, kill, a container stop) unwinds like Ctrl-C, so the local server is stopped with us.
    signal.signal(signal.SIGTERM, _interrupt)
    server = None
    if not os.environ.get("PREFECT_API_URL"):
        server = start_local_server(layout, port)
        os.environ["PREFECT_API_URL"] = f"http://{LOOPBACK}:{port}/api"
        print(f"Prefect server on http://{LOOPBACK}:{port} (UI), database in {layout.prefect_home}\n"
              f"trigger a run from another shell: PREFECT_API_URL=http://{LOOPBACK}:{port}/api "
              f"prefect deployment run 'pretrain-pipeline/{name}'", flush=True)
    try:
        from prefect.deployments.runner import EntrypointType

        from flows.pipeline import pipeline

        # Module entrypoint: runs load ``flows.pipeline`` from the installed package, whatever the working directory.
        pipeline.serve(name=name, schedule=schedule, parameters={"config_path": str(config.resolve()),
                                                                 "runs_dir": str(layout.root), **parameters},
                       limit=limit, tags=["pretrain", name], entrypoint_type=EntrypointType.MODULE_PATH,
                       description=f"pretrain pipeline for {config} (runs folder {layout.root})")
    finally:
        if server is not None:
            stop_local_server(server)
