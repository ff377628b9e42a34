"""Concurrent runs of one config: a lease per artifact key, and DuckDB writes that wait instead of failing.

Real processes contend for the real file locks (``flock`` for the lease, DuckDB's own lock for the warehouse).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pandas as pd

from infra.artifacts import ArtifactStore
from infra.warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[2]

# One contender: take the lease, compute the artifact unless it exists, and record what it did.
CONTENDER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from infra.artifacts import ArtifactStore

    root, name, log = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    store = ArtifactStore(root)
    waited = []
    with store.computing("corpus", "k1", on_wait=lambda who: waited.append(True), poll_s=0.05):
        if store.get("corpus", "k1") is None:
            tmp = store.begin("corpus", "k1")
            (tmp / "data.txt").write_text(name)
            time.sleep(1.0)  # long enough that the other contender arrives while this one computes
            store.commit("corpus", "k1", tmp, {})
            did = "computed"
        else:
            did = "reused"
    with open(log, "a") as f:
        f.write(json.dumps({"name": name, "did": did, "waited": bool(waited)}) + "\\n")
""")


def _spawn(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_two_processes_one_computes_the_other_waits_and_reuses(tmp_path):
    log = tmp_path / "log.jsonl"
    procs = [_spawn(CONTENDER, str(tmp_path / "artifacts"), name, str(log)) for name in ("a", "b")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(r["did"] for r in rows) == ["computed", "reused"]
    computer = next(r for r in rows if r["did"] == "computed")["name"]
    assert next(r for r in rows if r["did"] == "reused")["waited"], "the reuser should have waited for the lease"
    artifact = ArtifactStore(tmp_path / "artifacts").get("corpus", "k1")
    assert (artifact.path / "data.txt").read_text() == computer


def test_a_killed_holder_releases_the_lease(tmp_path):
    holder = _spawn(textwrap.dedent("""
        import sys, time
        from pathlib import Path
        from infra.artifacts import ArtifactStore
        with ArtifactStore(Path(sys.argv[1])).computing("main", "k2"):
            Path(sys.argv[2]).touch()
            time.sleep(600)
    """), str(tmp_path / "artifacts"), str(tmp_path / "held"))
    deadline = time.monotonic() + 30
    while not (tmp_path / "held").exists():
        assert time.monotonic() < deadline and holder.poll() is None, "holder never took the lease"
        time.sleep(0.05)
    waited = []
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    started = time.monotonic()
    with ArtifactStore(tmp_path / "artifacts").computing("main", "k2", on_wait=lambda who: waited.append(1), poll_s=0.05):
        pass
    assert not waited, "the lease of a SIGKILLed holder must be free at once"
    assert time.monotonic() - started < 5


def test_warehouse_write_waits_for_another_process_holding_the_file(tmp_path):
    path = tmp_path / "results.duckdb"
    duckdb.connect(str(path)).close()
    holder = _spawn(textwrap.dedent("""
        import sys, time, duckdb
        from pathlib import Path
        con = duckdb.connect(sys.argv[1])
        Path(sys.argv[2]).touch()
        time.sleep(2.0)
        con.close()
    """), str(path), str(tmp_path / "held"))
    deadline = time.monotonic() + 30
    while not (tmp_path / "held").exists():
        assert time.monotonic() < deadline and holder.poll() is None, "holder never opened the file"
        time.sleep(0.05)
    try:  # a bare connection fails at once: the conflict is real
        duckdb.connect(str(path)).close()
        raise AssertionError("expected DuckDB's lock conflict while the holder has the file open")
    except duckdb.IOException as err:
        assert "lock" in str(err).lower()
    written = Warehouse(path).replace("manifest", pd.DataFrame({"source": ["a", "b"], "docs_in": [3, 4]}), "key1")
    assert holder.wait(timeout=30) == 0
    assert written == 2
    assert Warehouse(path).query("SELECT sum(docs_in) AS n FROM manifest")["n"].iloc[0] == 7
