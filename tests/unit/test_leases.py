"""Leases say who holds them: a waiting run and `pretrain status` name the run computing an artifact (its pid),
and a killed holder's record is not believed (infra/leases.py)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from flows.config import load_config
from flows.status import stage_statuses
from infra.artifacts import ArtifactStore
from infra.leases import describe
from infra.runs import RunsLayout

ROOT = Path(__file__).resolve().parents[2]

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from infra.artifacts import ArtifactStore
    with ArtifactStore(Path(sys.argv[1])).computing("main", "k2"):
        Path(sys.argv[2]).touch()
        time.sleep(600)
""")


def test_a_waiter_is_told_which_process_holds_the_lease_and_a_killed_one_is_forgotten(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(store.root), str(tmp_path / "held")], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "held").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "holder never took the lease"
            time.sleep(0.05)
        assert store.lease_holder("main", "k2")["pid"] == proc.pid
        seen = []
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert store.lease_holder("main", "k2") is None  # its record outlives it, but its pid is gone
        with store.computing("main", "k2", on_wait=seen.append, poll_s=0.05):
            assert store.lease_holder("main", "k2")["pid"] == os.getpid()
        assert seen == [] and store.lease_holder("main", "k2") is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_waiter_gets_the_holders_record(tmp_path):
    import threading

    store = ArtifactStore(tmp_path / "artifacts")
    seen = []

    def wait_for_lease():
        with store.computing("main", "k2", on_wait=seen.append, poll_s=0.05):
            pass

    with store.computing("main", "k2"):
        # flock locks are per open file: a second FileLock in this process contends like another process would
        waiter = threading.Thread(target=wait_for_lease)
        waiter.start()
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
    waiter.join(timeout=10)
    assert seen and seen[0]["pid"] == os.getpid()
    assert describe(seen[0]).startswith(f"another run (pid {os.getpid()}, since ")


def test_status_names_the_run_computing_a_stage(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_config(ROOT / "configs/smoke.toml")
    layout = RunsLayout(tmp_path / "runs")
    first = stage_statuses(cfg, layout)
    assert all(s.computing_by is None for s in first)
    with ArtifactStore(layout.artifacts).computing("corpus", first[2].key):
        statuses = {s.stage: s for s in stage_statuses(cfg, layout)}
    assert statuses["corpus"].computing_by["pid"] == os.getpid()
    assert statuses["tokenizer"].computing_by is None


def test_a_run_waiting_for_the_stores_lock_says_who_holds_it_and_why(tmp_path):
    import threading

    from flows.cli import stores_wait_line
    from infra.stores import stores_lock

    layout = RunsLayout(tmp_path / "runs")
    seen = []

    def wait_for_stores():
        with stores_lock(layout, on_wait=seen.append):
            pass

    with stores_lock(layout):
        waiter = threading.Thread(target=wait_for_stores)
        waiter.start()
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
    waiter.join(timeout=10)
    line = stores_wait_line(seen[0], layout)
    assert line.startswith(f"waiting for another run (pid {os.getpid()}, since ")
    assert str(layout.stores_lock) in line and "creating" not in line
