"""Resolve a Debian package to one version, fetch exactly that version and unpack it without root.

Uses the system's own tools: ``apt-cache show`` reads the local apt package lists (offline, no root) for the
version ``apt-get download`` would fetch (the candidate) or a pinned one, with its architecture and the .deb's
SHA256; ``apt-get download NAME=VERSION`` fetches that version (no install, no root needed for the download
itself); ``dpkg-deb -f`` confirms the version and ``dpkg-deb --fsys-tarfile`` unpacks. Layout under ``cache_dir``::

    debs/<package>_<version>_<arch>.deb          reused when present and its SHA256 is the resolved one
    unpacked/<package>_<version>/                 written atomically (tmp dir, then rename)

The resolved release is part of the sources key, so a moved archive is a new key, never new content under an
old one. The package version is the source's snapshot and its ``usr/share/doc/<package>/copyright`` the licence
(DESIGN "The embedded default and real input"; docs/methods.md §7 "Manifest per component").
"""

import glob
import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from infra.archives import extract_tar
from infra.atomic import atomic_dir
from infra.errors import ConfigError, SourceError
from tasks.sources.config import check_package_name, check_version

APT_LISTS = Path("/var/lib/apt/lists")
_ARCH_RE = re.compile(r"^[a-z0-9-]+$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class DebRelease:
    """One version of a package in the apt package lists: what ``apt-get download NAME=VERSION`` fetches.

    ``sha256`` is the .deb's checksum from the archive's Packages index ("" when the lists give none, e.g. a
    version known only as installed)."""

    package: str
    version: str
    architecture: str
    sha256: str

    def key_fields(self) -> dict[str, str]:
        """What the sources key records of this release (the package name is already in the source's config)."""
        return {"version": self.version, "architecture": self.architecture, "sha256": self.sha256}


@dataclass(frozen=True)
class DebPackage:
    """An unpacked Debian package: ``root`` is the directory holding its ``usr/...`` tree."""

    package: str
    version: str
    root: Path
    licence: str
    deb_path: Path
    release: DebRelease


def resolve_debs(wanted: Iterable[tuple[str, str | None]], *, update_lists: bool = False
                 ) -> dict[tuple[str, str | None], DebRelease]:
    """Resolve (package, pinned version or None) pairs against the local apt package lists, without downloading.

    None resolves to the candidate version, the one ``apt-get download NAME`` would fetch now; a pinned version
    must be in the lists. One ``apt-cache show`` call per kind (candidates, pins). ``update_lists`` runs
    ``apt-get update`` first when no package list exists at all (a fresh machine; it downloads the lists).

    Raises:
        ConfigError: a package name or pinned version breaks Debian's grammar.
        SourceError: apt-cache is missing; a package is unknown to the lists; a pinned version is not in them (the
            message names the package, the version and the versions the lists have); the lists give a version,
            architecture or checksum that is not well formed.
    """
    wanted = list(dict.fromkeys((check_package_name(p), None if v is None else check_version(v)) for p, v in wanted))
    if not wanted:
        return {}
    _require_tool("apt-cache")
    note = _apt_update_if_needed() if update_lists else ""
    out: dict[tuple[str, str | None], DebRelease] = {}
    candidates = [p for p, v in wanted if v is None]
    if candidates:
        records = _show(candidates, all_versions=False)
        for package in candidates:
            found = next((r for r in records if r.get("Package") == package), None)
            if found is None:
                raise SourceError(
                    f"apt-cache knows no package {package!r}{note}: check the name (a virtual package has no "
                    f"version to fetch), or the package lists in {APT_LISTS} are missing or old (`apt-get update`; "
                    "`pretrain fetch CONFIG` runs it when there are none)")
            out[(package, None)] = _release(package, found)
    pins = [(p, v) for p, v in wanted if v is not None]
    if pins:
        records = _show([f"{p}={v}" for p, v in pins], all_versions=False)
        for package, version in pins:
            found = next((r for r in records if r.get("Package") == package and r.get("Version") == version), None)
            if found is None:
                have = list(dict.fromkeys(r.get("Version", "?") for r in _show([package], all_versions=True)
                                          if r.get("Package") == package))
                raise SourceError(
                    f"{package} version {version} is not in the apt package lists{note} (they have: "
                    f"{', '.join(have) or 'no version of ' + package}); pin one of those, or add an apt source that "
                    "still has it (such as snapshot.debian.org) and run `apt-get update`")
            out[(package, version)] = _release(package, found)
    return out


def resolve_deb(package: str, version: str | None = None, *, update_lists: bool = False) -> DebRelease:
    """``resolve_debs`` for one package: its candidate version, or ``version`` checked against the lists.

    Raises:
        ConfigError, SourceError: as ``resolve_debs``.
    """
    return resolve_debs([(package, version)], update_lists=update_lists)[(package, version)]


def fetch_deb(package: str, cache_dir: Path, version: str | None = None, *,
              release: DebRelease | None = None) -> DebPackage:
    """Download (or reuse) one version of ``package``'s .deb and unpack it under ``cache_dir``.

    The version is ``release`` when given (what a sources key was computed from), else ``version`` or the
    candidate resolved now (``resolve_deb``, running ``apt-get update`` when there are no package lists). The
    download is pinned (``apt-get download NAME=VERSION``) and checked: the .deb's version and, when the lists
    give one, its SHA256 must be the release's. A cached .deb of that version and checksum is reused.

    Raises:
        ConfigError: ``package`` is not a Debian package name, or ``version`` not a Debian version.
        SourceError: apt-get/apt-cache/dpkg-deb missing, the version cannot be resolved (see ``resolve_debs``),
            the download failed (message carries apt's stderr), the .deb is not the resolved release, or the
            archive could not be unpacked.
    """
    check_package_name(package)
    _require_tool("apt-get")
    _require_tool("dpkg-deb")
    if release is None:
        release = resolve_deb(package, version, update_lists=True)
    elif release.package != package:
        raise SourceError(f"release {release.package} {release.version} given for package {package!r}")
    check_version(release.version)
    deb_path = _download(release, Path(cache_dir) / "debs")
    got = _run(["dpkg-deb", "-f", str(deb_path), "Version"], what=f"read the version of {deb_path}").strip()
    if got != release.version:
        raise SourceError(f"{deb_path} holds {package} {got}, not the resolved version {release.version}; delete "
                          "it and fetch again")
    root = _unpack(deb_path, Path(cache_dir) / "unpacked" / f"{package}_{got.replace(':', '%3a')}")
    licence = licence_summary(root / "usr" / "share" / "doc" / package / "copyright")
    return DebPackage(package=package, version=got, root=root, licence=licence, deb_path=deb_path, release=release)


def parse_records(text: str) -> list[dict[str, str]]:
    """Paragraphs of deb822 text (``apt-cache show`` output) as {field: value}; continuation lines are dropped."""
    records, current = [], {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                records.append(current)
            current = {}
        elif not line[0].isspace() and ":" in line:
            name, _, value = line.partition(":")
            current[name] = value.strip()
    if current:
        records.append(current)
    return records


def _show(queries: list[str], *, all_versions: bool) -> list[dict[str, str]]:
    """Records ``apt-cache show`` prints for ``queries`` (names, or NAME=VERSION); unknown ones print nothing."""
    cmd = ["apt-cache", "show", *([] if all_versions else ["--no-all-versions"]), "--", *queries]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    records = parse_records(proc.stdout)
    # Exit 100 with nothing printed is "no packages found"; other failures (a broken lists folder) are reported.
    if proc.returncode != 0 and not (proc.returncode == 100 and not records):
        raise SourceError(f"could not read the apt package lists: {' '.join(cmd)} exited {proc.returncode}: "
                          f"{proc.stderr.strip()}")
    return records


def _release(package: str, record: dict[str, str]) -> DebRelease:
    """A checked release from one apt record: names and versions from the lists are validated before use too."""
    version, arch, sha = record.get("Version", ""), record.get("Architecture", ""), record.get("SHA256", "").lower()
    try:
        check_version(version)
    except ConfigError:
        raise SourceError(f"the apt package lists give {package} the version {version!r}, which is not a Debian "
                          "version; check the apt sources") from None
    if not _ARCH_RE.match(arch) or (sha and not _SHA256_RE.match(sha)):
        raise SourceError(f"the apt package lists give {package} {version} architecture {arch!r} and SHA256 "
                          f"{sha!r}, which are not well formed; check the apt sources")
    return DebRelease(package=package, version=version, architecture=arch, sha256=sha)


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


def _download(release: DebRelease, debs_dir: Path) -> Path:
    """The .deb of exactly ``release``: the cached file when its checksum matches, else ``apt-get download``."""
    debs_dir.mkdir(parents=True, exist_ok=True)
    # apt-get names the file <package>_<version>_<arch>.deb with an epoch's ':' written as '%3a'.
    pattern = glob.escape(f"{release.package}_{release.version.replace(':', '%3a')}_") + "*.deb"
    for cached in sorted(debs_dir.glob(pattern)):
        if not release.sha256 or _sha256(cached) == release.sha256:
            return cached
        cached.unlink()  # a partial or foreign file under the release's name: fetch it again
    target = f"{release.package}={release.version}"
    proc = subprocess.run(["apt-get", "download", target], cwd=debs_dir, capture_output=True, text=True)
    found = sorted(debs_dir.glob(pattern))
    if proc.returncode != 0 or not found:
        raise SourceError(
            f"apt-get download {target} failed (exit {proc.returncode}): {proc.stderr.strip()} "
            "— check the package name and the apt sources, or use kind='local'"
        )
    if release.sha256 and _sha256(found[0]) != release.sha256:
        found[0].unlink()
        raise SourceError(f"apt-get download {target} gave a file whose SHA256 is not the package lists' "
                          f"{release.sha256}; run `apt-get update` and fetch again")
    return found[0]


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _apt_update_if_needed() -> str:
    """Run ``apt-get update`` when no package index exists; return a note for error messages if it failed."""
    lists = APT_LISTS
    if lists.is_dir() and any(lists.glob("*_Packages*")):
        return ""
    proc = subprocess.run(["apt-get", "update"], capture_output=True, text=True)
    return "" if proc.returncode == 0 else f" (apt-get update also failed: {proc.stderr.strip()})"


def _unpack(deb_path: Path, target: Path) -> Path:
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Another process unpacking the same release may finish first: its folder is kept (same content).
    with atomic_dir(target) as tmp:
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
    return target


def _run(cmd: list[str], *, what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SourceError(f"could not {what}: {' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout
