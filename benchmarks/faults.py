"""Fault injection: kill the pipeline inside every stage, tear a checkpoint and a commit, corrupt a checkpoint and
fill the disk; every rerun of the same command must finish with artifacts identical to an uninterrupted run.

    python benchmarks/faults.py                          # 20 random kills + 4 targeted faults, configs/smoke.toml
    python benchmarks/faults.py --trials 40 --seed 1 --keep /tmp/faults
    python benchmarks/faults.py --stage mixture --trials 10   # soak one stage: every kill lands in it

Each run is ``python -m flows.cli run CONFIG --runs-dir DIR`` in its own process group; a kill is SIGKILL to the
whole group (the Prefect API server and the corpus workers die with it, and any descendant that left the group).

1. Reference: two uninterrupted runs in two fresh folders. Their artifacts must hash equal (training on CPU is
   deterministic); each stage's ``wall_s`` (meta.json) sizes the kill delays.
2. Random kills, in rounds. A round resets every stage of the trial folder (artifacts, scratch, proxy cache, Optuna
   journal; Prefect's persisted task results are kept, so a stale cached result must never stand in for a missing
   artifact), then runs the command once per target stage, in stage order: wait until the stage's temporary
   artifact directory appears, sleep a seeded random fraction of its reference wall time, kill. The next run of the
   same command must finish the killed stage (it is itself killed in the round's next target stage) and the last one
   runs to the end. Its artifacts are then compared with the reference.
3. Targeted faults on the main stage: a kill while a scratch checkpoint is being written (its ``.step_*.tmp``
   directory exists); a kill once a newer checkpoint is complete, then a byte flipped in that checkpoint's weights
   (the rerun must log a warning, skip it and resume from the one before); a kill while the artifact is committed
   (``meta.json`` written, not yet renamed); a rerun with the artifacts folder on a tmpfs too small for the
   artifact (the stage must fail with a clear error and leave no marker); a rerun with space.
4. Documents lost, per source and per corpus build: documents in − kept − removed (corpus manifest), and the
   kept and removed ids against the ids read (the sources artifact).

Meaningful content compared per artifact (meta.json, timestamps and run ids are not): sources, documents (every
column) and read rejects; corpus, kept document ids per source and removal (id, rule) pairs; tokenizer,
tokenizer.json, the split of every document and the token shards (bytes); mixture, choice.json; sweep, the best
peak LR and its loss; main and cpt, every tensor of each model.safetensors; gate, the decision table.

Needs Linux (/proc, tmpfs mount as root; without mount rights RLIMIT_FSIZE stands in, and the output says so).
Exit status 1 when any artifact mismatches, a document is lost, a rerun fails, or a process outlives its kill.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# flows.registry.STAGES, in order (importing it would pull the stage packages into the harness).
STAGES = ("sources", "corpus", "tokenizer", "mixture", "sweep", "main", "cpt", "gate")
POLL_S = 0.001  # checkpoint and commit windows last milliseconds
RUN_TIMEOUT_S = 1800.0
RANDOM_KILL = "kill (random moment)"


# --------------------------------------------------------------------------- running and killing the command

@dataclass
class Run:
    """One invocation of the pipeline command."""

    proc: subprocess.Popen
    log: Path
    runs: Path
    tmp_before: dict[str, set[str]]
    started: float = field(default_factory=time.monotonic)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class Harness:
    def __init__(self, work: Path, config: str, until: str | None = None):
        self.work, self.config, self.until = work, config, until
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.count = 0
        self.orphans: list[str] = []
        self.run_wall: list[float] = []

    def start(self, runs: Path, fsize_limit: int | None = None) -> Run:
        self.count += 1
        log = self.logs / f"{self.count:03d}-{runs.name}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        env.pop("PRETRAIN_RUNS_DIR", None)

        def limit_file_size() -> None:  # the disk-full fallback: writes past the limit fail with EFBIG
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, fsize_limit))

        tmp_before = {stage: _tmp_dirs(runs, stage) for stage in STAGES}
        with open(log, "w") as out:
            until = ["--until", self.until] if self.until else []
            proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", self.config, "--runs-dir", str(runs),
                                     *until],
                                    cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
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
        """SIGKILL the run's process group and every descendant; record any process still alive after 10 s."""
        family = _descendants(run.proc.pid) | {run.proc.pid}
        try:
            os.killpg(run.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in family:  # one that started its own session is not in the group
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        run.proc.wait()
        self.run_wall.append(time.monotonic() - run.started)
        deadline = time.monotonic() + 10
        while (left := {p for p in family if _running(p)}) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.orphans += [f"{pid} ({_cmdline(pid)[:80]})" for pid in left]


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


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
    """Poll ``condition`` while the run is alive; False when the run ended (or timed out) first."""
    deadline = time.monotonic() + timeout
    while run.alive() and time.monotonic() < deadline:
        if condition():
            return True
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


# --------------------------------------------------------------------------- the runs folder

def _tmp_dirs(runs: Path, stage: str) -> set[str]:
    try:
        return {p.name for p in (runs / "artifacts" / stage).iterdir() if p.name.startswith(".tmp-")}
    except FileNotFoundError:
        return set()


def new_tmp(run: Run, stage: str) -> Path | None:
    """The temporary artifact directory this run opened for ``stage`` (still there: not committed yet)."""
    fresh = _tmp_dirs(run.runs, stage) - run.tmp_before[stage]
    return run.runs / "artifacts" / stage / sorted(fresh)[0] if fresh else None


def stage_in_progress(run: Run) -> str:
    """The stage whose temporary directory this run holds open now, else 'between stages'."""
    open_now = [stage for stage in STAGES if new_tmp(run, stage) is not None]
    return open_now[-1] if open_now else "between stages"


def complete(runs: Path, stage: str, key: str) -> bool:
    folder = runs / "artifacts" / stage / key
    return (folder / "_COMPLETE").is_file() and (folder / "meta.json").is_file()


def reset(runs: Path, stages: list[str], experiment: str) -> None:
    """Make ``stages`` never-run in ``runs``: artifacts (and stale attempts), scratch, and their resumable caches.
    Prefect's persisted task results and the MLflow/DuckDB records stay."""
    for stage in stages:
        for path in (runs / "artifacts" / stage, runs / "scratch" / stage):
            shutil.rmtree(path, ignore_errors=True)
    if "mixture" in stages:
        shutil.rmtree(runs / "cache" / "proxies", ignore_errors=True)
    if "sweep" in stages:
        shutil.rmtree(runs / "optuna" / experiment, ignore_errors=True)


def stale_prefect_results(runs: Path, keys: dict[str, str], stages: list[str]) -> list[str]:
    """Stages whose Prefect persisted result (storage/<stage>-<key>) exists while their artifact does not."""
    storage = runs / "prefect" / "storage"
    return [s for s in stages if (storage / f"{s}-{keys[s]}").exists() and not complete(runs, s, keys[s])]


def main_checkpoints(runs: Path, key: str) -> dict[int, Path]:
    """Complete scratch checkpoints of the unfinished main run, by step."""
    out = {}
    for folder in (runs / "scratch" / "main" / key).glob("step_*"):
        try:
            if (folder / "checksums.json").is_file():
                out[json.loads((folder / "state.json").read_text())["step"]] = folder
        except (OSError, ValueError, KeyError):
            continue  # removed by retention while we looked
    return out


def torn_checkpoints(runs: Path, key: str) -> list[Path]:
    return sorted((runs / "scratch" / "main" / key).glob(".step_*.tmp-*"))


# --------------------------------------------------------------------------- content hashes

def _sha(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


def _frame_bytes(frame) -> bytes:
    import pandas as pd

    return (",".join(map(str, frame.columns)).encode()
            + pd.util.hash_pandas_object(frame.reset_index(drop=True), index=False).values.tobytes())


def _tensors(path: Path) -> bytes:
    from safetensors.numpy import load_file

    tensors = load_file(str(path))
    return b"".join(name.encode() + str(t.dtype).encode() + str(t.shape).encode() + t.tobytes()
                    for name, t in sorted(tensors.items()))


def content_hash(stage: str, folder: Path) -> str:
    """Hash of the meaningful content of one artifact (see the module docstring)."""
    import pandas as pd

    if stage == "sources":
        parts = [_frame_bytes(pd.read_parquet(p).sort_values("doc_id")) for p in sorted((folder / "docs").glob("*.parquet"))]
        return _sha(*parts, _frame_bytes(pd.read_parquet(folder / "rejects.parquet").sort_values("doc_id")))
    if stage == "corpus":
        kept = pd.read_parquet(folder / "kept.parquet", columns=["source", "doc_id"]).sort_values(["source", "doc_id"])
        removed = pd.read_parquet(folder / "removals.parquet", columns=["source", "doc_id", "rule"])
        return _sha(_frame_bytes(kept), _frame_bytes(removed.sort_values(["source", "doc_id"])))
    if stage == "tokenizer":
        splits = pd.read_parquet(folder / "splits.parquet").sort_values("doc_id")
        shards = sorted(p for p in (folder / "shards").rglob("*") if p.suffix in (".bin", ".npy"))
        return _sha((folder / "tokenizer.json").read_bytes(), _frame_bytes(splits),
                    *[p.relative_to(folder).as_posix().encode() + p.read_bytes() for p in shards])
    if stage == "mixture":  # the decision record's timestamps say when, not what
        choice = json.loads((folder / "choice.json").read_text())
        for stamp in ("declared_at", "decided_at"):
            choice.get("decision", {}).pop(stamp, None)
        return _sha(json.dumps(choice, sort_keys=True).encode())
    if stage == "sweep":
        best = json.loads((folder / "best.json").read_text())
        return _sha(json.dumps([best["best_lr"], best["best_value"]]).encode())
    if stage == "main":
        return _sha(_tensors(folder / "checkpoint" / "model.safetensors"))
    if stage == "cpt":
        return _sha(*[p.parent.name.encode() + _tensors(p) for p in sorted((folder / "candidates").glob("*/model.safetensors"))])
    if stage == "gate":
        return _sha(_frame_bytes(pd.read_parquet(folder / "decisions.parquet")))
    raise ValueError(f"no content hash for stage {stage!r}")


def artifact_hashes(runs: Path, keys: dict[str, str]) -> dict[str, str]:
    return {s: content_hash(s, runs / "artifacts" / s / keys[s]) if complete(runs, s, keys[s]) else "missing"
            for s in STAGES}


def documents_lost(runs: Path, keys: dict[str, str]) -> dict[str, int]:
    """Per source: documents in − kept − removed (manifest), plus ids read that are neither kept nor removed."""
    import pandas as pd

    corpus = runs / "artifacts" / "corpus" / keys["corpus"]
    sources = runs / "artifacts" / "sources" / keys["sources"]
    manifest = json.loads((corpus / "manifest.json").read_text())["sources"]
    kept = pd.read_parquet(corpus / "kept.parquet", columns=["source", "doc_id"])
    removed = pd.read_parquet(corpus / "removals.parquet", columns=["source", "doc_id"])
    lost = {}
    for name, entry in manifest.items():
        by_count = entry["docs_in"] - entry["docs_out"] - sum(entry["removed_by_rule"].values())
        read = set(pd.read_parquet(sources / "docs" / f"{name}.parquet", columns=["doc_id"])["doc_id"])
        accounted = set(kept.loc[kept["source"] == name, "doc_id"]) | set(removed.loc[removed["source"] == name, "doc_id"])
        lost[name] = abs(by_count) + len(read - accounted)
    return lost


# --------------------------------------------------------------------------- faults

@dataclass
class Fault:
    kind: str
    target: str
    landed: str = ""
    detail: str = ""
    recovered: bool | None = None  # None: not yet known


class Campaign:
    def __init__(self, harness: Harness, runs: Path, reference: dict[str, str], keys: dict[str, str],
                 wall: dict[str, float], experiment: str, rng: random.Random):
        self.h, self.runs, self.reference, self.keys = harness, runs, reference, keys
        self.wall, self.experiment, self.rng = wall, experiment, rng
        self.faults: list[Fault] = []
        self.problems: list[str] = []
        self.mismatches: list[str] = []
        self.comparisons = 0
        self.lost: dict[str, int] = {}
        self.builds = 0
        self.stale_checked = 0
        self.too_late = 0
        self.skipped = 0  # targets already complete: a kill aimed earlier landed after them
        self._pending: list[Fault] = []  # faults whose recovery the next run decides
        until = harness.until or STAGES[-1]
        self.compared = STAGES[:STAGES.index(until) + 1]  # a soak of one stage runs no further than that stage

    # -- bookkeeping

    def _fault(self, fault: Fault) -> Fault:
        self.faults.append(fault)
        self._pending.append(fault)
        return fault

    def _passed(self, run: Run, rc: int | None, reached: str | None = None) -> None:
        """``run`` came after faults: it finished (exit ``rc``) or reached stage ``reached`` (``rc`` None). Each
        pending fault in a stage before that point is recovered when its stage's artifact is complete now."""
        keep = []
        for fault in self._pending:
            stage = fault.landed if fault.landed in STAGES else fault.target
            if reached is not None and STAGES.index(stage) >= STAGES.index(reached):
                keep.append(fault)
                continue
            fault.recovered = (rc in (0, None)) and complete(self.runs, stage, self.keys[stage])
            if not fault.recovered:
                self.problems.append(f"{fault.kind} in {stage}: the next run did not complete it "
                                     f"(exit {rc}; log {run.log})")
        self._pending = keep

    def compare(self, label: str) -> None:
        hashes = artifact_hashes(self.runs, self.keys)
        for stage in self.compared:
            self.comparisons += 1
            if hashes[stage] != self.reference[stage]:
                self.mismatches.append(f"{label}: {stage} {hashes[stage]} != reference {self.reference[stage]}")
        if hashes["corpus"] != "missing":
            self.builds += 1
            for source, n in documents_lost(self.runs, self.keys).items():
                self.lost[source] = self.lost.get(source, 0) + n

    def run_to_end(self, label: str) -> None:
        run = self.h.start(self.runs)
        rc = self.h.finish(run)
        self._passed(run, rc)
        if rc != 0:
            self.problems.append(f"{label}: exit {rc} (log {run.log})")

    # -- random kills

    def round(self, number: int, targets: list[str]) -> None:
        """Reset, then one run killed inside each stage of ``targets`` in turn (a stage may repeat: each rerun
        resumes what the killed one left), then a run to the end, compared with the reference.

        A soak of one stage (``targets`` all that stage) resets only it and what follows, so the upstream
        artifacts are reused and each kill costs one start-up, not a pipeline."""
        first = min(STAGES.index(t) for t in targets) if self.h.until else 0
        reset(self.runs, list(STAGES[first:]), self.experiment)
        stale = stale_prefect_results(self.runs, self.keys, list(STAGES))
        self.stale_checked += len(stale)
        for stage in targets:
            if complete(self.runs, stage, self.keys[stage]):  # an earlier kill of this round came after it
                self.skipped += 1
                continue
            run = self.h.start(self.runs)
            if not wait_until(run, lambda: new_tmp(run, stage) is not None):
                rc = self.h.finish(run)
                self._passed(run, rc)
                if rc != 0 or not complete(self.runs, stage, self.keys[stage]):
                    self.problems.append(f"round {number}: the run ended before {stage} started (log {run.log})")
                continue
            self._passed(run, None, reached=stage)
            fraction = self.rng.random()
            delay = fraction * self.wall[stage]
            alive = sleep_while_alive(run, delay)
            self._kill_or_finish(run, alive)
            # After the kill: a stage whose commit beat it has no temporary directory left.
            landed = stage_in_progress(run) if alive else "after the run ended"
            fault = self._fault(Fault(RANDOM_KILL, stage, landed,
                                      f"{fraction:.2f} × {self.wall[stage]:.1f} s after its start"))
            if landed in STAGES and complete(self.runs, landed, self.keys[landed]):
                self.problems.append(f"round {number}: {landed} has a marker although it was killed mid-write")
            if not alive:  # no fault was injected: the run had ended
                self.faults.remove(fault)
                self._pending.remove(fault)
                self.too_late += 1
        self.run_to_end(f"round {number} final run")
        self.compare(f"round {number}")

    # -- targeted faults on the main stage

    def targeted(self, tmpfs_ok: bool) -> None:
        key = self.keys["main"]
        reset(self.runs, ["main", "cpt", "gate"], self.experiment)
        self.stale_checked += len(stale_prefect_results(self.runs, self.keys, ["main", "cpt", "gate"]))

        # 1. Kill while a scratch checkpoint after step 0 is being written (its hidden .step_*.tmp directory
        #    exists), so that the rerun has an earlier one to resume from; or, every write missed, when CPT starts.
        run = self.h.start(self.runs)
        wait_until(run, lambda: any(int(t.name[6:14]) > 0 for t in torn_checkpoints(self.runs, key))
                   or new_tmp(run, "cpt") is not None)
        done = sorted(main_checkpoints(self.runs, key))
        self._kill_or_finish(run, run.alive())
        torn = torn_checkpoints(self.runs, key)
        write = self._fault(Fault("kill (checkpoint write)", "main", "main" if torn else "missed",
                                  f"torn {torn[0].name if torn else '-'}, complete steps {done}"))
        if not torn:
            reset(self.runs, ["main", "cpt", "gate"], self.experiment)
            done = []

        # 2. Rerun: resumes from the newest complete checkpoint, never the torn one. Killed during the main
        #    artifact's commit: meta.json is in the temporary directory, the rename has not happened.
        run = self.h.start(self.runs)
        in_commit = lambda: (tmp := new_tmp(run, "main")) is not None and (tmp / "meta.json").exists()  # noqa: E731
        hit = wait_until(run, lambda: in_commit() or complete(self.runs, "main", key))
        self._kill_or_finish(run, run.alive())
        self._passed(run, None, reached="main")
        tmp = next((self.runs / "artifacts" / "main" / n for n in sorted(_tmp_dirs(self.runs, "main"))
                    if n not in run.tmp_before["main"]), None)
        committed = complete(self.runs, "main", key)
        record = tmp / "run.json" if tmp else self.runs / "artifacts" / "main" / key / "run.json"
        resumed = json.loads(record.read_text())["resumed_from_step"] if record.is_file() else None
        write.detail += f"; the rerun resumed from step {resumed}"
        if resumed != max(done, default=0):
            self.problems.append(f"checkpoint write: the rerun resumed from step {resumed}, not the newest complete "
                                 f"one ({max(done, default=0)})")
        marker = bool(tmp and (tmp / "_COMPLETE").exists())
        self._fault(Fault("kill (artifact commit)", "main", "main" if hit and not committed else "missed",
                          f"left {tmp.name} {'with' if marker else 'without'} its marker, never renamed into place"
                          if tmp else "the commit finished before the poll saw it"))
        if committed:  # missed: start main over so that the next faults have an unfinished run to work on
            reset(self.runs, ["main", "cpt", "gate"], self.experiment)

        # 3. Rerun (main starts over: its scratch went before the commit). Killed once three checkpoints are
        #    complete (a resume from step 0 would look like a fresh start); then the newest one's weights get
        #    flipped bytes.
        run = self.h.start(self.runs)
        if not wait_until(run, lambda: len(main_checkpoints(self.runs, key)) >= 3 or new_tmp(run, "cpt") is not None):
            self._passed(run, self.h.finish(run))
            self.problems.append(f"corrupt checkpoint: the run ended first (log {run.log})")
            return
        self.h.kill(run)
        if len(main_checkpoints(self.runs, key)) < 3:
            self.problems.append("corrupt checkpoint: the window between the last checkpoint and the end of the "
                                 "main run was missed")
            return
        self._passed(run, None, reached="main")
        steps = main_checkpoints(self.runs, key)
        newest, previous = max(steps), sorted(steps)[-2]
        weights = steps[newest] / "model.safetensors"
        blob = bytearray(weights.read_bytes())
        for i in range(len(blob) - 40, len(blob) - 8):  # inside the last tensor's data, not the header
            blob[i] ^= 0xFF
        weights.write_bytes(bytes(blob))
        corrupt = self._fault(Fault("kill + corrupt newest checkpoint", "main", "main",
                                    f"flipped 32 bytes of step {newest}'s weights"))

        # 4. Rerun: warns, resumes from the checkpoint before; killed when CPT starts.
        run = self.h.start(self.runs)
        reached = wait_until(run, lambda: new_tmp(run, "cpt") is not None)
        self._kill_or_finish(run, reached)
        self._passed(run, None if reached else run.proc.returncode, reached="cpt")
        warned = f"skipping unusable checkpoint step_{newest:08d}" in run.output()
        record = self.runs / "artifacts" / "main" / key / "run.json"
        resumed = json.loads(record.read_text())["resumed_from_step"] if record.is_file() else None
        corrupt.detail += f"; the rerun logged the warning: {'yes' if warned else 'NO'}, resumed from step {resumed}" \
                          f" (the one before: {previous})"
        if not warned or resumed != previous:
            self.problems.append(f"corrupt checkpoint: warning {'seen' if warned else 'missing'}, resumed from "
                                 f"{resumed}, expected {previous} (log {run.log})")

        # 5. CPT writes its artifact onto a nearly full disk: a clear error, no marker.
        artifacts = self.runs / "artifacts" / "cpt"
        artifacts.mkdir(parents=True, exist_ok=True)
        size = max(64 * 1024, _du(self.runs.parent / "ref-a" / "artifacts" / "cpt") // 8) // 4096 * 4096
        how, limit = f"tmpfs of {size // 1024} KiB on artifacts/cpt", None
        if tmpfs_ok:
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(artifacts)], check=True)
        else:
            how, limit = f"RLIMIT_FSIZE of {size // 1024} KiB per file (mounting a tmpfs is not permitted here)", size
        try:
            run = self.h.start(self.runs, limit)
            rc = self.h.finish(run)
            markers = [p.relative_to(self.runs).as_posix() for p in artifacts.rglob("_COMPLETE")]
        finally:
            if tmpfs_ok:
                subprocess.run(["umount", "--lazy", str(artifacts)], check=True)
        lines = [line.strip() for line in run.output().splitlines() if line.strip()]
        at = max((i for i, line in enumerate(lines) if line.startswith("error:")), default=len(lines) - 1)
        last = " ".join(lines[at:]) if lines else ""  # the console wraps long messages
        self._fault(Fault("disk nearly full", "cpt", "cpt" if rc else "missed", f"{how}: exit {rc}, markers "
                          f"{markers or 'none'}; the user sees: {last[:700]}"))
        if rc == 0 or markers or complete(self.runs, "cpt", self.keys["cpt"]):
            self.problems.append(f"disk full: exit {rc}, markers {markers} (log {run.log})")
        if not (last.startswith("error: DiskFullError") and "run the same command again" in last):
            self.problems.append(f"disk full: the last line is no clear error: {last[:300]!r} (log {run.log})")

        # 6. Rerun with space: finishes; main resumes nothing (complete), CPT and gate run.
        self.run_to_end("targeted final run")
        self.compare("targeted faults")

    def _kill_or_finish(self, run: Run, kill: bool) -> None:
        if kill:
            self.h.kill(run)
        else:
            self.h.finish(run)


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


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
        run = harness.start(runs)
        started = time.monotonic()
        rc = harness.finish(run)
        if rc != 0:
            sys.exit(f"reference run failed (exit {rc}); log {run.log}:\n{run.output()[-3000:]}")
        (runs / "done").touch()
    keys, wall = {}, {}
    for stage in STAGES:
        (folder,) = [p for p in (runs / "artifacts" / stage).iterdir() if not p.name.startswith(".")]
        keys[stage] = folder.name
        wall[stage] = float(json.loads((folder / "meta.json").read_text())["wall_s"])
    return keys, wall, None if started is None else time.monotonic() - started


def plan_rounds(trials: int, rng: random.Random, stage: str | None = None, per_round: int = 2) -> list[list[str]]:
    """Every stage once per full round (in stage order); the remainder a seeded random subset. Aimed at one
    ``stage``: rounds of ``per_round`` kills in that stage (each rerun resumes what the killed run left)."""
    if stage is not None:
        return [[stage] * min(per_round, trials - i) for i in range(0, trials, per_round)]
    rounds = [list(STAGES) for _ in range(trials // len(STAGES))]
    if trials % len(STAGES):
        rounds.append(sorted(rng.sample(STAGES, trials % len(STAGES)), key=STAGES.index))
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20, help="random kills (spread over every stage)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None,
                        help="work folder to keep (default: a temp folder, removed); reference runs finished there "
                             "by an earlier call are reused")
    parser.add_argument("--config", default="configs/smoke.toml")
    parser.add_argument("--stage", choices=STAGES, default=None,
                        help="aim every random kill at this stage (runs stop after it; upstream artifacts are reused "
                             "between rounds); the targeted main-stage faults run only with --stage main or without "
                             "--stage")
    parser.add_argument("--kills-per-round", type=int, default=2,
                        help="with --stage: kills in the stage before a run is let finish (default 2)")
    args = parser.parse_args()
    if args.trials < 1:
        parser.error(f"--trials {args.trials}: give at least 1 (the reliability check wants ≥ 20)")
    if args.kills_per_round < 1:
        parser.error(f"--kills-per-round {args.kills_per_round}: give at least 1")

    started = time.monotonic()
    work = (args.keep or Path(tempfile.mkdtemp(prefix="pretrain-faults-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    harness = Harness(work, args.config)
    experiment = _experiment_name(args.config)
    try:
        print(f"config {args.config}, seed {args.seed}, work folder {work}")
        keys, wall, ref_s = reference_run(harness, work / "ref-a")
        print(f"reference run: {_took(ref_s)}; stage wall times (s): " + ", ".join(f"{s} {wall[s]:.1f}" for s in STAGES))
        keys_b, _, ref_b_s = reference_run(harness, work / "ref-b")
        reference = artifact_hashes(work / "ref-a", keys)
        second = artifact_hashes(work / "ref-b", keys_b)
        same = [s for s in STAGES if reference[s] == second[s]]
        print(f"second reference run (fresh folder): {_took(ref_b_s)}; keys equal: {keys == keys_b}; "
              f"content equal: {len(same)}/{len(STAGES)} artifacts")
        if len(same) != len(STAGES) or keys != keys_b:
            for s in STAGES:
                if reference[s] != second[s]:
                    print(f"  NONDETERMINISTIC {s}: {reference[s]} vs {second[s]}")
            sys.exit(1)

        harness.until = args.stage
        campaign = Campaign(harness, work / "trials", reference, keys, wall, experiment, rng)
        plan = lambda n: plan_rounds(n, rng, args.stage, args.kills_per_round)  # noqa: E731
        rounds, number = plan(args.trials), 0
        while rounds:
            number += 1
            before = len(campaign.faults)
            campaign.round(number, rounds.pop(0))
            print(f"round {number}: killed in {', '.join(f.landed for f in campaign.faults[before:])}; "
                  f"mismatches so far {len(campaign.mismatches)}")
            # A soak counts only the kills that landed inside its stage (one that came after the commit does not).
            missing = args.trials - sum(f.kind == RANDOM_KILL and (args.stage is None or f.landed == args.stage)
                                        for f in campaign.faults)
            if number >= 5 * args.trials:
                campaign.problems.append(f"only {args.trials - missing} of {args.trials} kills landed where aimed "
                                         f"after {number} rounds")
            elif not rounds and missing > 0 and not campaign.problems:  # kills that came too late or were skipped
                rounds = plan(missing)
        if args.stage in (None, "main"):
            harness.until = None  # the targeted faults run through CPT
            campaign.compared = STAGES
            campaign.targeted(_can_mount(work))
        lost_refs = [documents_lost(work / name, keys_of) for name, keys_of in (("ref-a", keys), ("ref-b", keys_b))]
        for lost in lost_refs:
            for source, n in lost.items():
                campaign.lost[source] = campaign.lost.get(source, 0) + n
        report(campaign, harness, len(lost_refs), time.monotonic() - started)
        failed = campaign.mismatches or any(campaign.lost.values()) or campaign.problems or harness.orphans
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failed else 0)


def _took(seconds: float | None) -> str:
    return "reused (--keep)" if seconds is None else f"{seconds:.0f} s"


def _experiment_name(config: str) -> str:
    import tomllib

    return tomllib.loads((ROOT / config).read_text())["name"]


def report(campaign: Campaign, harness: Harness, reference_builds: int, wall_s: float) -> None:
    faults = campaign.faults
    print()
    print(f"faults injected: {len(faults)}")
    kinds = list(dict.fromkeys(f.kind for f in faults))
    counts = Counter((f.kind, f.landed) for f in faults)
    columns = [*STAGES, "between stages", "missed"]
    columns = [c for c in columns if any(counts[(k, c)] for k in kinds)]
    print(f"  {'kind (by the stage it hit)':<34}" + "".join(f"{c.split()[0][:9]:>10}" for c in columns)
          + f"{'total':>8}")
    for kind in kinds:
        print(f"  {kind:<34}" + "".join(f"{counts[(kind, c)]:>10}" for c in columns)
              + f"{sum(f.kind == kind for f in faults):>8}")
    for fault in faults:
        if fault.kind != RANDOM_KILL:
            print(f"  - {fault.kind}: {fault.detail}")
    if campaign.too_late or campaign.skipped:
        print(f"  (not counted: {campaign.too_late} kill(s) whose run had ended before the delay was up, and "
              f"{campaign.skipped} target(s) already complete because an earlier kill of the round landed after them)")
    recovered = sum(bool(f.recovered) for f in faults)
    print(f"runs recovered: {recovered}/{len(faults)} (the next run of the same command finished the faulted stage; "
          f"{len(harness.run_wall)} runs in all)")
    print(f"stale Prefect results present for a stage without its artifact: {campaign.stale_checked} (all recomputed)"
          if not campaign.problems else f"stale Prefect results present: {campaign.stale_checked}")
    print(f"mismatching artifacts: {len(campaign.mismatches)} (of {campaign.comparisons} compared with the reference)")
    for line in campaign.mismatches:
        print(f"  {line}")
    lost = sum(campaign.lost.values())
    print(f"documents lost: {lost} (per source, in − kept − removed, over {campaign.builds + reference_builds} corpus "
          f"builds: " + ", ".join(f"{s} {n}" for s, n in campaign.lost.items()) + ")")
    print(f"processes left after a kill: {len(harness.orphans)}" + "".join(f"\n  {p}" for p in harness.orphans))
    for problem in campaign.problems:
        print(f"problem: {problem}")
    print(f"wall time: {wall_s / 60:.1f} min")


if __name__ == "__main__":
    main()
