"""Scale of the corpus build, in one command: throughput, the peak memory of every process and its growth per
document, the time of each pass, and an extrapolation to 1 TB on N machines.

    python benchmarks/corpus_scale.py                                   # 10^4, 10^5, 10^6 documents, processes
    python benchmarks/corpus_scale.py --sizes 2000,8000 --out /tmp/scale.json
    python benchmarks/corpus_scale.py --engine processes,ray --workers 4 --crawl-dir /tmp/crawls
    cd /tmp/other && python /path/to/benchmarks/corpus_scale.py --code /tmp/other    # another checkout

For each size a synthetic crawl (:mod:`benchmarks.crawl`: real text mutated into new documents, 30% near and 5%
exact duplicates by default, HTML and plain text, several sources) is built through the production code path,
``split_sources`` then ``curate`` with a real shard map (``process_map(workers)`` for ``processes``; the Ray shard
map of ``infra.shard_map`` for ``ray``, when the measured checkout has one), each build in a fresh child process
that imports the project from ``--code`` (default: this checkout). Figures per build:

* documents/s and MB/s per core: input bytes (UTF-8 ``content``) / wall time of split + curate / cores, where cores
  = min(workers, CPUs);
* peak RSS of the main process and of every other process of the build (shard workers, forkserver, Ray's
  raylet and services, …): the child's process tree is polled every ``--poll`` s with psutil (or /proc when
  psutil is missing), keeping each pid's largest RSS and its kernel high-water mark (VmHWM); each shard call also
  reports its worker's VmHWM when it returns, and the main process its own at the end. With ``--engine ray`` a
  private Ray instance is started in the child for the whole build (``--ray-address local``, its start-up time
  reported apart), so its processes are in the tree; for another address, Ray processes that were not running
  before the build are polled too;
* the time of each pass: ``split``; every shard-map call by its label (``filter``, ``key``, …: parallel, with the
  core-seconds the shards really used); the main-process time between them, named by the build function around
  it (``boilerplate``, ``decide``, ``write (main)``: pass-through timers on ``_frequent``, ``_decide`` and
  ``_write_outputs`` when the build module has them), else by the build's progress stage (``candidates``, …),
  else ``other (main)``.

Over the sizes run: a least-squares line of peak RSS over documents per process role (main, largest worker,
forkserver, …); its slope (bytes per document) is what a larger corpus costs, target < 50 bytes per document in
every process (PASS/FAIL). Each pass's time is fitted as a power of documents (exponent 1 is linear) and the sizes
of ``--estimate`` not run are estimated from it. Then 1 TB of HTML and 1 TB of plain text on each N of
``--machines`` × ``--cores-per-machine``: parallel passes at the per-core rate measured on a crawl of only that
content type (``--calibrate-docs`` documents; the largest of them), ideal scaling and no data movement; serial
(main-process) passes, which no machine count changes (Amdahl 1967, "Validity of the single processor approach to
achieving large scale computing capabilities"), from a least-squares line over the calibration sizes, seconds =
fixed + per-document × documents (a slope below zero counts as zero; one size: its rate, fixed cost included,
charged per byte); and the main process's memory at that document count from its slope. A summary table is printed and every figure written to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
CODE_ENV = "PRETRAIN_BENCH_CODE"
TARGET_BYTES_PER_DOC = 50.0
TB = 1e12
ENGINES = ("processes", "ray")
RAY_MAP_NAMES = ("ray_map", "ray_shard_map")
TIMED_FUNCTIONS = {"_frequent": "boilerplate", "_decide": "decide", "_write_outputs": "write (main)"}
PASS_ORDER = ["split", "filter", "boilerplate", "key", "candidates", "shingle", "verify", "dedup", "decide", "write",
              "write (main)"]

if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
from benchmarks import crawl  # noqa: E402  (the harness's own generator, imported before --code goes first)


def use_code(code: Path | str | None) -> Path:
    """Put checkout ``code`` (default: this one) first on ``sys.path`` and in the environment that child builds
    inherit, so the project is imported from it; returns its resolved path.

    Raises:
        SystemExit: ``code`` has no ``tasks/corpus/build.py``.
    """
    path = Path(code or os.environ.get(CODE_ENV) or ROOT).resolve()
    if not (path / "tasks" / "corpus" / "build.py").is_file():
        sys.exit(f"--code {path}: not a checkout of the project (no tasks/corpus/build.py)")
    if str(path) in sys.path:
        sys.path.remove(str(path))
    sys.path.insert(0, str(path))
    os.environ[CODE_ENV] = str(path)
    return path


# ---------------------------------------------------------------------------------------------------------------
# The child: one build, timed from inside.

def _hwm_kb() -> int:
    """This process's peak RSS in kB: VmHWM (Linux), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class Timed:
    """A shard function that also returns where and when it ran and its worker's peak RSS so far.

    ``__module__`` is the wrapped function's, so a shard map that preloads the shard function's module in its
    workers (``infra.shard_map.process_pool``) preloads the same module as without the wrapper.
    """

    def __init__(self, fn):
        self.fn = fn
        self.__module__ = fn.__module__
        self.__name__ = getattr(fn, "__name__", type(self).__name__)
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)

    def __call__(self, **kwargs):
        start = time.time()
        result = self.fn(**kwargs)
        return {"result": result, "timing": {"pid": os.getpid(), "start": start, "end": time.time(),
                                             "hwm_kb": _hwm_kb()}}


def engine_map(engine: str, workers: int, ray_address: str = "local", recycle_after: int = 0):
    """The shard map of ``engine`` from the imported ``infra.shard_map``; a Ray map connects to ``ray_address``
    ("local": a private instance started in this process) when it takes an address; ``recycle_after`` (the
    config's ``[corpus.execution] recycle_after``) is passed where the map takes it.

    Raises:
        SystemExit: ``engine`` is unknown, or ``ray`` is asked for and the module has no Ray shard map.
    """
    import inspect

    import infra.shard_map as shard_map

    def recycling(make) -> dict:
        return {"recycle_after": recycle_after} if "recycle_after" in inspect.signature(make).parameters else {}

    if engine == "processes":
        return shard_map.process_map(workers, **recycling(shard_map.process_map))
    if engine == "ray":
        make = _ray_map_factory()
        if make is None:
            sys.exit(f"--engine ray: {shard_map.__file__} has no Ray shard map ({' or '.join(RAY_MAP_NAMES)}) "
                     "or the ray package is missing")
        import ray.cloudpickle

        # The wrapper class by value: a Ray task's PYTHONPATH may name only the project.
        ray.cloudpickle.register_pickle_by_value(sys.modules[Timed.__module__])
        kwargs = {"address": ray_address} if "address" in inspect.signature(make).parameters else {}
        return make(workers, **kwargs, **recycling(make))
    sys.exit(f"unknown engine {engine!r}; use {', '.join(ENGINES)}")


