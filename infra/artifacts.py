"""Content-addressed artifact store: one immutable directory per (stage, key).

Layout (docs/methods.md §13: "Artifacts, caching, lineage")::

    <runs>/artifacts/<stage>/<key>/
        ... outputs ...
        _CHECKSUMS.json every output's size and xxh3-128 digest, checked before a later run reuses the artifact
        meta.json      stage, key, config, input keys, code version, timings, counts
        _COMPLETE      completion marker, written last; a directory without it does not exist

key = sha256(stage name, canonical stage config, input artifact keys, stage code version)[:16].
Outputs are written into a sibling temporary directory and renamed into place after the marker, so a
crash mid-write never leaves a directory that looks complete.
"""

from __future__ import annotations

import datetime
import errno
import functools
import hashlib
import importlib
import importlib.util
import json
import shutil
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, Callable, Iterator

from infra.atomic import publish_dir
from infra.errors import ConfigError, DiskFullError
from infra.leases import hold, holder
from infra.runs import ensure_folder

MARKER = "_COMPLETE"
META = "meta.json"
CHECKSUMS = "_CHECKSUMS.json"
CORRUPT_PREFIX = ".corrupt-"  # a quarantined artifact that failed its checksums: gc removes it
_CHUNK = 8 << 20


def file_digest(path: Path) -> str:
    """xxh3-128 of a file's bytes as 32 hex digits, read in 8 MiB chunks (memory bounded by the chunk)."""
    import xxhash

    digest = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_checksums(root: Path) -> dict[str, list]:
    """``{relative posix path: [bytes, xxh3-128 hex]}`` of every file under ``root`` (the store's own bookkeeping
    files excepted), sorted by path."""
    root = Path(root)
    own = {root / META, root / MARKER, root / CHECKSUMS}
    files = sorted(p for p in root.rglob("*") if p.is_file() and p not in own)
    return {p.relative_to(root).as_posix(): [p.stat().st_size, file_digest(p)] for p in files}


def checksum_mismatches(path: Path) -> list[str]:
    """What in the artifact directory ``path`` differs from the checksums recorded when it was committed: one
    description per missing file, changed size or changed digest; [] when all match or when the artifact records
    none (written before checksums). Reads every recorded file once: seconds per GB at the disk's read rate."""
    path = Path(path)
    recorded_file = path / CHECKSUMS
    if not recorded_file.is_file():
        return []
    try:
        recorded = json.loads(recorded_file.read_text())
    except (OSError, ValueError) as err:
        return [f"{CHECKSUMS} unreadable ({err})"]
    found = []
    for name, (size, digest) in recorded.items():
        file = path / name
        if not file.is_file():
            found.append(f"{name}: missing")
        elif (actual := file.stat().st_size) != size:
            found.append(f"{name}: {actual} bytes, committed with {size}")
        elif file_digest(file) != digest:
            found.append(f"{name}: content differs from its checksum (same size)")
    return found


def _key_value(obj: Any) -> Any:
    """The JSON form of a value json cannot encode itself, for values with one deterministic form only.

    Raises:
        ConfigError: anything else (its ``str`` may hold a memory address or depend on the process, and a key
            built from it would silently miss or, worse, hit a stale artifact).
    """
    from enum import Enum

    if isinstance(obj, PurePath):
        return obj.as_posix()
    if isinstance(obj, Enum):
        return _key_value(obj.value) if not isinstance(obj.value, (str, int, float, bool)) else obj.value
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=canonical_json)
    if isinstance(obj, (tuple,)):
        return list(obj)
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "shape", None) == ():  # numpy scalars
        return obj.item()
    if isinstance(obj, (datetime.date, datetime.datetime)):
        return obj.isoformat()
    raise ConfigError(f"a cache key component of type {type(obj).__name__} ({str(obj)[:80]!r}) has no deterministic "
                      "JSON form; key configs must hold plain values (str, numbers, bools, lists, dicts, paths)")


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: the same config always hashes the same.

    Raises:
        ConfigError: a component has no deterministic JSON form (see ``_key_value``); never silently dropped or
            stringified.
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_key_value, ensure_ascii=False)


def code_version(*modules: str) -> str:
    """sha256[:12] over the source files of the given packages/modules (sorted by path).

    A change to any file of a stage's code gives the stage a new key, so stale artifacts are never reused.
    """
    digest = hashlib.sha256()
    for name in sorted(modules):
        module = importlib.import_module(name)
        root = Path(module.__file__)
        files = sorted(root.parent.rglob("*.py")) if root.name == "__init__.py" else [root]
        for path in files:
            digest.update(path.relative_to(root.parent.parent).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


# The project's top-level packages (pyproject's setuptools include): the scope of a stage's import closure.
PROJECT_PACKAGES = ("flows", "tasks", "evals", "models", "infra")


@contextmanager
def _on_sys_path(folders: tuple[str, ...]) -> Iterator[None]:
    if not folders:
        yield
        return
    saved = list(sys.path)
    sys.path[:0] = folders
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = saved
        importlib.invalidate_caches()


@functools.lru_cache(maxsize=None)
def _import_graph(packages: tuple[str, ...], search_path: tuple[str, ...]) -> tuple[Any, dict[str, list[Path]]]:
    """The grimp import graph of ``packages`` plus each package's folders, built once per process (30–60 ms for
    this project's ~130 modules)."""
    import grimp  # only stages keyed by their closure need it

    with _on_sys_path(search_path):
        # Function-level imports are edges too; TYPE_CHECKING-only ones never run. No on-disk cache: grimp's
        # default writes .grimp_cache into the working directory.
        graph = grimp.build_graph(*packages, include_external_packages=False, exclude_type_checking_imports=True,
                                  cache_dir=None)
        roots = {name: [Path(p) for p in importlib.util.find_spec(name).submodule_search_locations]
                 for name in packages}
    # Importing a module first runs the __init__ of each package above it: model that as an import.
    for module in list(graph.modules):
        if "." in module:
            graph.add_import(importer=module, imported=module.rpartition(".")[0])
    return graph, roots


def _module_file(module: str, roots: dict[str, list[Path]]) -> Path | None:
    top, *rest = module.split(".")
    for root in roots[top]:
        base = root.joinpath(*rest)
        for candidate in (base / "__init__.py", base.with_suffix(".py")) if rest else (root / "__init__.py",):
            if candidate.is_file():
                return candidate
    return None  # a namespace package: no code of its own


def import_closure(*entry_modules: str, packages: tuple[str, ...] = PROJECT_PACKAGES,
                   search_path: tuple[str | Path, ...] = ()) -> list[str]:
    """The modules of ``packages`` that importing ``entry_modules`` can run, sorted: each entry (a package counts
    with all its submodules), everything it imports directly or indirectly, at module level or inside a function
    (``TYPE_CHECKING``-only imports excluded), and the packages above each of those (their ``__init__`` runs
    first). Imports through ``importlib`` with a computed name are not seen.

    Args:
        entry_modules: dotted module or package names inside ``packages``.
        packages: top-level packages to build the import graph from (located through ``sys.path``).
        search_path: folders put in front of ``sys.path`` while locating ``packages`` (a tree outside the project).

    Raises:
        ValueError: no entry module given, an entry module is not in ``packages``, or a package cannot be found.
        grimp.exceptions.NotATopLevelModule: a name in ``packages`` is not a top-level package.
        grimp.exceptions.SourceSyntaxError: a module of ``packages`` does not parse.
    """
    if not entry_modules:
        raise ValueError("import_closure needs at least one entry module")
    graph, _ = _import_graph(tuple(packages), tuple(str(p) for p in search_path))
    known = graph.modules
    missing = sorted(m for m in entry_modules if m not in known)
    if missing:
        raise ValueError(f"modules {missing} are not in the import graph of {list(packages)}")
    closure: set[str] = set()
    for entry in entry_modules:
        for module in {entry} | graph.find_descendants(entry):
            closure |= {module} | graph.find_upstream_modules(module)
    return sorted(closure)


def code_version_closure(*entry_modules: str, packages: tuple[str, ...] = PROJECT_PACKAGES,
                         search_path: tuple[str | Path, ...] = ()) -> str:
    """sha256[:12] over the source of every module in ``import_closure(*entry_modules)``, by module name.

    Unlike ``code_version``, which hashes only the packages a stage lists, this sees every project line the stage
    can run: a change to a helper it imports from another package (``infra.archives`` for the sources stage) gives
    it a new key. Passing the packages a stage lists gives a version that covers at least what ``code_version``
    covers. Only ``.py`` source counts: the YAML/JSON under ``infra/`` are launch and deployment settings, read by
    path from the config, not code a stage imports. The import graph is cached per process (a new import edge
    needs a new process); file bytes are read on every call.

    Args and raises: as ``import_closure``; also ``OSError`` when a module file cannot be read.
    """
    _, roots = _import_graph(tuple(packages), tuple(str(p) for p in search_path))
    digest = hashlib.sha256()
    for module in import_closure(*entry_modules, packages=packages, search_path=search_path):
        path = _module_file(module, roots)
        if path is not None:
            digest.update(module.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:12]


def artifact_key(stage: str, config: Any, input_keys: dict[str, str], version: str) -> str:
    """Key of a stage's artifact: sha256(stage, canonical config, input keys, code version)[:16]."""
    payload = canonical_json({"stage": stage, "config": config, "inputs": input_keys, "code": version})
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Artifact:
    """A completed artifact directory and its metadata."""

    stage: str
    key: str
    path: Path
    meta: dict[str, Any] = field(hash=False, compare=False)

    @property
    def marker_id(self) -> str:
        return self.meta.get("marker_id", "")


class ArtifactStore:
    """Reads and atomically writes artifact directories under ``root``."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def get(self, stage: str, key: str) -> Artifact | None:
        """The completed artifact, or None when absent or unfinished (no marker)."""
        path = self.path(stage, key)
        if not (path / MARKER).is_file() or not (path / META).is_file():
            return None
        meta = json.loads((path / META).read_text())
        return Artifact(stage, key, path, meta)

    @contextmanager
    def computing(self, stage: str, key: str, on_wait: Callable[[dict[str, Any] | None], None] = lambda who: None,
                  poll_s: float = 5.0) -> Iterator[None]:
        """Hold the lease to compute (stage, key): one process at a time, across processes on this filesystem.

        The lease (``infra.leases.hold``) is an OS file lock (``flock``) on ``<runs>/locks/<stage>/<key>.lock``,
        beside the artifacts rather than among them: a killed holder releases it with its process, so a crash never
        leaves a stale lock; the holder records its pid beside it (:meth:`lease_holder`). ``on_wait`` is called once
        when another process holds it, with that process's record (None when unknown). Callers re-check ``get``
        after entering: the holder may have finished the artifact meanwhile. Raises ``RunsFolderError`` when a file
        is in the way of the lock's folder.
        """
        with hold(self.lock_path(stage, key), on_wait, poll_s=poll_s):
            yield

    def lock_path(self, stage: str, key: str) -> Path:
        """The compute lease of (stage, key): ``<runs>/locks/<stage>/<key>.lock``."""
        return self.root.parent / "locks" / stage / f"{key}.lock"

    def lease_holder(self, stage: str, key: str) -> dict[str, Any] | None:
        """The record (pid, host, since) of the process computing (stage, key) now, or None (``infra.leases``)."""
        return holder(self.lock_path(stage, key))

    def begin(self, stage: str, key: str) -> Path:
        """A fresh temporary directory to write a stage's outputs into; ``RunsFolderError`` when a file is in the
        way of the stage's folder."""
        tmp = ensure_folder(self.root / stage) / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        return tmp

    def commit(self, stage: str, key: str, tmp: Path, meta: dict[str, Any]) -> Artifact:
        """Write meta.json, then the marker, fsync everything under ``tmp``, then rename it into place
        (``infra.atomic.publish_dir``).

        Raises:
            DiskFullError: the disk is full; ``tmp`` is removed and no marker remains.
            OSError: an fsync or the rename fails; ``tmp`` is removed and no marker remains.
        """
        final = self.path(stage, key)
        meta = {**meta, "stage": stage, "key": key, "marker_id": uuid.uuid4().hex, "committed_at": time.time()}
        try:
            # Before meta and marker: what a later run checks before it reuses the artifact (``verify``).
            (tmp / CHECKSUMS).write_text(json.dumps(file_checksums(tmp), indent=0, sort_keys=True))
            (tmp / META).write_text(json.dumps(meta, indent=2, sort_keys=True, default=str))
            (tmp / MARKER).write_text(meta["marker_id"])
            # fsyncs every output, then renames; an existing ``final`` is an unfinished earlier attempt (no marker)
            publish_dir(tmp, final, replace=True)
        except BaseException as err:
            full = disk_full_error(err, tmp, stage)  # before the rmtree frees the space
            shutil.rmtree(tmp, ignore_errors=True)
            if full is not None:
                raise full from err
            raise
        return Artifact(stage, key, final, meta)

    def abort(self, tmp: Path) -> None:
        shutil.rmtree(tmp, ignore_errors=True)

    def verify(self, stage: str, key: str) -> tuple[Artifact | None, str | None]:
        """The completed artifact if its files match the checksums recorded at commit; otherwise the artifact is
        moved aside (``<stage>/.corrupt-<key>-<id>``, never read again, removed by ``pretrain gc``) and
        ``(None, why)`` is returned, ``why`` naming the first files that differ and where it went, so the caller
        computes it afresh. ``(None, None)`` when there is no complete artifact."""
        artifact = self.get(stage, key)
        if artifact is None:
            return None, None
        bad = checksum_mismatches(artifact.path)
        if not bad:
            return artifact, None
        aside = artifact.path.with_name(f"{CORRUPT_PREFIX}{key}-{uuid.uuid4().hex[:8]}")
        artifact.path.rename(aside)
        shown = "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
        return None, f"artifact {key} fails its checksums ({shown}); moved to {aside}"


# Below this many free bytes a failed write is taken as a full disk: libraries word ENOSPC differently (torch.save
# reports "unexpected pos", not the errno), and the stage's partial outputs still fill the disk when this is checked.
NEARLY_FULL_BYTES = 1 << 20
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
# SQLite (the MLflow and Prefect stores) says SQLITE_FULL as "database or disk is full".
_FULL_WORDS = ("no space left on device", "os error 28", "disk quota exceeded", "file too large",
               "database or disk is full")


def _chain(err: BaseException) -> list[BaseException]:
    chain, seen = [], err
    while seen is not None and len(chain) < 20:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def says_disk_full(text: str) -> bool:
    """Whether ``text`` (an error message, a log line) says that a disk is full or a file-size limit was reached, in
    the words of the OS, Rust's std, SQLite or a quota."""
    lowered = text.lower()
    return any(w in lowered for w in _FULL_WORDS)


def full_disk_exception(err: BaseException) -> BaseException | None:
    """The exception in ``err``'s chain of causes and contexts that says the disk is full or a file-size limit was
    reached (an ENOSPC/EDQUOT/EFBIG errno, or the wording of one), the innermost such; None when none says so."""
    found = [e for e in _chain(err) if getattr(e, "errno", None) in _FULL_ERRNOS or says_disk_full(str(e))]
    return found[-1] if found else None


def _one_line(err: BaseException, limit: int = 200) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text if len(text) <= limit else text[:limit] + ' ...'}"


