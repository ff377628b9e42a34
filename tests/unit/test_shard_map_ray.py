"""The Ray shard map on a real in-process Ray: results in call order, at most ``workers`` calls in flight, the first
failure raised once the other submitted calls finished, the worker environment, and a Ray it starts itself.

Ray takes seconds to start, so every test but the first shares one module-wide instance (``shared_ray``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

# Keep this module's Ray on the loopback interface (Ray binds the primary address of a Linux host otherwise). Ray
# reads the variable once, on import; it is not left set for the processes later tests start.
_LOOPBACK = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_set_here = _LOOPBACK not in os.environ
os.environ.setdefault(_LOOPBACK, "0")
ray = pytest.importorskip("ray")
if _set_here:
    del os.environ[_LOOPBACK]

from infra.errors import ConfigError, DataError, ShardCallError  # noqa: E402
from infra.execution import ExecutionConfig  # noqa: E402
from infra.shard_map import PROJECT_ROOT, one_connection, ray_shard_map, shard_map_for  # noqa: E402

# pytest imports this file as a top-level module the Ray workers cannot import: send its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def slow_square(x: int, delay: float) -> int:
    time.sleep(delay)
    return x * x


def span(i: int, delay: float) -> list[float]:
    """When this call ran, in wall-clock seconds (every worker shares this machine's clock)."""
    start = time.time()
    time.sleep(delay)
    return [start, time.time()]


def meet(i: int, n: int, folder: str, timeout_s: float) -> int:
    """Arrive at a barrier of ``n`` calls (one file each) and wait for the others: how many were running at once."""
    (Path(folder) / f"arrived-{i}").touch()
    deadline = time.time() + timeout_s
    while len(list(Path(folder).glob("arrived-*"))) < n and time.time() < deadline:
        time.sleep(0.05)
    return len(list(Path(folder).glob("arrived-*")))


def finish_or_fail(i: int, delay: float, fail: bool, marks: str) -> int:
    """Sleep ``delay`` s, then raise (``fail``) or leave a mark file named after the call."""
    time.sleep(delay)
    if fail:
        raise ValueError(f"call {i} failed")
    (Path(marks) / f"done-{i}").touch()
    return i


def worker_env() -> dict[str, str | None]:
    keys = ("PYTHONPATH", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "TOKENIZERS_PARALLELISM")
    return {**{k: os.environ.get(k) for k in keys}, "pid": str(os.getpid())}


def test_local_address_starts_a_private_ray_and_stops_it(tmp_path):
    """With Ray not initialised, address = "local" starts an instance for the map and shuts it down after."""
    assert not ray.is_initialized()
    sigterm = signal.getsignal(signal.SIGTERM)
    done = []
    record = tmp_path / "calls.jsonl"
    results = ray_shard_map(2, "local", on_done=lambda: done.append(1), record=record)(
        slow_square, [{"x": i, "delay": 0.0} for i in range(4)], "sq")
    assert results == [0, 1, 4, 9]
    assert len(done) == 4
    assert not ray.is_initialized()
    assert signal.getsignal(signal.SIGTERM) is sigterm  # ray.init's exiting handler does not outlive the map
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert sorted(r["call"] for r in rows) == [0, 1, 2, 3]
    assert {r["label"] for r in rows} == {"sq"}
    assert all(r["node_id"] and r["pid"] != os.getpid() for r in rows)  # ran in Ray workers, not here


def test_maps_inside_one_connection_share_the_ray_they_start(tmp_path):
    """A stage's passes pay for one ray.init: the first map starts the local instance, the next maps reuse it,
    and the block shuts it down, also when a map inside it fails."""
    assert not ray.is_initialized()
    with pytest.raises(ShardCallError, match="call 0 failed"), one_connection():
        assert ray_shard_map(2, "local")(slow_square, [{"x": i, "delay": 0.0} for i in range(3)], "a") == [0, 1, 4]
        assert ray.is_initialized()
        instance = ray.get_runtime_context().gcs_address
        assert ray_shard_map(2, "local")(slow_square, [{"x": 3, "delay": 0.0}], "b") == [9]
        assert ray.get_runtime_context().gcs_address == instance  # the same instance, not a fresh one
        ray_shard_map(1, "local")(finish_or_fail, [{"i": 0, "delay": 0.0, "fail": True, "marks": str(tmp_path)}], "c")
    assert not ray.is_initialized()


def test_unreachable_address_is_a_config_error_at_once():
    # 127.0.0.2 is loopback that Ray does not rewrite to the host's address; nothing listens on port 9.
    started = time.time()
    with pytest.raises(ConfigError, match="no Ray cluster at address = '127.0.0.2:9'.*ray start --head"):
        ray_shard_map(1, "127.0.0.2:9")(slow_square, [{"x": 1, "delay": 0}], "sq")
    assert time.time() - started < 30


@pytest.fixture(scope="module")
def shared_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield
    finally:
        ray.shutdown()


def test_results_come_back_in_call_order(shared_ray):
    # Later calls finish first; the map still returns them in call order and leaves Ray running (not its own).
    calls = [{"x": i, "delay": 0.6 - 0.1 * i} for i in range(6)]
    assert ray_shard_map(2, "auto")(slow_square, calls, "sq") == [i * i for i in range(6)]
    assert ray.is_initialized()
    assert ray_shard_map(2, "auto")(slow_square, [], "sq") == []


def test_at_most_workers_calls_in_flight(shared_ray, tmp_path):
    one = ray_shard_map(1, "auto")(span, [{"i": i, "delay": 0.3} for i in range(3)], "span")
    assert all(later[0] >= earlier[1] for earlier, later in zip(one, one[1:])), one  # strictly one at a time
    # workers = 0: as many as the cluster has CPUs (2), so both calls reach the barrier together.
    met = ray_shard_map(0, "auto")(meet, [dict(i=i, n=2, folder=str(tmp_path), timeout_s=60) for i in range(2)],
                                   "meet")
    assert met == [2, 2]


def test_first_failure_is_raised_after_the_submitted_calls_finish(shared_ray, tmp_path):
    # 3 in flight: call 0 is slow and succeeds, calls 1 and 2 fail; call 3 is never submitted after a failure.
    calls = [dict(i=0, delay=1.5, fail=False), dict(i=1, delay=0.3, fail=True), dict(i=2, delay=0.0, fail=True),
             dict(i=3, delay=0.0, fail=False)]
    started = time.time()
    with pytest.raises(ShardCallError, match=r"^mixed: call 2 of 4 \(no partition or shard\) failed after 1 "
                                             r"attempt: ValueError: call 1 failed$") as caught:
        ray_shard_map(3, "auto")(finish_or_fail, [{**c, "marks": str(tmp_path)} for c in calls], "mixed")
    assert time.time() - started >= 1.5  # waited for call 0
    assert (tmp_path / "done-0").exists()  # ... which finished its write
    assert not (tmp_path / "done-3").exists()
    assert isinstance(caught.value.__cause__, ValueError)  # the call's own error ...
    assert isinstance(caught.value.__cause__.__cause__, ray.exceptions.RayTaskError)  # ... and the remote traceback


def flaky(part: int, marks: str, fail_times: int, bad_input: bool = False) -> int:
    """Fail the first ``fail_times`` attempts (one mark file each): an OSError, or a DataError for ``bad_input``."""
    done = len(list(Path(marks).glob(f"attempt-{part}-*")))
    (Path(marks) / f"attempt-{part}-{done}").touch()
    if done < fail_times:
        raise DataError("bad input") if bad_input else OSError(f"partition {part}: transient")
    return part


def test_a_failed_call_is_resubmitted_then_named_with_its_partition(shared_ray, tmp_path):
    calls = [dict(part=p, marks=str(tmp_path), fail_times=2 if p == 1 else 0) for p in range(3)]
    assert ray_shard_map(2, "auto", retries=2)(flaky, calls, "corpus-exact") == [0, 1, 2]
    assert len(list(tmp_path.glob("attempt-1-*"))) == 3
    spent = tmp_path / "spent"
    spent.mkdir()
    with pytest.raises(ShardCallError, match=r"^corpus-exact: call 1 of 2 \(partition 0\) failed after 2 attempts: "
                                             r"OSError: partition 0: transient$"):
        ray_shard_map(2, "auto", retries=1)(flaky, [dict(part=p, marks=str(spent), fail_times=9) for p in range(2)],
                                            "corpus-exact")
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(DataError, match="bad input"):  # raised as is, never resubmitted
        ray_shard_map(2, "auto", retries=3)(flaky, [dict(part=0, marks=str(bad), fail_times=9, bad_input=True)],
                                            "corpus-exact")
    assert len(list(bad.glob("attempt-0-*"))) == 1


def test_workers_get_the_project_and_the_thread_policy(shared_ray, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    (env,) = shard_map_for(ExecutionConfig(engine="ray", workers=1))(worker_env, [{}], "env")
    assert env["pid"] != str(os.getpid())
    assert env["PYTHONPATH"] == str(PROJECT_ROOT)
    assert env["OMP_NUM_THREADS"] == "1"  # one CPU per task
    assert env["OMP_WAIT_POLICY"] == os.environ["OMP_WAIT_POLICY"]  # as this process chose it (PASSIVE by default)
    assert env["TOKENIZERS_PARALLELISM"] == os.environ.get("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's export wins
    (env,) = ray_shard_map(1, "auto")(worker_env, [{}], "env")
    assert env["OMP_NUM_THREADS"] == "3"


def test_tokenizer_parts_encoded_on_ray_join_into_the_serial_bytes(shared_ray, tmp_path):
    from tasks.tokenizer.config import TokenizerConfig
    from tasks.tokenizer.encode import pack_parts
    from tasks.tokenizer.fit import fit_tokenizer
    from test_tokenizer_encode import (assert_same_files, documents, kept_parts, serial_shards,  # beside this file
                                       shard_meta)

    docs = documents()
    tok = fit_tokenizer(docs["text"].tolist(), TokenizerConfig(vocab_size=300))
    tok.save(str(tmp_path / "tokenizer.json"))
    meta = shard_meta(tok)
    serial_shards(tok, docs, meta, tmp_path / "serial")
    parts, labels, rows = kept_parts(docs, tmp_path / "kept", [6, 5])
    pack_parts(parts, labels, rows, tokenizer_path=tmp_path / "tokenizer.json", out=tmp_path / "ray",
               work=tmp_path / "work", part_docs=2, meta=meta, tokenizer_vocab=tok.get_vocab_size(),
               shard_map=ray_shard_map(2, "auto"))
    assert_same_files(tmp_path / "serial" / "shards", tmp_path / "ray" / "shards")


def test_recycle_after_gives_each_ray_worker_process_at_most_that_many_calls(shared_ray):
    from collections import Counter

    rows = ray_shard_map(2, "auto", recycle_after=2)(worker_env, [{} for _ in range(8)], "env")
    per_process = Counter(r["pid"] for r in rows)
    assert max(per_process.values()) <= 2 and len(per_process) >= 4

