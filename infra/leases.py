"""File-lock leases that say who holds them.

A lease is an OS file lock (``flock`` through ``filelock``): a killed holder releases it with its process, so a crash
never leaves a stale lock. The lock file itself tells nothing about its holder (every waiter opens and truncates it),
so the holder writes ``<lock>.holder.json`` beside it once it holds the lock (pid, host, UTC start) and removes it
before releasing. A waiting run and ``pretrain status`` read it to say what they wait for; a record left by a killed
holder on this host is recognised by its pid being gone.

    with hold(layout.stores_lock, on_wait=lambda who: print(f"waiting for {describe(who)}")):
        ...
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from filelock import FileLock, Timeout

from infra.runs import ensure_folder


def holder_file(lock: Path) -> Path:
    """Where the holder of ``lock`` records itself: ``<lock>.holder.json``."""
    return lock.with_name(lock.name + ".holder.json")


@contextmanager
def hold(lock: Path, on_wait: Callable[[dict[str, Any] | None], None] = lambda who: None,
         poll_s: float = 0.5) -> Iterator[None]:
    """Hold the lease ``lock``, waiting (polling every ``poll_s`` seconds) while another process holds it;
    ``on_wait`` is called once, before waiting, with the holder's record (:func:`holder`; None when unknown).

    Raises:
        RunsFolderError: a file is in the way of the lock's folder.
    """
    ensure_folder(lock.parent)
    file_lock = FileLock(str(lock))
    try:
        file_lock.acquire(timeout=0)
    except Timeout:
        on_wait(holder(lock))
        file_lock.acquire(poll_interval=poll_s)
    record = holder_file(lock)
    try:
        record.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                      "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}))
        yield
    finally:
        record.unlink(missing_ok=True)
        file_lock.release()


def holder(lock: Path) -> dict[str, Any] | None:
    """The record of the process holding ``lock`` (``pid``, ``host``, ``since``), or None: no record, an unreadable
    one, or one left by a process of this host that has ended."""
    try:
        record = json.loads(holder_file(lock).read_text())
        pid, host = int(record["pid"]), str(record["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host == socket.gethostname() and not _alive(pid):
        return None
    return record


def describe(record: dict[str, Any] | None) -> str:
    """``another run (pid 1234, since 2026-12-05T21:03:23+00:00)`` ("on host H" when it is another machine's), or
    ``another run`` without a record."""
    if record is None:
        return "another run"
    where = "" if record.get("host") == socket.gethostname() else f" on host {record.get('host')}"
    return f"another run (pid {record['pid']}{where}, since {record.get('since', '?')})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