def _free(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path if path.exists() else path.parent).free
    except OSError:
        return None


def _left(free: int | None) -> str:
    return f"{free / 2**20:.1f} MiB free" if free is not None else "free space unknown"


def disk_full_error(err: BaseException, tmp: Path, stage: str) -> DiskFullError | None:
    """A clear ``DiskFullError`` when ``err`` (raised while ``stage`` wrote into ``tmp``) comes from a full disk or a
    file-size limit, else None. Call it before removing ``tmp``.

    Recognised by an ENOSPC/EDQUOT/EFBIG errno or message anywhere in the exception chain (SQLite's "database or
    disk is full" too: the tracking store shares the disk), or by fewer than ``NEARLY_FULL_BYTES`` left free on the
    file system holding ``tmp``. The message quotes, on one line, the exception that says so (else ``err``).
    """
    said = full_disk_exception(err)
    free = _free(tmp)
    if said is None and (free is None or free >= NEARLY_FULL_BYTES):
        return None
    return DiskFullError(
        f"stage {stage} ran out of space writing its artifact in {tmp.parent}: the disk is full or a file-size limit "
        f"was reached ({_left(free)}; {_one_line(said or err)}). Nothing was committed: the partial output is removed "
        "and no _COMPLETE marker written. Free space (or give --runs-dir on a larger disk) and run the same command "
        "again; finished stages are reused")


def runs_disk_full_error(err: BaseException, runs: Path) -> DiskFullError | None:
    """A clear ``DiskFullError`` when ``err``, raised outside a stage's own writes (by the MLflow, Prefect or DuckDB
    store, the run log, a commit's bookkeeping), comes from a full disk under the runs folder ``runs``; else None.
    Recognised as ``disk_full_error`` does, the free space measured on the runs folder's file system."""
    said = full_disk_exception(err)
    free = _free(Path(runs))
    if said is None and (free is None or free >= NEARLY_FULL_BYTES):
        return None
    return DiskFullError(
        f"the disk of the runs folder {runs} is full ({_left(free)}; {_one_line(said or err)}). No unfinished "
        "stage was committed, and MLflow runs left RUNNING are marked FAILED by the next command. Free space (or give "
        "--runs-dir on a larger disk) and run the same command again; finished stages are reused")
