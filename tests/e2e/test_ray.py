"""End to end on a real Ray cluster: ``ray start --head`` plus a second node on this machine, then
``pretrain run --until tokenizer`` with ``[corpus.execution]`` and ``[tokenizer.execution]`` on ``engine = "ray"``.

The corpus and the token shards must be exactly what the default engine (``processes``, the session's smoke run)
produced, and the shard calls must have run on both nodes (the ``ray_calls.jsonl`` the Ray shard map writes into
each artifact). The cluster is ours alone: its own temp folder, port and token, loopback addresses only; it is stopped
by the ids of the processes the test started, never by a machine-wide ``ray stop``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import psutil
import pytest

from conftest import pretrain, stage_status
from tasks.readers import kept_files, load_kept, load_removals

pytestmark = pytest.mark.e2e
pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).with_name("ray")
HEAD_IP, NODE_IP = "127.0.0.2", "127.0.0.3"  # loopback that Ray keeps as given (it rewrites 127.0.0.1 to the host's IP)

# A shard map whose calls each leave a file naming their node, then wait a few seconds: long enough for the test
# to kill the worker node while calls run on it.
LOST_NODE_DRIVER = """
import json, pathlib, sys, time
import ray
from infra.shard_map import ray_shard_map

def slow_square(i, folder):
    node = ray.get_runtime_context().get_node_id()
    pathlib.Path(folder, f"{i}-{node}-{time.time_ns()}").touch()
    time.sleep(3)
    return i * i

print(json.dumps(ray_shard_map(2, sys.argv[1])(slow_square, [dict(i=i, folder=sys.argv[2]) for i in range(6)], "lost")))
"""

NODES_PROBE = """
import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR")
print(json.dumps([n["NodeID"] for n in ray.nodes() if n["Alive"]]))
"""


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _wait_for(log: Path, proc: subprocess.Popen, text: str, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"{' '.join(map(str, proc.args[:3]))} did not start:\n{log.read_text()[-3000:]}")


def _alive_nodes(address: str, env: dict[str, str]) -> list[str]:
    probe = subprocess.run([sys.executable, "-c", NODES_PROBE, address], env=env, capture_output=True, text=True,
                           timeout=120)
    assert probe.returncode == 0, probe.stderr[-3000:]
    return json.loads(probe.stdout.strip().splitlines()[-1])


def _stop(started: list[subprocess.Popen], temp: Path) -> list[str]:
    """SIGTERM each ``ray start --block`` (it stops its node's processes), then SIGKILL whatever of theirs is left:
    their descendants, recorded first, and any process naming our temp folder. Returns what was still alive."""
    ours: dict[int, psutil.Process] = {}
    for proc in started:
        try:
            root = psutil.Process(proc.pid)
            ours.update({p.pid: p for p in [root, *root.children(recursive=True)]})
        except psutil.NoSuchProcess:
            pass
    for p in psutil.process_iter(["cmdline"]):
        if str(temp) in " ".join(p.info["cmdline"] or []):
            ours.setdefault(p.pid, p)
    for proc in reversed(started):  # the worker node first, the head last
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    _, alive = psutil.wait_procs(list(ours.values()), timeout=15)
    survivors = [f"{p.pid} {' '.join(p.cmdline()[:2])}" for p in alive if _running(p)]
    for p in alive:
        try:
            p.kill()  # the same process psutil recorded (it checks the start time), never a reused pid
        except psutil.NoSuchProcess:
            pass
    return survivors


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def ray_cluster():
    """A two-node Ray cluster of one CPU per node: {address, env, node_ids}. Ray's socket paths must stay under
    ~107 characters, so the temp folder is a short one of the test's own directly under /tmp (pytest's, nested one
    level deeper per pytest-xdist worker, is too long)."""
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    token = temp / "token"
    token.write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    port = _free_port(HEAD_IP)
    address = f"{HEAD_IP}:{port}"
    common = ["--block", "--temp-dir", str(temp), "--num-cpus", "1", "--disable-usage-stats",
              "--object-store-memory", str(100 * 2**20)]
    started: list[subprocess.Popen] = []
    try:
        head_log = temp / "head.log"
        started.append(subprocess.Popen(
            [str(RAY), "start", "--head", "--port", str(port), "--node-ip-address", HEAD_IP,
             "--include-dashboard=false", *common], cwd=temp, env=env, stdout=head_log.open("w"),
            stderr=subprocess.STDOUT, start_new_session=True))
        _wait_for(head_log, started[0], "Ray runtime started", 120)
        node_log = temp / "node.log"
        elsewhere = temp / "node-cwd"  # the second node starts outside the checkout, as one on another machine would
        elsewhere.mkdir()
        started.append(subprocess.Popen(
            [str(RAY), "start", "--address", address, "--node-ip-address", NODE_IP, *common], cwd=elsewhere,
            env=env, stdout=node_log.open("w"), stderr=subprocess.STDOUT, start_new_session=True))
        _wait_for(node_log, started[1], "Ray runtime started", 120)
        deadline, nodes = time.time() + 120, []
        while time.time() < deadline and len(nodes) < 2:
            nodes = _alive_nodes(address, env)
        assert len(nodes) == 2, f"the cluster sees {len(nodes)} nodes, expected the head and one worker node"
        yield {"address": address, "env": env, "node_ids": set(nodes), "worker_node_pgid": started[1].pid}
    finally:
        survivors = _stop(started, temp)
        shutil.rmtree(temp, ignore_errors=True)
        assert not survivors, f"Ray processes outlived the test's cluster: {survivors}"


def _artifact(runs: Path, stage: str) -> Path:
    (path,) = [p for p in (runs / "artifacts" / stage).iterdir() if (p / "_COMPLETE").exists()]
    return path


def _same_key(runs: Path, artifact: Path) -> Path:
    """The artifact of the same stage and key in ``runs``: the engine must not change the cache key."""
    path = runs / "artifacts" / artifact.parent.name / artifact.name
    assert (path / "_COMPLETE").exists(), f"{runs} has no complete {artifact.parent.name} artifact {artifact.name}"
    return path


def _calls(artifact: Path) -> pd.DataFrame:
    return pd.DataFrame([json.loads(line) for line in (artifact / "ray_calls.jsonl").read_text().splitlines()])


def test_corpus_and_tokenizer_on_a_ray_cluster_match_the_local_engine(ray_cluster, smoke_runs, tmp_path):
    config = tmp_path / "smoke-ray.toml"
    execution = f'engine = "ray"\naddress = "{ray_cluster["address"]}"\nworkers = 2\n'
    config.write_text((ROOT / "configs" / "smoke.toml").read_text()
                      + f"\n[corpus.execution]\n{execution}shard_docs = 100\n"
                      + f"\n[tokenizer.execution]\n{execution}part_docs = 16\n")
    started = time.perf_counter()
    proc = pretrain("run", str(config), "--until", "tokenizer", runs=tmp_path / "runs", env=ray_cluster["env"])
    wall_s = time.perf_counter() - started
    assert stage_status(proc.stdout) == {"sources": "ran", "quality_model": "ran", "corpus": "ran", "tokenizer": "ran"}

    local, remote = smoke_runs["runs"], tmp_path / "runs"
    ray_corpus, ray_tokenizer = _artifact(remote, "corpus"), _artifact(remote, "tokenizer")
    corpus, tokenizer = _same_key(local, ray_corpus), _same_key(local, ray_tokenizer)
    for table, read in (("kept", load_kept), ("removals", load_removals),
                        ("funnel", lambda path: pd.read_parquet(path / "funnel.parquet"))):
        pd.testing.assert_frame_equal(read(corpus), read(ray_corpus), obj=table)
    # The Ray run uses smaller shards: other parts, the same kept corpus and ledger in the same order.
    assert len(kept_files(ray_corpus)) > len(kept_files(corpus))
    shard_files = sorted(p.relative_to(tokenizer) for p in (tokenizer / "shards").rglob("*") if p.is_file())
    assert shard_files == sorted(p.relative_to(ray_tokenizer) for p in (ray_tokenizer / "shards").rglob("*")
                                 if p.is_file())
    for name in [*shard_files, Path("shards.parquet"), Path("tokenizer.json")]:
        assert (tokenizer / name).read_bytes() == (ray_tokenizer / name).read_bytes(), name

    corpus_calls, tokenizer_calls = _calls(ray_corpus), _calls(ray_tokenizer)
    encode_calls = tokenizer_calls[tokenizer_calls["label"] == "tokenizer-encode"]
    n_shards = json.loads((ray_corpus / "meta.json").read_text())["summary"]["shards"]
    assert n_shards >= 4 and (corpus_calls["label"] == "corpus-filter").sum() == n_shards  # one call per shard
    assert corpus_calls["label"].str.startswith("corpus-").all()
    # Decontamination indexes and looks up the kept parts on the cluster as well: a call per part for each.
    assert set(tokenizer_calls["label"]) == {"tokenizer-heldout-index", "tokenizer-heldout-lookup", "tokenizer-encode"}
    n_index = (tokenizer_calls["label"] == "tokenizer-heldout-index").sum()
    assert n_index == (tokenizer_calls["label"] == "tokenizer-heldout-lookup").sum() == len(kept_files(ray_corpus))
    # Encoding runs a call per 16 rows of each kept part (a call never spans two parts).
    part_rows = [pq.ParquetFile(p).metadata.num_rows for p in kept_files(ray_corpus)]
    assert len(encode_calls) == sum(-(-n // 16) for n in part_rows) > len(part_rows)
    # Both nodes ran shard work.
    assert set(corpus_calls["node_id"]) == ray_cluster["node_ids"]
    assert set(encode_calls["node_id"]) == ray_cluster["node_ids"]
    _a_lost_worker_node_has_its_calls_retried(ray_cluster, tmp_path / "lost-node")
    print(f"\nray e2e: pretrain run --until tokenizer {wall_s:.1f} s; {len(corpus_calls)} corpus calls "
          f"({corpus_calls.groupby('node_id').size().tolist()} per node), {len(encode_calls)} encode calls "
          f"({encode_calls.groupby('node_id').size().tolist()} per node)")


def _a_lost_worker_node_has_its_calls_retried(ray_cluster: dict, folder: Path) -> None:
    """Kill the worker node (its whole process group) while a call runs on it: Ray retries the lost calls on the
    head and the map returns every result, in order, as if nothing happened. Last, as it takes the node away."""
    folder.mkdir()
    driver = subprocess.Popen([sys.executable, "-c", LOST_NODE_DRIVER, ray_cluster["address"], str(folder)],
                              env={**ray_cluster["env"], "PYTHONPATH": str(ROOT)}, cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while len({p.name.split("-")[1] for p in folder.iterdir()}) < 2 and time.time() < deadline:
            assert driver.poll() is None, driver.communicate()
            time.sleep(0.2)
        assert len({p.name.split("-")[1] for p in folder.iterdir()}) == 2, "no call reached both nodes"
        os.killpg(ray_cluster["worker_node_pgid"], signal.SIGKILL)
        out, err = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1]) == [i * i for i in range(6)]
    starts = sorted(p.name.split("-")[0] for p in folder.iterdir())
    assert len(starts) > 6  # at least one call started again after its node was lost
