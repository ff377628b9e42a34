"""Processes a run starts end with it, even when its own process is killed with SIGKILL (``infra.lifetime``); a
process's identity survives the reuse of its PID."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from infra.lifetime import OWNER_HOST, OWNER_PID, OWNER_STARTED, owner_gone, owner_tags, process_start_ticks

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")

# A stand-in for `pretrain run`: ties itself, then starts what a run starts (an exec'd helper in its process group,
# one in a session of its own as `accelerate launch` is, a forked pool worker) and prints their PIDs.
PARENT = textwrap.dedent("""
    import multiprocessing, subprocess, sys, time
    from infra.lifetime import tie_to_this_process

    tie_to_this_process()
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    session = subprocess.Popen(["sleep", "300"], start_new_session=True)
    forked = multiprocessing.get_context("fork").Process(target=time.sleep, args=(300,))
    forked.start()
    print(helper.pid, session.pid, forked.pid, flush=True)
    time.sleep(300)
""")


def _alive(pid: int) -> bool:
    """Running (not a zombie waiting for whoever inherited it to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pids, timeout_s: float) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while (left := {p for p in pids if _alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _start_parent():
    proc = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    children = [int(p) for p in proc.stdout.readline().split()]
    assert len(children) == 3 and all(_alive(p) for p in children)
    return proc, children


def test_sigkill_of_the_run_process_ends_every_process_it_started():
    proc, children = _start_parent()
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not _wait_gone(children, timeout_s=15)
    finally:
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_supervisor_ends_when_the_run_ends_and_leaves_other_processes_alone():
    bystander = subprocess.Popen(["sleep", "300"])  # this test's own child: it carries no run's token
    proc, children = _start_parent()
    supervisors = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _is_supervisor_of(p, proc.pid)]
    try:
        assert len(supervisors) == 1
        proc.terminate()
        proc.wait()
        assert not _wait_gone(children + supervisors, timeout_s=15)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _is_supervisor_of(proc_dir: Path, pid: int) -> bool:
    try:
        argv = (proc_dir / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a.endswith(b"infra/lifetime.py") for a in argv) and str(pid).encode() in argv


def test_an_owner_is_gone_once_its_process_has_ended_even_if_its_pid_is_reused():
    assert not owner_gone(owner_tags())
    child = subprocess.Popen(["sleep", "30"])
    tags = {OWNER_HOST: socket.gethostname(), OWNER_PID: str(child.pid),
            OWNER_STARTED: str(process_start_ticks(child.pid))}
    assert not owner_gone(tags)
    assert owner_gone({**tags, OWNER_STARTED: str(int(tags[OWNER_STARTED]) - 1)})  # the PID of another process
    child.kill()
    child.wait()
    assert owner_gone(tags)
    assert not owner_gone({**tags, OWNER_HOST: "another-host"})  # its processes cannot be checked from here
    assert not owner_gone({})


IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(300)"


def test_stopping_a_run_terminates_its_processes_and_kills_those_that_ignore_sigterm():
    from infra.lifetime import TOKEN_ENV, run_processes, stop_run_processes

    token = f"test-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, TOKEN_ENV: token}
    polite = subprocess.Popen(["sleep", "300"], env=env)
    stubborn = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], env=env, stdout=subprocess.PIPE, text=True)
    bystander = subprocess.Popen(["sleep", "300"])  # no token: not the run's
    try:
        assert stubborn.stdout.readline().strip() == "ready"
        assert sorted(run_processes(token)) == sorted([polite.pid, stubborn.pid])
        started = time.monotonic()
        assert sorted(stop_run_processes(token, grace_s=0.5)) == sorted([polite.pid, stubborn.pid])
        assert polite.wait(timeout=10) == -signal.SIGTERM
        assert stubborn.wait(timeout=10) == -signal.SIGKILL  # after the grace period
        assert time.monotonic() - started >= 0.5
        assert bystander.poll() is None and run_processes(token) == []
    finally:
        for proc in (polite, stubborn, bystander):
            proc.kill()
            proc.wait()


# A process group's leader with a child in its group; "ignores": both ignore SIGTERM (SIG_IGN survives exec).
GROUP_LEADER = textwrap.dedent("""
    import signal, subprocess, sys, time
    if sys.argv[1] == "ignores":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(["sleep", "300"])
    print(child.pid, flush=True)
    time.sleep(300)
""")


def _start_group(behaviour: str) -> tuple[subprocess.Popen, int]:
    leader = subprocess.Popen([sys.executable, "-c", GROUP_LEADER, behaviour], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    return leader, int(leader.stdout.readline())


@pytest.mark.parametrize("behaviour, grace_s, signalled", [
    ("ignores", 0.5, signal.SIGKILL),
    ("exits", 10.0, signal.SIGTERM),
])
def test_stop_process_group_terminates_the_group_and_kills_it_only_after_the_grace(behaviour, grace_s, signalled):
    from infra.lifetime import stop_process_group

    leader, child = _start_group(behaviour)
    try:
        started = time.monotonic()
        assert stop_process_group(leader, grace_s) == -signalled
        took = time.monotonic() - started
        assert not _wait_gone([child], 5.0), "the leader's child outlived its group's stop"
        if signalled == signal.SIGKILL:
            assert took >= grace_s
        else:
            assert took < grace_s / 2
    finally:
        if leader.poll() is None:
            os.killpg(leader.pid, signal.SIGKILL)
            leader.wait()
        leader.stdout.close()


def test_stop_process_group_leaves_an_ended_process_alone():
    from infra.lifetime import stop_process_group

    done = subprocess.Popen(["true"], start_new_session=True)
    done.wait()
    assert stop_process_group(done, grace_s=0.1) == 0


# A run stand-in that starts the supervisor as a plain script (not ``-I -S``, so that coverage.py measures it);
# ``no-pidfd`` takes away ``os.pidfd_open`` in the supervisor, which then waits on the parent-death signal.
SUPERVISED = textwrap.dedent("""
    import os, subprocess, sys, time
    token = sys.argv[2]
    env = {**os.environ, "PRETRAIN_RUN_TOKEN": token}
    worker = subprocess.Popen(["sleep", "300"], env=env)
    prelude = "import os; del os.pidfd_open; " if sys.argv[1] == "no-pidfd" else ""
    code = prelude + ("import runpy, sys; sys.argv = [sys.argv[1], *sys.argv[2:]]; "
                      "runpy.run_path(sys.argv[0], run_name='__main__')")
    supervisor = subprocess.Popen([sys.executable, "-c", code, "infra/lifetime.py", str(os.getpid()), token],
                                  env=env, start_new_session=True)
    print(worker.pid, supervisor.pid, flush=True)
    time.sleep(300)
""")


@pytest.mark.parametrize("wait", ["pidfd", "no-pidfd"])
def test_the_supervisor_script_stops_the_run_when_its_parent_is_killed(wait):
    token = f"test-{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISED, wait, token], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    worker, supervisor = (int(p) for p in proc.stdout.readline().split())
    try:
        time.sleep(1.0)  # the supervisor is waiting (it has opened its pidfd or set its death signal)
        assert _alive(worker) and _alive(supervisor)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not _wait_gone([worker, supervisor], timeout_s=15)
    finally:
        for pid in (worker, supervisor):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