def _ray_map_factory():
    import importlib.util

    import infra.shard_map as shard_map

    if importlib.util.find_spec("ray") is None:
        return None
    return next((getattr(shard_map, n) for n in RAY_MAP_NAMES if callable(getattr(shard_map, n, None))), None)


def ray_available() -> bool:
    """True when the imported ``infra.shard_map`` has a Ray shard map and the ray package is installed."""
    return _ray_map_factory() is not None


def child(job_path: str) -> None:
    """Build the corpus of one crawl as the job file says; write the timeline and the main peak as JSON."""
    import inspect

    import tasks.corpus.build as build
    from flows.config import load_config

    job = json.loads(Path(job_path).read_text())
    cfg = load_config(job["config"]).corpus
    execution = cfg.execution.model_copy(update={"workers": job["workers"], "shard_docs": job["shard_docs"],
                                                 "memory_limit": job["memory_limit"]})
    cfg = cfg.model_copy(update={"execution": execution})
    quality = getattr(cfg, "quality_model", None)  # absent in checkouts older than the quality classifier
    if quality is not None and quality.enabled:
        # The rules and dedup at scale; the classifier's scoring is benchmarks/quality_model.py's.
        cfg = cfg.model_copy(update={"quality_model": type(quality)()})
    ray_start = 0.0
    address = job.get("ray_address", "local")
    if job["engine"] == "ray" and address == "local":
        import logging

        import ray

        started = time.time()  # one private instance for the whole build, as a cluster would be
        ray.init(address="local", num_cpus=job["workers"], include_dashboard=False, logging_level=logging.WARNING)
        ray_start = time.time() - started
    inner = engine_map(job["engine"], job["workers"], address, getattr(cfg.execution, "recycle_after", 0))
    maps, timers, ticks = [], [], []

    def shard_map(fn, calls, label):
        start = time.time()
        out = inner(Timed(fn), calls, label)
        maps.append({"label": label, "start": start, "end": time.time(), "calls": [o["timing"] for o in out]})
        return [o["result"] for o in out]

    def timed(name, fn):
        def run(*args, **kwargs):
            start = time.time()
            try:
                return fn(*args, **kwargs)
            finally:
                timers.append({"name": name, "start": start, "end": time.time()})
        return run

    for name in TIMED_FUNCTIONS:  # pass-through timers on the main-process passes the build module has
        if callable(getattr(build, name, None)):
            setattr(build, name, timed(name, getattr(build, name)))

    def progress(stage, done, total):
        ticks.append({"t": time.time(), "stage": stage, "done": done, "total": total})

    work, out = Path(job["work"]), Path(job["out"])
    files = [Path(f) for f in job["files"]]
    split_params = inspect.signature(build.split_sources).parameters
    split_kwargs = {"shard_map": shard_map} if "shard_map" in split_params else {}
    if "memory_limit" in split_params:
        split_kwargs["memory_limit"] = cfg.execution.memory_limit
    curate_params = inspect.signature(build.curate).parameters
    curate_kwargs = {"shard_map": shard_map, **({"progress": progress} if "progress" in curate_params else {})}
    t0 = time.time()
    build.split_sources(files, work, cfg.execution.shard_docs, **split_kwargs)
    t1 = time.time()
    build.curate(work, out, cfg, **curate_kwargs)
    t2 = time.time()
    Path(job["result"]).write_text(json.dumps({
        "build_module": build.__file__, "split": [t0, t1], "curate": [t1, t2], "maps": maps, "timers": timers,
        "ticks": ticks, "main_hwm_kb": _hwm_kb(), "pid": os.getpid(), "ray_start_s": ray_start}))


# ---------------------------------------------------------------------------------------------------------------
# The parent: the process tree's memory, polled.

