"""Fault injection: kill the pipeline inside every stage, tear a checkpoint and a commit, corrupt a checkpoint, fill
the disk, start two runs at once, kill the run process alone and kill inside a DuckDB write, MLflow logging, an
Optuna trial and a Ray task; every rerun of the same command must finish with
artifacts whose content equals an uninterrupted run's. docs/faults.md describes the campaign and its record.

    python benchmarks/faults.py                          # 20 random kills + the targeted faults, configs/smoke.toml
    python benchmarks/faults.py --trials 6 --seed 0 --record /tmp/faults.json
    python benchmarks/faults.py --stage mixture --trials 10   # soak one stage: every kill lands in it
    python benchmarks/faults.py --only "tracking store"      # one targeted fault alone (no random kills)

The stages are the registry's (``flows.registry.stage_names()``, read in a child interpreter), so a new stage is
killed and compared without a change here. Each run is ``python -m flows.cli run CONFIG --runs-dir DIR`` in its
own process group; a kill is SIGKILL to the whole group and to every descendant that left it.

1. Reference: two uninterrupted runs in two fresh folders. Their artifacts' content must be equal (training on CPU
   is deterministic); each stage's ``wall_s`` (meta.json) sizes the kill delays.
2. Random kills, in rounds. ``--trials`` wants kills landed per stage (``--trials 130`` = 10 in each of 13
   stages). A round resets every stage it aims at and those after it (artifacts, scratch and the stage's resumable
   state outside them: ``STAGE_STATE``; Prefect's persisted task results are kept, so a stale cached result must
   never stand in for a missing artifact), then runs the command once per target stage in stage order: wait until
   the stage's temporary artifact directory appears, sleep a seeded random fraction of its reference wall time,
   kill. The next run must finish the killed stage and say in one line what it resumed from; the last run goes to
   the end, and its artifacts are compared with the reference. A kill counts for the stage it landed in; rounds
   are added until every stage has its share or ``5 × --trials`` rounds have run.
3. Targeted faults, each on its own reset of main and what follows, each retried up to ``ATTEMPTS`` times when
   its window is missed (a window missed on every attempt is a problem; the next fault still runs):
   - kill (checkpoint write): while a scratch or stable-phase checkpoint of main is being written (its hidden
     ``.step_*.tmp-*`` directory exists). The rerun must resume from the newest complete checkpoint by main's rule:
     the newest usable scratch checkpoint, else the newest stable-phase (WSD trunk, ``<runs>/cache/stable``)
     checkpoint at or before the decay start, else step 0 (``expected_resume``).
   - kill + corrupt checkpoint: a kill once two scratch checkpoints are complete, then 32 bytes flipped in the
     weights of the one the rerun would resume from; the rerun must log that it skips it and resume from the next
     one by the same rule.
   - kill (artifact commit): while main's artifact is committed (``meta.json`` written, not yet renamed).
   - disk full under an artifact: CPT's artifacts folder on a tmpfs too small for it.
   - disk full under the tracking store: the whole runs folder (MLflow, Prefect and DuckDB stores included) on a
     tmpfs that fills during main; after the tmpfs is grown the same command finishes with the reference content.
     Both disk faults want a non-zero exit, one ``error: DiskFullError`` line and no traceback, and no
     ``_COMPLETE`` marker in a partial output.
   - two runs at once: two commands started ``CONCURRENT_GAP_S`` apart on an empty runs folder; both exit 0 and
     the artifacts equal the reference.
   - SIGKILL of the run process alone (not its group): no process of that run may be left 10 s later.
   - kill (DuckDB write): while ``results.duckdb.wal`` exists, in a random stage's publish step; afterwards the
     warehouse rows of the current artifacts must equal the reference's (``warehouse_diff``).
   - kill (MLflow logging): while ``mlflow.db-journal`` exists, inside a random training or evaluation stage; the
     store must pass SQLite's integrity check and hold no run left ``RUNNING``.
   - kill (Optuna trial): while a sweep trial is created and not finished in the Optuna journal.
   - kill (Ray task): the corpus build or the tokenizer on a Ray cluster the harness starts (``RayCluster``),
     killed while a ``ray::<task>`` worker executes; no task may execute 10 s later.
4. Documents lost, per source and per corpus build: documents in − kept − removed (corpus manifest), and the
   kept and removed ids against the ids read (the sources artifact).

Content compared: every file of every artifact but ``NOT_CONTENT_FILES`` (meta.json, the marker, the store's
checksums of the outputs, a checkpoint's checksums of the files beside them), parsed by kind (``file_digest``):
JSON without ``NOT_CONTENT`` keys (when, how long, which process or run, how a rerun got there), Parquet as the
multiset of its rows without ``NOT_CONTENT`` columns, zip containers (``.npz``, ``.pt``, ``.skops``) by member
contents, any other file by bytes; the runs folder's path is replaced by ``<runs>`` in text. Left out besides: the
Python generator's state in a checkpoint (``NOT_CONTENT_PATHS``). A mismatch names the files (and a JSON file's keys)
that differ; an artifact complete only under another key means the code changed after the reference runs.

Needs Linux and root for the tmpfs faults (without mount rights the disk faults are recorded as not run, a problem).
``--record FILE`` writes the campaign as JSON. Exit status 0 only when no problem was found: no mismatching
artifact, lost document, failed rerun, process left after a kill, missing resume line or window missed throughout.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]

POLL_S = 0.001  # checkpoint and commit windows last milliseconds
RUN_TIMEOUT_S = 1800.0
ORPHAN_GRACE_S = 10.0  # how long processes of a killed run may take to go
ATTEMPTS = 3  # tries of a targeted fault whose window was missed
CONCURRENT_GAP_S = 1.0
RANDOM_KILL = "kill (random moment)"

# What a stage keeps outside its artifact and scratch folders, which a rerun resumes or reuses ({experiment}: the
# config's name). A round's reset removes it, so that the stage runs from nothing.
STAGE_STATE = {
    "mixture": ("cache/proxies",),
    "sweep": ("optuna/{experiment}",),
    "ladder": ("cache/ladder",),
    "main": ("cache/stable",),  # WSD stable-phase checkpoints (tasks.train.trunk)
    "branches": ("cache/branches",),
    "cpt": ("cache/cpt",),
}

# JSON keys and Parquet columns that say when, how long, by which process or run, or how a rerun got to the result
# (what it resumed from, what it reused), not what the result is; object ids: skops' ``__id__`` and scikit-learn's
# ``_stop_words_id``. ``cached``: a ladder rung read back from runs/cache/ladder (a rerun reuses the rungs a killed
# run finished; their losses are compared). ``retries`` and ``optuna_number``: a sweep trial redone after a kill, and
# its number in the Optuna journal, which also numbered the attempt the kill cut short (the trial's own ``number``,
# its slot, its LR, seed and losses are compared).
NOT_CONTENT = re.compile(r"_(at|time|timestamp|datetime|date|wall|seconds|duration|elapsed)$|_s$|_run_id$|"
                         r"^(timestamp|datetime|duration|run_id|marker_id|pid)$|^resumed_from|"
                         r"^(trained|reused|scored|cached)$|_(trained|reused)$|^(retries|optuna_number)$|"
                         r"^__id__$|^_stop_words_id$")
# checksums.json: sha256 of the files beside it, compared themselves (a state.json holds the runs folder's path);
# _CHECKSUMS.json likewise, of every output of the artifact.
RECORD_KEYS = 256
# ray_calls.jsonl: which node ran each shard call of a Ray engine (execution, not content; the processes engine
# writes none).
NOT_CONTENT_FILES = {"meta.json", "_COMPLETE", "_CHECKSUMS.json", "checksums.json", "ray_calls.jsonl"}
# Values at these key paths of these files are not content either: the Python generator's state in a checkpoint
# (training draws nothing from it, so the weights, compared, would show any draw; library threads of the run draw
# from it at moments that differ between a resumed and an uninterrupted process).
NOT_CONTENT_PATHS = {"state.json": (("rng", "python"),)}
ZIP_SUFFIXES = {".npz", ".pt", ".skops", ".zip"}
ZIP_NOT_CONTENT = ("serialization_id",)  # torch.save writes a fresh id into every archive

# A rerun's line that says what it resumed from (the product's wording; the interrupt notice is not one).
RESUME_LINE = re.compile(r"^(?!interrupted\b).*\b(resum|reus)\w*\b.*$", re.IGNORECASE | re.MULTILINE)


def registry_stages(python: str = sys.executable) -> tuple[str, ...]:
    """The pipeline's stage names in order, from ``flows.registry`` in a child interpreter (the registry imports
    every stage's definition module; the harness keeps its own process free of them)."""
    out = subprocess.run([python, "-c", "from flows.registry import stage_names; print(*stage_names(), sep='\\n')"],
                         cwd=ROOT, capture_output=True, text=True, check=True, env=_env())
    return tuple(line.strip() for line in out.stdout.splitlines() if line.strip())


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    env.pop("PRETRAIN_RUNS_DIR", None)
    return env


# --------------------------------------------------------------------------- running and killing the command

@dataclass
class Run:
    """One invocation of the pipeline command."""

    proc: subprocess.Popen
    log: Path
    runs: Path
    tmp_before: dict[str, set[str]]
    started: float = field(default_factory=time.monotonic)
    opened: dict[str, float] = field(default_factory=dict)  # stage → when its temporary directory was first seen
    killed_at: float | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def has_opened(self, stage: str) -> bool:
        """Whether this run has opened ``stage``'s temporary artifact directory (the time is noted once)."""
        if stage not in self.opened and new_tmp(self, stage) is not None:
            self.opened[stage] = time.monotonic()
        return stage in self.opened

    def kill_s(self, stage: str) -> float | None:
        """Seconds from ``stage``'s start (as first seen) to the kill."""
        if self.killed_at is None or stage not in self.opened:
            return None
        return round(self.killed_at - self.opened[stage], 3)


