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

The file is written in DuckDB storage format ``STORAGE_VERSION``, which every DuckDB 1.x and later opens (the CLI,
JDBC/ODBC drivers, DBeaver), not in the newest format the installed duckdb package would pick by default. A
warehouse an earlier version wrote in a newer format is rewritten in this one on its first write (docs/duckdb.md).
"""

from __future__ import annotations

import os
import random
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

import duckdb
import pandas as pd

from infra.errors import DataError
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
        if not read_only and _newer_than_compatible(_storage_version(con)):
            con = _rewrite_compatible(self.path, con)
        try:
            yield con
        finally:
            con.close()

    def replace(self, table: str, frame: pd.DataFrame | Path | list[Path], artifact_key: str) -> int:
        """Replace the rows of ``table`` written from ``artifact_key`` with ``frame``; returns rows written.

        ``frame`` is a DataFrame, or the path of a Parquet file (or a list of parts of one table) that DuckDB reads
        itself (out of core: a corpus's removal ledger never has to fit in memory).

        Raises:
            ValueError: ``table`` is not a plain lower-case identifier.
        """
        _check_table(table)
        with self.connect() as con:
            if isinstance(frame, (Path, list)):
                files = ", ".join(_literal(str(f)) for f in (frame if isinstance(frame, list) else [frame]))
                con.execute("CREATE TEMP VIEW frame AS SELECT *, " + _literal(artifact_key) + " AS artifact_key "
                            "FROM read_parquet([" + files + "], union_by_name = true)")
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

# The storage format of the files the warehouse creates. DuckDB 2.x creates files in its newest format (v2.0.0,
# storage number 69) unless told otherwise, and no DuckDB 1.x reader opens those ("can only read versions between 64
# and 68"). Every DuckDB from 1.0 on opens v1.0.0 (storage number 64), and duckdb>=1.1 (pyproject) can write it; the
# newer formats made a million-row table no smaller. DuckDB applies it only when it creates the file: an existing file
# keeps its format (``_rewrite_compatible`` converts one). A column type that needs a newer format (VARIANT, v1.5.0)
# fails to be written, which no table of the platform's has.
STORAGE_VERSION = "v1.0.0"
_CREATE_CONFIG = {"storage_compatibility_version": STORAGE_VERSION}


def _connect_with_retry(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + LOCK_WAIT_S
    delay = 0.05
    # Read-only connections pass no config: they never create the file, and DuckDB refuses a second connection to a
    # file in one process whose config differs (so a caller's plain read-only connection can stay open meanwhile).
    config = {} if read_only else _CREATE_CONFIG
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only, config=config)
        except duckdb.IOException as err:
            if "lock" not in str(err).lower() or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay + random.uniform(0, delay))  # jitter: waiting writers do not retry in lockstep
            delay = min(delay * 2, 2.0)


def _storage_version(con: duckdb.DuckDBPyConnection) -> str | None:
    """The storage format of ``con``'s database as DuckDB tags it (``v2.0.0+``); None when DuckDB does not say."""
    rows = con.execute("SELECT tags FROM duckdb_databases() WHERE database_name = current_database()").fetchall()
    tags = rows[0][0] if rows else None
    return tags.get("storage_version") if isinstance(tags, dict) else None


def _version_key(version: str | None) -> tuple[int, ...] | None:
    found = re.match(r"v(\d+)\.(\d+)\.(\d+)", version or "")
    return tuple(int(part) for part in found.groups()) if found else None


def _newer_than_compatible(version: str | None) -> bool:
    found = _version_key(version)
    return found is not None and found > _version_key(STORAGE_VERSION)


def _rewrite_compatible(path: Path, con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Rewrite the warehouse ``con`` holds open for writing in ``STORAGE_VERSION`` and return a connection to the new
    file. Every table is copied (``COPY FROM DATABASE``) to a file beside it, the row counts are compared, and that
    file replaces the old one while ``con`` still holds the old one's write lock, so no other process can have
    written to it meanwhile. The old file is left untouched when anything fails.

    Raises:
        DataError: the copy failed or lost rows (the message says how to read the file meanwhile).
    """
    found = _storage_version(con)
    rewrite = path.with_name(path.name + ".rewrite")
    wal = rewrite.with_name(rewrite.name + ".wal")
    for leftover in (rewrite, wal):
        leftover.unlink(missing_ok=True)
    old = '"' + con.execute("SELECT current_database()").fetchall()[0][0].replace('"', '""') + '"'
    try:
        con.execute(f"ATTACH {_literal(str(rewrite))} AS warehouse_rewrite "
                    f"(STORAGE_VERSION {_literal(STORAGE_VERSION)})")
        try:
            con.execute(f"COPY FROM DATABASE {old} TO warehouse_rewrite")
            tables = [r[0] for r in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()").fetchall()]
            for table in tables:
                quoted = '"' + table.replace('"', '""') + '"'
                before = con.execute(f"SELECT count(*) FROM {old}.{quoted}").fetchall()[0][0]
                after = con.execute(f"SELECT count(*) FROM warehouse_rewrite.{quoted}").fetchall()[0][0]
                if before != after:
                    raise duckdb.Error(f"table {table}: {after} of {before} rows copied")
        finally:
            con.execute("DETACH warehouse_rewrite")  # checkpoints the copy into its file
        os.replace(rewrite, path)
    except (duckdb.Error, OSError) as err:
        con.close()
        for leftover in (rewrite, wal):
            leftover.unlink(missing_ok=True)
        raise DataError(
            f"{path} is in DuckDB storage format {found}, which DuckDB 1.x tools cannot open, and rewriting it in "
            f"format {STORAGE_VERSION} failed: {err}. The file is unchanged. Drop or convert what the error names "
            f"(Python's duckdb {duckdb.__version__} opens it: duckdb.connect({str(path)!r})), or move the file aside "
            f"to start a new warehouse") from err
    con.close()
    print(f"warehouse: rewrote {path} from DuckDB storage format {found} to {STORAGE_VERSION}, "
          f"which DuckDB 1.x tools open (docs/duckdb.md)", file=sys.stderr)
    return _connect_with_retry(path, read_only=False)


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
