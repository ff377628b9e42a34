"""Extracting archives a user points at (and the data tarballs of ``.deb`` packages) without letting a member write
outside the destination.

Tar archives go through the standard library's ``data`` extraction filter (PEP 706), which refuses absolute paths,
``..`` components, links that point outside the destination, and device files; zip archives are checked member by
member with the same rules (zip has no links to follow, but names can still climb). A refused archive raises
``SourceError`` naming the member and leaves nothing behind in the destination; so does a damaged one (truncated or
corrupt compressed data, encrypted zip members, an unknown zip compression method).

``unpack_cached`` unpacks an archive once into a folder named by the SHA-256 of its bytes, so the same content is
found again whatever the archive's name, path or mtime.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import IO

from infra.atomic import atomic_dir
from infra.errors import SourceError
from infra.runs import ensure_folder

# Names (any case) read as archives: tar, optionally gzip/xz/bzip2-compressed, and zip.
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".zip")
# What the decompressors raise on damaged data (zlib for gzip/deflate, lzma for xz, EOFError when data ends early).
_DAMAGED = (EOFError, zlib.error, lzma.LZMAError)


def is_archive(path: Path) -> bool:
    """True for file names ending in one of ``ARCHIVE_SUFFIXES`` (any case)."""
    return Path(path).name.lower().endswith(ARCHIVE_SUFFIXES)


def _damaged_os_error(err: OSError) -> bool:
    # gzip's BadGzipFile and bz2's "Invalid data stream" are OSErrors without an errno; real I/O errors have one.
    return err.errno is None


def _refuse(archive: str, member: str, why: str) -> SourceError:
    return SourceError(f"{archive}: member {member!r} {why}; the archive is refused (nothing was extracted)")


def extract_tar(source: Path | IO[bytes], destination: Path, *, name: str | None = None) -> list[str]:
    """Extract a tar archive (a path, or an open binary stream such as ``dpkg-deb --fsys-tarfile`` output) into
    ``destination`` and return the member names written.

    Raises:
        SourceError: a member is absolute, climbs out with ``..``, is a link escaping the destination, or is a
            device/special file; or the archive is unreadable. ``destination`` is then left as it was.
    """
    label = name or str(source)
    destination = Path(destination)
    staging = destination.parent / f".{destination.name}.extract-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        opened = tarfile.open(source, "r:*") if isinstance(source, (str, Path)) else \
            tarfile.open(fileobj=source, mode="r|*")
        with opened as archive:
            names = []
            for member in archive:
                if member.name.startswith(("/", os.sep)) or PurePosixPath(member.name).is_absolute():
                    # The data filter would silently strip the slash; an absolute member is refused outright.
                    raise _refuse(label, member.name, "has an absolute path")
                try:
                    checked = tarfile.data_filter(member, str(staging))
                except tarfile.FilterError as err:
                    raise _refuse(label, member.name, _why(err)) from err
                if checked is None:
                    continue
                archive.extract(checked, staging, filter="data")
                names.append(member.name)
    except (tarfile.TarError, *_DAMAGED) as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise SourceError(f"{label}: not a readable tar archive ({type(err).__name__}: {err})") from err
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        if _damaged_os_error(err):
            raise SourceError(f"{label}: not a readable tar archive ({type(err).__name__}: {err})") from err
        if isinstance(err, _COLLISIONS):
            raise _collision(label, err) from err
        raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _move_into(staging, destination)
    return names


# A member written where an earlier one put a file (``a`` then ``a/b``), or a file where it put a folder.
_COLLISIONS = (NotADirectoryError, FileExistsError, IsADirectoryError)


def _collision(label: str, err: OSError) -> SourceError:
    where = Path(err.filename).name if err.filename else "?"
    return SourceError(f"{label}: two members collide at {where!r} (a file and a folder of the same name, or a "
                       f"member below a link); the archive is refused (nothing was extracted); repack it without "
                       f"the clash")


def _why(err: tarfile.FilterError) -> str:
    if isinstance(err, tarfile.AbsolutePathError):
        return "has an absolute path"
    if isinstance(err, tarfile.OutsideDestinationError):
        return "would be written outside the destination ('..' components)"
    if isinstance(err, tarfile.AbsoluteLinkError):
        return "is a link to an absolute path"
    if isinstance(err, tarfile.LinkOutsideDestinationError):
        return "is a link pointing outside the destination"
    if isinstance(err, tarfile.SpecialFileError):
        return "is a device or other special file"
    return f"is refused by the extraction filter ({err})"


def extract_zip(source: Path, destination: Path) -> list[str]:
    """Extract a zip archive into ``destination``; return the member names written.

    Raises:
        SourceError: a member name is absolute (``/x``, ``C:\\x``) or climbs out with ``..``, the file is not a
            zip archive, or a member is damaged, encrypted or compressed with a method Python cannot read.
            ``destination`` is then left as it was.
    """
    destination = Path(destination)
    try:
        with zipfile.ZipFile(source) as archive:
            members = archive.infolist()
            for member in members:
                path = PurePosixPath(member.filename.replace("\\", "/"))
                if path.is_absolute() or (path.parts and ":" in path.parts[0]):
                    raise _refuse(str(source), member.filename, "has an absolute path")
                if ".." in path.parts:
                    raise _refuse(str(source), member.filename, "would be written outside the destination ('..')")
            staging = destination.parent / f".{destination.name}.extract-{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            try:
                archive.extractall(staging)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
    # zipfile raises RuntimeError for an encrypted member and NotImplementedError for an unknown compression method.
    except (zipfile.BadZipFile, RuntimeError, NotImplementedError, *_DAMAGED) as err:
        raise SourceError(f"{source}: not a readable zip archive ({type(err).__name__}: {err})") from err
    except _COLLISIONS as err:
        raise _collision(str(source), err) from err
    _move_into(staging, destination)
    return [m.filename for m in members]


def _move_into(staging: Path, destination: Path) -> None:
    """Move the staged tree into ``destination`` (created if missing), then drop the staging folder."""
    destination.mkdir(parents=True, exist_ok=True)
    for item in staging.iterdir():
        target = destination / item.name
        if target.is_dir() and not target.is_symlink() and item.is_dir():
            shutil.copytree(item, target, symlinks=True, dirs_exist_ok=True)
        else:
            if target.exists() or target.is_symlink():
                shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
            shutil.move(str(item), str(target))
    shutil.rmtree(staging, ignore_errors=True)


def extract_archive(source: Path, destination: Path) -> list[str]:
    """``extract_zip`` for ``*.zip`` names, else ``extract_tar`` (compression detected from the bytes).

    Raises:
        SourceError: as ``extract_tar`` / ``extract_zip``.
    """
    source = Path(source)
    if source.name.lower().endswith(".zip"):
        return extract_zip(source, destination)
    return extract_tar(source, destination)


def archive_digest(path: Path) -> str:
    """SHA-256 (hex) of the file's bytes."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def unpack_cached(source: Path, cache_dir: Path) -> Path:
    """Unpack ``source`` into ``cache_dir/<SHA-256 of its bytes>/`` unless already there; return that folder.

    The folder appears by one rename once every member is written, so a crash or a refused archive never leaves a
    partial one, and concurrent runs unpacking the same archive agree on the result.

    Raises:
        SourceError: as ``extract_archive``; nothing is left under ``cache_dir``.
        RunsFolderError: a file is in the way of ``cache_dir``.
    """
    target = Path(cache_dir) / archive_digest(source)
    if target.is_dir():
        return target
    ensure_folder(cache_dir)
    # An archive without members is an empty folder; a concurrent run's finished folder is kept (same content).
    with atomic_dir(target) as tmp:
        extract_archive(source, tmp)
    return target
