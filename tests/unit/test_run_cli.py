"""The real `pretrain run` command: a third-party failure is one ``error:`` line with its traceback in the run's log,
and a SIGKILL of the command alone leaves no process of the run behind (the Prefect API server included)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _pretrain_run(runs: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flows.cli", "run", "configs/smoke.toml", "--until", "sources",
                             "--runs-dir", str(runs)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, **kw)


def test_a_third_party_exception_is_one_error_line_and_a_traceback_in_the_runs_log(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "mlflow.db").write_bytes(b"not a SQLite file " * 100)  # MLflow's store cannot open it
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PRETRAIN_TRACKING_URI")}
    proc = _pretrain_run(runs, env=env)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "DatabaseError" in errors[0] and "file is not a database" in errors[0], out[-3000:]
    assert "Traceback" not in out
    logs = list((runs / "logs").glob("run-*.log"))
    assert len(logs) == 1 and f"(traceback in {logs[0]})" in errors[0]
    assert "Traceback (most recent call last)" in logs[0].read_text()


def _processes_of(runs: Path, exclude: set[int]) -> dict[int, str]:
    """Live processes (not zombies) whose environment or command line names ``runs``."""
    needle, found = str(runs).encode(), {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if state != "Z" and (needle in cmdline or needle in environ):
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")[:200]
    return found


@pytest.mark.e2e
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
def test_sigkill_of_the_run_process_alone_leaves_no_process_of_the_run(tmp_path):
    runs = tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # the run starts its own API server
    proc = _pretrain_run(runs, env=env)
    try:
        deadline = time.monotonic() + 240
        while not any("uvicorn" in cmd for cmd in _processes_of(runs, {os.getpid()}).values()):
            assert proc.poll() is None and time.monotonic() < deadline, "the Prefect API server never started"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 15
        while (left := _processes_of(runs, {os.getpid()})) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left
    finally:
        for pid in _processes_of(runs, {os.getpid()}):
            os.kill(pid, signal.SIGKILL)
        proc.stdout.close()
