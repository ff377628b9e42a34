"""Writes that are whole or absent: a file or folder is written under a temporary name beside its target and renamed
into place, so a reader, or a run resumed after a crash, sees the old content or the new, never part of either.

The temporary name is ``.<name>.tmp-<pid>-<random>``: hidden, unique to one writer (concurrent writers of one path
never share a temporary, and the last rename wins whole), and ending in neither the target's name nor its suffix,
so neither ``path.exists()`` nor a ``*.parquet`` glob takes a leftover for the target. It sits in the target's
folder, so the rename stays on one file system and is atomic (POSIX ``rename``).

Durable by default: the new bytes are fsynced before the rename and the folder after it, so after a power cut the
target is the old or the new content, not an empty or torn file. ``durable=False`` keeps the atomicity and skips
the fsyncs.

A killed writer (SIGKILL, power cut) leaves its hidden temporary behind. ``remove_temps`` clears those of a target
for writers that are the only one of it at a time; the artifact store's own ``.tmp-*`` attempts are swept by ``gc``.
"""

from __future__ import annotations

import errno
import glob
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

__all__ = ["TEMP_MARK", "atomic_dir", "atomic_file", "atomic_write_bytes", "atomic_write_text", "fsync_path",
           "fsync_tree", "open_file_modes", "publish_dir", "remove_temps", "temp_path"]

TEMP_MARK = ".tmp-"
_FILE_MODES = {"w": "x", "wt": "xt", "wb": "xb"}


def temp_path(path: str | Path) -> Path:
    """A fresh hidden sibling name for a temporary copy of ``path`` (nothing is created)."""
    path = Path(path)
    return path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def fsync_path(path: str | Path) -> None:
    """fsync a file or folder by name.

    Raises:
        OSError: the fsync fails (a full disk or an I/O error can surface only here), or ``path`` cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(path: Path) -> None:
    try:
        fsync_path(path)
    except OSError as err:
        # Some file systems (network, FUSE) refuse fsync on a folder; the rename itself is still atomic there.
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise


def fsync_tree(root: str | Path) -> None:
    """fsync every regular file under ``root``, then every folder bottom-up, ``root`` last; links are not followed.

    Raises:
        OSError: as ``fsync_path``.
    """
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                fsync_path(path)
        _fsync_folder(Path(folder))


def current_umask() -> int:
    """The process's umask; read from /proc where it can be (setting it to read it races with other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def open_file_modes(root: str | Path) -> None:
    """Give every regular file under ``root`` (links not followed) at least the permissions a plain ``open()``
    gives a new file, 0o666 less the umask; bits a file already has are kept.

    Some writers create their files owner-only (the safetensors library: 0o600), which would make one file of
    an artifact unreadable to the group and others who can read the rest.

    Raises:
        OSError: a file cannot be changed (not its owner).
    """
    wanted = 0o666 & ~current_umask()
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode) and stat.S_IMODE(mode) & wanted != wanted:
                os.chmod(path, stat.S_IMODE(mode) | wanted)


def remove_temps(path: str | Path) -> list[Path]:
    """Remove the temporaries of ``path`` left by killed writers; returns what was removed.

    Only for a target that one writer at a time writes: another writer's temporary in progress would go too.
    """
    path = Path(path)
    found = sorted(path.parent.glob(f".{glob.escape(path.name)}{TEMP_MARK}*"))
    for temp in found:
        if temp.is_dir() and not temp.is_symlink():
            shutil.rmtree(temp, ignore_errors=True)
        else:
            with suppress(FileNotFoundError):
                temp.unlink()
    return found


