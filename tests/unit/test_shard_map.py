"""Shard maps: every task runner gives the same results in order; a failing shard fails the map after the rest."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.errors import ConfigError
from infra.shard_map import prefect_shard_map, sequential_map

ROOT = Path(__file__).resolve().parents[2]


def square(x: int) -> int:
    return x * x


def test_sequential_map_keeps_order():
    assert sequential_map(square, [{"x": i} for i in range(5)], "sq") == [0, 1, 4, 9, 16]
    done = []
    assert prefect_shard_map("sequential", 1, on_done=lambda: done.append(1))(square, [{"x": 3}], "sq") == [9]
    assert done == [1]


def test_unknown_runner_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown engine"):
        prefect_shard_map("cluster", 2)(square, [{"x": 1}], "sq")


SCRIPT = """
import sys

from infra.runs import RunsLayout


def main():
    RunsLayout.resolve(sys.argv[1]).prepare_environment()
    from prefect import flow

    from infra.shard_map import prefect_shard_map
    from tests.unit.test_shard_map import square

    @flow
    def shards():
        calls = [{"x": i} for i in range(6)]
        for kind in ("threads", "processes"):
            assert prefect_shard_map(kind, 2)(square, calls, f"sq-{kind}") == [i * i for i in range(6)], kind
        try:
            prefect_shard_map("processes", 2)(square, [{"x": 1}, {"x": "a"}], "bad")
        except TypeError as err:
            print("failed as expected:", err)
        else:
            raise SystemExit("a failing shard did not fail the map")

    shards()


if __name__ == "__main__":  # worker processes re-import this module
    main()
"""


def test_threads_and_processes_run_as_prefect_tasks(tmp_path):
    """Real Prefect (ephemeral API in a temporary runs folder) in a child process, inside a flow as in the pipeline."""
    script = tmp_path / "shards.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "runs")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "failed as expected" in proc.stdout


def test_local_process_map_keeps_order():
    from infra.shard_map import process_map

    calls = [{"x": i} for i in range(12)]
    assert process_map(2)(square, calls, "sq") == [i * i for i in range(len(calls))]
    assert process_map(2)(square, [], "sq") == []


def pid(i: int) -> int:
    return os.getpid()


def test_process_map_replaces_its_workers_after_recycle_after_calls_each():
    from collections import Counter

    from infra.shard_map import process_map

    calls = [{"i": i} for i in range(12)]
    reused = Counter(process_map(2)(pid, calls, "pid"))
    assert len(reused) <= 2  # never replaced: two processes ran everything
    recycled = Counter(process_map(2, recycle_after=2)(pid, calls, "pid"))
    assert os.getpid() not in recycled
    assert max(recycled.values()) <= 4  # a pool takes 2 × 2 calls, however its two processes share them
    assert len(recycled) >= 3  # three pools at least


def span(i: int) -> tuple[float, float]:
    import time

    start = time.time()
    time.sleep(0.3)  # long enough that a second pool's processes would overlap
    return start, time.time()


def test_a_recycling_pool_never_runs_more_than_workers_calls_at_once():
    from infra.shard_map import process_map

    spans = process_map(2, recycle_after=1)(span, [{"i": i} for i in range(12)], "span")
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    running, most = 0, 0
    for _, step in edges:
        running += step
        most = max(most, running)
    assert most <= 2