class Harness:
    def __init__(self, work: Path, config: str, stages: tuple[str, ...], until: str | None = None):
        self.work, self.config, self.stages, self.until = work, config, stages, until
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.count = 0
        self.orphans: list[str] = []
        self.run_wall: list[float] = []
        self.extra_env: dict[str, str] = {}  # what a run needs to reach the harness's Ray cluster, while it is up

    def start(self, runs: Path, *, until: str | None = "", fsize_limit: int | None = None,
              config: str | None = None) -> Run:
        """Start the command on ``runs``; ``until`` "" takes the harness's, None runs to the end; ``config``: another
        config file than the harness's (same keys, e.g. another execution engine)."""
        self.count += 1
        log = self.logs / f"{self.count:03d}-{runs.name}.log"
        until = self.until if until == "" else until

        def limit_file_size() -> None:  # the disk-full fallback: writes past the limit fail with EFBIG
            import resource

            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, fsize_limit))

        tmp_before = {stage: _tmp_dirs(runs, stage) for stage in self.stages}
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", config or self.config, "--runs-dir",
                                     str(runs), *(["--until", until] if until else [])],
                                    cwd=ROOT, env={**_env(), **self.extra_env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=limit_file_size if fsize_limit else None)
        return Run(proc, log, runs, tmp_before)

    def finish(self, run: Run) -> int:
        """Wait for the run to end by itself; returns its exit status."""
        try:
            rc = run.proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill(run)
            rc = -9
        self.run_wall.append(time.monotonic() - run.started)
        return rc

    def kill(self, run: Run) -> None:
        """SIGKILL the run's process group and every descendant; record any process still alive after
        ``ORPHAN_GRACE_S``."""
        family = _descendants(run.proc.pid) | {run.proc.pid}
        run.killed_at = time.monotonic()
        try:
            os.killpg(run.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in family:  # one that started its own session is not in the group
            _sigkill(pid)
        run.proc.wait()
        self.run_wall.append(time.monotonic() - run.started)
        self.orphans += [f"{pid} ({_cmdline(pid)[:80]})" for pid in _outliving(family)]

    def kill_alone(self, run: Run) -> list[str]:
        """SIGKILL the run's own process only; returns the processes of the run (its descendants and group at
        the kill) still alive after ``ORPHAN_GRACE_S``, which are then killed."""
        family = _descendants(run.proc.pid) | _group(run.proc.pid)
        family.discard(run.proc.pid)
        run.killed_at = time.monotonic()
        _sigkill(run.proc.pid)
        run.proc.wait()
        self.run_wall.append(time.monotonic() - run.started)
        left = _outliving(family)
        described = [f"{pid} ({_cmdline(pid)[:100]})" for pid in sorted(left)]
        for pid in left:
            _sigkill(pid)
        return described


def _sigkill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _outliving(pids: set[int], grace: float = ORPHAN_GRACE_S) -> set[int]:
    deadline = time.monotonic() + grace
    while (left := {p for p in pids if _running(p)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _proc_stats() -> dict[int, list[str]]:
    """pid → the fields of /proc/<pid>/stat after the command name (state, ppid, pgrp, ...)."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stats[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone while we looked
    return stats


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, fields in _proc_stats().items():
        children.setdefault(int(fields[1]), []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _group(pgid: int) -> set[int]:
    return {pid for pid, fields in _proc_stats().items() if int(fields[2]) == pgid}


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def wait_until(run: Run, condition: Callable[[], bool], timeout: float = RUN_TIMEOUT_S) -> bool:
    """Poll ``condition`` while the run is alive; False when the run ended (or timed out) first. A path that
    vanishes while the condition looks at it (the run renames and removes as it goes) reads as not yet."""
    deadline = time.monotonic() + timeout
    while run.alive() and time.monotonic() < deadline:
        try:
            if condition():
                return True
        except (FileNotFoundError, NotADirectoryError):
            pass
        time.sleep(POLL_S)
    return False


def sleep_while_alive(run: Run, seconds: float) -> bool:
    """Sleep up to ``seconds``; False when the run ended first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not run.alive():
            return False
        time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
    return run.alive()


# --------------------------------------------------------------------------- stores, trials and tasks in progress

# Warehouse tables that log every run (a row per stage per run, a forecast per run that made one), not an
# artifact's content.
WAREHOUSE_LOGS = {"stage_runs", "forecasts"}


def warehouse_diff(reference: Path, ours: Path, keys: dict[str, str]) -> list[str]:
    """Tables whose rows written from the current artifacts (``artifact_key`` in ``keys``) differ between two
    warehouses, by ``frame_digest``; tables without ``artifact_key`` are compared whole. ``WAREHOUSE_LOGS`` are
    left out. Both files are opened read-only."""
    import duckdb

    wanted = sorted(set(keys.values()))

    def tables(path: Path) -> dict[str, Any]:
        with duckdb.connect(str(path), read_only=True) as con:
            names = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                               "WHERE table_type = 'BASE TABLE'").fetchall()]
            out = {}
            for name in names:
                if name in WAREHOUSE_LOGS:
                    continue
                frame = con.execute(f'SELECT * FROM "{name}"').df()
                if "artifact_key" in frame:
                    frame = frame[frame["artifact_key"].isin(wanted)]
                out[name] = frame
            return out

    ref, got = tables(reference), tables(ours)
    differing = [f"{t}: missing" for t in sorted(set(ref) - set(got))]
    differing += [f"{t}: {len(got[t])} rows vs {len(ref[t])} in the reference" for t in sorted(set(ref) & set(got))
                  if frame_digest(got[t], str(ours.parent.resolve())) != frame_digest(ref[t], str(reference.parent.resolve()))]
    return differing


def tracking_store_state(db: Path) -> dict[str, Any]:
    """SQLite's ``integrity_check`` of an MLflow store and its runs by status: {ok, summary}. ``ok``: the check
    passes and no run is left ``RUNNING``."""
    import sqlite3

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
        statuses = dict(con.execute("SELECT status, COUNT(*) FROM runs GROUP BY status").fetchall())
    finally:
        con.close()
    summary = f"integrity_check {integrity}; runs by status " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
    return {"ok": integrity == "ok" and not statuses.get("RUNNING"), "summary": summary}


def running_trials(journal: Path) -> list[int]:
    """Trials an Optuna journal has created but not finished (no ``SET_TRIAL_STATE_VALUES`` to a final state);
    a torn last line (being written) is ignored. Trials are numbered by their creation order in the journal."""
    from optuna.storages.journal._storage import JournalOperation

    created, finished = 0, set()
    try:
        lines = journal.read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            op = json.loads(line)
        except ValueError:
            continue
        if op.get("op_code") == JournalOperation.CREATE_TRIAL:
            created += 1
        elif op.get("op_code") == JournalOperation.SET_TRIAL_STATE_VALUES and op.get("state") in (1, 2, 3):
            finished.add(op["trial_id"])  # COMPLETE, PRUNED, FAIL
    return [t for t in range(created) if t not in finished]


# Ray process titles that are not a task: an idle worker and the node's own agents.
RAY_NOT_TASKS = {"IDLE", "DashboardAgent", "RuntimeEnvAgent", "JobSupervisor"}


def ray_tasks_executing(cluster_pid: int | None = None) -> dict[int, str]:
    """Ray worker processes executing a task now: pid → task name (Ray titles a worker ``ray::<task>`` while it
    runs one and ``ray::IDLE`` otherwise); with ``cluster_pid``, only the workers under that ``ray start`` process
    (another cluster on the machine, another test's, runs tasks of the same names)."""
    found = {}
    ours = _descendants(cluster_pid) if cluster_pid is not None else None
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (ours is None or int(entry.name) in ours):
            title = _cmdline(int(entry.name)).strip()
            if title.startswith("ray::") and title.split()[0][5:] not in RAY_NOT_TASKS and _running(int(entry.name)):
                found[int(entry.name)] = title.split()[0][5:]
    return found


class RayCluster:
    """A one-node Ray cluster of the harness's own: ``ray start --head --block`` in its own session, its temp folder
    short and under /tmp (Ray's socket paths must stay under ~107 characters), loopback only, token auth; stopped
    by the ids of the processes it started, never by a machine-wide ``ray stop``."""

    def __init__(self, work: Path, host: str = "127.0.0.2", timeout_s: float = 120.0):
        import secrets
        import socket

        self.temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
        token = self.temp / "token"
        token.write_text(secrets.token_hex(32))
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        self.address = f"{host}:{port}"
        self.env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | self.env
        self.log = work / "logs" / "ray-head.log"
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", "--port", str(port),
             "--node-ip-address", host, "--include-dashboard=false", "--temp-dir", str(self.temp), "--num-cpus", "2",
             "--disable-usage-stats", "--object-store-memory", str(100 * 2**20)],
            cwd=self.temp, env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while "Ray runtime started" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Ray head did not start; log {self.log}")
            time.sleep(0.5)

    def stop(self) -> list[str]:
        """SIGTERM the head (it stops its processes), then SIGKILL whatever of it is left: its descendants and any
        process naming its temp folder. Returns what was still alive."""
        ours = _descendants(self.proc.pid) | {self.proc.pid}
        ours |= {int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and str(self.temp) in _cmdline(int(e.name))}
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        left = _outliving(ours, 15.0)
        described = [f"{pid} ({_cmdline(pid)[:80]})" for pid in sorted(left)]
        for pid in left:
            _sigkill(pid)
        shutil.rmtree(self.temp, ignore_errors=True)
        return described


# --------------------------------------------------------------------------- the runs folder

