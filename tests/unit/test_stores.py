"""The runs folder's stores are created one command at a time (``infra.stores``), and MLflow runs left RUNNING by a
process that has ended are marked FAILED by the next command (``Tracker.fail_abandoned_runs``)."""

import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from filelock import FileLock

from infra.lifetime import OWNER_HOST, OWNER_PID, OWNER_STARTED, process_start_ticks
from infra.runs import RunsLayout
from infra.tracking import Tracker

ROOT = Path(__file__).resolve().parents[2]

# One command's store creation; Prefect is pointed at a server (never contacted) so that none is started here.
OPEN = textwrap.dedent("""
    import sys
    from infra.runs import RunsLayout
    from infra.stores import open_stores

    layout = RunsLayout.resolve(sys.argv[1])
    open_stores(layout, "exp", server_log=layout.logs / "run.log", on_wait=lambda who: print("waiting", flush=True))
    print("opened", flush=True)
""")


def _open_stores(runs: Path) -> subprocess.Popen:
    env = {"PATH": "/usr/bin:/bin", "PREFECT_API_URL": "http://127.0.0.1:9/api", "PREFECT_HOME": str(runs / "prefect")}
    return subprocess.Popen([sys.executable, "-c", OPEN, str(runs)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_second_command_waits_for_the_stores_lock_then_shares_the_stores(tmp_path):
    layout = RunsLayout.resolve(tmp_path / "runs")
    layout.stores_lock.parent.mkdir(parents=True)
    with FileLock(str(layout.stores_lock)):  # a first command creating the stores
        second = _open_stores(layout.root)
        assert second.stdout.readline() == "waiting\n"
        time.sleep(0.5)
        assert second.poll() is None and not layout.mlflow_db.exists()
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err[-3000:]
    assert out == "opened\n"
    assert layout.mlflow_db.is_file() and layout.duckdb.is_file()


def test_runs_left_running_by_an_ended_process_are_marked_failed_and_others_left_alone(tmp_path):
    layout = RunsLayout.resolve(tmp_path / "runs")
    tracker = Tracker(layout.tracking_uri, layout.mlflow_artifacts, "exp")
    gone = subprocess.Popen(["true"])
    started = process_start_ticks(gone.pid)
    gone.wait()
    dead_owner = {OWNER_HOST: socket.gethostname(), OWNER_PID: str(gone.pid), OWNER_STARTED: str(started)}
    abandoned = tracker.start_run("pipeline", tags=dead_owner)
    abandoned_stage = tracker.start_run("sources", parent_id=abandoned, tags=dead_owner)
    live = tracker.start_run("pipeline")  # this process's
    elsewhere = tracker.start_run("pipeline", tags={**dead_owner, OWNER_HOST: "another-host"})
    finished = tracker.start_run("pipeline", tags=dead_owner)
    tracker.end_run(finished)

    assert sorted(tracker.fail_abandoned_runs()) == sorted([abandoned, abandoned_stage])
    status = {run: tracker.client.get_run(run).info.status for run in (abandoned, abandoned_stage, live, elsewhere,
                                                                      finished)}
    assert status == {abandoned: "FAILED", abandoned_stage: "FAILED", live: "RUNNING", elsewhere: "RUNNING",
                      finished: "FINISHED"}
    assert "has ended" in tracker.client.get_run(abandoned).data.tags["pretrain.failed_reason"]
    assert tracker.fail_abandoned_runs() == []
