"""The stores people open with their own tools open in those tools: the warehouse in the DuckDB 1.x command-line
shell (what 1.x JDBC/ODBC drivers and DBeaver read too), the sweep's journal in Optuna's CLI.

The DuckDB shell is the real ``duckdb-cli`` package, in a venv of its own that ``make duckdb-cli`` makes (``make
test`` makes it first); without it these tests fail and say so, they never skip.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import duckdb
import optuna
import pandas as pd
import pytest

from infra import warehouse as wh
from infra.errors import DataError
from infra.warehouse import Warehouse
from tasks.sweep.config import SweepConfig
from tasks.sweep.study import JOURNAL_FILE, run_sweep

optuna.logging.set_verbosity(optuna.logging.ERROR)

REPO = Path(__file__).resolve().parents[2]


def duckdb_cli() -> Path:
    """The DuckDB 1.x shell: ``PRETRAIN_DUCKDB_CLI`` (the Makefile exports it), else the default side venv's."""
    cli = Path(os.environ.get("PRETRAIN_DUCKDB_CLI") or REPO / ".venv-duckdb-cli" / "bin" / "duckdb")
    if not cli.is_file():
        pytest.fail(f"the DuckDB 1.x shell {cli} is missing: run `make duckdb-cli` (it installs duckdb-cli 1.5.x in "
                    f"a venv of its own; `make test` does this first)", pytrace=False)
    return cli


