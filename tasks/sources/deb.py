"""Fetch a Debian package by name and unpack it without root.

Uses the system's own tools: ``apt-get download`` (no install, no root needed for the download itself),
``dpkg-deb -f`` for the version and ``dpkg-deb -x`` to unpack. Layout under ``cache_dir``::

    debs/<package>_<version>_<arch>.deb          reused when present
    unpacked/<package>_<version>/                 written atomically (tmp dir, then rename)

The package version is the source's snapshot and its ``usr/share/doc/<package>/copyright`` the licence
(DESIGN "The embedded default and real input"; SPEC §7 "Manifest per component").
"""

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from infra.archives import extract_tar
from infra.errors import SourceError
from tasks.sources.config import check_package_name


@dataclass(frozen=True)
class DebPackage:
    """An unpacked Debian package: ``root`` is the directory holding its ``usr/...`` tree."""

    package: str
    version: str
    root: Path
    licence: str
    deb_path: Path


def fetch_deb(package: str, cache_dir: Path) -> DebPackage:
    """Download (or reuse) ``package``'s .deb and unpack it under ``cache_dir``.

    Raises:
        ConfigError: ``package`` is not a Debian package name.
        SourceError: apt-get/dpkg-deb missing, the download failed (message carries apt's stderr), or the
            archive could not be unpacked.
    """
    check_package_name(package)
    _require_tool("apt-get")
    _require_tool("dpkg-deb")
    deb_path = _download(package, Path(cache_dir) / "debs")
    version = _run(["dpkg-deb", "-f", str(deb_path), "Version"], what=f"read the version of {deb_path}").strip()
    root = _unpack(deb_path, Path(cache_dir) / "unpacked" / f"{package}_{version.replace(':', '%3a')}")
    licence = licence_summary(root / "usr" / "share" / "doc" / package / "copyright")
    return DebPackage(package=package, version=version, root=root, licence=licence, deb_path=deb_path)


def licence_summary(copyright_path: Path) -> str:
    """Short licence string from a Debian ``copyright`` file.

    Machine-readable files (first line ``Format: ...copyright-format...``): the distinct ``License:`` short names
    in order of appearance, joined with ", ". Other files: their first non-empty line. Missing file: "unknown".
    """
    if not copyright_path.is_file():
        return "unknown (no copyright file)"
    lines = copyright_path.read_text(encoding="utf-8", errors="replace").splitlines()
    if lines and lines[0].startswith("Format:"):
        names = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("License:")]
        distinct = list(dict.fromkeys(n for n in names if n))
        if distinct:
            return ", ".join(distinct)
    return next((ln.strip() for ln in lines if ln.strip()), "unknown (empty copyright file)")


def _require_tool(tool: str) -> None:
    if shutil.which(tool) is None:
        raise SourceError(
            f"{tool} is not on PATH, so Debian packages cannot be fetched on this machine; "
            "use a source with kind='local' pointing at files you already have"
        )


def _download(package: str, debs_dir: Path) -> Path:
    debs_dir.mkdir(parents=True, exist_ok=True)
    found = sorted(debs_dir.glob(f"{package}_*.deb"))
    if found:
        return found[-1]
    update_note = _apt_update_if_needed()
    proc = subprocess.run(["apt-get", "download", package], cwd=debs_dir, capture_output=True, text=True)
    found = sorted(debs_dir.glob(f"{package}_*.deb"))
    if proc.returncode != 0 or not found:
        raise SourceError(
            f"apt-get download {package} failed (exit {proc.returncode}): {proc.stderr.strip()}{update_note} "
            "— check the package name and the apt sources, or use kind='local'"
        )
    return found[-1]


def _apt_update_if_needed() -> str:
    """Run ``apt-get update`` when no package index exists; return a note for error messages if it failed."""
    lists = Path("/var/lib/apt/lists")
    if lists.is_dir() and any(lists.glob("*_Packages*")):
        return ""
    proc = subprocess.run(["apt-get", "update"], capture_output=True, text=True)
    return "" if proc.returncode == 0 else f" (apt-get update also failed: {proc.stderr.strip()})"


def _unpack(deb_path: Path, target: Path) -> Path:
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        # The data tarball goes through the safe extractor: a member with an absolute path, '..', a link
        # leaving the tree or a device file refuses the package (dpkg-deb -x would write it as root would).
        proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb_path)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        try:
            extract_tar(proc.stdout, tmp, name=str(deb_path))
        finally:
            proc.stdout.close()
            stderr = proc.stderr.read().decode(errors="replace")
            proc.wait()
        if proc.returncode != 0:
            raise SourceError(f"could not unpack {deb_path}: dpkg-deb --fsys-tarfile exited {proc.returncode}: "
                              f"{stderr.strip()}")
        os.rename(tmp, target)
    except OSError:
        if not target.is_dir():  # another process may have won the rename; otherwise it is a real failure
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return target


def _run(cmd: list[str], *, what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SourceError(f"could not {what}: {' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout
