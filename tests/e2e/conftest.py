"""Shared by the end-to-end tests: the ``pretrain`` CLI in a subprocess, and one completed smoke run per session.

The smoke runs folder is made once per session, also under pytest-xdist: the first worker to ask makes it under a
file lock in the session's shared temporary folder, and every worker then works on its own copy, so a test that
writes into ``smoke_runs["runs"]`` (MLflow, DuckDB) never meets another worker's writes. Tests that change a runs
folder copy ``smoke_runs["runs"]`` first (``shutil.copytree``); the worker's copy stays as the two runs (cold, then
fully cached) made it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[2]


def pretrain(*args: str, runs: Path, env: dict[str, str] | None = None,
             timeout: float = 900) -> subprocess.CompletedProcess:
    """Run ``pretrain ARGS`` with ``runs`` as the runs folder; asserts exit code 0."""
    full_env = {**os.environ, "PRETRAIN_RUNS_DIR": str(runs), "COLUMNS": "200", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"pretrain {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def stage_status(stdout: str) -> dict[str, str]:
    """{stage: "cached" | "ran"} from the summary's ``stages:`` line."""
    line = next(line for line in stdout.splitlines() if line.startswith("stages:"))
    return dict(re.findall(r"(\w+)=(cached|ran)", line))


def _make_smoke_runs(runs: Path) -> dict:
    """Two runs of configs/smoke.toml into ``runs``: cold, then fully cached."""
    first = pretrain("run", "configs/smoke.toml", runs=runs)
    second = pretrain("run", "configs/smoke.toml", runs=runs)
    return {"runs": runs, "first": first, "second": second}


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory) -> dict:
    """{"runs": this worker's smoke runs folder, "first"/"second": the two runs' CompletedProcess}."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return _make_smoke_runs(tmp_path_factory.mktemp("runs"))
    shared = tmp_path_factory.getbasetemp().parent  # the session's folder, common to all workers
    record = shared / "smoke_runs.json"
    with FileLock(str(shared / "smoke_runs.lock")):
        if not record.exists():
            made = _make_smoke_runs(shared / "smoke" / "runs")
            record.write_text(json.dumps({name: {"args": made[name].args, "returncode": made[name].returncode,
                                                 "stdout": made[name].stdout, "stderr": made[name].stderr}
                                          for name in ("first", "second")}))
    runs = tmp_path_factory.mktemp("smoke") / "runs"
    shutil.copytree(shared / "smoke" / "runs", runs)
    procs = {name: subprocess.CompletedProcess(p["args"], p["returncode"], p["stdout"], p["stderr"])
             for name, p in json.loads(record.read_text()).items()}
    return {"runs": runs, **procs}