def cli_query(path: Path, sql: str) -> list[dict]:
    """Rows of ``sql`` read by the DuckDB 1.x shell from ``path`` opened read-only (its ``-json`` output)."""
    done = subprocess.run([str(duckdb_cli()), "-readonly", str(path), "-json", "-c", sql],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"duckdb CLI could not read {path}:\n{done.stderr}{done.stdout}"
    return json.loads(done.stdout or "[]")


def storage_version(path: Path) -> str:
    """The storage format of the DuckDB file at ``path`` as DuckDB names it (``v1.0.0``, ``v2.0.0``)."""
    with duckdb.connect(str(path), read_only=True) as con:
        tags = con.execute("SELECT tags FROM duckdb_databases() WHERE database_name = current_database()").fetchone()[0]
    return tags["storage_version"].rstrip("+")


def test_cli_is_duckdb_1x():
    done = subprocess.run([str(duckdb_cli()), "-version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("v1."), done.stdout + done.stderr


def _write_tables(warehouse: Warehouse, tmp_path: Path) -> None:
    """Real tables, through every kind of write the warehouse makes: a frame, a Parquet file, an append, a column
    a newer version adds, an update."""
    manifest = pd.DataFrame({"source": ["debian-docs", "wiki"], "docs_in": [120, 30], "docs_out": [100, 25],
                             "keep_share": [100 / 120, float("nan")], "licence": ["GPL-2.0", None]})
    warehouse.replace("manifest", manifest, "corpus-abc")
    removals = tmp_path / "removals.parquet"
    pd.DataFrame({"doc_id": ["d1", "d2", "d3"], "rule": ["exact_dup", "near_dup", "pii"]}).to_parquet(removals)
    warehouse.replace("removals", removals, "corpus-abc")
    runs = pd.DataFrame({"stage": ["corpus"], "cached": [False],
                         "started": [pd.Timestamp("2025-03-01 12:00", tz="UTC")], "seconds": [1.5]})
    warehouse.append("stage_runs", runs)
    warehouse.append("stage_runs", runs.assign(stage="tokenizer", cached=True, host="node-1"))
    warehouse.update("stage_runs", {"seconds": 2.5}, {"stage": "corpus"})


def test_duckdb_1x_cli_opens_the_warehouse(tmp_path: Path):
    path = tmp_path / "results.duckdb"
    warehouse = Warehouse(path)
    _write_tables(warehouse, tmp_path)

    tables = cli_query(path, "SELECT table_name FROM information_schema.tables ORDER BY table_name")
    assert [t["table_name"] for t in tables] == ["manifest", "removals", "stage_runs"]
    manifest = cli_query(path, "SELECT source, docs_out, licence, artifact_key FROM manifest ORDER BY source")
    assert manifest == [
        {"source": "debian-docs", "docs_out": 100, "licence": "GPL-2.0", "artifact_key": "corpus-abc"},
        {"source": "wiki", "docs_out": 25, "licence": None, "artifact_key": "corpus-abc"},
    ]
    assert cli_query(path, "SELECT rule, count(*) AS n FROM removals GROUP BY rule ORDER BY rule") == [
        {"rule": "exact_dup", "n": 1}, {"rule": "near_dup", "n": 1}, {"rule": "pii", "n": 1}]
    assert cli_query(path, "SELECT stage, cached, seconds, host, strftime(started, '%Y-%m-%d %H:%M') AS started "
                           "FROM stage_runs ORDER BY stage") == [
        {"stage": "corpus", "cached": False, "seconds": 2.5, "host": None, "started": "2025-03-01 12:00"},
        {"stage": "tokenizer", "cached": True, "seconds": 1.5, "host": "node-1", "started": "2025-03-01 12:00"},
    ]
    assert storage_version(path) == wh.STORAGE_VERSION


def test_warehouse_in_new_format_is_rewritten_on_first_write(tmp_path: Path):
    """A warehouse an earlier version wrote in DuckDB's newest storage format (what DuckDB 2.x writes by default):
    reads leave it alone; the first write rewrites it, every row, in ``infra.warehouse.STORAGE_VERSION``."""
    path = tmp_path / "results.duckdb"
    with duckdb.connect(str(path), config={"storage_compatibility_version": "latest"}) as con:
        con.execute("CREATE TABLE gates AS SELECT 'g1' AS gate, 0.5::DOUBLE AS threshold, 'k0' AS artifact_key")
        con.execute("CREATE TABLE removals AS SELECT 'd' || i AS doc_id, 'k0' AS artifact_key FROM range(5000) t(i)")
    newest = storage_version(path)
    if newest == wh.STORAGE_VERSION:
        pytest.fail(f"this DuckDB ({duckdb.__version__}) writes {wh.STORAGE_VERSION} by default: nothing to rewrite")
    assert subprocess.run([str(duckdb_cli()), "-readonly", str(path), "-c", "SELECT 1"],
                          capture_output=True, text=True, timeout=60).returncode != 0  # the lock-out being fixed

    warehouse = Warehouse(path)
    assert list(warehouse.query("SELECT gate FROM gates")["gate"]) == ["g1"]
    assert storage_version(path) == newest  # a read never rewrites

    warehouse.append("gates", pd.DataFrame({"gate": ["g2"], "threshold": [0.7], "artifact_key": ["k1"]}))
    assert storage_version(path) == wh.STORAGE_VERSION
    assert cli_query(path, "SELECT gate, threshold FROM gates ORDER BY gate") == [
        {"gate": "g1", "threshold": 0.5}, {"gate": "g2", "threshold": 0.7}]
    assert cli_query(path, "SELECT count(*) AS n FROM removals") == [{"n": 5000}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.duckdb"]  # no rewrite or WAL left beside it


def test_warehouse_the_rewrite_cannot_hold_stops_with_one_message(tmp_path: Path):
    """A table whose type the compatible format cannot store (VARIANT needs v1.5.0): the write stops with a message
    naming the file, both formats and the column's error, and the file is left as it was."""
    path = tmp_path / "results.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE notes AS SELECT 1::VARIANT AS note")
    before = path.read_bytes()
    with pytest.raises(DataError) as raised:
        Warehouse(path).append("gates", pd.DataFrame({"gate": ["g1"]}))
    message = str(raised.value)
    assert message.startswith(f"{path} is in DuckDB storage format v2.0.0+, which DuckDB 1.x tools cannot open")
    assert f"rewriting it in format {wh.STORAGE_VERSION} failed" in message and "VARIANT" in message
    assert "The file is unchanged" in message
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.duckdb"]


def documented_optuna_command(doc: str) -> str:
    """The ``optuna studies`` command ``doc`` gives for the sweeps' journal."""
    found = re.findall(r"`(\.venv/bin/optuna studies [^`]+)`", (REPO / doc).read_text())
    assert len(found) == 1, f"{doc} gives {len(found)} `optuna studies` commands"
    return found[0]


def test_optuna_cli_lists_the_sweep_study(tmp_path: Path):
    """The ``optuna studies`` command README.md and docs/runs-folder.md give (the journal file under
    ``<runs>/optuna/<experiment>/`` and ``--storage-class JournalFileBackend``) finds the study the sweep wrote,
    and ``optuna trials --study-name NAME`` (same storage flags) its trials."""
    storage = tmp_path / "optuna" / "demo"  # <runs>/optuna/<experiment>, as the sweep stage lays it out

    def objective(peak_lr: float, seed: int, report) -> float:
        report(0, 4.0)
        return 3.0 + abs(peak_lr - 1e-3)

    cfg = SweepConfig(n_trials=3, lr_min=1e-4, lr_max=1e-2, report_every=1, sampler="grid")
    run_sweep(objective, cfg, storage_path=storage, study_name="demo-lr-d64-abc123")
    documented = {doc: documented_optuna_command(doc) for doc in ("README.md", "docs/runs-folder.md")}
    assert len(set(documented.values())) == 1, documented
    optuna_cli = Path(sys.executable).parent / "optuna"
    command = [str(optuna_cli) if arg == ".venv/bin/optuna" else arg.replace("runs/", f"{tmp_path}/", 1)
               for arg in shlex.split(documented["README.md"])]
    journal = Path(command[command.index("--storage") + 1])
    assert journal == storage / JOURNAL_FILE and journal.is_file()
    done = subprocess.run([*command, "--format", "json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    studies = json.loads(done.stdout)
    assert [(s["name"], s["n_trials"], s["direction"]) for s in studies] == [("demo-lr-d64-abc123", 3, ["MINIMIZE"])]

    done = subprocess.run([str(optuna_cli), "trials", "--study-name", "demo-lr-d64-abc123", "--storage", str(journal),
                           "--storage-class", "JournalFileBackend", "--format", "json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    trials = json.loads(done.stdout)
    assert [t["state"] for t in trials] == ["COMPLETE"] * 3
    assert sorted(t["params"]["peak_lr"] for t in trials) == pytest.approx([1e-4, 1e-3, 1e-2])
