"""DuckDB warehouse (``<runs>/results.duckdb``): the tables people query.

Each stage's rows carry the ``artifact_key`` of the artifact they were read from. Writing a stage's rows
replaces earlier rows with the same key, so a rerun (cached or not) never duplicates them and the tables
always mirror the artifact store. The connection is opened per write and closed at once, so the file can
be inspected with ``duckdb runs/results.duckdb`` between runs.

Tables: manifest, removals, funnel, decontamination, boilerplate, tokenizer_report, tokenizer_fragmentation,
packing_report, mixture_trials, sweep_trials, heldout_loss,
cloze_results, gates, gate_decisions, stage_runs, train_events, stability_runs, audit_crosstab, audit_extractors,
audit_detectors, tokenizer_sources (``TABLES``, the core ones; a stage may add its own under a plain lower-case
name).
"""

from __future__ import annotations

import random
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

import duckdb
import pandas as pd

from infra.runs import ensure_folder

TABLES = (
    "manifest", "removals", "funnel", "boilerplate", "decontamination", "audit_crosstab", "audit_extractors",
    "audit_detectors", "tokenizer_report", "tokenizer_sources",
    "tokenizer_fragmentation", "packing_report", "train_events", "stability_runs",
    "mixture_trials", "sweep_trials", "heldout_loss", "cloze_results", "gates", "gate_decisions", "stage_runs",
)


class Warehouse:
    """Thin writer/reader over one DuckDB file."""

    def __init__(self, path: Path):
        self.path = Path(path)  # the folder is made on the first write, so reading never creates a runs folder

    @contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short-lived connection. DuckDB lets one process at a time open the file for writing, so while another
        run (or a ``duckdb`` shell) holds it this waits and retries, for up to ``LOCK_WAIT_S`` seconds.

        Raises:
            duckdb.IOException: the file stayed locked for ``LOCK_WAIT_S`` seconds, or another I/O error.
        """
        if not read_only:
            ensure_folder(self.path.parent)
        con = _connect_with_retry(self.path, read_only)
        try:
            yield con
        finally:
            con.close()

    def replace(self, table: str, frame: pd.DataFrame | Path, artifact_key: str) -> int:
        """Replace the rows of ``table`` written from ``artifact_key`` with ``frame``; returns rows written.

        ``frame`` is a DataFrame, or the path of a Parquet file that DuckDB reads itself (out of core: a corpus's
        removal ledger never has to fit in memory).

        Raises:
            ValueError: ``table`` is not a plain lower-case identifier.
        """
        _check_table(table)
        with self.connect() as con:
            if isinstance(frame, Path):
                con.execute("CREATE TEMP VIEW frame AS SELECT *, " + _literal(artifact_key) + " AS artifact_key "
                            "FROM read_parquet(" + _literal(str(frame)) + ")")
            else:
                con.register("frame", frame.assign(artifact_key=artifact_key))
            _ensure_table(con, table)
            con.execute(f"DELETE FROM {table} WHERE artifact_key = ?", [artifact_key])
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM frame")
            return int(con.execute("SELECT count(*) FROM frame").fetchone()[0])

    def append(self, table: str, frame: pd.DataFrame) -> None:
        """Append rows (for logs such as ``gates`` and ``stage_runs`` that are never replaced).

        Raises:
            ValueError: ``table`` is not a plain lower-case identifier.
        """
        _check_table(table)
        with self.connect() as con:
            con.register("frame", frame)
            _ensure_table(con, table)
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM frame")

    def update(self, table: str, values: Mapping[str, Any], where: Mapping[str, Any]) -> None:
        """``UPDATE table SET values WHERE where`` (equalities joined by AND); nothing when the table is absent.

        Raises:
            ValueError: a table or column name is not a plain identifier, or ``values``/``where`` is empty.
        """
        _check_table(table)
        if not values or not where:
            raise ValueError(f"update of {table}: give at least one column to set and one to match")
        for column in (*values, *where):
            if not _COLUMN_NAME.fullmatch(column):
                raise ValueError(f"update of {table}: column {column!r} is not a plain identifier")
        if not self.has_table(table):
            return
        sets = ", ".join(f'"{c}" = ?' for c in values)
        conditions = " AND ".join(f'"{c}" = ?' for c in where)
        with self.connect() as con:
            con.execute(f"UPDATE {table} SET {sets} WHERE {conditions}", [*values.values(), *where.values()])

    def query(self, sql: str, params: list | None = None) -> pd.DataFrame:
        """Rows of ``sql`` (empty before the first write); values go in ``params`` (``?``), never into ``sql``."""
        if not self.path.exists():
            return pd.DataFrame()
        with self.connect(read_only=True) as con:
            return con.execute(sql, params or []).df()

    def has_table(self, table: str) -> bool:
        found = self.query(
            "SELECT count(*) AS n FROM information_schema.tables WHERE table_name = ?", [table]
        )
        return bool(len(found)) and int(found["n"].iloc[0]) > 0


LOCK_WAIT_S = 300.0


def _connect_with_retry(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + LOCK_WAIT_S
    delay = 0.05
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as err:
            if "lock" not in str(err).lower() or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay + random.uniform(0, delay))  # jitter: waiting writers do not retry in lockstep
            delay = min(delay * 2, 2.0)


_TABLE_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
_COLUMN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def _literal(text: str) -> str:
    """A SQL string literal (a view definition cannot take parameters)."""
    return "'" + text.replace("'", "''") + "'"


def _check_table(table: str) -> None:
    # Table names are spliced into SQL (DuckDB cannot bind identifiers): plain lower-case identifiers only, so a
    # stage can add its own tables while no name can carry SQL.
    if not _TABLE_NAME.fullmatch(table):
        raise ValueError(f"warehouse table {table!r} is not a plain lower-case identifier ([a-z][a-z0-9_]*)")


def _ensure_table(con: duckdb.DuckDBPyConnection, table: str) -> None:
    """Create ``table`` from the registered ``frame``, or add the columns a newer version writes (older rows NULL)."""
    con.execute(f"CREATE TABLE IF NOT EXISTS {table} AS SELECT * FROM frame LIMIT 0")
    have = {row[0] for row in con.execute(f"DESCRIBE {table}").fetchall()}
    for name, dtype, *_ in con.execute("DESCRIBE SELECT * FROM frame").fetchall():
        if name not in have:
            quoted = '"' + name.replace('"', '""') + '"'  # a column name is data: quote it as an identifier
            con.execute(f"ALTER TABLE {table} ADD COLUMN {quoted} {dtype}")
