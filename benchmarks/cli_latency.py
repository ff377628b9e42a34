"""CPU time of the ``pretrain`` command's quick answers, beside the interpreter's own start.

    python benchmarks/cli_latency.py             # 7 repeats of each command, median and spread
    python benchmarks/cli_latency.py --repeat 15

Each command runs in a fresh process (``python -m flows.cli ...``, the console script's entry point) and is
charged the user + system CPU seconds of that process (``resource.getrusage(RUSAGE_CHILDREN)`` before and after),
so a loaded machine inflates wall time but not these figures. Rows: ``python -c pass`` (the floor), ``--help``,
``run --help``, a config error (exit 2 before anything runs), and the full stack's import (``import torch, mlflow,
prefect``), which the commands above no longer pay. Target: < 0.5 s of CPU for each quick answer.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BAD_CONFIG = 'name = "typo"\nsources = {}\n[corpus]\nnear_dedupe = {}\n'


def cpu_seconds(argv: list[str], expect: int) -> float:
    """User + system CPU seconds of one child process running ``argv``.

    Raises:
        SystemExit: the command exits with another status than ``expect``.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != expect:
        sys.exit(f"{' '.join(argv)} exited {proc.returncode}, expected {expect}:\n{proc.stdout[-2000:]}"
                 f"\n{proc.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs of each command (median reported)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pretrain-cli-") as tmp:
        bad = Path(tmp) / "bad.toml"
        bad.write_text(BAD_CONFIG)
        cli = [sys.executable, "-m", "flows.cli"]
        rows = [("python -c pass", [sys.executable, "-c", "pass"], 0),
                ("pretrain --help", cli + ["--help"], 0),
                ("pretrain run --help", cli + ["run", "--help"], 0),
                ("pretrain run BAD.toml (config error)", cli + ["run", str(bad)], 2),
                ("import torch, mlflow, prefect", [sys.executable, "-c", "import torch, mlflow, prefect"], 0)]
        print(f"{'command':<40} {'median CPU s':>12} {'min':>7} {'max':>7}   (n = {args.repeat})")
        medians = {}
        for label, argv, expect in rows:
            runs = [cpu_seconds(argv, expect) for _ in range(args.repeat)]
            medians[label] = statistics.median(runs)
            print(f"{label:<40} {medians[label]:>12.3f} {min(runs):>7.3f} {max(runs):>7.3f}")
    floor, stack = medians["python -c pass"], medians["import torch, mlflow, prefect"]
    quick = [label for label, _, _ in rows[1:4]]
    worst = max(medians[label] for label in quick)
    print(f"slowest quick answer {worst:.3f} s CPU = {worst / floor:.1f}x the interpreter's start, "
          f"{worst / stack:.2f}x the stack's import; target < 0.5 s: {'met' if worst < 0.5 else 'NOT met'}")


if __name__ == "__main__":
    main()