@contextmanager
def atomic_file(path: str | Path, mode: str = "wb", *, durable: bool = True, encoding: str | None = None,
                newline: str | None = None) -> Iterator[IO]:
    """Yield a file handle (``open`` with ``mode``) to write ``path``'s new content into; on a clean exit it replaces
    ``path`` in one rename. For writers that take a handle: ``DataFrame.to_parquet(f)``, ``np.save(f, a)``.

    Args:
        path: the target; its folder must exist. An existing file is replaced.
        mode: ``"wb"`` (default), ``"w"`` or ``"wt"``.
        durable: fsync the file before the rename and the folder after it.
        encoding, newline: as for ``open`` in text mode.

    Raises:
        ValueError: ``mode`` is not a write mode listed above.
        OSError: the temporary cannot be created (``FileNotFoundError`` when the folder is missing), written,
            fsynced or renamed.
        Whatever the body raises. On any error ``path`` is left as it was and the temporary is removed.
    """
    if mode not in _FILE_MODES:
        raise ValueError(f"atomic_file mode must be one of {sorted(_FILE_MODES)}, got {mode!r}")
    path = Path(path)
    while True:
        temp = temp_path(path)
        try:  # exclusive create: never shares (or truncates) another writer's temporary
            handle = open(temp, _FILE_MODES[mode], encoding=encoding, newline=newline)
            break
        except FileExistsError:
            continue
    try:
        with handle:
            yield handle
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            temp.unlink()
        raise
    if durable:
        _fsync_folder(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path``'s content with ``data``, whole or not at all.

    Raises:
        OSError: as ``atomic_file``; ``path`` is then left as it was.
    """
    with atomic_file(path, "wb", durable=durable) as handle:
        handle.write(data)


def atomic_write_text(path: str | Path, text: str, *, encoding: str = "utf-8", durable: bool = True) -> None:
    """Replace ``path``'s content with ``text`` (bytes as ``Path.write_text`` would write them), whole or not at all.

    Raises:
        OSError: as ``atomic_file``; ``path`` is then left as it was.
        UnicodeEncodeError: ``text`` cannot be encoded with ``encoding``; ``path`` is then left as it was.
    """
    with atomic_file(path, "w", durable=durable, encoding=encoding) as handle:
        handle.write(text)


def publish_dir(temp: str | Path, path: str | Path, *, replace: bool = False, durable: bool = True) -> bool:
    """Rename the filled folder ``temp`` to ``path``: the commit step of ``atomic_dir``, for writers that create
    their own temporary folder (any name in ``path``'s folder).

    Args:
        replace: an existing ``path`` is moved aside (to ``<temp>.old``), ``temp`` renamed in, then the old one
            removed; if the second rename fails the old one is put back. When False and ``path`` already exists as
            a folder (another writer finished first), ``path`` is kept and False returned; ``temp`` is then the
            caller's to remove.
        durable: fsync everything under ``temp`` before the rename and ``path``'s folder after it.

    Every file under ``temp`` gets at least the mode a plain ``open()`` gives (``open_file_modes``).

    Returns:
        True when ``temp`` became ``path``.

    Raises:
        OSError: a mode change, an fsync or a rename fails (``path`` is then as it was; ``temp`` is left for the
            caller to remove).
    """
    temp, path = Path(temp), Path(path)
    open_file_modes(temp)
    if durable:
        fsync_tree(temp)
    if replace and (path.exists() or path.is_symlink()):
        aside = temp.with_name(temp.name + ".old")
        os.rename(path, aside)
        try:
            os.rename(temp, path)
        except BaseException:
            os.rename(aside, path)
            raise
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            aside.unlink()
    else:
        try:
            os.rename(temp, path)
        except OSError:
            if not path.is_dir():
                raise
            return False
    if durable:
        _fsync_folder(path.parent)
    return True


@contextmanager
def atomic_dir(path: str | Path, *, replace: bool = False, durable: bool = True,
               clear_stale: bool = False) -> Iterator[Path]:
    """Yield a new empty temporary folder beside ``path`` to fill; on a clean exit it becomes ``path`` in one rename
    (see ``publish_dir`` for ``replace`` and ``durable``). Its folder must exist.

    With ``replace=False`` a ``path`` that exists by the end (another writer of the same content finished first) is
    kept and the new folder discarded: meant for targets whose name fixes their content, such as caches keyed by a
    digest. ``clear_stale`` first removes temporaries of ``path`` that killed writers left (``remove_temps``): only
    when no other writer of ``path`` can be running.

    Raises:
        OSError: the temporary cannot be created (``FileNotFoundError`` when the folder is missing), or an fsync or
            the rename fails.
        Whatever the body raises. On any error ``path`` is left as it was and the temporary is removed.
    """
    path = Path(path)
    if clear_stale:
        remove_temps(path)
    while True:
        temp = temp_path(path)
        try:
            temp.mkdir()
            break
        except FileExistsError:
            continue
    try:
        yield temp
        publish_dir(temp, path, replace=replace, durable=durable)
    finally:
        if temp.exists() or temp.is_symlink():
            shutil.rmtree(temp, ignore_errors=True)
