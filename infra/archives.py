"""Extracting archives a user points at (and the data tarballs of ``.deb`` packages) without letting a member write
outside the destination.

Tar archives go through the standard library's ``data`` extraction filter (PEP 706), which refuses absolute paths,
``..`` components, links that point outside the destination, and device files; zip archives are checked member by
member with the same rules (zip has no links to follow, but names can still climb). A refused archive raises
``SourceError`` naming the member and leaves nothing behind in the destination.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import IO

from infra.errors import SourceError


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
    except tarfile.TarError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise SourceError(f"{label}: not a readable tar archive ({err})") from err
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _move_into(staging, destination)
    return names


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
        SourceError: a member name is absolute (``/x``, ``C:\\x``) or climbs out with ``..``, or the file is not a
            zip archive. ``destination`` is then left as it was.
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
    except zipfile.BadZipFile as err:
        raise SourceError(f"{source}: not a readable zip archive ({err})") from err
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
