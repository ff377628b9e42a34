"""The processes of a run die with it, even when its own process is killed with SIGKILL.

``tie_to_this_process()`` (called once by ``pretrain run`` and ``pretrain serve``, from the main thread, before any
child starts) marks the run's environment with ``PRETRAIN_RUN_TOKEN`` and starts a small supervisor process (this
file run as a script). Every program the run starts inherits the token: the Prefect API server (Prefect spawns it
with ``subprocess.Popen``, out of our reach), ``accelerate launch`` and its workers, forkserver pools, Ray. When the
run's process ends, however it ends, the supervisor wakes (``pidfd``, else ``PR_SET_PDEATHSIG``) and stops every
process whose environment carries the token: SIGTERM, then SIGKILL after ``GRACE_S``. Children forked without exec
(a ``fork`` process pool) keep the parent's startup environment, which has no token; they are bound to their parent
with ``PR_SET_PDEATHSIG`` when forked.

How a run stops when asked (``StopSignals``): SIGINT and SIGTERM raise ``KeyboardInterrupt`` in the run's main
thread, so the run unwinds (an unfinished stage keeps its checkpoints) and the command exits with 128 + the signal's
number. Ctrl-C sends SIGINT to the terminal's whole foreground process group, not only to the run; the run's helper
processes are started inside ``shielded_from_terminal_interrupts()`` (SIGINT blocked in the calling thread; a
child inherits the mask across fork and exec, as Ray does for its own processes), so the Prefect API server stays up
while the run records how it ended, and pool workers print no traceback of their own. They end with the run.

``stop_process_group`` stops one child started in a session of its own (the launched training workers, a Prefect
server that ``pretrain serve`` starts): SIGTERM to its group, SIGKILL after a grace period.

Also the identity of a process that outlives reuse of its PID: ``owner_tags`` / ``owner_gone`` (host, PID and start
time), which MLflow runs carry so that a run left RUNNING by a dead process can be recognised.

This file runs as the supervisor with ``python -I -S``: it imports the standard library only.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

TOKEN_ENV = "PRETRAIN_RUN_TOKEN"
GRACE_S = 3.0  # between SIGTERM and SIGKILL: the Prefect server and training workers stop in well under a second
_PR_SET_PDEATHSIG = 1

OWNER_HOST, OWNER_PID, OWNER_STARTED = "pretrain.owner.host", "pretrain.owner.pid", "pretrain.owner.started"


_prctl = None


def _libc_prctl():
    global _prctl
    if _prctl is None:
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    return _prctl


def _set_parent_death_signal(sig: int) -> None:
    """``prctl(PR_SET_PDEATHSIG, sig)``: the kernel sends ``sig`` to this process when the thread that created it
    ends. Raises OSError when the call fails."""
    if _libc_prctl()(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


_forking_pid: int | None = None
_tied = False
_supervisors: list[subprocess.Popen] = []  # held: a dropped Popen of a live process warns


def _before_fork() -> None:
    global _forking_pid
    _forking_pid = os.getpid()


def _after_fork_in_child() -> None:
    _set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != _forking_pid:  # the parent died before the signal was set
        os._exit(1)


def tie_to_this_process() -> str:
    """Make every process this one starts from now on end when it ends; returns the run's token.

    Call from the main thread (a forked child's death signal follows the thread that forked it; pools are used
    within the thread that makes them). Does nothing but return the token on a system without ``/proc`` (not Linux).

    Raises:
        OSError: the supervisor process cannot be started.
    """
    token = os.environ[TOKEN_ENV] = f"{os.getpid()}-{uuid.uuid4().hex}"  # a nested run gets its own
    global _tied
    if not Path("/proc/self/environ").exists():
        return token
    if not _tied:
        _libc_prctl()  # resolved now, not in a forked child
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
        _tied = True
    # Its own session: a Ctrl-C meant for the run does not reach it; no pipe of ours stays open in it.
    _supervisors.append(subprocess.Popen([sys.executable, "-I", "-S", str(Path(__file__).resolve()), str(os.getpid()), token],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True))
    return token


def run_processes(token: str, *, exclude: int | None = None) -> list[int]:
    """PIDs of the live processes whose environment carries ``TOKEN_ENV=token`` (zombies have none)."""
    needle = f"\0{TOKEN_ENV}={token}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == exclude:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in b"\0" + environ + b"\0":
            found.append(int(entry.name))
    return found


def stop_run_processes(token: str, grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM every process of the run ``token`` except this one, SIGKILL those left after ``grace_s``; returns
    the PIDs that were signalled."""
    me = os.getpid()
    signalled = run_processes(token, exclude=me)
    for pid in signalled:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (left := run_processes(token, exclude=me)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        _signal(pid, signal.SIGKILL)
    return signalled


def stop_process_group(proc: subprocess.Popen, grace_s: float) -> int | None:
    """Stop the process group that ``proc`` leads (started with ``start_new_session=True``): SIGTERM to the group,
    then SIGKILL to it when ``proc`` has not ended ``grace_s`` seconds later. Returns ``proc``'s exit status (None
    only if it outlives even SIGKILL, which a process in uninterruptible sleep can for a while). A ``proc`` that
    has already ended is left alone: its group's number may belong to another process by now."""
    if proc.poll() is not None:
        return proc.returncode
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=grace_s)
    except ProcessLookupError:  # the group ended between the poll and the signal
        return proc.wait()
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        return proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        return None


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_for_exit(pid: int) -> None:
    """Return once ``pid``, this process's parent, has ended."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): the kernel signals the parent's end instead
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        _set_parent_death_signal(signal.SIGUSR1)
        while os.getppid() == pid:
            signal.sigtimedwait({signal.SIGUSR1}, 1.0)
        return
    if os.getppid() != pid:  # it ended before the pidfd was opened, and the PID may be another's by now
        return
    select.select([fd], [], [])


def _supervise(parent: int, token: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _wait_for_exit(parent)
    stop_run_processes(token)


class StopSignals:
    """SIGINT and SIGTERM raise ``KeyboardInterrupt`` in the main thread until ``restore()`` puts the earlier
    handlers back; ``signum`` is the first of them received (None: none yet), ``exit_code`` 128 + its number (130
    when a ``KeyboardInterrupt`` came without one of these signals).

    A second signal while the run is already unwinding ends the process at once (``os._exit``): the supervisor
    stops the run's other processes, and the next run resumes as after a kill. Prefect replaces the SIGTERM handler
    while a flow runs and sends the signal again once the flow has ended (``prefect.utilities.engine
    .capture_sigterm``); that second delivery is this class's first.

    Must be made in the main thread.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum or signal.SIGINT).name

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            os._exit(128 + signum)
        self.signum = signum
        if _DEFERRED[0]:  # inside a store write: raised when the write is done (``interrupts_deferred``)
            _DEFERRED[1] = signum
            return
        raise KeyboardInterrupt(signal.Signals(signum).name)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    @staticmethod
    def before_exit() -> None:
        """Spare this process's shutdown its full garbage collections, which take seconds once a stage has loaded
        its data: the process is about to end and the system frees its memory. Nothing changes until the process
        exits (an in-process caller, a test, keeps its collector); then the collector is off for the ``atexit``
        handlers and the interpreter's finalisation (objects are still finalised as their modules are cleared)."""
        atexit.unregister(_skip_final_collections)
        atexit.register(_skip_final_collections)  # registered last, so it runs first


def _skip_final_collections() -> None:
    gc.disable()
    gc.freeze()


# [depth of interrupts_deferred blocks in the main thread, the signal received inside them (0: none)]
_DEFERRED = [0, 0]


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Inside, a stop signal ``StopSignals`` handles does not interrupt the main thread; its ``KeyboardInterrupt``
    is raised when the outermost block ends. For writes to a store that a ``KeyboardInterrupt`` would leave inside
    an open transaction (an MLflow SQLite insert cut short keeps its write lock, and every later write of the run,
    recording the stop included, then waits out SQLite's busy timeout). Other threads: no effect."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _DEFERRED[0] += 1
    try:
        yield
    finally:
        _DEFERRED[0] -= 1
        if not _DEFERRED[0] and _DEFERRED[1]:
            signum, _DEFERRED[1] = _DEFERRED[1], 0
            raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def shielded_from_terminal_interrupts() -> Iterator[None]:
    """Block SIGINT in the calling thread while inside: a process started meanwhile inherits the blocked signal
    (across fork and exec), so the terminal's Ctrl-C, which reaches its whole foreground process group, does not
    reach it. A SIGINT that arrives meanwhile is delivered to this thread on the way out."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def process_start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22); None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def owner_tags() -> dict[str, str]:
    """This process's identity as run tags: host, PID and start time (a PID alone is reused)."""
    started = process_start_ticks(os.getpid())
    return {OWNER_HOST: socket.gethostname(), OWNER_PID: str(os.getpid()),
            OWNER_STARTED: "" if started is None else str(started)}


def owner_gone(tags: dict[str, str]) -> bool:
    """Whether the process named by ``owner_tags`` has ended. False when the tags are missing or name another host
    (its processes cannot be checked from here) or when start times are unknown and the PID exists."""
    if tags.get(OWNER_HOST) != socket.gethostname() or not tags.get(OWNER_PID, "").isdigit():
        return False
    started = process_start_ticks(int(tags[OWNER_PID]))
    if started is None:
        return Path("/proc/self").exists()  # on Linux a process without /proc/<pid>/stat has ended
    return bool(tags.get(OWNER_STARTED)) and str(started) != tags[OWNER_STARTED]


if __name__ == "__main__":
    _supervise(int(sys.argv[1]), sys.argv[2])