def _proc_hwm_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _proc_snapshot() -> dict[int, tuple[int, str, int]]:
    """pid → (ppid, command line, RSS kB) of every process, from /proc (used when psutil is missing)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            rss = int(stat[stat.rindex(")") + 2:].split()[21]) * os.sysconf("SC_PAGE_SIZE") // 1024
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        table[int(entry)] = (ppid, cmd, rss)
    return table


def _is_ray(cmd: str) -> bool:
    return cmd.startswith("ray::") or any(k in cmd for k in ("raylet", "gcs_server", "default_worker.py",
                                                              "site-packages/ray/"))


class TreePoller:
    """Peak memory of every process of a build, sampled every ``interval`` seconds on a thread: ``root`` and its
    descendants, and with ``scan_ray`` also every Ray process (``ray::…``, raylet, …) that was not running when the
    poller started (a Ray cluster started outside the build's process tree)."""

    def __init__(self, root: int, interval: float, scan_ray: bool = False):
        self.root, self.interval, self.scan_ray = root, interval, scan_ray
        self.info: dict[int, dict] = {}
        self.samples = 0
        try:
            import psutil
            self.psutil = psutil
        except ImportError:
            self.psutil = None
        self.baseline = set(self._ray_processes()) if scan_ray else set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _ray_processes(self) -> dict[int, tuple[int, str, int]]:
        if self.psutil is None:
            return {pid: row for pid, row in _proc_snapshot().items() if _is_ray(row[1])}
        found = {}
        for p in self.psutil.process_iter(["pid", "ppid", "cmdline", "memory_info"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if _is_ray(cmd) and p.info["memory_info"] is not None:
                found[p.info["pid"]] = (p.info["ppid"], cmd, p.info["memory_info"].rss // 1024)
        return found

    def _tree(self) -> dict[int, tuple[int, str, int]]:
        """pid → (ppid, command line, RSS kB) of ``root`` and its descendants."""
        if self.psutil is None:
            table = _proc_snapshot()
            children: dict[int, list[int]] = {}
            for pid, (ppid, _, _) in table.items():
                children.setdefault(ppid, []).append(pid)
            tree, stack = {}, [self.root]
            while stack:
                pid = stack.pop()
                if pid in table:
                    tree[pid] = table[pid]
                    stack.extend(children.get(pid, []))
            return tree
        ps, tree = self.psutil, {}
        try:
            root = ps.Process(self.root)
            procs = [root] + root.children(recursive=True)
        except ps.Error:
            return {}
        for p in procs:
            try:
                with p.oneshot():
                    tree[p.pid] = (p.ppid(), " ".join(p.cmdline()), p.memory_info().rss // 1024)
            except ps.Error:
                continue
        return tree

    def sample(self) -> None:
        self.samples += 1
        found = self._tree()
        if self.scan_ray:
            found.update({pid: row for pid, row in self._ray_processes().items()
                          if pid not in self.baseline and pid not in found})
        now = time.time()
        for pid, (ppid, cmd, rss_kb) in found.items():
            entry = self.info.setdefault(pid, {"ppid": ppid, "cmd": cmd[:300], "first": now, "rss_kb": 0,
                                               "hwm_kb": 0})
            entry["rss_kb"] = max(entry["rss_kb"], rss_kb)
            entry["hwm_kb"] = max(entry["hwm_kb"], _proc_hwm_kb(pid))
            entry["last"] = now
            if cmd.startswith("ray::"):  # a Ray worker renames itself after the task it runs
                entry["cmd"] = cmd[:300]

    def role(self, pid: int) -> str:
        """main, forkserver, worker, resource tracker, raylet, gcs server, ray service or other."""
        if pid == self.root:
            return "main"
        entry = self.info[pid]
        cmd = entry["cmd"]
        if "resource_tracker" in cmd:
            return "resource tracker"
        if "forkserver" in cmd:
            return "forkserver" if entry["ppid"] == self.root else "worker"
        if cmd.startswith("ray::") and cmd.split()[0].endswith("Agent"):
            return "ray service"
        if "spawn_main" in cmd or cmd.startswith("ray::") or "default_worker.py" in cmd:
            return "worker"
        if "raylet" in cmd:
            return "raylet"
        if "gcs_server" in cmd:
            return "gcs server"
        return "ray service" if _is_ray(cmd) else "other"


# ---------------------------------------------------------------------------------------------------------------
# One build, from the parent.

def run_build(files: list[Path], engine: str, workers: int, config: Path, shard_docs: int, work_root: Path,
              poll: float, log: Path, ray_address: str = "local", memory_limit: str = "1GB") -> dict:
    """Build ``files`` in a fresh child process and return its timeline, the peaks of its processes and its
    outputs' counts (the build folder is deleted afterwards).

    Raises:
        RuntimeError: the child build failed (the message ends with its stderr).
    """
    build_dir = Path(tempfile.mkdtemp(prefix=f"build-{engine}-", dir=work_root))
    job = {"files": [str(f) for f in files], "work": str(build_dir / "_work"), "out": str(build_dir / "out"),
           "engine": engine, "workers": workers, "config": str(config), "shard_docs": shard_docs,
           "result": str(build_dir / "result.json"), "ray_address": ray_address, "memory_limit": memory_limit}
    (build_dir / "job.json").write_text(json.dumps(job))
    code = os.environ[CODE_ENV]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([code, str(BENCH)])}
    command = [sys.executable, "-c", "import sys, corpus_scale; corpus_scale.child(sys.argv[1])",
               str(build_dir / "job.json")]
    with open(log, "ab") as err:
        started = time.time()
        proc = subprocess.Popen(command, cwd=code, env=env, stdout=err, stderr=err)
        poller = TreePoller(proc.pid, poll, scan_ray=engine == "ray" and ray_address != "local")
        rc = proc.wait()
        poller.stop()
        lifetime = time.time() - started
    if rc:
        tail = log.read_text(errors="replace")[-3000:]
        shutil.rmtree(build_dir, ignore_errors=True)
        raise RuntimeError(f"{engine} build of {len(files)} files failed (exit {rc}); log {log}:\n{tail}")
    t = json.loads((build_dir / "result.json").read_text())
    outputs = _outputs(build_dir / "out", files)
    shutil.rmtree(build_dir, ignore_errors=True)
    return {"timeline": t, "processes": _processes(poller, t), "outputs": outputs, "child_lifetime_s": lifetime,
            "poll_samples": poller.samples}


def _processes(poller: TreePoller, t: dict) -> list[dict]:
    """Every process seen, with its role and peak RSS in MB (largest of sampled RSS, VmHWM polled, and the VmHWM
    its shard calls reported; the main process's own VmHWM at the end of the build)."""
    call_hwm: dict[int, int] = {}
    for m in t["maps"]:
        for c in m["calls"]:
            call_hwm[c["pid"]] = max(call_hwm.get(c["pid"], 0), c["hwm_kb"])
    rows = []
    for pid, entry in poller.info.items():
        role = poller.role(pid)
        peak = max(entry["rss_kb"], entry["hwm_kb"], call_hwm.get(pid, 0))
        if role == "main":
            peak = max(peak, t["main_hwm_kb"])
        rows.append({"pid": pid, "role": role, "peak_mb": peak / 1024, "sampled_rss_mb": entry["rss_kb"] / 1024,
                     "hwm_mb": entry["hwm_kb"] / 1024, "shard_calls": sum(c["pid"] == pid for m in t["maps"]
                                                                          for c in m["calls"]),
                     "seen_s": entry.get("last", entry["first"]) - entry["first"], "cmd": entry["cmd"][:120]})
    for pid, hwm in call_hwm.items():  # a worker that lived between two samples
        if pid not in poller.info:
            rows.append({"pid": pid, "role": "worker", "peak_mb": hwm / 1024, "sampled_rss_mb": 0.0,
                         "hwm_mb": hwm / 1024, "shard_calls": sum(c["pid"] == pid for m in t["maps"]
                                                                  for c in m["calls"]), "seen_s": 0.0, "cmd": ""})
    return sorted(rows, key=lambda r: (r["role"] != "main", r["role"], r["pid"]))


def _outputs(out: Path, files: list[Path]) -> dict:
    """Kept documents, removals by stage, and the crawl's ground truth against them (kind → where it went).

    A kept document is ``kept_origin_filtered`` when it is a near copy whose original a per-document rule removed
    (nothing kept to be a duplicate of), ``kept_boilerplate_cut`` when the boilerplate pass cut lines from it (a
    family of ``min_docs`` or more copies makes its shared lines boilerplate, so what is left may no longer match),
    else ``kept``."""
    import duckdb
    import pyarrow.parquet as pq

    if (out / "kept").is_dir():  # parts (tasks.readers), else a checkout that wrote one file each
        kept_parts = [str(f) for f in sorted((out / "kept").glob("part-*.parquet"))]
        removal_parts = [str(f) for f in sorted((out / "removals").glob("*.parquet"))]
    else:
        kept_parts, removal_parts = [str(out / "kept.parquet")], [str(out / "removals.parquet")]
    kept = sum(pq.ParquetFile(f).metadata.num_rows for f in kept_parts)
    labels = files[0].parent.parent / "labels.parquet"
    with duckdb.connect() as con:
        stages = dict(con.execute("SELECT stage, count(*) FROM read_parquet(?) GROUP BY stage ORDER BY stage",
                                  [removal_parts]).fetchall())
        fates: dict[str, dict[str, int]] = {}
        if labels.exists():
            for kind, stage, n in con.execute(
                    "SELECT l.kind, CASE WHEN r.stage IS NOT NULL THEN r.stage "
                    "  WHEN l.kind = 'near' AND o.stage NOT IN ('dedup_exact', 'dedup_near') "
                    "    THEN 'kept_origin_filtered' "
                    "  WHEN k.lines_dropped > 0 THEN 'kept_boilerplate_cut' ELSE 'kept' END, count(*) "
                    "FROM read_parquet(?) l LEFT JOIN read_parquet(?) r USING (doc_id) "
                    "LEFT JOIN read_parquet(?) o ON o.doc_id = l.origin_id "
                    "LEFT JOIN (SELECT doc_id, lines_dropped FROM read_parquet(?)) k USING (doc_id) "
                    "GROUP BY ALL ORDER BY ALL",
                    [str(labels), removal_parts, removal_parts, kept_parts]).fetchall():
                fates.setdefault(kind, {})[stage] = n
    return {"kept": kept, "removed_by_stage": stages, "fate_by_kind": fates}


# ---------------------------------------------------------------------------------------------------------------
# Figures.

def pass_name(label: str) -> str:
    """A shard-map label as a pass name (``corpus-filter`` → ``filter``)."""
    return label.removeprefix("corpus-")


def _stage_spans(ticks: list[dict], end: float) -> list[tuple[float, float, str]]:
    """(start, end, stage) of each progress stage: from its (stage, 0, total) tick to its (stage, total, total)
    tick, or to the next stage's first tick when it is never closed."""
    spans: list[tuple[float, float, str]] = []
    open_: dict[str, float] = {}
    for tick in ticks:
        stage, t = tick["stage"], tick["t"]
        if tick["done"] == 0 and stage not in open_:
            for other in [o for o in open_ if o != stage]:  # an earlier stage that never closed ends here
                spans.append((open_.pop(other), t, other))
            open_[stage] = t
        if tick["done"] >= tick["total"] and stage in open_:
            spans.append((open_.pop(stage), t, stage))
    spans += [(t, end, stage) for stage, t in open_.items()]
    return spans


def passes(t: dict) -> dict[str, dict]:
    """Seconds per pass from a child's timeline.

    Parallel passes are the shard-map calls, by label, with the core-seconds their shards used and their number
    of shards. Every other instant of split + curate is main-process (serial) time, named by the innermost thing
    around it: a timed build function (``TIMED_FUNCTIONS``), else a progress stage, else ``split`` or
    ``other (main)``; main-process time in a progress stage named like a shard-map pass (the dispatch around the
    call) is added to that pass's wall time.
    """
    maps = [(m["start"], m["end"]) for m in t["maps"]]
    timers = [(x["start"], x["end"], TIMED_FUNCTIONS.get(x["name"], x["name"])) for x in t["timers"]]
    stages = _stage_spans(t["ticks"], t["curate"][1])
    split, curate = tuple(t["split"]), tuple(t["curate"])
    out: dict[str, dict] = {}
    for m in t["maps"]:
        p = out.setdefault(pass_name(m["label"]), {"kind": "parallel", "seconds": 0.0, "busy_core_s": 0.0,
                                                    "calls": 0})
        p["seconds"] += m["end"] - m["start"]
        p["busy_core_s"] += sum(c["end"] - c["start"] for c in m["calls"])
        p["calls"] += len(m["calls"])
    parallel = set(out)
    edges = sorted({split[0], split[1], curate[0], curate[1], *(x for s in maps for x in s),
                    *(x for s in timers for x in s[:2]), *(x for s in stages for x in s[:2])})
    for a, b in zip(edges, edges[1:]):
        mid = (a + b) / 2
        if b <= a or any(s <= mid < e for s, e in maps):
            continue
        inside = lambda spans: [name for s, e, name in spans if s <= mid < e]  # noqa: E731
        if split[0] <= mid < split[1]:
            name = (inside(timers) or ["split"])[-1]
        elif curate[0] <= mid < curate[1]:
            name = (inside(timers) or inside(stages) or ["other (main)"])[-1]
        else:
            continue
        if name in parallel:  # the stage around a shard-map call: its dispatch, part of that pass's wall time
            out[name]["seconds"] += b - a
            continue
        p = out.setdefault(name, {"kind": "serial", "seconds": 0.0, "busy_core_s": 0.0, "calls": 0})
        p["seconds"] += b - a
    order = {name: i for i, name in enumerate(PASS_ORDER)}
    return dict(sorted(out.items(), key=lambda kv: (kv[0] == "other (main)", order.get(kv[0], len(order)), kv[0])))


def figures(build: dict, crawl_report: dict, workers: int) -> dict:
    """The headline figures of one build."""
    t = build["timeline"]
    wall = t["curate"][1] - t["split"][0]
    cores = min(workers, os.cpu_count() or workers)
    nbytes, docs = crawl_report["content_bytes"], crawl_report["docs"]
    procs = build["processes"]
    workers_seen = [p for p in procs if p["role"] == "worker"]
    main_peak = max([p["peak_mb"] for p in procs if p["role"] == "main"] + [t["main_hwm_kb"] / 1024])
    by_role: dict[str, float] = {}
    for p in procs:
        by_role[p["role"]] = max(by_role.get(p["role"], 0.0), p["peak_mb"])
    return {"docs": docs, "content_bytes": nbytes, "wall_s": wall, "cores": cores, "docs_per_s": docs / wall,
            "mb_per_s_per_core": nbytes / 1e6 / wall / cores, "main_peak_mb": main_peak,
            "largest_worker_mb": max((p["peak_mb"] for p in workers_seen), default=float("nan")),
            "workers_seen": len(workers_seen), "peak_mb_by_role": by_role, "passes": passes(t),
            "child_lifetime_s": build["child_lifetime_s"]}


def fit_line(xs: list[float], ys: list[float]) -> dict:
    """Least-squares line y = intercept + slope · x: slope, intercept and the largest residual (same units)."""
    import numpy as np

    if len(xs) < 2:
        return {"slope": float("nan"), "intercept": ys[0] if ys else float("nan"), "residual": float("nan")}
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    residual = float(np.abs(np.asarray(ys) - (slope * np.asarray(xs) + intercept)).max())
    return {"slope": float(slope), "intercept": float(intercept), "residual": residual}


def fit_power(xs: list[float], ys: list[float]) -> dict:
    """Least-squares fit of log y = log a + e · log x: a power law y = a · x^e (e = 1 is linear)."""
    import numpy as np

    pts = [(x, y) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(pts) < 2:
        return {"a": float("nan"), "exponent": float("nan")}
    e, log_a = np.polyfit(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]), 1)
    return {"a": float(math.exp(log_a)), "exponent": float(e)}


def memory_slopes(rows: list[dict]) -> dict[str, dict]:
    """Per process role (the largest of each role in each build): peak RSS ≈ intercept + slope · documents, slope
    in bytes per document, intercept and residual in MB, and the verdict against the target."""
    roles = sorted({r for row in rows for r in row["peak_mb_by_role"]})
    out = {}
    for role in roles:
        pts = [(row["docs"], row["peak_mb_by_role"][role] * 2**20) for row in rows if role in row["peak_mb_by_role"]]
        if len(pts) < len(rows):
            continue  # not in every build: no line to fit
        line = fit_line([p[0] for p in pts], [p[1] for p in pts])
        slope = line["slope"]
        out[role] = {"bytes_per_doc": slope, "intercept_mb": line["intercept"] / 2**20,
                     "max_mb": max(p[1] for p in pts) / 2**20,
                     "residual_mb": line["residual"] / 2**20 if not math.isnan(line["residual"]) else float("nan"),
                     "verdict": "n/a" if math.isnan(slope) else ("PASS" if slope < TARGET_BYTES_PER_DOC else "FAIL")}
    return out


def pass_exponents(rows: list[dict]) -> dict[str, float]:
    """Each pass's power of documents over the builds ``rows`` (NaN with fewer than two sizes)."""
    names = list(dict.fromkeys(n for row in rows for n in row["passes"]))
    return {n: fit_power([r["docs"] for r in rows], [r["passes"].get(n, {}).get("seconds", 0.0) for r in rows])
            ["exponent"] for n in names}


def estimate(rows: list[dict], slopes: dict, sizes: list[int]) -> dict[int, dict]:
    """Wall time per pass at ``sizes`` from each pass's power law over the builds run, and the peaks from the
    memory lines."""
    out = {}
    names = list(dict.fromkeys(n for row in rows for n in row["passes"]))
    for size in sizes:
        per_pass = {}
        for name in names:
            law = fit_power([r["docs"] for r in rows], [r["passes"].get(name, {}).get("seconds", 0.0) for r in rows])
            if not math.isnan(law["exponent"]):
                per_pass[name] = {"seconds": law["a"] * size ** law["exponent"], "exponent": law["exponent"]}
        peaks = {role: max(s["max_mb"], s["intercept_mb"] + max(0.0, s["bytes_per_doc"]) * size / 2**20)
                 for role, s in slopes.items() if not math.isnan(s["bytes_per_doc"])}
        out[size] = {"passes": per_pass, "wall_s": sum(p["seconds"] for p in per_pass.values()), "peak_mb": peaks}
    return out


def extrapolate(calibration: dict[str, list[dict]], slopes: dict, machines: list[int], cores: int,
                exponents: dict[str, float]) -> dict[str, dict]:
    """1 TB of each content type on each machine count, from that type's builds (``calibration[type]``: figures
    of one or more sizes).

    Parallel pass p: 10^12 B / (rate_p · N · cores), rate_p = input bytes / shard core-seconds of the largest build
    (ideal balance, no data movement). Serial pass p, whatever N: with two or more sizes, fixed_p + per_doc_p ·
    documents in 1 TB, from a least-squares line of its main-process seconds over documents (per_doc_p < 0 is
    noise around a constant: 0, and fixed_p the largest time measured); with one size, 10^12 B / (input bytes /
    seconds), its fixed cost charged per byte. Main-process memory: intercept + slope · documents in 1 TB at the
    type's mean document size. ``exponents``: each pass's measured power of documents, reported so that growth
    faster than linear is visible (the linear extrapolation is then a lower bound).
    """
    out = {}
    for ctype, figs in calibration.items():
        figs = sorted(figs if isinstance(figs, list) else [figs], key=lambda f: f["docs"])
        fig = figs[-1]
        nbytes = fig["content_bytes"]
        docs_tb = TB * fig["docs"] / nbytes
        rates = {}
        for name, p in fig["passes"].items():
            if p["kind"] == "parallel":
                rates[name] = {"kind": "parallel", "mb_per_core_s": nbytes / 1e6 / p["busy_core_s"]
                               if p["busy_core_s"] > 0 else float("inf")}
            elif len(figs) > 1:
                seconds = [f["passes"].get(name, {}).get("seconds", 0.0) for f in figs]
                line = fit_line([f["docs"] for f in figs], seconds)
                per_doc = max(0.0, line["slope"])
                fixed = max(0.0, line["intercept"]) if line["slope"] >= 0 else max(seconds)
                rates[name] = {"kind": "serial", "us_per_doc": per_doc * 1e6, "fixed_s": fixed,
                               "seconds_1tb": fixed + per_doc * docs_tb,
                               "mb_per_s": nbytes / 1e6 / p["seconds"] if p["seconds"] > 0 else float("inf")}
            elif p["seconds"] > 0:
                rates[name] = {"kind": "serial", "mb_per_s": nbytes / 1e6 / p["seconds"],
                               "seconds_1tb": TB / 1e6 / (nbytes / 1e6 / p["seconds"])}
            if name in rates:
                rates[name]["exponent"] = exponents.get(name, float("nan"))
        serial_s = sum(r["seconds_1tb"] for r in rates.values() if r["kind"] == "serial")
        rows = {}
        for n in machines:
            parallel_s = sum(TB / 1e6 / (r["mb_per_core_s"] * n * cores) for r in rates.values()
                             if r["kind"] == "parallel")
            total = parallel_s + serial_s
            rows[n] = {"parallel_h": parallel_s / 3600, "serial_h": serial_s / 3600, "total_h": total / 3600,
                       "serial_share": serial_s / total if total else float("nan")}
        one_core = sum(TB / 1e6 / r["mb_per_core_s"] for r in rates.values() if r["kind"] == "parallel")
        # A slope below zero is noise around a flat line: the memory is then the largest peak measured.
        memory = {role: max(s["max_mb"], s["intercept_mb"] + max(0.0, s["bytes_per_doc"]) * docs_tb / 2**20) / 1024
                  for role, s in slopes.items() if not math.isnan(s["bytes_per_doc"])}
        out[ctype] = {"calibration_docs": [f["docs"] for f in figs], "mean_doc_bytes": nbytes / fig["docs"],
                      "docs_in_1tb": docs_tb,
                      "rates": rates, "machines": rows, "cores_per_machine": cores,
                      "amdahl_max_speedup": (one_core + serial_s) / serial_s if serial_s else float("inf"),
                      "peak_gb_at_1tb": memory}
    return out


# ---------------------------------------------------------------------------------------------------------------
# Printing.

def _fmt_s(s: float) -> str:
    return f"{s:,.1f}" if s < 100 else f"{s:,.0f}"


def print_builds(rows: list[dict]) -> None:
    names = list(dict.fromkeys(n for r in rows for n in r["passes"]))
    head = (f"{'engine':<10}{'crawl':<7}{'docs':>10}{'input MB':>10}{'wall s':>9}{'docs/s':>8}{'MB/s/core':>10}"
            f"{'main MB':>9}{'worker MB':>10}{'workers':>8}  " + "".join(f"{n[:11]:>12}" for n in names))
    print("\n" + head)
    for r in rows:
        cells = "".join(f"{_fmt_s(r['passes'][n]['seconds']) if n in r['passes'] else '-':>12}" for n in names)
        print(f"{r['engine']:<10}{r['crawl']:<7}{r['docs']:>10,}{r['content_bytes'] / 1e6:>10,.0f}{r['wall_s']:>9,.1f}"
              f"{r['docs_per_s']:>8,.0f}{r['mb_per_s_per_core']:>10.2f}{r['main_peak_mb']:>9,.0f}"
              f"{r['largest_worker_mb']:>10,.0f}{r['workers_seen']:>8}  {cells}")
    kinds = {n: next(r["passes"][n]["kind"] for r in rows if n in r["passes"]) for n in names}
    print("pass columns: seconds of wall time; parallel: " + ", ".join(n for n in names if kinds[n] == "parallel")
          + "; serial (main process): " + ", ".join(n for n in names if kinds[n] == "serial"))


def print_workers(rows: list[dict]) -> None:
    import numpy as np

    print("\npeak RSS per process role (MB): count, max, median; then each worker that ran shards [its calls]")
    for r in rows:
        roles: dict[str, list[float]] = {}
        for p in r["processes"]:
            roles.setdefault(p["role"], []).append(p["peak_mb"])
        summary = "; ".join(f"{role} ×{len(v)} max {max(v):,.0f} median {np.median(v):,.0f}"
                            for role, v in roles.items())
        busy = ", ".join(f"{p['pid']}: {p['peak_mb']:,.0f} [{p['shard_calls']}]" for p in r["processes"]
                         if p["role"] == "worker" and p["shard_calls"])
        ray = f"; Ray started in {r['timeline']['ray_start_s']:.1f} s" if r["timeline"].get("ray_start_s") else ""
        print(f"  {r['engine']} {r['crawl']} {r['docs']:,}: {summary}{ray}\n    workers: {busy}")


def print_slopes(engine: str, slopes: dict, n_builds: int) -> bool:
    print(f"\n{engine}: peak RSS ≈ intercept + slope × documents over {n_builds} builds "
          f"(target < {TARGET_BYTES_PER_DOC:.0f} bytes per document in every process)")
    ok = True
    for role, s in slopes.items():
        if s["verdict"] == "n/a":
            print(f"  {role:<17} n/a (one size: no slope)")
            continue
        ok &= s["verdict"] == "PASS"
        print(f"  {role:<17} {s['intercept_mb']:>8,.0f} MB + {s['bytes_per_doc']:>9,.1f} bytes/doc "
              f"(largest residual {s['residual_mb']:,.0f} MB): {s['verdict']}")
    return ok


def print_estimates(engine: str, est: dict) -> None:
    for size, e in est.items():
        parts = ", ".join(f"{n} {_fmt_s(p['seconds'])} s (n^{p['exponent']:.2f})" for n, p in e["passes"].items())
        peaks = ", ".join(f"{role} {mb:,.0f} MB" for role, mb in e["peak_mb"].items())
        print(f"\n{engine}: estimated at {size:,} documents (power law per pass over the sizes run): "
              f"wall {_fmt_s(e['wall_s'])} s = {parts}; peaks {peaks}")


def print_extrapolation(engine: str, ext: dict, machines: list[int]) -> None:
    for ctype, e in ext.items():
        sizes = e["calibration_docs"] if isinstance(e["calibration_docs"], list) else [e["calibration_docs"]]
        print(f"\n{engine}: 1 TB of {ctype} ({e['docs_in_1tb']:,.3g} documents of {e['mean_doc_bytes']:,.0f} bytes; "
              f"rates from the {' and '.join(f'{n:,}' for n in sizes)}-document {ctype} build"
              f"{'s (serial: fixed + per-document line)' if len(sizes) > 1 else ''}; {e['cores_per_machine']} cores "
              "per machine; parallel passes ideally balanced, no data movement)")
        print(f"  {'machines':>8}{'parallel h':>12}{'serial h':>10}{'total h':>10}{'serial share':>14}")
        for n in machines:
            m = e["machines"][n]
            print(f"  {n:>8}{m['parallel_h']:>12,.1f}{m['serial_h']:>10,.1f}{m['total_h']:>10,.1f}"
                  f"{m['serial_share']:>14.1%}")
        serial_rates = {n: r for n, r in e["rates"].items() if r["kind"] == "serial"}
        total = sum(r["seconds_1tb"] for r in serial_rates.values()) or 1.0
        shown = {n: r for n, r in serial_rates.items() if r["seconds_1tb"] / total >= 0.005}

        def serial_rate(r: dict) -> str:
            if "us_per_doc" in r:
                return f"{r['us_per_doc']:,.2f} µs/doc + {r['fixed_s']:,.2f} s fixed"
            return f"{r['mb_per_s']:,.2f} MB/s"

        serial = [f"{n} {serial_rate(r)} ({r['seconds_1tb'] / total:.0%})" + _growth(r["exponent"])
                  for n, r in shown.items()]
        if len(shown) < len(serial_rates):
            serial.append(f"{len(serial_rates) - len(shown)} more under 0.5% of the serial time")
        parallel = [f"{n} {r['mb_per_core_s']:,.3f} MB/s per core" + _growth(r["exponent"])
                    for n, r in e["rates"].items() if r["kind"] == "parallel"]
        print("  serial parts that remain (main process; share of the serial time): " + "; ".join(serial))
        print("  parallel parts: " + "; ".join(parallel))
        print(f"  Amdahl: at most {e['amdahl_max_speedup']:,.1f}× faster than one core, however many machines")
        mem = ", ".join(f"{role} {gb:,.1f} GB" for role, gb in e["peak_gb_at_1tb"].items())
        print(f"  peak memory at that document count (memory lines): {mem or 'n/a (one size: no line)'}")


def _growth(exponent: float) -> str:
    if math.isnan(exponent):
        return ""
    return f" (time ∝ n^{exponent:.2f}{', faster than linear: a lower bound' if exponent > 1.1 else ''})"


def print_crawl(name: str, r: dict) -> None:
    m = r["measured"]
    w = r["written"]
    types = ", ".join(f"{t} {v['docs']:,} docs {v['bytes'] / 1e6:,.1f} MB" for t, v in r["by_type"].items())
    print(f"crawl {name}: {r['docs']:,} documents, {r['content_bytes'] / 1e6:,.1f} MB of content ({types}), "
          f"{len(r['sources'])} sources, generated in {r['seconds']:,.1f} s; "
          f"near: declared {r['declared']['near_share']:.1%}, written {w['near'] / r['docs']:.1%}, measured "
          f"{m['near_share']:.1%} ({m['near_above_threshold']:.1%} of {m['near_pairs']} sampled pairs at Jaccard ≥ "
          f"{m['threshold']}, {m['identical_after_extraction']:.1%} identical after extraction, median "
          f"{m['near_jaccard'].get('median', float('nan')):.3f}); exact: declared {r['declared']['exact_share']:.1%}, "
          f"measured {m['exact_share']:.1%}; unrelated originals at Jaccard ≥ {m['threshold']}: "
          f"{m['unrelated_above_threshold']:.1%} of {m['unrelated_pairs']} (max "
          f"{m['unrelated_jaccard'].get('max', float('nan')):.3f})")


# ---------------------------------------------------------------------------------------------------------------

def _ints(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=_ints, default=[10_000, 100_000, 1_000_000], help="documents per build")
    parser.add_argument("--engine", default="processes",
                        help="comma-separated shard maps: processes, ray; 'all' = processes and ray when available")
    parser.add_argument("--workers", type=int, default=None, help="shard workers (default: the config's)")
    parser.add_argument("--ray-address", default="local",
                        help="Ray cluster of --engine ray ('local': a private one per build, in its process tree)")
    parser.add_argument("--shard-docs", type=int, default=None, help="documents per shard (default: the config's)")
    parser.add_argument("--memory-limit", default=None,
                        help="DuckDB memory_limit of the main process's global passes, e.g. 256MB "
                             "(default: the config's [corpus.execution] memory_limit)")
    parser.add_argument("--code", type=Path, default=None, help="checkout whose project is measured (default: this)")
    parser.add_argument("--config", type=Path, default=None, help="config whose [corpus] is used "
                        "(default: configs/demo.toml of --code)")
    parser.add_argument("--text", choices=crawl.ORIGINS, default="auto", help="real text the crawl is made of")
    parser.add_argument("--runs-dir", type=Path, default=Path(os.environ.get("PRETRAIN_RUNS_DIR", ROOT / "runs")))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--near-share", type=float, default=crawl.CrawlSpec.near_share)
    parser.add_argument("--exact-share", type=float, default=crawl.CrawlSpec.exact_share)
    parser.add_argument("--html-share", type=float, default=crawl.CrawlSpec.html_share)
    parser.add_argument("--verify-pairs", type=int, default=crawl.CrawlSpec.verify_pairs)
    parser.add_argument("--calibrate-docs", type=_ints, default=None,
                        help="comma-separated documents of the HTML-only and text-only builds the 1 TB rates come "
                             "from; two or more sizes fit the serial parts as fixed + per-document (default: the "
                             "sizes run; 0: use the mixed builds)")
    parser.add_argument("--worker-ratio", type=int, default=0, metavar="ROUNDS",
                        help="also build the largest size with 1 worker and with --workers, alternating, ROUNDS "
                             "times each, and print the wall-time ratio (0: not measured)")
    parser.add_argument("--machines", type=_ints, default=[1, 8, 64])
    parser.add_argument("--cores-per-machine", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--estimate", type=_ints, default=[1_000_000], help="sizes to estimate when not run")
    parser.add_argument("--poll", type=float, default=0.2, help="seconds between memory samples")
    parser.add_argument("--crawl-dir", type=Path, default=None,
                        help="keep (and reuse) generated crawls here, with the snapshot of the real text they are "
                             "made of")
    parser.add_argument("--work-dir", type=Path, default=None, help="where builds run (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=None, help="JSON of every figure")
    return parser.parse_args(argv)


def _engines(text: str) -> list[str]:
    wanted = [e.strip() for e in text.split(",") if e.strip()]
    if wanted == ["all"]:
        return ["processes"] + (["ray"] if ray_available() else [])
    unknown = [e for e in wanted if e not in ENGINES]
    if unknown or not wanted:
        sys.exit(f"--engine {text!r}: use a comma-separated list of {', '.join(ENGINES)}, or all")
    if "ray" in wanted and not ray_available():
        import infra.shard_map as shard_map
        sys.exit(f"--engine ray: {shard_map.__file__} has no Ray shard map ({' or '.join(RAY_MAP_NAMES)}) "
                 "or the ray package is missing")
    return wanted


def _git(code: Path) -> dict:
    def run(*args: str) -> str:
        command = ["git", "-C", str(code), *args]
        proc = subprocess.run(command, capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else ""
    return {"path": str(code), "commit": run("rev-parse", "HEAD"), "dirty": bool(run("status", "--porcelain"))}


def run(argv: list[str] | None = None) -> dict:
    """Run the benchmark with command-line ``argv``; print the tables and return every figure (also written to
    ``--out``)."""
    args = parse_args(argv)
    code = use_code(args.code)
    from flows.config import load_config

    config = (args.config or code / "configs" / "demo.toml").resolve()
    corpus_cfg = load_config(config).corpus
    workers = args.workers or corpus_cfg.execution.workers
    shard_docs = args.shard_docs or corpus_cfg.execution.shard_docs
    memory_limit = args.memory_limit or corpus_cfg.execution.memory_limit
    engines = _engines(args.engine)
    calibrate = list(args.sizes) if args.calibrate_docs is None else [n for n in args.calibrate_docs if n > 0]
    print(f"measuring {code} ({_git(code)['commit'][:12] or 'not a git checkout'}), config {config}, "
          f"{workers} workers, {shard_docs} documents per shard, DuckDB memory_limit {memory_limit}, "
          f"engines {', '.join(engines)}, "
          f"{os.cpu_count()} CPUs")

    work_root = Path(tempfile.mkdtemp(prefix="corpus-scale-", dir=args.work_dir))
    crawl_root = args.crawl_dir or work_root / "crawls"
    crawl_root.mkdir(parents=True, exist_ok=True)
    # The real text is snapshotted into the crawl folder on first use and read from there afterwards: the crawls
    # kept in --crawl-dir stay the same whichever process or checkout runs next (crawl.real_text).
    pool = crawl.load_pool(args.text, args.runs_dir, snapshot_dir=crawl_root)
    print(f"text: {pool.origin} ({sum(map(len, pool.html.values()))} HTML templates, "
          f"{sum(map(len, pool.text.values()))} paragraph groups, digest {pool.digest})")
    log = work_root / "builds.log"
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "code": _git(code),
              "config": str(config), "machine": _machine(), "args": {k: str(v) for k, v in vars(args).items()},
              "workers": workers, "shard_docs": shard_docs, "memory_limit": memory_limit, "text_origin": pool.origin,
              "crawls": {}, "builds": []}

    def crawl_for(docs: int, html_share: float, name: str) -> tuple[dict, list[Path]]:
        spec = crawl.CrawlSpec(docs=docs, seed=args.seed, near_share=args.near_share, exact_share=args.exact_share,
                               html_share=html_share, verify_pairs=args.verify_pairs)
        folder = crawl_root / f"{name}-{docs}-seed{args.seed}"
        report = crawl.ensure(spec, pool, folder, corpus_cfg)
        result["crawls"][f"{name}-{docs}"] = report
        print_crawl(f"{name}-{docs}", report)
        return report, crawl.doc_files(folder)

    def build(engine: str, report: dict, files: list[Path], name: str, n_workers: int | None = None,
              record: bool = True) -> dict:
        started = time.perf_counter()
        n_workers = n_workers or workers
        b = run_build(files, engine, n_workers, config, shard_docs, work_root, args.poll, log, args.ray_address,
                      memory_limit)
        row = {"engine": engine, "crawl": name, **figures(b, report, n_workers), "workers": n_workers,
               "processes": b["processes"],
               "outputs": b["outputs"], "timeline": b["timeline"], "poll_samples": b["poll_samples"]}
        if not b["timeline"]["build_module"].startswith(str(code)):
            sys.exit(f"the child imported {b['timeline']['build_module']}, not the project in {code}")
        if record:
            result["builds"].append(row)
        fate = b["outputs"]["fate_by_kind"]
        print(f"  {engine} {name} {report['docs']:,} ({n_workers} workers): {row['wall_s']:,.1f} s build "
              f"({time.perf_counter() - started:,.1f} s with start-up), kept {b['outputs']['kept']:,}; "
              f"near duplicates → {fate.get('near', {})}; exact → {fate.get('exact', {})}", flush=True)
        return row

    def worker_ratio(report: dict, files: list[Path], engine: str) -> dict:
        """Wall times of the same build with 1 worker and with ``workers``, alternating, ``--worker-ratio``
        rounds each; the ratio of the medians (ideal: the number of workers, at most the cores)."""
        walls: dict[int, list[float]] = {1: [], workers: []}
        for _ in range(args.worker_ratio):
            for n in (1, workers):
                walls[n].append(build(engine, report, files, "mixed", n, record=False)["wall_s"])
        med = {n: statistics.median(v) for n, v in walls.items()}
        ratio = med[1] / med[workers]
        print(f"  1 → {workers} workers at {report['docs']:,} documents: {med[1]:,.1f} s → {med[workers]:,.1f} s "
              f"(medians of {args.worker_ratio}), ratio {ratio:.2f} (ideal {min(workers, os.cpu_count() or 1)})",
              flush=True)
        return {"docs": report["docs"], "walls_s": walls, "ratio": ratio}

    try:
        for size in args.sizes:
            report, files = crawl_for(size, args.html_share, "mixed")
            for engine in engines:
                build(engine, report, files, "mixed")
            if size == max(args.sizes) and args.worker_ratio:
                result["worker_ratio"] = worker_ratio(report, files, engines[0])
            if args.crawl_dir is None:
                shutil.rmtree(files[0].parent.parent, ignore_errors=True)
        calibration: dict[str, dict[str, list[dict]]] = {e: {} for e in engines}
        for ctype, share in (("html", 1.0), ("text", 0.0)) if calibrate else ():
            for size in calibrate:
                report, files = crawl_for(size, share, ctype)
                for engine in engines:
                    calibration[engine].setdefault(ctype, []).append(build(engine, report, files, ctype))
                if args.crawl_dir is None:
                    shutil.rmtree(files[0].parent.parent, ignore_errors=True)
    finally:
        shutil.rmtree(work_root / "crawls", ignore_errors=True)

    mixed = [r for r in result["builds"] if r["crawl"] == "mixed"]
    print_builds(result["builds"])
    print_workers(result["builds"])
    result.update(slopes={}, estimates={}, extrapolation={})
    all_ok = True
    for engine in engines:
        rows = [r for r in mixed if r["engine"] == engine]
        slopes = memory_slopes(rows)
        result["slopes"][engine] = slopes
        all_ok &= print_slopes(engine, slopes, len(rows))
        todo = [s for s in args.estimate if s not in {r["docs"] for r in rows}]
        est = estimate(rows, slopes, todo) if len(rows) > 1 and todo else {}
        result["estimates"][engine] = est
        print_estimates(engine, est)
        exponents = pass_exponents(rows)
        cal = calibration[engine] or ({"mixed": rows} if rows else {})
        ext = extrapolate(cal, slopes, args.machines, args.cores_per_machine, exponents)
        result["extrapolation"][engine] = ext
        print_extrapolation(engine, ext, args.machines)
    verdicts = [s["verdict"] for e in result["slopes"].values() for s in e.values()]
    result["verdict"] = "n/a" if all(v == "n/a" for v in verdicts) else ("PASS" if all_ok else "FAIL")
    print(f"\nmemory slopes (< {TARGET_BYTES_PER_DOC:.0f} bytes per document in every process): {result['verdict']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str))
        print(f"figures written to {args.out}")
    shutil.rmtree(work_root, ignore_errors=True)
    return result


def _machine() -> dict:
    info = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    try:
        import psutil
        info["memory_gb"] = psutil.virtual_memory().total / 2**30
    except ImportError:
        info["memory_gb"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return info


if __name__ == "__main__":
    run()