def _names(folder: Path) -> list[str]:
    """Entry names of ``folder``; none when it is missing or vanishes while listed."""
    try:
        return [entry.name for entry in os.scandir(folder)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _tmp_dirs(runs: Path, stage: str) -> set[str]:
    return {name for name in _names(runs / "artifacts" / stage) if name.startswith(".tmp-")}


def new_tmp(run: Run, stage: str) -> Path | None:
    """The temporary artifact directory this run opened for ``stage`` (still there: not committed yet)."""
    fresh = _tmp_dirs(run.runs, stage) - run.tmp_before.get(stage, set())
    return run.runs / "artifacts" / stage / sorted(fresh)[0] if fresh else None


def stage_in_progress(run: Run, stages: tuple[str, ...]) -> str:
    """The stage whose temporary directory this run holds open now, else 'between stages'."""
    open_now = [stage for stage in stages if new_tmp(run, stage) is not None]
    return open_now[-1] if open_now else "between stages"


def complete(runs: Path, stage: str, key: str) -> bool:
    folder = runs / "artifacts" / stage / key
    return (folder / "_COMPLETE").is_file() and (folder / "meta.json").is_file()


def reset(runs: Path, stages: list[str] | tuple[str, ...], experiment: str) -> None:
    """Make ``stages`` never-run in ``runs``: artifacts (and stale attempts), scratch, and their resumable state
    (``STAGE_STATE``). Prefect's persisted task results and the MLflow/DuckDB records stay."""
    for stage in stages:
        paths = [runs / "artifacts" / stage, runs / "scratch" / stage]
        paths += [runs / p.format(experiment=experiment) for p in STAGE_STATE.get(stage, ())]
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)


def stale_prefect_results(runs: Path, keys: dict[str, str], stages: list[str] | tuple[str, ...]) -> list[str]:
    """Stages whose Prefect persisted result (storage/<stage>-<key>) exists while their artifact does not."""
    storage = runs / "prefect" / "storage"
    return [s for s in stages if (storage / f"{s}-{keys[s]}").exists() and not complete(runs, s, keys[s])]


def checkpoint_steps(folder: Path) -> dict[int, Path]:
    """Complete checkpoints (``step_*`` with their completion record) in ``folder``, by step."""
    out = {}
    for name in _names(folder):
        if not name.startswith("step_"):
            continue
        try:
            if (folder / name / "checksums.json").is_file():
                out[int(json.loads((folder / name / "state.json").read_text())["step"])] = folder / name
        except (OSError, ValueError, KeyError):
            continue  # removed by retention while we looked
    return out


def torn_checkpoints(folder: Path) -> list[str]:
    """Checkpoints being written in ``folder`` (hidden ``.step_*.tmp-*`` directories)."""
    return sorted(n for n in _names(folder) if n.startswith(".step_") and ".tmp" in n)


def expected_resume(scratch: list[int], stable: list[int], decay_start: int | None) -> tuple[int, str]:
    """Main's resume rule (tasks.main.stage): the newest usable scratch checkpoint, else the newest stable-phase
    checkpoint at or before the decay start, else a fresh start. Returns (step, "scratch" | "stable" | "")."""
    if scratch:
        return max(scratch), "scratch"
    usable = [s for s in stable if decay_start is not None and s <= decay_start]
    return (max(usable), "stable") if usable else (0, "")


# --------------------------------------------------------------------------- content digests

def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def normalise(value: Any, runs_root: str = "") -> Any:
    """JSON value without ``NOT_CONTENT`` keys, with the runs folder's path written ``<runs>``. An object of more
    than ``RECORD_KEYS`` keys is data keyed by content (a tokenizer's vocabulary: "_at" is a token), kept whole."""
    if isinstance(value, dict):
        record = len(value) <= RECORD_KEYS
        return {str(k): normalise(v, runs_root) for k, v in value.items()
                if not (record and NOT_CONTENT.search(str(k)))}
    if isinstance(value, (list, tuple)):
        return [normalise(v, runs_root) for v in value]
    if isinstance(value, str) and runs_root:
        return value.replace(runs_root, "<runs>")
    return value


def _canonical(value: Any, runs_root: str) -> str:
    import numpy as np

    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(normalise(value, runs_root), sort_keys=True, default=str)
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, bytes):
        return _sha(value)
    if isinstance(value, str):
        return repr(value.replace(runs_root, "<runs>") if runs_root else value)
    return repr(value)


def frame_digest(frame, runs_root: str = "") -> str:
    """Digest of a table's content: its columns (without ``NOT_CONTENT`` ones and date-times) and the multiset of
    its rows (row order is how the work was split, not content)."""
    import pandas as pd

    columns = [c for c in frame.columns if not NOT_CONTENT.search(str(c))
               and not pd.api.types.is_datetime64_any_dtype(frame[c]) and not pd.api.types.is_timedelta64_dtype(frame[c])]
    rows = sorted("\x1f".join(_canonical(v, runs_root) for v in row)
                  for row in frame[columns].itertuples(index=False, name=None))
    return _sha("\x1e".join([json.dumps(list(map(str, columns))), *rows]).encode())


def file_digest(path: Path, runs_root: str = "") -> str:
    """Digest of one artifact file's content, parsed by kind (see the module docstring)."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        record = json.loads(path.read_text())
        for *parents, last in NOT_CONTENT_PATHS.get(path.name, ()):
            holder = record
            for key in parents:
                holder = holder.get(key, {}) if isinstance(holder, dict) else {}
            if isinstance(holder, dict):
                holder.pop(last, None)
        return _sha(json.dumps(normalise(record, runs_root), sort_keys=True).encode())
    if suffix == ".jsonl":
        lines = [json.dumps(normalise(json.loads(line), runs_root), sort_keys=True)
                 for line in path.read_text().splitlines() if line.strip()]
        return _sha("\n".join(lines).encode())
    if suffix == ".parquet":
        import pandas as pd

        return frame_digest(pd.read_parquet(path), runs_root)
    data = path.read_bytes()
    if suffix in ZIP_SUFFIXES and zipfile.is_zipfile(io.BytesIO(data)):
        return _zip_digest(data)
    if runs_root and runs_root.encode() in data:
        data = data.replace(runs_root.encode(), b"<runs>")
    return _sha(data)


def _zip_digest(data: bytes) -> str:
    """A zip container by its members' contents: member dates say when it was written, and member names may be
    object ids (skops names its arrays by ``id()``), so a name another member mentions is replaced by the named
    member's digest."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = {m: archive.read(m) for m in archive.namelist() if not m.endswith(ZIP_NOT_CONTENT)}
    digests = {m: _sha(blob) for m, blob in members.items()}
    parts = []
    for member, blob in members.items():
        if len(blob) < 1 << 22:
            for name, digest in digests.items():
                blob = blob.replace(name.encode(), digest.encode())
            if member.endswith(".json"):
                blob = json.dumps(normalise(json.loads(blob)), sort_keys=True).encode()
        parts.append(_sha(blob))
    return _sha("".join(sorted(parts)).encode())


def artifact_digest(folder: Path, runs_root: Path | str = "") -> dict[str, str]:
    """File (relative path) → content digest, for every file of one artifact but ``NOT_CONTENT_FILES``."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in NOT_CONTENT_FILES)
    return {p.relative_to(folder).as_posix(): file_digest(p, str(runs_root)) for p in files}


def digest_diff(ours: dict[str, str] | None, reference: dict[str, str]) -> list[str]:
    """The files in which an artifact differs from the reference ("missing" when there is no artifact)."""
    if ours is None:
        return ["missing"]
    files = sorted(set(ours) | set(reference))
    return [f + ("" if f in ours else " (absent)") + ("" if f in reference else " (extra)")
            for f in files if ours.get(f) != reference.get(f)]


def artifact_digests(runs: Path, keys: dict[str, str], stages: tuple[str, ...]) -> dict[str, dict[str, str] | None]:
    return {s: artifact_digest(runs / "artifacts" / s / keys[s], runs.resolve()) if complete(runs, s, keys[s])
            else None for s in stages}


def json_keys_differing(reference: Path, ours: Path, reference_root: Path, runs_root: Path) -> str:
    """`` (keys: a, b)``: the top-level keys in which two JSON files' content differs; "" for other files."""
    if reference.suffix != ".json" or not reference.is_file() or not ours.is_file():
        return ""
    try:
        a = normalise(json.loads(reference.read_text()), str(reference_root))
        b = normalise(json.loads(ours.read_text()), str(runs_root))
    except ValueError:
        return ""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return ""
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return f" (keys: {', '.join(keys[:5])})" if keys else ""


def other_keys(runs: Path, stage: str, key: str) -> list[str]:
    """Complete artifacts of ``stage`` under keys other than ``key``."""
    return sorted(n for n in _names(runs / "artifacts" / stage) if n != key and not n.startswith(".")
                  and complete(runs, stage, n))


def documents_lost(runs: Path, keys: dict[str, str]) -> dict[str, int]:
    """Per source: documents in − kept − removed (manifest), plus ids read that are neither kept nor removed."""
    import pandas as pd

    corpus = runs / "artifacts" / "corpus" / keys["corpus"]
    sources = runs / "artifacts" / "sources" / keys["sources"]
    manifest = json.loads((corpus / "manifest.json").read_text())["sources"]
    from tasks.readers import load_kept, load_removals

    kept = load_kept(corpus, ["source", "doc_id"])
    removed = load_removals(corpus, ["source", "doc_id"])
    lost = {}
    for name, entry in manifest.items():
        by_count = entry["docs_in"] - entry["docs_out"] - sum(entry["removed_by_rule"].values())
        read = set(pd.read_parquet(sources / "docs" / f"{name}.parquet", columns=["doc_id"])["doc_id"])
        accounted = set(kept.loc[kept["source"] == name, "doc_id"]) | set(removed.loc[removed["source"] == name, "doc_id"])
        lost[name] = abs(by_count) + len(read - accounted)
    return lost


def resume_line(output: str) -> str | None:
    """The rerun's line saying what it resumed from, if it printed one."""
    found = RESUME_LINE.search(output)
    return found.group(0).strip()[:300] if found else None


def error_lines(output: str) -> list[str]:
    """The ``error:`` messages of a run's output, each joined with its continuation lines (the console wraps)."""
    lines = [line.rstrip() for line in output.splitlines()]
    out = []
    for i, line in enumerate(lines):
        if line.startswith("error:"):
            rest = []
            for nxt in lines[i + 1:]:
                if not nxt.strip() or nxt.startswith("error:"):
                    break
                rest.append(nxt.strip())
            out.append(" ".join([line.strip(), *rest]))
    return out


# --------------------------------------------------------------------------- faults

@dataclass
class Fault:
    kind: str
    target: str  # the stage aimed at
    landed: str = ""  # the stage in progress when it struck, "between stages", or "missed"
    kill_s: float | None = None  # seconds after the landed stage's start (its temporary directory appeared)
    outcome: str = "pending"  # recovered | not recovered | missed | injected (not a kill) | not run
    resumed_from: str | None = None  # the line of the next run that says what it resumed from
    main_resume: dict | None = None  # main's run.json resume point in the run after the fault
    mismatches: list[str] = field(default_factory=list)  # "<stage>: <files>" against the reference afterwards
    compared: list[str] = field(default_factory=list)  # stages compared with the reference afterwards
    attempts: int = 1
    detail: str = ""


def is_kill(fault: Fault) -> bool:
    return fault.kind.lower().startswith(("kill", "sigkill"))


def covered_stages(faults: list[Fault], stages: tuple[str, ...]) -> list[str]:
    """Stages in which a kill landed whose next run finished the stage and whose artifact then compared equal."""
    hit = set()
    for fault in faults:
        mismatched = {m.split(":", 1)[0] for m in fault.mismatches}
        if (fault.landed in stages and fault.outcome == "recovered" and fault.landed in fault.compared
                and fault.landed not in mismatched):
            hit.add(fault.landed)
    return [s for s in stages if s in hit]


def plan_rounds(wanted: dict[str, int], stages: tuple[str, ...], per_round: int = 2,
                stage: str | None = None) -> list[list[str]]:
    """Rounds of target stages for the kills still ``wanted`` per stage: each round aims once at every stage that
    still wants kills, in stage order. Aimed at one ``stage``: rounds of ``per_round`` kills in it (each rerun
    resumes what the killed run left)."""
    if stage is not None:
        n = wanted.get(stage, 0)
        return [[stage] * min(per_round, n - i) for i in range(0, n, per_round)]
    rounds = []
    left = {s: n for s, n in wanted.items() if n > 0}
    while left:
        rounds.append([s for s in stages if s in left])
        left = {s: n - 1 for s, n in left.items() if n > 1}
    return rounds


def wanted_kills(trials: int, stages: tuple[str, ...], rng: random.Random, stage: str | None = None) -> dict[str, int]:
    """Kills to land per stage: ``trials`` spread evenly, the remainder on a seeded random subset, and at least one
    in every stage (a campaign of fewer trials than stages still covers each); none for 0 trials."""
    if stage is not None:
        return {stage: trials}
    if trials == 0:  # --only, or the targeted faults alone
        return {s: 0 for s in stages}
    wanted = {s: trials // len(stages) for s in stages}
    for s in rng.sample(stages, trials % len(stages)):
        wanted[s] += 1
    return {s: max(n, 1) for s, n in wanted.items()}


class Campaign:
    def __init__(self, harness: Harness, runs: Path, reference: dict[str, dict[str, str]], keys: dict[str, str],
                 wall: dict[str, float], experiment: str, rng: random.Random, main_run: dict):
        self.h, self.runs, self.reference, self.keys = harness, runs, reference, keys
        self.stages: tuple[str, ...] = harness.stages
        self.wall, self.experiment, self.rng = wall, experiment, rng
        self.reference_dir = harness.work / "ref-a"
        self.decay_start = main_run.get("decay_start")
        self.trunk = runs / "cache" / "stable" / main_run["trunk_key"] if main_run.get("trunk_key") else None
        self.faults: list[Fault] = []
        self.problems: list[str] = []
        self.comparisons = 0
        self.lost: dict[str, int] = {}
        self.builds = 0
        self.stale_checked = 0
        self.too_late = 0
        self.ray: RayCluster | None = None
        self.skipped = 0  # targets already complete: a kill aimed earlier landed after them
        self._pending: list[Fault] = []  # faults whose recovery the next run decides
        self._since_compare: list[Fault] = []  # faults the next comparison speaks for
        until = harness.until or self.stages[-1]
        self.compared = self.stages[:self.stages.index(until) + 1]  # a soak of one stage runs no further

    @property
    def mismatches(self) -> list[str]:
        return [f"{f.kind} in {f.landed}: {m}" for f in self.faults for m in f.mismatches]

    # -- bookkeeping

    def _fault(self, fault: Fault) -> Fault:
        self.faults.append(fault)
        self._pending.append(fault)
        self._since_compare.append(fault)
        return fault

    def _drop(self, fault: Fault) -> None:
        for bucket in (self.faults, self._pending, self._since_compare):
            if fault in bucket:
                bucket.remove(fault)

    def _passed(self, run: Run, rc: int | None, reached: str | None = None) -> None:
        """``run`` came after faults: it finished (exit ``rc``) or reached stage ``reached`` (``rc`` None). Each
        pending fault in a stage before that point is recovered when its stage's artifact is complete now, and
        takes the run's line saying what it resumed from."""
        keep = []
        for fault in self._pending:
            stage = fault.landed if fault.landed in self.stages else fault.target
            if reached is not None and self.stages.index(stage) >= self.stages.index(reached):
                keep.append(fault)
                continue
            recovered = (rc in (0, None)) and complete(self.runs, stage, self.keys[stage])
            fault.outcome = "recovered" if recovered else "not recovered"
            if not recovered:
                self.problems.append(f"{fault.kind} in {stage}: the next run did not complete it "
                                     f"(exit {rc}; log {run.log})")
            fault.resumed_from = resume_line(run.output())
            if stage == "main":
                fault.main_resume = self._main_resume()
        self._pending = keep

    def _main_resume(self) -> dict | None:
        record = self.runs / "artifacts" / "main" / self.keys["main"] / "run.json"
        try:
            run = json.loads(record.read_text())
        except (OSError, ValueError):
            return None
        return {"step": run.get("resumed_from_step"), "from": run.get("resumed_from", "")}

    def compare(self, label: str) -> list[str]:
        """Compare the trial folder's artifacts with the reference; the faults since the last comparison take the
        result. Returns the mismatches."""
        ours = artifact_digests(self.runs, self.keys, self.compared)
        found = []
        for stage in self.compared:
            self.comparisons += 1
            diff = digest_diff(ours[stage], self.reference[stage])
            diff = [f + json_keys_differing(self.reference_dir / "artifacts" / stage / self.keys[stage] / f,
                                            self.runs / "artifacts" / stage / self.keys[stage] / f,
                                            self.reference_dir.resolve(), self.runs.resolve())
                    for f in diff]
            if ours[stage] is None and (others := other_keys(self.runs, stage, self.keys[stage])):
                diff = [f"missing; complete under another key {others} (the code or config changed since the "
                        "reference run)"]
            if diff:
                found.append(f"{stage}: {', '.join(diff[:6])}" + (f" (+{len(diff) - 6} more)" if len(diff) > 6 else ""))
        for fault in self._since_compare:
            fault.compared, fault.mismatches = list(self.compared), found
        self._since_compare = []
        if ours.get("corpus") is not None:
            self.builds += 1
            for source, n in documents_lost(self.runs, self.keys).items():
                self.lost[source] = self.lost.get(source, 0) + n
        if found:
            print(f"  {label}: {len(found)} mismatching artifact(s): " + "; ".join(found))
        return found

    def run_to_end(self, label: str, runs: Path | None = None, config: str | None = None) -> int:
        run = self.h.start(runs or self.runs, config=config)
        rc = self.h.finish(run)
        self._passed(run, rc)
        if rc != 0:
            self.problems.append(f"{label}: exit {rc} (log {run.log})")
        return rc

    def check_resume_lines(self) -> None:
        """Every kill whose next run finished its stage must have had that run say what it resumed from."""
        silent = [f for f in self.faults if is_kill(f) and f.outcome == "recovered" and f.landed in self.stages
                  and f.resumed_from is None]
        if silent:
            where = Counter(f.landed for f in silent)
            self.problems.append(f"{len(silent)} rerun(s) after a kill printed no line saying what they resumed "
                                 f"from (looked for {RESUME_LINE.pattern!r}; killed in " +
                                 ", ".join(f"{s} ×{n}" for s, n in where.items()) + ")")

    # -- random kills

    def round(self, number: int, targets: list[str]) -> None:
        """Reset the targets' stages and those after them, then one run killed inside each stage of ``targets`` in
        turn (a stage may repeat: each rerun resumes what the killed one left), then a run to the end, compared
        with the reference. Upstream artifacts are reused, so a kill costs one start-up, not a pipeline."""
        first = min(self.stages.index(t) for t in targets)
        reset(self.runs, self.stages[first:], self.experiment)
        self.stale_checked += len(stale_prefect_results(self.runs, self.keys, self.stages))
        for stage in targets:
            if complete(self.runs, stage, self.keys[stage]):  # an earlier kill of this round came after it
                self.skipped += 1
                continue
            run = self.h.start(self.runs)
            if not wait_until(run, lambda: run.has_opened(stage)):
                rc = self.h.finish(run)
                self._passed(run, rc)
                if rc != 0 or not complete(self.runs, stage, self.keys[stage]):
                    self.problems.append(f"round {number}: the run ended before {stage} started (log {run.log})")
                continue
            self._passed(run, None, reached=stage)
            fraction = self.rng.random()
            alive = sleep_while_alive(run, fraction * self.wall[stage])
            if not alive:  # no fault was injected: the run had ended
                self.h.finish(run)
                self._passed(run, run.proc.returncode)
                self.too_late += 1
                continue
            self.h.kill(run)
            landed = stage_in_progress(run, self.stages)  # a stage whose commit beat the kill has no tmp dir left
            self._fault(Fault(RANDOM_KILL, stage, landed, run.kill_s(landed) if landed in self.stages else None,
                              detail=f"aimed {fraction:.2f} × {self.wall[stage]:.1f} s after {stage}'s start"))
            if landed in self.stages and complete(self.runs, landed, self.keys[landed]):
                self.problems.append(f"round {number}: {landed} has a marker although it was killed mid-write")
        self.run_to_end(f"round {number} final run")
        self.compare(f"round {number}")

    # -- targeted faults

    def attempt(self, kind: str, target: str, inject: Callable[[], Fault | None]) -> None:
        """Run one targeted fault, again when its window was missed (``inject`` returns None), up to ``ATTEMPTS``
        times; a fault missed every time is recorded and is a problem. A fault that raises is recorded as such and
        the campaign goes on."""
        for number in range(1, ATTEMPTS + 1):
            try:
                fault = inject()
            except Exception as err:  # the harness's own failure: recorded, the next fault still runs
                fault = Fault(kind, target, "not run", outcome="harness error", detail=f"{type(err).__name__}: {err}")
                self.faults.append(fault)
                self.problems.append(f"{kind}: the harness failed: {type(err).__name__}: {err}")
                self._pending, self._since_compare = [], []
                return
            if fault is not None:
                fault.attempts = number
                return
            print(f"  {kind}: window missed (attempt {number} of {ATTEMPTS})")
        self.faults.append(Fault(kind, target, "missed", outcome="missed", attempts=ATTEMPTS,
                                 detail=f"the window was missed on all {ATTEMPTS} attempts"))
        self.problems.append(f"{kind}: the window was missed on all {ATTEMPTS} attempts")

    def _fresh_main(self) -> None:
        """Main and every stage after it never run (upstream artifacts from earlier runs are kept)."""
        after = self.stages[self.stages.index("main"):]
        if not complete(self.runs, self.stages[self.stages.index("main") - 1],
                        self.keys[self.stages[self.stages.index("main") - 1]]):
            rc = self.h.finish(self.h.start(self.runs, until=self.stages[self.stages.index("main") - 1]))
            if rc != 0:
                raise RuntimeError(f"the run up to main failed (exit {rc})")
        reset(self.runs, after, self.experiment)
        self.stale_checked += len(stale_prefect_results(self.runs, self.keys, after))

    def _checkpoints(self) -> tuple[dict[int, Path], dict[int, Path]]:
        scratch = checkpoint_steps(self.runs / "scratch" / "main" / self.keys["main"])
        stable = checkpoint_steps(self.trunk) if self.trunk else {}
        return scratch, stable

    def _finish_and_compare(self, fault: Fault, label: str, expected: tuple[int, str] | None = None,
                            config: str | None = None) -> None:
        """Rerun to the end (with ``config``: that config file), then compare; with ``expected``, main's resume
        point must be it."""
        self.run_to_end(f"{label}: rerun", config=config)
        self.compare(label)
        if expected is not None:
            got = fault.main_resume or {}
            fault.detail += f"; the rerun resumed from {got.get('from') or 'nothing'} step {got.get('step')}"
            if (got.get("step"), got.get("from", "")) != expected:
                self.problems.append(f"{label}: the rerun resumed from {got.get('from') or 'nothing'} step "
                                     f"{got.get('step')}, not the newest complete checkpoint ({expected[1] or 'fresh'} "
                                     f"step {expected[0]})")

    def checkpoint_write(self) -> Fault | None:
        """Kill while a checkpoint of main after step 0 (scratch or stable phase) is being written."""
        self._fresh_main()
        scratch_dir = self.runs / "scratch" / "main" / self.keys["main"]

        def writing() -> bool:
            run.has_opened("main")
            return any(int(n[6:14]) > 0 for folder in (scratch_dir, self.trunk) if folder
                       for n in torn_checkpoints(folder))

        run = self.h.start(self.runs)
        if not wait_until(run, lambda: writing() or run.has_opened(self._after("main"))):
            self.h.finish(run)
            return None
        scratch, stable = self._checkpoints()
        torn = [f"{folder.parent.name}/{folder.name}/{n}" for folder in (scratch_dir, self.trunk) if folder
                for n in torn_checkpoints(folder)]
        self.h.kill(run)
        if not torn:  # the run got past main first
            return None
        expected = expected_resume(sorted(scratch), sorted(stable), self.decay_start)
        fault = self._fault(Fault("kill (checkpoint write)", "main", "main", run.kill_s("main"), detail=(
            f"torn {', '.join(torn)}; complete: scratch steps {sorted(scratch)}, stable steps {sorted(stable)}; "
            f"expected resume: {expected[1] or 'fresh'} step {expected[0]}")))
        self._finish_and_compare(fault, "kill (checkpoint write)", expected)
        return fault

    def corrupt_checkpoint(self) -> Fault | None:
        """Kill once two scratch checkpoints are complete, flip bytes in the checkpoint the rerun would resume
        from; the rerun must skip it with a warning and resume from the next one by main's rule."""
        self._fresh_main()
        run = self.h.start(self.runs)
        enough = lambda: run.has_opened("main") and len(self._checkpoints()[0]) >= 2  # noqa: E731
        if not wait_until(run, lambda: enough() or run.has_opened(self._after("main"))):
            self.h.finish(run)
            return None
        self.h.kill(run)
        scratch, stable = self._checkpoints()
        if len(scratch) < 2 or complete(self.runs, "main", self.keys["main"]):
            return None
        step, kind = expected_resume(sorted(scratch), sorted(stable), self.decay_start)
        victim = (scratch if kind == "scratch" else stable)[step]
        weights = victim / "model.safetensors"
        blob = bytearray(weights.read_bytes())
        for i in range(len(blob) - 40, len(blob) - 8):  # inside the last tensor's data, not the header
            blob[i] ^= 0xFF
        weights.write_bytes(bytes(blob))
        left = {s: p for s, p in scratch.items() if p != victim}
        expected = expected_resume(sorted(left), sorted(s for s, p in stable.items() if p != victim), self.decay_start)
        fault = self._fault(Fault("kill + corrupt checkpoint", "main", "main", run.kill_s("main"), detail=(
            f"flipped 32 bytes of {kind} step {step}'s weights ({victim.name}); complete: scratch steps "
            f"{sorted(scratch)}, stable steps {sorted(stable)}; expected resume: {expected[1] or 'fresh'} step "
            f"{expected[0]}")))
        self._finish_and_compare(fault, "kill + corrupt checkpoint", expected)
        warned = "skipping unusable" in self.h_last_output() and victim.name in self.h_last_output()
        fault.detail += f"; the rerun said it skipped {victim.name}: {'yes' if warned else 'NO'}"
        if not warned:
            self.problems.append(f"kill + corrupt checkpoint: the rerun did not say that it skipped the corrupt "
                                 f"{victim.name}")
        return fault

    def h_last_output(self) -> str:
        logs = sorted(self.h.logs.glob("*.log"))
        return logs[-1].read_text(errors="replace") if logs else ""

    def artifact_commit(self) -> Fault | None:
        """Kill while main's artifact is committed: meta.json is in the temporary directory, the rename has not
        happened."""
        self._fresh_main()
        run = self.h.start(self.runs)
        key = self.keys["main"]

        def in_commit() -> bool:
            tmp = new_tmp(run, "main") if run.has_opened("main") else None
            return (tmp is not None and (tmp / "meta.json").exists()) or complete(self.runs, "main", key)

        wait_until(run, in_commit)
        tmp = new_tmp(run, "main")
        if run.alive():
            self.h.kill(run)
        else:
            self.h.finish(run)
        if tmp is None or complete(self.runs, "main", key):
            return None
        scratch, stable = self._checkpoints()
        marker = (tmp / "_COMPLETE").exists()
        expected = expected_resume(sorted(scratch), sorted(stable), self.decay_start)
        fault = self._fault(Fault("kill (artifact commit)", "main", "main", run.kill_s("main"), detail=(
            f"left {tmp.name} {'with' if marker else 'without'} its marker, never renamed into place; expected "
            f"resume: {expected[1] or 'fresh'} step {expected[0]}")))
        self._finish_and_compare(fault, "kill (artifact commit)", expected)
        if tmp.exists() and (tmp / "_COMPLETE").exists() and not complete(self.runs, "main", key):
            self.problems.append("kill (artifact commit): the torn attempt was not replaced by a complete artifact")
        return fault

    def disk_full_artifact(self, tmpfs_ok: bool) -> Fault | None:
        """CPT writes its artifact onto a tmpfs too small for it: a clear error, no marker; then a rerun with space."""
        if not tmpfs_ok:
            return self._not_run("disk full under an artifact", "cpt")
        self._fresh_main()
        rc0 = self.h.finish(self.h.start(self.runs, until=self._before("cpt")))
        if rc0 != 0:
            raise RuntimeError(f"the run up to cpt failed (exit {rc0})")
        artifacts = self.runs / "artifacts" / "cpt"
        artifacts.mkdir(parents=True, exist_ok=True)
        reference = self.h.work / "ref-a" / "artifacts" / "cpt"
        size = max(64 * 1024, _du(reference) // 8) // 4096 * 4096
        _mount_tmpfs(artifacts, size)
        try:
            run = self.h.start(self.runs, until=None)
            rc = watch(self.h, run, self.stages)
            markers = [p.relative_to(self.runs).as_posix() for p in _files(artifacts) if p.name == "_COMPLETE"]
        finally:
            subprocess.run(["umount", "--lazy", str(artifacts)], check=True)
        fault = self._fault(Fault("disk full under an artifact", "cpt", _failed_in(run),
                                  outcome="injected"))
        self._disk_verdict(fault, run, rc, markers, f"tmpfs of {size // 1024} KiB on artifacts/cpt")
        self._finish_and_compare(fault, "disk full under an artifact")
        fault.outcome = "recovered" if complete(self.runs, "cpt", self.keys["cpt"]) else "not recovered"
        return fault

    def disk_full_runs(self, tmpfs_ok: bool) -> Fault | None:
        """The whole runs folder on a tmpfs that fills during main (MLflow, Prefect, DuckDB and the artifacts all
        write there): a clear error, no marker; after the tmpfs is grown the same command finishes."""
        kind = "disk full under the tracking store"
        if not tmpfs_ok:
            return self._not_run(kind, "main")
        folder = self.h.work / "disk-full"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        _mount_tmpfs(folder, 1 << 30)
        try:
            rc0 = self.h.finish(self.h.start(folder, until=self._before("main")))
            if rc0 != 0:
                raise RuntimeError(f"the run up to main on the tmpfs failed (exit {rc0})")
            reference = self.h.work / "ref-a"
            main_bytes = _du(reference / "artifacts" / "main") + _du(reference / "cache" / "stable")
            used = shutil.disk_usage(folder).used
            size = (used + main_bytes // 2) // 4096 * 4096 + 4096
            subprocess.run(["mount", "-o", f"remount,size={size}", str(folder)], check=True)
            run = self.h.start(folder, until=None)
            rc = watch(self.h, run, self.stages)
            landed = _failed_in(run)
            markers = [p.relative_to(folder).as_posix() for p in _files(folder / "artifacts")
                       if p.name == "_COMPLETE" and p.parent.name.startswith(".tmp-")]
            fault = Fault(kind, "main", landed, outcome="injected")
            self.faults.append(fault)
            self._disk_verdict(fault, run, rc, markers, f"runs folder on a tmpfs of {size / 2**20:.1f} MiB "
                                                        f"({used / 2**20:.1f} MiB used after the stages before main)")
            subprocess.run(["mount", "-o", "remount,size=1g", str(folder)], check=True)
            rerun = self.h.start(folder, until=None)
            rc2 = self.h.finish(rerun)
            fault.resumed_from = resume_line(rerun.output())
            ours = artifact_digests(folder, self.keys, self.stages)
            fault.compared = list(self.stages)
            fault.mismatches = [f"{s}: {', '.join(d[:6])}" for s in self.stages
                                if (d := digest_diff(ours[s], self.reference[s]))]
            self.comparisons += len(self.stages)
            fault.outcome = "recovered" if rc2 == 0 and not fault.mismatches else "not recovered"
            fault.detail += f"; the rerun with space: exit {rc2}"
            if rc2 != 0:
                self.problems.append(f"{kind}: the rerun with space exited {rc2} (log {rerun.log})")
        finally:
            subprocess.run(["umount", "--lazy", str(folder)], check=False)
            shutil.rmtree(folder, ignore_errors=True)
        return fault

    def _disk_verdict(self, fault: Fault, run: Run, rc: int, markers: list[str], how: str) -> None:
        errors = error_lines(run.output())
        fault.detail = (f"{how}: exit {rc}, markers in partial outputs: {markers or 'none'}; the user sees: "
                        + (" | ".join(e[:400] for e in errors) or "no error: line"))
        if rc == 0:
            self.problems.append(f"{fault.kind}: the run exited 0 on a full disk (log {run.log})")
        if markers:
            self.problems.append(f"{fault.kind}: partial outputs carry a marker: {markers} (log {run.log})")
        tracebacks = run.output().count("Traceback (most recent call last)")
        if tracebacks:
            fault.detail += f"; {tracebacks} traceback(s) in the output besides"
            self.problems.append(f"{fault.kind}: {tracebacks} traceback(s) in the output besides the error line "
                                 f"(log {run.log})")
        if len(errors) != 1 or "DiskFullError" not in errors[0]:
            self.problems.append(f"{fault.kind}: expected one 'error: DiskFullError' line, got {len(errors)}: "
                                 f"{[e[:200] for e in errors]} (log {run.log})")

    def concurrent_runs(self) -> Fault | None:
        """Two commands on one fresh runs folder, started ``CONCURRENT_GAP_S`` apart: both exit 0 (the second may
        wait for the first and share its artifacts); the artifacts equal the reference."""
        kind = "two runs at once on a fresh folder"
        folder = self.h.work / "concurrent"
        shutil.rmtree(folder, ignore_errors=True)
        first = self.h.start(folder, until=None)
        time.sleep(CONCURRENT_GAP_S)
        second = self.h.start(folder, until=None)
        rcs = [self.h.finish(first), self.h.finish(second)]
        ours = artifact_digests(folder, self.keys, self.stages)
        fault = Fault(kind, "all", "all", outcome="injected", compared=list(self.stages), detail=(
            f"exits {rcs[0]} and {rcs[1]}; errors: " + (" | ".join(e[:300] for r in (first, second)
                                                            for e in error_lines(r.output())) or "none")))
        fault.mismatches = [f"{s}: {', '.join(d[:6])}" for s in self.stages
                            if (d := digest_diff(ours[s], self.reference[s]))]
        self.comparisons += len(self.stages)
        fault.outcome = "recovered" if rcs == [0, 0] and not fault.mismatches else "not recovered"
        self.faults.append(fault)
        if rcs != [0, 0]:
            self.problems.append(f"{kind}: exits {rcs} (logs {first.log}, {second.log})")
        shutil.rmtree(folder, ignore_errors=True)
        return fault

    def kill_run_process(self) -> Fault | None:
        """SIGKILL of the ``flows.cli run`` process alone, inside main: none of its processes (the Prefect API
        server, workers) may outlive it by ``ORPHAN_GRACE_S``; then the rerun finishes."""
        kind = "SIGKILL of the run process alone"
        self._fresh_main()
        run = self.h.start(self.runs)
        if not wait_until(run, lambda: run.has_opened("main")):
            self.h.finish(run)
            return None
        sleep_while_alive(run, self.rng.random() * self.wall["main"])
        if not run.alive():
            self.h.finish(run)
            return None
        left = self.h.kill_alone(run)
        landed = stage_in_progress(run, self.stages)
        fault = self._fault(Fault(kind, "main", landed, run.kill_s(landed) if landed in self.stages else None,
                                  detail=f"processes of the run alive {ORPHAN_GRACE_S:.0f} s later: "
                                         + ("; ".join(left) if left else "none")))
        if left:
            self.problems.append(f"{kind}: {len(left)} process(es) of the run outlived it: " + "; ".join(left))
        self._finish_and_compare(fault, kind)
        return fault

    # -- kills inside a store's write, an Optuna trial, a Ray task

    def _kill_when(self, kind: str, target: str, window: Callable[[], str | None], *, delay_s: float = 0.0,
                   config: str | None = None) -> tuple[Fault, Run] | None:
        """Reset ``target`` and the stages after it, run to the end, and once ``target`` has opened and ``delay_s``
        has passed, kill as soon as ``window()`` names what is in progress; None when the run got past ``target``
        (or ended) first. The fault lands in the stage in progress; one that struck while ``target``'s artifact
        was committed but the next stage had not opened (its publish step: DuckDB rows, MLflow records) counts
        for ``target``."""
        reset(self.runs, self.stages[self.stages.index(target):], self.experiment)
        run = self.h.start(self.runs, until=None, config=config)
        after = self._after(target)
        seen: list[str] = []

        def in_window() -> bool:
            if (what := window()) is not None:
                seen.append(what)
                return True
            return after != target and run.has_opened(after)

        if not wait_until(run, lambda: run.has_opened(target)) or not sleep_while_alive(run, delay_s) \
                or not wait_until(run, in_window) or not seen:
            if run.alive():
                self.h.kill(run)
            else:
                self.h.finish(run)
            return None
        self.h.kill(run)
        landed = stage_in_progress(run, self.stages)
        where = ""
        if landed == "between stages" and complete(self.runs, target, self.keys[target]):
            landed, where = target, f" (in {target}'s publish step: its artifact was committed)"
        fault = self._fault(Fault(kind, target, landed, run.kill_s(landed) if landed in self.stages else None,
                                  detail=f"killed while {seen[-1]}{where}"))
        return fault, run

    def duckdb_write(self) -> Fault | None:
        """Kill while the warehouse is being written (DuckDB's write-ahead log ``results.duckdb.wal`` exists),
        in the publish step of a seeded random stage. The rerun must finish, and the warehouse rows of every
        stage's artifact must equal the reference run's (a torn transaction is rolled back, never half-read)."""
        target = self.rng.choice(self.stages)
        wal = self.runs / "results.duckdb.wal"
        got = self._kill_when("kill (DuckDB write)", target,
                              lambda: f"writing the warehouse ({wal.name}: {wal.stat().st_size} bytes)"
                              if wal.exists() else None)
        if got is None:
            return None
        fault, _ = got
        self._finish_and_compare(fault, fault.kind)
        differing = warehouse_diff(self.reference_dir / "results.duckdb", self.runs / "results.duckdb", self.keys)
        fault.detail += "; warehouse rows of the current artifacts: " + ("; ".join(differing) or "equal to the reference")
        if differing:
            self.problems.append(f"{fault.kind}: warehouse rows differ from the reference: " + "; ".join(differing))
        return fault

    def mlflow_logging(self) -> Fault | None:
        """Kill while MLflow writes its store (SQLite's rollback journal ``mlflow.db-journal`` exists), at a
        seeded random moment of a seeded random training or evaluation stage. The rerun must finish; the store
        must pass SQLite's integrity check and hold no run left ``RUNNING`` (the killed run's are marked
        failed)."""
        target = self.rng.choice([s for s in ("mixture", "sweep", "ladder", "main", "branches", "cpt", "gate")
                                  if s in self.stages] or list(self.stages))
        journal = self.runs / "mlflow.db-journal"
        got = self._kill_when("kill (MLflow logging)", target,
                              lambda: "writing the tracking store (mlflow.db-journal)" if journal.exists() else None,
                              delay_s=self.rng.random() * 0.8 * self.wall[target])
        if got is None:
            return None
        fault, _ = got
        self._finish_and_compare(fault, fault.kind)
        verdict = tracking_store_state(self.runs / "mlflow.db")
        fault.detail += f"; the tracking store after the rerun: {verdict['summary']}"
        if not verdict["ok"]:
            self.problems.append(f"{fault.kind}: {verdict['summary']}")
        return fault

    def optuna_trial(self) -> Fault | None:
        """Kill while a sweep trial runs (the Optuna journal holds a created trial with no final state), at a
        seeded random moment of the sweep. The rerun must finish the study with the reference trials (compared:
        the sweep artifact)."""
        journal = self.runs / STAGE_STATE["sweep"][0].format(experiment=self.experiment) / "optuna_journal.log"

        def running() -> str | None:
            trials = running_trials(journal)
            return f"trial(s) {trials} ran (Optuna journal)" if trials else None

        got = self._kill_when("kill (Optuna trial)", "sweep", running,
                              delay_s=self.rng.random() * 0.8 * self.wall["sweep"])
        if got is None:
            return None
        fault, _ = got
        self._finish_and_compare(fault, fault.kind)
        return fault

    def ray_task(self) -> Fault | None:
        """Kill the run while a Ray task of the corpus build or the tokenizer (a seeded choice) executes on a local
        Ray cluster the harness started (``engine = "ray"`` in both execution tables; the cache keys do not
        depend on the engine, so the reference artifacts apply). No task of the killed run may still execute
        ``ORPHAN_GRACE_S`` later; the rerun, on the same cluster, must finish with the reference content."""
        config = self._ray_config()
        target = self.rng.choice([s for s in ("corpus", "tokenizer") if s in self.stages])

        def busy() -> str | None:
            tasks = ray_tasks_executing()
            return f"Ray task(s) executed: {', '.join(sorted(set(tasks.values())))}" if tasks else None

        got = self._kill_when("kill (Ray task)", target, busy, config=config,
                              delay_s=self.rng.random() * 0.7 * self.wall[target])
        if got is None:
            return None
        fault, _ = got
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while (left := ray_tasks_executing()) and time.monotonic() < deadline:
            time.sleep(0.1)
        fault.detail += f"; Ray tasks still executing {ORPHAN_GRACE_S:.0f} s later: " + (
            ", ".join(f"{pid} {name}" for pid, name in left.items()) or "none")
        if left:
            self.problems.append(f"{fault.kind}: Ray tasks of the killed run still executed {ORPHAN_GRACE_S:.0f} s "
                                 "later: " + ", ".join(f"{pid} {name}" for pid, name in left.items()))
        self._finish_and_compare(fault, fault.kind, config=config)
        return fault

    def _ray_config(self) -> str:
        """The harness's config with both execution tables on the harness's Ray cluster (started on first use)."""
        if self.ray is None:
            self.ray = RayCluster(self.h.work)
            self.h.extra_env.update(self.ray.env)
        import tomllib

        text = (ROOT / self.h.config).read_text()
        cfg = tomllib.loads(text)
        tables = []
        for section in ("corpus", "tokenizer"):
            if "execution" in cfg.get(section, {}):
                raise RuntimeError(f"{self.h.config} has [{section}.execution]: the Ray fault appends its own")
            tables.append(f'\n[{section}.execution]\nengine = "ray"\naddress = "{self.ray.address}"\nworkers = 2\n')
        path = self.h.work / "ray.toml"
        path.write_text(text + "".join(tables))
        return str(path)

    def close(self) -> None:
        """Stop what the campaign started (the Ray cluster)."""
        if self.ray is not None:
            left = self.ray.stop()
            self.ray = None
            for key in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_USAGE_STATS_ENABLED"):
                self.h.extra_env.pop(key, None)
            if left:
                self.problems.append(f"Ray processes outlived the harness's cluster: {left}")

    def _not_run(self, kind: str, target: str) -> Fault:
        fault = Fault(kind, target, "not run", outcome="not run", detail="mounting a tmpfs is not permitted here")
        self.faults.append(fault)
        self.problems.append(f"{kind}: not run (mounting a tmpfs needs root)")
        return fault

    def _after(self, stage: str) -> str:
        i = self.stages.index(stage)
        return self.stages[i + 1] if i + 1 < len(self.stages) else stage

    def _before(self, stage: str) -> str:
        return self.stages[max(0, self.stages.index(stage) - 1)]

    def targeted(self, tmpfs_ok: bool, only: list[str] | None = None) -> None:
        """The targeted faults in ``TARGETED``'s order; ``only``: those of these kinds (``--only``) alone."""
        saved, self.compared = self.compared, self.stages  # the targeted faults run to the end
        self.h.until = None
        try:
            for kind, target, method, needs_tmpfs in TARGETED:
                if only is None or kind in only:
                    inject = getattr(self, method)
                    self.attempt(kind, target, (lambda inject=inject: inject(tmpfs_ok)) if needs_tmpfs else inject)
        finally:
            self.close()
        self.compared = saved


# The targeted faults in the order they run: (kind, the stage aimed at, the Campaign method that injects one, whether
# it takes the tmpfs verdict). ``--only`` names kinds of this list.
TARGETED = (
    ("kill (checkpoint write)", "main", "checkpoint_write", False),
    ("kill + corrupt checkpoint", "main", "corrupt_checkpoint", False),
    ("kill (artifact commit)", "main", "artifact_commit", False),
    ("SIGKILL of the run process alone", "main", "kill_run_process", False),
    ("kill (DuckDB write)", "any", "duckdb_write", False),
    ("kill (MLflow logging)", "any", "mlflow_logging", False),
    ("kill (Optuna trial)", "sweep", "optuna_trial", False),
    ("kill (Ray task)", "corpus", "ray_task", False),
    ("disk full under an artifact", "cpt", "disk_full_artifact", True),
    ("disk full under the tracking store", "main", "disk_full_runs", True),
    ("two runs at once on a fresh folder", "all", "concurrent_runs", False),
)


def targeted_kinds(names: list[str]) -> list[str]:
    """The ``TARGETED`` kinds that ``--only`` names: each name is a kind or a case-insensitive part of exactly one
    (``"tracking store"``, ``"corrupt"``).

    Raises:
        ValueError: a name matches no kind, or several (the message lists the kinds).
    """
    kinds = [kind for kind, *_ in TARGETED]
    chosen = []
    for name in names:
        found = [k for k in kinds if k == name] or [k for k in kinds if name.strip().lower() in k.lower()]
        if len(found) != 1:
            raise ValueError(f"--only {name!r} names {'no' if not found else 'more than one'} targeted fault"
                             f"{'' if not found else ' (' + '; '.join(found) + ')'}; the kinds: " + "; ".join(kinds))
        if found[0] not in chosen:
            chosen.append(found[0])
    return chosen


def watch(harness: Harness, run: Run, stages: tuple[str, ...]) -> int:
    """Let the run end by itself, noting when it opens each stage; returns its exit status."""
    while run.alive():
        for stage in stages:
            run.has_opened(stage)
        time.sleep(0.02)
    return harness.finish(run)


def _failed_in(run: Run) -> str:
    """The stage a failed run was in: the last one it was seen to open (``watch``)."""
    return max(run.opened, key=run.opened.get) if run.opened else "before any stage"


def _files(folder: Path) -> list[Path]:
    """Files under ``folder``; those removed while it is walked are left out."""
    out = []
    for dirpath, _, names in os.walk(folder):
        out += [Path(dirpath) / n for n in names]
    return out


def _du(path: Path) -> int:
    total = 0
    for p in _files(path):
        try:
            total += p.stat().st_size
        except FileNotFoundError:
            continue
    return total


def _mount_tmpfs(folder: Path, size: int) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)


def _can_mount(work: Path) -> bool:
    probe = work / "mount-probe"
    probe.mkdir(exist_ok=True)
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["umount", str(probe)], check=True)
    probe.rmdir()
    return ok


# --------------------------------------------------------------------------- main

def reference_run(harness: Harness, runs: Path) -> tuple[dict[str, str], dict[str, float], float | None]:
    """Keys and wall times of an uninterrupted run into ``runs``; one already complete there (``--keep``) is reused
    (wall time None)."""
    started = None
    if not (runs / "done").is_file():
        shutil.rmtree(runs, ignore_errors=True)
        run = harness.start(runs, until=None)
        started = time.monotonic()
        rc = harness.finish(run)
        if rc != 0:
            sys.exit(f"reference run failed (exit {rc}); log {run.log}:\n{run.output()[-3000:]}")
        (runs / "done").touch()
    keys, wall = {}, {}
    for stage in harness.stages:
        (name,) = [n for n in _names(runs / "artifacts" / stage) if not n.startswith(".")]
        keys[stage] = name
        wall[stage] = float(json.loads((runs / "artifacts" / stage / name / "meta.json").read_text())["wall_s"])
    return keys, wall, None if started is None else time.monotonic() - started


def main() -> None:
    stages = registry_stages()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20,
                        help="random kills to land, spread evenly over the stages (the remainder on a seeded random "
                             "subset); with --stage, all in that stage")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None,
                        help="work folder to keep (default: a temp folder, removed); reference runs finished there "
                             "by an earlier call are reused")
    parser.add_argument("--config", default="configs/smoke.toml")
    parser.add_argument("--stage", choices=stages, default=None,
                        help="aim every random kill at this stage (runs stop after it; upstream artifacts are reused "
                             "between rounds); the targeted faults run only with --stage main or without --stage")
    parser.add_argument("--kills-per-round", type=int, default=2,
                        help="with --stage: kills in the stage before a run is let finish (default 2)")
    parser.add_argument("--no-targeted", action="store_true", help="random kills only")
    parser.add_argument("--only", action="append", default=None, metavar="KIND",
                        help="run this targeted fault alone, no random kills (repeatable; a kind or a part of one, "
                             "e.g. 'tracking store', 'corrupt'; the kinds: "
                             + "; ".join(k for k, *_ in TARGETED) + ")")
    parser.add_argument("--record", type=Path, default=None, help="write the campaign as JSON to this file")
    args = parser.parse_args()
    if args.trials < 0:
        parser.error(f"--trials {args.trials}: give 0 or more")
    if args.kills_per_round < 1:
        parser.error(f"--kills-per-round {args.kills_per_round}: give at least 1")
    only = None
    if args.only:
        if args.no_targeted or args.stage not in (None, "main"):
            parser.error("--only runs targeted faults, which run without --no-targeted and with no --stage or "
                         "--stage main")
        try:
            only = targeted_kinds(args.only)
        except ValueError as err:
            parser.error(str(err))
        args.trials, args.only = 0, only  # the named faults alone (recorded by their kinds)

    started = time.monotonic()
    work = (args.keep or Path(tempfile.mkdtemp(prefix="pretrain-faults-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    harness = Harness(work, args.config, stages)
    experiment = _experiment_name(args.config)
    failed = True
    try:
        print(f"config {args.config}, seed {args.seed}, work folder {work}")
        print(f"stages ({len(stages)}, from flows.registry): {', '.join(stages)}")
        keys, wall, ref_s = reference_run(harness, work / "ref-a")
        print(f"reference run: {_took(ref_s)}; stage wall times (s): " + ", ".join(f"{s} {wall[s]:.1f}" for s in stages))
        keys_b, _, ref_b_s = reference_run(harness, work / "ref-b")
        reference = artifact_digests(work / "ref-a", keys, stages)
        second = artifact_digests(work / "ref-b", keys_b, stages)
        unequal = {s: digest_diff(second[s], reference[s]) for s in stages if digest_diff(second[s], reference[s])}
        print(f"second reference run (fresh folder): {_took(ref_b_s)}; keys equal: {keys == keys_b}; "
              f"content equal: {len(stages) - len(unequal)}/{len(stages)} artifacts")
        if unequal or keys != keys_b:
            for s, files in unequal.items():
                print(f"  NONDETERMINISTIC {s}: {', '.join(files)}")
            sys.exit(1)
        main_run = json.loads((work / "ref-a" / "artifacts" / "main" / keys["main"] / "run.json").read_text()) \
            if "main" in keys else {}

        harness.until = args.stage
        campaign = Campaign(harness, work / "trials", reference, keys, wall, experiment, rng, main_run)
        wanted = wanted_kills(args.trials, stages, rng, args.stage)
        landed = lambda: Counter(f.landed for f in campaign.faults if f.kind == RANDOM_KILL)  # noqa: E731
        deficit = lambda: {s: n - landed()[s] for s, n in wanted.items() if n > landed()[s]}  # noqa: E731
        rounds, number = plan_rounds(deficit(), stages, args.kills_per_round, args.stage), 0
        while rounds:
            number += 1
            before = len(campaign.faults)
            campaign.round(number, rounds.pop(0))
            print(f"round {number}: killed in {', '.join(f.landed for f in campaign.faults[before:]) or 'none'}; "
                  f"mismatches so far {len(campaign.mismatches)}")
            if not rounds and deficit():  # kills that came too late, landed elsewhere or were skipped
                if number >= 5 * max(1, args.trials):
                    campaign.problems.append(f"after {number} rounds, kills still wanted in: " +
                                             ", ".join(f"{s} {n}" for s, n in deficit().items()))
                    break
                rounds = plan_rounds(deficit(), stages, args.kills_per_round, args.stage)
        if not args.no_targeted and args.stage in (None, "main"):
            campaign.targeted(_can_mount(work), only)
        campaign.check_resume_lines()
        lost_refs = [documents_lost(work / name, keys_of) for name, keys_of in (("ref-a", keys), ("ref-b", keys_b))]
        for lost in lost_refs:
            for source, n in lost.items():
                campaign.lost[source] = campaign.lost.get(source, 0) + n
        problems = all_problems(campaign, harness)
        wall_s = time.monotonic() - started
        report(campaign, harness, len(lost_refs), wall_s, problems)
        if args.record:
            write_record(args.record, args, campaign, harness, problems, wall_s)
            print(f"record: {args.record}")
        failed = bool(problems)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failed else 0)


def all_problems(campaign: Campaign, harness: Harness) -> list[str]:
    """Everything that makes the campaign fail, one line each."""
    return ([f"mismatch: {m}" for m in campaign.mismatches]
            + [f"documents lost in {s}: {n}" for s, n in campaign.lost.items() if n]
            + list(campaign.problems)
            + [f"process left after a kill: {p}" for p in harness.orphans])


def write_record(path: Path, args: argparse.Namespace, campaign: Campaign, harness: Harness, problems: list[str],
                 wall_s: float) -> None:
    covered = covered_stages(campaign.faults, campaign.stages)
    record = {
        "config": args.config, "seed": args.seed, "trials": args.trials, "stage": args.stage,
        "only": getattr(args, "only", None),
        "stages": list(campaign.stages),
        "faults": [asdict(f) for f in campaign.faults],
        "totals": {
            "faults": len(campaign.faults),
            "landed": dict(Counter(f.landed for f in campaign.faults)),
            "random_kills_landed": dict(Counter(f.landed for f in campaign.faults if f.kind == RANDOM_KILL)),
            "recovered": sum(f.outcome == "recovered" for f in campaign.faults),
            "too_late": campaign.too_late, "skipped": campaign.skipped,
            "comparisons": campaign.comparisons, "mismatches": len(campaign.mismatches),
            "documents_lost": dict(campaign.lost), "orphans": list(harness.orphans),
            "runs": len(harness.run_wall), "stages_covered": covered,
            "covered": f"{len(covered)} of {len(campaign.stages)}",
            "problems": len(problems), "wall_s": round(wall_s, 1),
        },
        "problems": problems,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2))


def _took(seconds: float | None) -> str:
    return "reused (--keep)" if seconds is None else f"{seconds:.0f} s"


def _experiment_name(config: str) -> str:
    import tomllib

    return tomllib.loads((ROOT / config).read_text())["name"]


def report(campaign: Campaign, harness: Harness, reference_builds: int, wall_s: float, problems: list[str]) -> None:
    faults, stages = campaign.faults, campaign.stages
    print()
    print(f"faults injected: {len(faults)}")
    kinds = list(dict.fromkeys(f.kind for f in faults))
    counts = Counter((f.kind, f.landed) for f in faults)
    columns = [*stages, "all", "between stages", "missed", "not run"]
    columns = [c for c in columns if any(counts[(k, c)] for k in kinds)]
    print(f"  {'kind (by the stage it hit)':<36}" + "".join(f"{c.split()[0][:9]:>10}" for c in columns)
          + f"{'total':>8}")
    for kind in kinds:
        print(f"  {kind:<36}" + "".join(f"{counts[(kind, c)]:>10}" for c in columns)
              + f"{sum(f.kind == kind for f in faults):>8}")
    for fault in faults:
        if fault.kind != RANDOM_KILL:
            print(f"  - {fault.kind} [{fault.outcome}, {fault.landed}]: {fault.detail}")
    if campaign.too_late or campaign.skipped:
        print(f"  (not counted: {campaign.too_late} kill(s) whose run had ended before the delay was up, and "
              f"{campaign.skipped} target(s) already complete because an earlier kill of the round landed after them)")
    recovered = sum(f.outcome == "recovered" for f in faults)
    print(f"runs recovered: {recovered}/{len(faults)} (the next run of the same command finished the faulted stage; "
          f"{len(harness.run_wall)} runs in all)")
    said = [f for f in faults if is_kill(f) and f.outcome == "recovered" and f.landed in stages]
    print(f"reruns that said what they resumed from: {sum(f.resumed_from is not None for f in said)}/{len(said)}"
          + "".join(f"\n  e.g. {f.resumed_from!r}" for f in said[:1] if f.resumed_from))
    print(f"stale Prefect results present for a stage without its artifact: {campaign.stale_checked}")
    print(f"mismatching artifacts: {len(campaign.mismatches)} (of {campaign.comparisons} compared with the reference)")
    for line in campaign.mismatches:
        print(f"  {line}")
    lost = sum(campaign.lost.values())
    print(f"documents lost: {lost} (per source, in − kept − removed, over {campaign.builds + reference_builds} corpus "
          f"builds: " + ", ".join(f"{s} {n}" for s, n in campaign.lost.items()) + ")")
    print(f"processes left after a kill: {len(harness.orphans)}" + "".join(f"\n  {p}" for p in harness.orphans))
    for problem in campaign.problems:
        print(f"problem: {problem}")
    covered = covered_stages(faults, stages)
    print(f"stages covered: {len(covered)} of {len(stages)}"
          + (f" (not: {', '.join(s for s in stages if s not in covered)})" if len(covered) < len(stages) else ""))
    print(f"problems: {len(problems)}")
    print(f"wall time: {wall_s / 60:.1f} min")


if __name__ == "__main__":
    main()
