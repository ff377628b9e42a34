"""Shard maps: every task runner gives the same results in order; a failing shard fails the map after the rest."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.errors import ConfigError, DataError, ShardCallError
from infra.shard_map import prefect_shard_map, sequential_map

ROOT = Path(__file__).resolve().parents[2]


def square(x: int) -> int:
    return x * x


def test_sequential_map_keeps_order():
    assert sequential_map(square, [{"x": i} for i in range(5)], "sq") == [0, 1, 4, 9, 16]
    done = []
    assert prefect_shard_map("sequential", 1, on_done=lambda: done.append(1))(square, [{"x": 3}], "sq") == [9]
    assert done == [1]


def flaky(part: int, marks: str, fail_times: int, how: str = "raise") -> int:
    """Fail the first ``fail_times`` attempts of this call (one mark file per attempt), then return ``part``.
    ``how``: ``raise`` an OSError, ``exit`` the worker process (a worker killed for memory) or raise a ``DataError``
    (bad input)."""
    done = len(list(Path(marks).glob(f"attempt-{part}-*")))
    (Path(marks) / f"attempt-{part}-{done}").touch()
    if done < fail_times:
        if how == "exit":
            os._exit(9)
        if how == "data":
            raise DataError(f"partition {part}: bad input")
        raise OSError(f"partition {part}: transient read error")
    return part


def attempts(marks: Path, part: int) -> int:
    return len(list(marks.glob(f"attempt-{part}-*")))


def test_a_failed_call_is_retried_then_named_with_its_partition(tmp_path):
    run = prefect_shard_map("sequential", 1, retries=2)
    calls = [dict(part=p, marks=str(tmp_path), fail_times=2 if p == 1 else 0) for p in range(3)]
    assert run(flaky, calls, "corpus-exact") == [0, 1, 2]  # two failures, the third attempt succeeds
    assert [attempts(tmp_path, p) for p in range(3)] == [1, 3, 1]
    marks = tmp_path / "spent"
    marks.mkdir()
    with pytest.raises(ShardCallError) as caught:
        run(flaky, [dict(part=p, marks=str(marks), fail_times=5 if p == 2 else 0) for p in range(4)], "corpus-exact")
    assert str(caught.value).startswith("corpus-exact: call 3 of 4 (partition 2) failed after 3 attempts: OSError: "
                                        "partition 2: transient read error")
    assert isinstance(caught.value.__cause__, OSError)
    assert attempts(marks, 2) == 3 and attempts(marks, 3) == 0  # nothing after the failed call runs
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(DataError, match="partition 0: bad input"):  # bad input: raised as is, not retried
        run(flaky, [dict(part=0, marks=str(bad), fail_times=5, how="data")], "corpus-exact")
    assert attempts(bad, 0) == 1


def test_unknown_runner_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown engine"):
        prefect_shard_map("cluster", 2)(square, [{"x": 1}], "sq")


SCRIPT = """
import sys
from pathlib import Path

from infra.errors import ShardCallError
from infra.runs import RunsLayout


def main():
    RunsLayout.resolve(sys.argv[1]).prepare_environment()
    from prefect import flow

    from infra.shard_map import prefect_shard_map
    from tests.unit.test_shard_map import attempts, flaky, square

    @flow
    def shards():
        calls = [{"x": i} for i in range(6)]
        for kind in ("threads", "processes"):
            assert prefect_shard_map(kind, 2)(square, calls, f"sq-{kind}") == [i * i for i in range(6)], kind
        try:
            prefect_shard_map("processes", 2)(square, [{"x": 1}, {"x": "a"}], "bad")
        except ShardCallError as err:
            assert isinstance(err.__cause__, TypeError), repr(err.__cause__)
            print("failed as expected:", err)
        else:
            raise SystemExit("a failing shard did not fail the map")
        # A worker process that dies (killed for memory) is replaced, and its call retried in the new pool.
        marks = Path(sys.argv[2])
        calls = [dict(part=p, marks=str(marks), fail_times=1 if p == 2 else 0, how="exit") for p in range(4)]
        assert prefect_shard_map("processes", 2, retries=1)(flaky, calls, "corpus-key") == [0, 1, 2, 3]
        assert attempts(marks, 2) == 2, attempts(marks, 2)
        try:
            prefect_shard_map("threads", 2, retries=1)(
                flaky, [dict(part=p, marks=str(marks / "t"), fail_times=9 if p == 1 else 0) for p in range(3)],
                "corpus-candidates")
        except ShardCallError as err:
            print("retries spent:", err)
            assert attempts(marks / "t", 1) == 2
        else:
            raise SystemExit("a call failing on every attempt did not fail the map")

    shards()


if __name__ == "__main__":  # worker processes re-import this module
    main()
"""


def test_threads_and_processes_run_as_prefect_tasks(tmp_path):
    """Real Prefect (ephemeral API in a temporary runs folder) in a child process, inside a flow as in the pipeline."""
    script = tmp_path / "shards.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    (tmp_path / "marks" / "t").mkdir(parents=True)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "runs"), str(tmp_path / "marks")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "failed as expected: bad: call 2 of 2 (no partition or shard) failed after 1 attempt: TypeError" \
        in proc.stdout
    assert "retries spent: corpus-candidates: call 2 of 3 (partition 1) failed after 2 attempts: OSError: " \
        "partition 1: transient read error" in proc.stdout


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
