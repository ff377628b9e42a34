"""Wall time of the demo: a cold run, then a fully cached rerun, side by side in one process tree.

    python benchmarks/demo_wall_time.py                      # configs/demo.toml into a fresh temp runs folder
    python benchmarks/demo_wall_time.py configs/smoke.toml   # any config

Targets (issue: walking skeleton): cold demo ≤ 15 min on a 2-core machine; cached rerun ≤ 15 % of cold.
The Debian packages are fetched into the temp folder too, so "cold" includes the download.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed_run(config: str, runs: Path) -> float:
    env = {**os.environ, "PRETRAIN_RUNS_DIR": str(runs)}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", config], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    status = next((line for line in proc.stdout.splitlines() if line.startswith("stages:")), "")
    print(f"  {status}")
    return elapsed


def main() -> None:
    config = sys.argv[1] if len(sys.argv) > 1 else "configs/demo.toml"
    with tempfile.TemporaryDirectory(prefix="pretrain-bench-") as tmp:
        runs = Path(tmp) / "runs"
        print(f"config {config}, runs folder {runs}")
        cold = timed_run(config, runs)
        print(f"cold run:   {cold:8.1f} s")
        cached = timed_run(config, runs)
        print(f"cached run: {cached:8.1f} s")
    print(f"cached / cold = {cached / cold:.3f}  (target ≤ 0.15)")
    if "demo" in config:
        print(f"cold / 15 min = {cold / 900:.3f}  (target ≤ 1.0)")


if __name__ == "__main__":
    main()
