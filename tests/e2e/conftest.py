"""Shared by the end-to-end tests: the ``pretrain`` CLI in a subprocess, and one completed smoke run per session.

Tests that change a runs folder copy ``smoke_runs["runs"]`` first (``shutil.copytree``); the original stays as the
two runs (cold, then fully cached) made it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory) -> dict:
    runs = tmp_path_factory.mktemp("runs")
    first = pretrain("run", "configs/smoke.toml", runs=runs)
    second = pretrain("run", "configs/smoke.toml", runs=runs)
    return {"runs": runs, "first": first, "second": second}
