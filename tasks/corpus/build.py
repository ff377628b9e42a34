"""The corpus build, by shards: every process's memory is bounded by the shard size, not the corpus size; shards run
in parallel; a crash resumes (docs/methods.md §7).

Passes over a work directory. A shard pass writes each shard's outputs under a temporary name and renames them when
complete, so a rerun skips finished shards and never reads a partial one. The global passes run as
``execution.partitions`` tasks on the engine, each reading only its hash partition of every shard's output
(:mod:`tasks.corpus.partitioned`); what stays in the main process (DuckDB tables in a file under the work
directory, ``memory_limit`` bounded, spilling to disk) is O(removed documents and pairs), over integer positions in
corpus order: no per-document Python object, and no per-document row, lives in the main process.

1. ``plan``: the raw documents are divided into input shards of ``execution.shard_docs`` documents, in corpus
   order, as slices of the source files (nothing is copied); repeated ``doc_id`` values are found by DuckDB.
2. ``filter`` (per shard): the per-document stages of :mod:`tasks.corpus.filters`, plus the document frequency of
   every line/paragraph (for boilerplate).
3. ``boilerplate`` (per hash partition of the units): units in ``boilerplate.min_docs`` documents or more,
   counted over every shard by ``execution.partitions`` tasks, each reading only its partition of every shard.
4. ``key`` (per shard): boilerplate cut, exact-dedup hash (xxh3-128 of the normal form), MinHash band keys
   (``bands`` × 8 bytes per document, not the whole signature), evaluation n-gram hits; then ``key parts``: the
   hashes and band keys split by hash partition (:func:`tasks.corpus.partitioned.split_keys`).
5. ``exact`` and ``candidates`` (per hash partition): exact duplicates (first in corpus order kept) and the quality
   classifier's removals (:func:`tasks.corpus.partitioned.exact_partition`), then the LSH candidate pairs of the
   partition's buckets among the survivors (:func:`tasks.corpus.partitioned.candidate_partition`), written by the
   shard of each pair's later document.
6. ``shingle`` (per shard): sorted shingle hashes of the shard's candidate documents
   (:func:`tasks.corpus.near_dedup.shingle_sets`).
7. ``verify`` (per shard): exact Jaccard of the distinct pairs whose later document is in the shard
   (:func:`tasks.corpus.near_dedup.verify_sets`; each earlier shard's partner sets are copied out of its pass-6
   file in one read through a short-lived memory map).
8. global ``decide``: leader clustering over the verified pairs in corpus order and families (connected
   components, for document-aware held-out splits), both on the ranks of the documents in a pair; the keys of the
   documents the decisions name are read back by a ``lookup`` shard pass; decontamination, funnel counts (the key
   pass's per-source totals less the removals); removals partitioned by shard.
9. ``substring`` (opt-in, ``[corpus.substring_dedup]``): the survivors are planned into partitions (DuckDB); per
   partition, repeated spans are found with a suffix array (:mod:`tasks.corpus.substring`); global: the cuts and
   the documents left too short, partitioned by shard. This step and the quality classifier's audit read every
   document's keys into the main process's DuckDB.
10. ``write`` (per shard): the shard's kept documents (with the substring cuts applied) and its removal rows, each
   in corpus order: the shard's parts of the artifact's ``kept/`` and ``removals/`` datasets, linked into place,
   never joined (``tasks.readers`` reads them).

Invariants: per source, documents in = kept + removed (one ledger row per removed document); the result does not
depend on the shard size, the engine, the number of workers or the number of partitions.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from evals.contamination import EvalIndex, EvalItem
from infra.atomic import atomic_dir, atomic_file, atomic_write_text, temp_path
from infra.errors import DataError
from infra.memory import release_memory
from infra.shard_map import ShardMap, sequential_map
from tasks.corpus import minhash, near_dedup, partitioned, substring
from tasks.corpus.boilerplate import COUNT_COLUMNS, count_units, frequent_units, strip_units
from tasks.corpus.config import CorpusConfig
from tasks.corpus.filters import (DOC_STEPS, FUNNEL_COLUMNS, INPUT_COLUMNS, OPTIONAL_COLUMNS, REMOVAL_COLUMNS,
                                  Ledger, filter_documents, sanitise)
from tasks.corpus.normalise import normal_form
from tasks.corpus.quality import CHARACTER_LANGUAGES, Reason, cjk_count
from tasks.corpus.urls import url_host
from tasks.readers import KEPT_DIR, REMOVALS_DIR, load_kept, load_removals

__all__ = ["build_corpus", "curate", "CorpusResult", "CURATION_STEPS", "KEPT_COLUMNS"]

CURATION_STEPS = DOC_STEPS + ["boilerplate", "dedup_exact", "quality_model", "dedup_near", "decontam"]
# The global steps in order; their position is the ``step`` code of the ``removed`` table.
GLOBAL_STEPS = ["dedup_exact", "quality_model", "dedup_near", "decontam"]
_EXACT, _QUALITY, _NEAR, _DECONTAM = range(4)
# The opt-in last step (``[corpus.substring_dedup]``): in the funnel, the ledger and the manifest only when enabled,
# so a default build's outputs stay as they were.
SUBSTRING_STEP = "dedup_substring"
ALL_STEPS = CURATION_STEPS + [SUBSTRING_STEP]
SPAN_COLUMNS = ["doc_id", "source", "start", "end", "n_bytes", "first_doc_id", "first_start", "doc_removed"]
KEPT_COLUMNS = ["doc_id", "source", "language", "lang_score", "text", "n_chars", "n_bytes", "n_words",
                "family_id", "pii_replacements", "lines_dropped", "fixes", "quality_score"]
HIT_COLUMNS = ["doc_id", "source", "ngram", "eval_set", "item_id", "common"]
_HIT_TYPES = {"doc_id": "string", "source": "string", "ngram": "string", "eval_set": "string", "item_id": "string",
              "common": "bool"}
_BATCH_ROWS = 65_536  # rows per batch streamed out of DuckDB
ShardProgress = Callable[[str, int, int], None]


@dataclass
class CorpusResult:
    """Paths and summaries of a finished build (all files under ``out``).

    ``kept``: the parts ``kept/part-NNNNN.parquet`` (``KEPT_COLUMNS``, one per input shard, in corpus order);
    ``removals``: the parts ``removals/part-NNNNN.parquet`` (``REMOVAL_COLUMNS``, exactly one row per removed document,
    in corpus order); ``funnel``: funnel.parquet (docs and characters in/out per source and stage);
    ``boilerplate``: boilerplate.parquet, the frequent units cut (``COUNT_COLUMNS``, ``boilerplate_units`` rows);
    ``hits``: decontamination hits (``HIT_COLUMNS``); ``near``: near-dedup statistics per source. The frames are read
    from disk on access: a large corpus's ``kept`` does not fit memory, so callers that aggregate should query the
    files (DuckDB) instead.
    """

    out: Path
    near: dict[str, dict[str, Any]]
    boilerplate_units: int
    substring: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def boilerplate(self) -> pd.DataFrame:
        return pd.read_parquet(self.out / "boilerplate.parquet")

    @property
    def kept(self) -> pd.DataFrame:
        return load_kept(self.out)

    @property
    def removals(self) -> pd.DataFrame:
        return load_removals(self.out)

    @property
    def funnel(self) -> pd.DataFrame:
        return pd.read_parquet(self.out / "funnel.parquet")

    @property
    def hits(self) -> pd.DataFrame:
        return pd.read_parquet(self.out / "decontamination.parquet")

    @property
    def spans(self) -> pd.DataFrame:
        """substring_spans.parquet (``SPAN_COLUMNS``): every span the substring step cut; empty when it is off."""
        path = self.out / "substring_spans.parquet"
        return pd.read_parquet(path) if path.exists() else pd.DataFrame(columns=SPAN_COLUMNS)


def curation_steps(cfg: CorpusConfig) -> list[str]:
    """The curation steps a build with ``cfg`` runs, in order: ``CURATION_STEPS``, then ``SUBSTRING_STEP`` when
    ``substring_dedup`` is enabled."""
    return CURATION_STEPS + [SUBSTRING_STEP] if cfg.substring_dedup.enabled else list(CURATION_STEPS)


def build_corpus(docs: pd.DataFrame, cfg: CorpusConfig, *, eval_items: Sequence[EvalItem] = (),
                 out: Path | None = None, progress: ShardProgress | None = None,
                 shard_map: ShardMap = sequential_map, quality_model: Path | None = None) -> CorpusResult:
    """Curate an in-memory frame of documents (columns ``INPUT_COLUMNS``, plus ``url`` if it has one; the
    quality classifier ``quality_model`` as in :func:`curate`): the sharded
    build, on ``shard_map``.

    Outputs go to ``out`` (a new temporary directory when None). Document order decides which duplicate is kept.

    Raises:
        DataError: a required column is missing or ``doc_id`` values repeat.
    """
    out = Path(tempfile.mkdtemp(prefix="corpus-")) if out is None else out
    work = out / "_work"
    work.mkdir(parents=True, exist_ok=True)
    _check_columns(list(docs.columns))
    # Sanitised first: Parquet holds only valid UTF-8 (a frame may carry lone surrogates).
    columns = INPUT_COLUMNS + [c for c in OPTIONAL_COLUMNS if c in docs.columns]
    sanitise(docs[columns]).to_parquet(work / "input.parquet", index=False, row_group_size=cfg.execution.shard_docs)
    split_sources([work / "input.parquet"], work, cfg.execution.shard_docs)
    return curate(work, out, cfg, eval_items=eval_items, progress=progress, shard_map=shard_map,
                  quality_model=quality_model)


def split_sources(files: Sequence[Path], work: Path, shard_docs: int, memory_limit: str = "256MB") -> int:
    """Plan the input shards: ``shard_docs`` consecutive documents each, in corpus order over ``files`` (raw-document
    Parquet files), written to ``work/shards.json`` as (file, first row, rows) slices; returns the shard count.

    Nothing is copied: each filter worker reads its slice from the files (only the row groups it overlaps), so no
    serial pass over the corpus's bytes remains in the main process. Repeated ``doc_id`` values are found by
    DuckDB over the files, out of core under ``memory_limit``. Skipped when a previous run finished planning.

    Raises:
        DataError: a required column is missing or ``doc_id`` values repeat.
    """
    plan_path = work / "shards.json"
    if plan_path.exists():
        return len(json.loads(plan_path.read_text())["shards"])
    files = [Path(f) for f in files]
    for f in files:
        _check_columns(pq.ParquetFile(f).schema_arrow.names, f)
    _check_unique_ids(files, work, memory_limit)
    counts = [pq.ParquetFile(f).metadata.num_rows for f in files]
    shards: list[list[tuple[str, int, int]]] = []
    current: list[tuple[str, int, int]] = []
    room = shard_docs
    for f, n in zip(files, counts):
        start = 0
        while start < n:
            take = min(room, n - start)
            current.append((str(f), start, take))
            start, room = start + take, room - take
            if room == 0:
                shards.append(current)
                current, room = [], shard_docs
    if current:
        shards.append(current)
    work.mkdir(parents=True, exist_ok=True)
    atomic_write_text(plan_path, json.dumps({"files": [str(f) for f in files], "rows": counts, "shards": shards}))
    return len(shards)


def read_slices(slices: Sequence[Sequence[Any]], columns: Sequence[str] = INPUT_COLUMNS,
                batch_rows: int = 512, optional: Sequence[str] = OPTIONAL_COLUMNS) -> pd.DataFrame:
    """The documents of (file, first row, rows) slices, in order. Only the row groups a slice overlaps are read,
    ``batch_rows`` rows at a time, so memory holds the slice plus one batch, not a whole row group. The
    ``optional`` columns are read from the files that have them and are None in the rows of those that do not."""
    frames = []
    extra = [c for c in optional if c not in columns]
    for path, start, count in slices:
        pf = pq.ParquetFile(path, pre_buffer=False)
        present = [c for c in extra if c in pf.schema_arrow.names]
        absent = {c: None for c in extra if c not in present}
        lo, stop = 0, start + count
        for group in range(pf.num_row_groups):
            n = pf.metadata.row_group(group).num_rows
            if lo + n > start and lo < stop:
                at = lo
                for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[group],
                                             columns=[*columns, *present], use_threads=False):
                    first, last = max(start - at, 0), min(stop - at, batch.num_rows)
                    if first < last:
                        frames.append(batch.slice(first, last - first).to_pandas().assign(**absent))
                    at += batch.num_rows
                    if at >= stop:
                        break
            lo += n
            if lo >= stop:
                break
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype="str") for c in [*columns, *extra]})
    return pd.concat(frames, ignore_index=True)


def _check_columns(columns: Sequence[str], where: Path | None = None) -> None:
    """Raises DataError when a column of ``INPUT_COLUMNS`` is missing; ``OPTIONAL_COLUMNS`` may be."""
    missing = [c for c in INPUT_COLUMNS if c not in columns]
    if missing:
        raise DataError(f"corpus input {where or ''} lacks columns {missing}; pass the sources stage's documents")


def _duckdb(work: Path, name: str | None = None, memory_limit: str = "256MB",
            fresh: bool = True) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection whose memory is capped and whose spill files go under ``work`` (a file database when
    ``name`` is given, so its tables are buffer-managed on disk too; ``fresh`` removes an earlier one first), with
    one thread per CPU this process may run on (DuckDB counts the machine's CPUs: a process confined to fewer, by
    ``taskset`` or a container's cpuset, would otherwise run more threads than it has CPUs)."""
    spill = work / "duckdb_tmp"
    spill.mkdir(parents=True, exist_ok=True)
    path = ":memory:"
    if name is not None:
        path = str(work / name)
        if fresh:
            Path(path).unlink(missing_ok=True)
            Path(path + ".wal").unlink(missing_ok=True)
    con = duckdb.connect(path)
    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute(f"SET temp_directory = '{spill}'")
    con.execute("SET preserve_insertion_order = false")
    if hasattr(os, "sched_getaffinity"):
        con.execute(f"SET threads = {max(1, len(os.sched_getaffinity(0)))}")
    return con


def _check_unique_ids(files: Sequence[Path], work: Path, memory_limit: str) -> None:
    if not files:
        return
    work.mkdir(parents=True, exist_ok=True)
    with _duckdb(work, memory_limit=memory_limit) as con:
        repeated = con.execute("SELECT doc_id FROM read_parquet(?) GROUP BY doc_id HAVING count(*) > 1 "
                               "ORDER BY doc_id LIMIT 3", [[str(f) for f in files]]).fetchall()
    if repeated:
        raise DataError(f"doc_id values repeat (e.g. {[r[0] for r in repeated]}); give each source a distinct name")


def curate(work: Path, out: Path, cfg: CorpusConfig, *, eval_items: Sequence[EvalItem] = (),
           shard_map: ShardMap = sequential_map, progress: ShardProgress | None = None,
           quality_model: Path | None = None) -> CorpusResult:
    """Passes 2–9 over the input shards in ``work/in``; writes kept/removals/funnel/boilerplate/decontamination
    Parquet files into ``out``. Finished shards of an earlier, interrupted call are reused.

    ``quality_model``: the saved classifier (``tasks.corpus.quality_model``) that scores every document in the key
    pass; documents it does not keep (``cfg.quality_model.action``) are removed after exact dedup and before near
    dedup, with the rule ``quality_model.low_score``. None: ``cfg.quality_model.path`` for a pretrained classifier,
    else nothing is scored (``quality_score`` is NaN).

    Raises:
        DataError: ``cfg.quality_model.enabled`` without a ``quality_model`` file.
    """
    if cfg.quality_model.enabled and quality_model is None and cfg.quality_model.kind == "pretrained":
        quality_model = Path(cfg.quality_model.path)
    if cfg.quality_model.enabled and quality_model is None:
        raise DataError("corpus.quality_model is enabled but no trained classifier was given; run the "
                        "quality_model stage first")
    plan = json.loads((work / "shards.json").read_text())
    names = [f"{i:05d}" for i in range(len(plan["shards"]))]
    cfg_json = cfg.model_dump_json()
    tick = progress or (lambda stage, done, total: None)

    def shard_pass(label: str, fn: Callable[..., Any], calls: list[dict[str, Any]]) -> None:
        tick(label, 0, len(calls))
        shard_map(fn, calls, f"corpus-{label}")
        tick(label, len(calls), len(calls))

    shard_pass("filter", filter_shard, [dict(slices=json.dumps(spec), out_dir=str(work / "filtered" / name),
                                             cfg_json=cfg_json) for name, spec in zip(names, plan["shards"])])
    n_frequent = _frequent(work, cfg, names, shard_pass)
    index = EvalIndex.build(eval_items, cfg.decontamination.ngram) if cfg.decontamination.enabled else EvalIndex(13)
    index.save(work / "eval_index.npz")
    model = str(quality_model) if quality_model is not None and cfg.quality_model.enabled else ""
    n_parts = cfg.execution.partitions
    shard_pass("key", key_shard, [dict(filtered_dir=str(work / "filtered" / name), out_dir=str(work / "keyed" / name),
                                       cfg_json=cfg_json, work=str(work), shard=i, quality_model=model)
                                  for i, name in enumerate(names)])
    offsets = _offsets(work, names)
    np.save(work / "offsets.npy", offsets)
    nd = cfg.near_dedup
    parts = partitioned.key_parts_folder(work, n_parts)
    shard_pass("key parts", split_shard_keys, [dict(keyed_dir=str(work / "keyed" / name), out_dir=str(parts / name),
                                                    n_parts=n_parts, bands=nd.bands if nd.enabled else 0)
                                               for name in names])
    exact_dir, cand_dir = (partitioned.key_parts_folder(work, n_parts, kind) for kind in ("exact", "candidates"))
    common = dict(work=str(work), names=",".join(names), n_parts=n_parts)
    shard_pass("exact", partitioned.exact_partition, [dict(common, part=p, exact_dedup=cfg.exact_dedup,
                                                           out_dir=str(exact_dir / f"{p:05d}")) for p in range(n_parts)])
    shard_pass("candidates", partitioned.candidate_partition,
               [dict(common, part=p, exact_dir=str(exact_dir), scope=nd.scope, max_links=near_dedup.MAX_LINKS,
                     out_dir=str(cand_dir / f"{p:05d}")) for p in range(n_parts)] if nd.enabled else [])
    near_on = nd.enabled and any(json.loads((cand_dir / f"{p:05d}" / "count.json").read_text())["pairs"]
                                 for p in range(n_parts))
    shard_pass("shingle", shingle_shard, [dict(keyed_dir=str(work / "keyed" / name), candidates=str(cand_dir),
                                               n_parts=n_parts, shard=i, out_dir=str(work / "shingles" / name),
                                               cfg_json=cfg_json, filtered_dir=str(work / "filtered" / name))
                                          for i, name in enumerate(names)] if near_on else [])
    shard_pass("verify", verify_shard, [dict(candidates=str(cand_dir), n_parts=n_parts, shard=i,
                                             work=str(work), names=",".join(names),
                                             out_dir=str(work / "verified" / name),
                                             threshold=nd.jaccard_threshold)
                                        for i, name in enumerate(names)] if near_on else [])
    n_pairs = sum(json.loads((work / "verified" / name / "count.json").read_text())["compared"]
                  for name in names) if near_on else 0
    tick("decide", 0, 1)
    with _duckdb(work, "decide.duckdb", cfg.execution.memory_limit) as con:
        _verdicts(con, work, names, cfg, offsets, near_on)
        wanted = con.execute(_WANTED_SQL).fetchnumpy()["pos"]
    lookup = work / "lookup"
    shard_pass("lookup", lookup_shard, [dict(keyed_dir=str(work / "keyed" / names[shard]), wanted=str(path),
                                             start=int(offsets[shard]), shard=shard,
                                             out_path=str(lookup / f"{names[shard]}.parquet"))
                                        for shard, path in _write_wanted(lookup, names, offsets, wanted)])
    with _duckdb(work, "decide.duckdb", cfg.execution.memory_limit, fresh=False) as con:
        _load_info(con, work, names)
        if cfg.quality_model.enabled or cfg.substring_dedup.enabled:  # the opt-in steps read every document's keys
            _load_keys(con, work, names, offsets, cfg.near_dedup.bands)
        near_stats = _decide(con, work, names, cfg, index, n_pairs)
        _quality_audit(con, work, names, cfg, out)
    tick("decide", 1, 1)
    sub_on = cfg.substring_dedup.enabled
    substring_stats = _substring_pass(work, names, cfg, shard_pass) if sub_on else {}
    shard_pass("write", write_shard, [dict(keyed_dir=str(work / "keyed" / name),
                                           decisions=str(work / "decisions"), shard=i,
                                           out_path=str(work / KEPT_DIR / f"{name}.parquet"),
                                           substring=str(work / "substring") if sub_on else "",
                                           filtered_dir=str(work / "filtered" / name), slices=json.dumps(spec),
                                           removals_path=str(work / REMOVALS_DIR / f"{name}.parquet"))
                                      for i, (name, spec) in enumerate(zip(names, plan["shards"]))])
    out.mkdir(parents=True, exist_ok=True)
    _write_outputs(work, names, out, substring=sub_on)
    shutil.copyfile(work / "frequent_units.parquet", out / "boilerplate.parquet")
    return CorpusResult(out=out, near=near_stats, boilerplate_units=n_frequent, substring=substring_stats)


def _atomic_dir(out_dir: Path, write: Callable[[Path], None]) -> bool:
    """Write a shard's outputs into a temporary sibling and rename it into place; False when already done."""
    if out_dir.exists():
        return False
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # One writer per shard, so a killed attempt's temporary can go: the */units.parquet globs would read it.
    with atomic_dir(out_dir, clear_stale=True) as tmp:
        write(tmp)
    return True


def filter_shard(slices: str, out_dir: str, cfg_json: str) -> bool:
    """Pass 2 on one shard (``slices``: its (file, first row, rows) list as JSON): per-document stages; writes
    survivors, removals, funnel and unit counts."""
    cfg = CorpusConfig.model_validate_json(cfg_json)

    def write(tmp: Path) -> None:
        ledger = Ledger()
        survivors = filter_documents(sanitise(read_slices(json.loads(slices))), cfg, ledger)
        survivors.to_parquet(tmp / "survivors.parquet", index=False)
        removals, funnel = ledger.frames()
        removals.to_parquet(tmp / "removals.parquet", index=False)
        funnel.to_parquet(tmp / "funnel.parquet", index=False)
        occurrences, examples = count_units(survivors.text if cfg.boilerplate.enabled else [],
                                            cfg.boilerplate.min_chars)
        occurrences.to_parquet(tmp / "units.parquet", index=False)
        examples.to_parquet(tmp / "unit_examples.parquet", index=False)

    done = _atomic_dir(Path(out_dir), write)
    release_memory()  # a worker runs many shards: give their freed pages back
    return done


def _frequent(work: Path, cfg: CorpusConfig, names: list[str],
              shard_pass: Callable[[str, Callable[..., Any], list[dict[str, Any]]], None]) -> int:
    """Units in ``min_docs`` or more distinct documents over all shards. Counted in ``execution.partitions``
    tasks on the engine, each over the units whose hash falls in its partition, from every shard
    (``count_partition``): no process holds the corpus-wide counts. Writes the table (``COUNT_COLUMNS``, most
    frequent first) to ``work/frequent_units.parquet``; the tasks' ``frequent.parquet`` say which frequent units
    each shard contains (what its key pass cuts). Returns the number of frequent units."""
    path = work / "frequent_units.parquet"
    files = [work / "filtered" / name / "units.parquet" for name in names]
    if not cfg.boilerplate.enabled or not any(f.exists() for f in files):
        frame = frequent_units(*count_units([], cfg.boilerplate.min_chars), cfg.boilerplate.min_docs)
        frame.astype({"unit_hash": "uint64"}).to_parquet(path, index=False)
        return 0
    folder = _partitions_folder(work, cfg)
    n_parts = cfg.execution.partitions
    shard_pass("boilerplate", count_partition, [dict(work=str(work), names=",".join(names), part=p, n_parts=n_parts,
                                                     min_docs=cfg.boilerplate.min_docs,
                                                     out_dir=str(folder / f"{p:05d}")) for p in range(n_parts)])
    # The partitions' frequent units, most frequent first, sorted by DuckDB under the memory limit (spilling
    # past it): a page family's lines are frequent units too, so their number grows with the corpus.
    files = [str(folder / f"{p:05d}" / "counts.parquet") for p in range(n_parts)]
    tmp = temp_path(path)
    with _duckdb(work, memory_limit=cfg.execution.memory_limit) as con:
        n_units = int(con.execute(  # COPY returns the rows it wrote
            f"COPY (SELECT unit_hash::UBIGINT AS unit_hash, n_docs::BIGINT AS n_docs, example FROM read_parquet(?) "
            f"ORDER BY n_docs DESC, unit_hash) TO '{tmp}' (FORMAT parquet)", [files]).fetchone()[0])
    os.replace(tmp, path)  # a killed run leaves the old table or none, never half of one
    return n_units


def _partitions_folder(work: Path, cfg: CorpusConfig) -> Path:
    # The partition count names the folder: a resumed build with another count never mixes the two.
    return Path(work) / f"boilerplate_p{cfg.execution.partitions}"


def count_partition(work: str, names: str, part: int, n_parts: int, min_docs: int, out_dir: str) -> bool:
    """The global boilerplate count of one hash partition (units with ``unit_hash % n_parts == part``), read from
    every shard's filter output: ``counts.parquet`` (``COUNT_COLUMNS``: units in ``min_docs`` or more distinct
    documents, each with the example of its first shard in corpus order) and ``frequent.parquet`` (``shard``,
    ``unit_hash``, ``keep_doc``: which of them each shard contains, sorted by shard, and the document hash of each
    unit's first occurrence in corpus order, which keeps it)."""

    def write(tmp: Path) -> None:
        units, examples = [], []
        for shard, name in enumerate(names.split(",")):
            folder = Path(work) / "filtered" / name
            if not (folder / "units.parquet").exists():
                continue
            occ = partitioned.read_shard_file(folder / "units.parquet", part, name, folder, "filter")
            occ = occ[occ.unit_hash.to_numpy(dtype=np.uint64) % np.uint64(n_parts) == np.uint64(part)]
            units.append(occ.assign(shard=np.int32(shard)))
            ex = partitioned.read_shard_file(folder / "unit_examples.parquet", part, name, folder, "filter")
            examples.append(ex[ex.unit_hash.to_numpy(dtype=np.uint64) % np.uint64(n_parts) == np.uint64(part)]
                            .assign(shard=np.int32(shard)))
        occurrences = pd.concat(units, ignore_index=True) if units else pd.DataFrame(
            {"unit_hash": np.zeros(0, np.uint64), "doc_hash": np.zeros(0, np.uint64), "row": np.zeros(0, np.int32),
             "shard": np.zeros(0, np.int32)})
        n_docs = occurrences.drop_duplicates(["unit_hash", "doc_hash"]).groupby("unit_hash").size()
        n_docs = n_docs[n_docs >= min_docs].rename("n_docs")
        # The document that keeps each frequent unit: its first occurrence in corpus order (shard, then row).
        keeper = (occurrences[occurrences.unit_hash.isin(n_docs.index)].sort_values(["shard", "row"], kind="stable")
                  .drop_duplicates("unit_hash").set_index("unit_hash")["doc_hash"].rename("keep_doc"))
        first = (pd.concat(examples, ignore_index=True).sort_values("shard", kind="stable")
                 .drop_duplicates("unit_hash").set_index("unit_hash")["example"]) if examples else pd.Series(
            dtype="string")
        counts = n_docs.to_frame().join(first).reset_index()
        counts = counts.astype({"unit_hash": "uint64", "n_docs": "int64", "example": "string"})[COUNT_COLUMNS]
        counts.to_parquet(tmp / "counts.parquet", index=False)
        frequent = occurrences[occurrences.unit_hash.isin(counts.unit_hash)][["shard", "unit_hash"]]
        frequent = frequent.drop_duplicates().sort_values(["shard", "unit_hash"], ignore_index=True)
        frequent = frequent.join(keeper, on="unit_hash")
        pq.write_table(pa.Table.from_pandas(frequent.astype({"shard": "int32", "unit_hash": "uint64",
                                                             "keep_doc": "uint64"}),
                                            preserve_index=False), tmp / "frequent.parquet", row_group_size=65_536)

    done = _atomic_dir(Path(out_dir), write)
    release_memory()
    return done


def _shard_frequent(work: Path, cfg: CorpusConfig, shard: int) -> dict[int, int]:
    """The frequent units shard ``shard`` contains, each with the document hash of its first occurrence in corpus
    order (every partition's ``frequent.parquet``, read by row groups of that shard only)."""
    folder = _partitions_folder(work, cfg)
    files = sorted(folder.glob("*/frequent.parquet")) if folder.is_dir() else []
    found: dict[int, int] = {}
    for f in files:
        table = pq.read_table(f, columns=["unit_hash", "keep_doc"], filters=[("shard", "=", shard)])
        found.update(zip(table.column("unit_hash").to_numpy().astype(np.uint64).tolist(),
                         table.column("keep_doc").to_numpy().astype(np.uint64).tolist()))
    return found


def _by_chars(languages: Sequence[str]) -> list[bool]:
    return [lang in CHARACTER_LANGUAGES for lang in languages]


@functools.lru_cache(maxsize=2)
def _classifier(path: str, positive_label: str = "") -> Any:
    """The saved quality classifier at ``path`` with its configured positive label, loaded once per worker process."""
    from tasks.corpus.quality_model import load_model

    return load_model(Path(path), positive_label)


def key_shard(filtered_dir: str, out_dir: str, cfg_json: str, work: str, shard: int, quality_model: str = "") -> bool:
    """Pass 4 on one shard: boilerplate cut, exact hash, MinHash band keys, evaluation n-gram hits, and the quality
    classifier's score and keep decision (on the text after the boilerplate cut, the text that would be kept)."""
    cfg = CorpusConfig.model_validate_json(cfg_json)
    frequent = _shard_frequent(Path(work), cfg, shard)
    index = EvalIndex.load(Path(work) / "eval_index.npz")

    def write(tmp: Path) -> None:
        docs = pd.read_parquet(Path(filtered_dir) / "survivors.parquet")
        texts, n_cut = strip_units(docs.text.tolist(), frequent, cfg.boilerplate.min_chars)
        before = docs
        docs = docs.assign(text=texts, lines_dropped=docs.lines_dropped + np.asarray(n_cut, dtype=np.int64))
        ledger = Ledger()
        emptied = [not t.strip() for t in texts]
        for doc_id, source, cut, empty in zip(docs.doc_id, docs.source, n_cut, emptied):
            if empty:
                ledger.remove(doc_id, source, "boilerplate", Reason(
                    "dedup.boilerplate", float(cut), float(cfg.boilerplate.min_docs),
                    f"all {cut} lines are boilerplate found in >= {cfg.boilerplate.min_docs} documents"))
        read_rows = np.flatnonzero(~np.array(emptied, dtype=bool)).astype(np.int32)
        docs = docs.iloc[read_rows].reset_index(drop=True)
        ledger.count("boilerplate", before, docs)
        # Near copies are found on the text as read: a family of copies shares the very lines the cut removes.
        np.save(tmp / "read_rows.npy", read_rows)
        scores, keep, keep_p = _quality(docs, cfg, quality_model)
        docs = docs.assign(quality_score=scores)
        docs.to_parquet(tmp / "docs.parquet", index=False)
        removals, funnel = ledger.frames()
        removals.to_parquet(tmp / "removals.parquet", index=False)
        funnel.to_parquet(tmp / "funnel.parquet", index=False)
        _keys(docs, cfg, before.text.to_numpy()[read_rows].tolist()).assign(shard=np.int32(shard), quality_score=scores, quality_keep=keep,
                                quality_keep_p=keep_p).to_parquet(tmp / "keys.parquet", index=False)
        hits = [(row, k, length, h) for row, text in enumerate(docs.text)
                for k, (length, h) in enumerate(index.hits(text))]
        pd.DataFrame(hits, columns=["row", "k", "length", "hash"]).astype(
            {"row": "int32", "k": "int32", "length": "int64", "hash": "uint64"}).assign(
            shard=np.int32(shard)).to_parquet(tmp / "hits.parquet", index=False)

    done = _atomic_dir(Path(out_dir), write)
    release_memory()
    return done


def _quality(docs: pd.DataFrame, cfg: CorpusConfig, model_path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per document (N,): the classifier's score in [0, 1] (NaN without a model), whether the action keeps it, and
    the probability it had of being kept (1 or 0 for ``threshold``)."""
    n = len(docs)
    if not model_path:
        return np.full(n, np.nan), np.ones(n, dtype=bool), np.ones(n)
    from tasks.corpus.quality_model import keep_decisions

    scores = np.asarray(_classifier(model_path, cfg.quality_model.positive_label).score(docs.text.tolist()), dtype=np.float64) if n else np.zeros(0)
    keep, keep_p = keep_decisions(scores, docs.doc_id.tolist(), cfg.quality_model)
    return scores, np.asarray(keep, dtype=bool), np.asarray(keep_p, dtype=np.float64)


def _keys(docs: pd.DataFrame, cfg: CorpusConfig, read_texts: Sequence[str] | None = None) -> pd.DataFrame:
    """Per document: its row, exact-dedup hash halves, characters and UTF-8 bytes (of ``docs.text``, the text after
    the boilerplate cut), and the MinHash band keys (uint64 per band) of ``read_texts``, the same documents' text
    before the cut (default: ``docs.text``)."""
    digests = [xxhash.xxh3_128_intdigest(normal_form(t).encode("utf-8")) for t in docs.text]
    nd = cfg.near_dedup
    frame = pd.DataFrame({
        "row": np.arange(len(docs), dtype=np.int32), "doc_id": docs.doc_id, "source": docs.source,
        "language": docs.language.astype(str),
        "host": pd.array([url_host(u) if isinstance(u, str) else None for u in docs.get("url", [None] * len(docs))],
                         dtype="string"),
        "n_chars": np.array([len(t) for t in docs.text], dtype=np.int64),
        "n_bytes": np.array([len(t.encode("utf-8")) for t in docs.text], dtype=np.int64),
        "h_hi": np.array([d >> 64 for d in digests], dtype=np.uint64),
        "h_lo": np.array([d & (2**64 - 1) for d in digests], dtype=np.uint64),
        "by_chars": _by_chars(docs.language.tolist()),
    })
    if nd.enabled and len(docs):
        texts = docs.text.tolist() if read_texts is None else list(read_texts)
        sigs, has = minhash.signatures(texts, frame.by_chars.to_numpy(), nd)
        keys = minhash.band_keys(sigs, nd.bands, nd.rows)
    else:
        has = np.zeros(len(docs), dtype=bool)
        keys = np.zeros((len(docs), nd.bands), dtype=np.uint64)
    frame["has_shingles"] = has
    for band in range(nd.bands):
        frame[f"band_{band}"] = keys[:, band]
    return frame


def _offsets(work: Path, names: list[str]) -> np.ndarray:
    """(shards + 1,) int64: the position of each keyed shard's first document in corpus order, then the total."""
    counts = [pq.ParquetFile(work / "keyed" / name / "docs.parquet").metadata.num_rows for name in names]
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def _load_keys(con: duckdb.DuckDBPyConnection, work: Path, names: list[str], offsets: np.ndarray,
               bands: int) -> None:
    """Table ``keys``: every keyed document with its position ``pos`` (corpus order) and a source code ``src``."""
    con.register("_offsets", pa.table({"shard": np.arange(len(names), dtype=np.int32),
                                       "start": offsets[:-1].astype(np.int64)}))
    files = [str(work / "keyed" / name / "keys.parquet") for name in names]
    if not files:
        con.execute("CREATE TABLE keys (pos BIGINT, shard INTEGER, row INTEGER, doc_id VARCHAR, source VARCHAR, "
                    "language VARCHAR, host VARCHAR, n_chars BIGINT, n_bytes BIGINT, h_hi UBIGINT, h_lo UBIGINT, "
                    "by_chars BOOLEAN, has_shingles BOOLEAN, " + "".join(f"band_{b} UBIGINT, " for b in range(bands))
                    + "quality_score DOUBLE, quality_keep BOOLEAN, quality_keep_p DOUBLE, src INTEGER)")
        return
    con.execute("CREATE TABLE keys AS SELECT o.start + k.row AS pos, k.*, "
                "dense_rank() OVER (ORDER BY k.source)::INTEGER - 1 AS src "
                "FROM read_parquet(?) k JOIN _offsets o USING (shard)", [files])


def split_shard_keys(keyed_dir: str, out_dir: str, n_parts: int, bands: int) -> bool:
    """The key pass's keys of one shard by hash partition (:func:`tasks.corpus.partitioned.split_keys`)."""
    if Path(out_dir).exists():
        return False
    columns = ["row", "source", "h_hi", "h_lo", "quality_keep", "by_chars", "has_shingles"]
    keys = pd.read_parquet(Path(keyed_dir) / "keys.parquet", columns=columns + [f"band_{b}" for b in range(bands)])
    done = partitioned.split_keys(keys, n_parts, bands, Path(out_dir))
    release_memory()
    return done


def _verdicts(con: duckdb.DuckDBPyConnection, work: Path, names: list[str], cfg: CorpusConfig,
              offsets: np.ndarray, near_on: bool) -> None:
    """The decisions over corpus positions, each table O(removed documents or pairs), none O(documents): ``exact``
    (pos, first_pos) and ``quality_low`` (pos) from the exact partitions; ``verified`` (i, j, sim) from the verify
    pass; ``near`` (j, i, sim, shown): leader clustering; ``family_links`` (pos, root); ``hit_rows`` (pos, k,
    length, hash): the evaluation n-gram hits of the documents these steps kept."""
    n_parts = cfg.execution.partitions
    exact_dir = partitioned.key_parts_folder(work, n_parts, "exact")
    for table, columns in (("exact", "pos, first_pos"), ("quality_low", "pos")):
        files = [str(exact_dir / f"{p:05d}" / f"{table}.parquet") for p in range(n_parts)]
        con.execute(f"CREATE TABLE {table} AS SELECT {columns} FROM read_parquet(?)", [files])
    con.execute("CREATE TABLE verified (i BIGINT, j BIGINT, sim DOUBLE)")
    files = [str(f) for name in names for f in [work / "verified" / name / "verified.parquet"] if f.exists()]
    if near_on and files:
        con.execute("INSERT INTO verified SELECT i, j, sim FROM read_parquet(?)", [files])
    _leaders(con)
    _families(con)
    con.register("_offsets", pa.table({"shard": np.arange(len(names), dtype=np.int32),
                                       "start": offsets[:-1].astype(np.int64)}))
    files = [str(work / "keyed" / name / "hits.parquet") for name in names]
    con.execute("CREATE TABLE hit_rows (pos BIGINT, k INTEGER, length BIGINT, hash UBIGINT)")
    if cfg.decontamination.enabled and files:
        con.execute("INSERT INTO hit_rows SELECT o.start + h.row AS pos, h.k, h.length, h.hash "
                    "FROM read_parquet(?) h JOIN _offsets o USING (shard) WHERE o.start + h.row NOT IN "
                    "(SELECT pos FROM exact UNION ALL SELECT pos FROM quality_low UNION ALL SELECT j FROM near)",
                    [files])
    con.unregister("_offsets")


# The documents whose doc_id, source or characters the decisions name: O(removed documents and pairs).
_WANTED_SQL = ("SELECT pos FROM exact UNION SELECT first_pos FROM exact UNION SELECT pos FROM quality_low "
               "UNION SELECT i FROM verified UNION SELECT j FROM verified UNION SELECT pos FROM hit_rows ORDER BY pos")
_INFO_COLUMNS = ["row", "doc_id", "source", "n_chars", "quality_score", "quality_keep_p"]


def _write_wanted(folder: Path, names: list[str], offsets: np.ndarray,
                  wanted: np.ndarray) -> list[tuple[int, Path]]:
    """The rows of ``wanted`` (corpus positions, ascending) by shard, one ``.npy`` per shard that has any, in a
    fresh ``folder``; returns (shard, file) of each."""
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "wanted").mkdir(parents=True)
    shard_of = np.searchsorted(offsets, wanted, side="right") - 1
    calls = []
    for shard in np.unique(shard_of).tolist():
        path = folder / "wanted" / f"{names[shard]}.npy"
        np.save(path, wanted[shard_of == shard] - offsets[shard])
        calls.append((shard, path))
    return calls


def lookup_shard(keyed_dir: str, wanted: str, start: int, shard: int, out_path: str) -> bool:
    """The keys (``pos``, ``shard``, ``_INFO_COLUMNS``) of the rows ``wanted`` (a ``.npy``) of one shard, whose
    first document is at corpus position ``start``."""
    rows = np.load(wanted)
    keys = pq.read_table(Path(keyed_dir) / "keys.parquet", columns=_INFO_COLUMNS).take(rows).to_pandas()
    keys.insert(0, "shard", np.int32(shard))
    keys.insert(0, "pos", keys.row.to_numpy(dtype=np.int64) + start)
    with atomic_file(Path(out_path)) as f:
        keys.to_parquet(f, index=False)
    return True


def _load_info(con: duckdb.DuckDBPyConnection, work: Path, names: list[str]) -> None:
    """Table ``info``: the looked-up keys of the documents the decisions name; ``_totals`` (source, docs, chars):
    the documents and characters of each source entering the global steps, summed from the key pass's funnel
    rows (O(shards × sources))."""
    files = sorted(str(f) for f in (work / "lookup").glob("*.parquet"))
    con.execute("CREATE OR REPLACE TABLE info (pos BIGINT, shard INTEGER, row INTEGER, doc_id VARCHAR, "
                "source VARCHAR, n_chars BIGINT, quality_score DOUBLE, quality_keep_p DOUBLE)")
    if files:
        con.execute("INSERT INTO info SELECT pos, shard, row, doc_id, source, n_chars, quality_score, "
                    "quality_keep_p FROM read_parquet(?)", [files])
    rows = _read_funnels([work / "keyed" / name / "funnel.parquet" for name in names])
    rows = rows[rows.stage == "boilerplate"]
    totals = rows.groupby("source", as_index=False)[["docs_out", "chars_out"]].sum()
    totals = totals.rename(columns={"docs_out": "docs", "chars_out": "chars"})
    totals = totals[totals.docs > 0].astype({"source": str, "docs": "int64", "chars": "int64"})
    con.execute("CREATE OR REPLACE TABLE _totals (source VARCHAR, docs BIGINT, chars BIGINT)")
    if len(totals):
        con.register("_t", totals)
        con.execute("INSERT INTO _totals SELECT source, docs, chars FROM _t")
        con.unregister("_t")


def _read_partition(folder: Path, columns: list[str]) -> pd.DataFrame | None:
    files = sorted(folder.glob("*.parquet")) if folder.exists() else []
    return pd.concat([pd.read_parquet(f, columns=columns) for f in files], ignore_index=True) if files else None


def shingle_shard(keyed_dir: str, candidates: str, n_parts: int, shard: int, out_dir: str, cfg_json: str,
                  filtered_dir: str) -> bool:
    """Pass 6 on one shard: the sorted shingle hashes of its candidate documents (named by every candidate
    partition), as three arrays (``rows.npy`` ascending, ``starts.npy`` of length rows + 1, ``hashes.npy`` uint64;
    :class:`tasks.corpus.near_dedup.ShingleSets` by row). Shingled, like the band keys, from the text before the
    boilerplate cut (the filter pass's survivors, ``filtered_dir``)."""
    nd = CorpusConfig.model_validate_json(cfg_json).near_dedup

    def write(tmp: Path) -> None:
        rows = partitioned.shard_wanted(candidates, n_parts, shard)
        language = pd.read_parquet(Path(keyed_dir) / "docs.parquet", columns=["language"]).language.to_numpy()
        read_rows = np.load(Path(keyed_dir) / "read_rows.npy")[rows]
        read = pq.read_table(Path(filtered_dir) / "survivors.parquet", columns=["text"]).column("text")
        texts = read.take(pa.array(read_rows)).to_pylist()
        sets = near_dedup.shingle_sets(texts, rows, nd.shingle_size, _by_chars(language[rows].tolist()))
        del read, texts
        np.save(tmp / "rows.npy", sets.pos)
        np.save(tmp / "starts.npy", sets.starts)
        np.save(tmp / "hashes.npy", sets.hashes)

    done = _atomic_dir(Path(out_dir), write)
    release_memory()
    return done


class _Shingles:
    """Shingle sets of candidate documents by corpus position, read from the shards' pass-6 outputs.

    :meth:`sets` reads the wanted documents' hashes of one shard at a time through a memory map that is closed
    before the next shard is read, so no map lingers in the process and its memory does not grow with the number
    of shards it has read: it holds the sets it returns.
    """

    def __init__(self, work: Path, names: list[str]):
        self.work, self.names = work, names
        self.offsets = np.load(work / "offsets.npy")

    def shard_of(self, pos: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets, pos, side="right") - 1

    def sets(self, pos: np.ndarray) -> near_dedup.ShingleSets:
        """The sets of the documents at ``pos`` (unique, ascending), copied into one ShingleSets."""
        pos = np.asarray(pos, dtype=np.int64)
        shards = self.shard_of(pos)
        counts_parts, hash_parts = [], []
        for shard in np.unique(shards).tolist():
            folder = self.work / "shingles" / self.names[shard]
            rows, starts = np.load(folder / "rows.npy"), np.load(folder / "starts.npy")
            at = np.searchsorted(rows, pos[shards == shard] - self.offsets[shard])
            lo, counts = starts[at], starts[at + 1] - starts[at]
            stored = np.load(folder / "hashes.npy", mmap_mode="r")
            take = np.repeat(lo - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) + np.arange(counts.sum())
            hash_parts.append(np.asarray(stored[take], dtype=np.uint64))
            counts_parts.append(counts)
            del stored
        counts = np.concatenate(counts_parts) if counts_parts else np.zeros(0, np.int64)
        starts = np.zeros(len(pos) + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        hashes = np.concatenate(hash_parts) if hash_parts else np.zeros(0, np.uint64)
        return near_dedup.ShingleSets(pos, starts, hashes)


def verify_shard(candidates: str, n_parts: int, shard: int, work: str, names: str, out_dir: str,
                 threshold: float) -> bool:
    """Pass 7 on one shard: exact Jaccard of the distinct candidate pairs whose later document ``j`` is in the
    shard, from every candidate partition (:func:`tasks.corpus.near_dedup.verify_sets`, one earlier shard's
    partners at a time); writes the verified pairs (i, j, sim) sorted by (j, i) and the number of pairs compared."""

    def write(tmp: Path) -> None:
        arr = partitioned.shard_pairs(candidates, n_parts, shard)  # by i: each earlier shard's partners in one stretch
        store = _Shingles(Path(work), names.split(","))
        own = store.sets(np.unique(arr[:, 1]))
        partner_shard = store.shard_of(arr[:, 0])
        parts = [near_dedup.verify_sets(group, store.sets(np.unique(group[:, 0])), own, threshold)
                 for group in np.split(arr, np.flatnonzero(np.diff(partner_shard)) + 1) if len(group)]
        verified = np.concatenate([v for v, _ in parts]) if parts else np.zeros((0, 2), np.int64)
        sims = np.concatenate([s for _, s in parts]) if parts else np.zeros(0, np.float64)
        order = np.lexsort((verified[:, 0], verified[:, 1]))
        pd.DataFrame({"i": verified[order, 0], "j": verified[order, 1], "sim": sims[order]}).to_parquet(
            tmp / "verified.parquet", index=False)
        (tmp / "count.json").write_text(json.dumps({"compared": int(len(arr))}))

    done = _atomic_dir(Path(out_dir), write)
    release_memory()
    return done


def _decide(con: duckdb.DuckDBPyConnection, work: Path, names: list[str], cfg: CorpusConfig, index: EvalIndex,
            n_pairs: int) -> dict[str, dict[str, Any]]:
    """Pass 8 over the tables of :func:`_verdicts` and :func:`_load_info`: removal rows, families,
    decontamination and the global funnel; writes ``decisions/`` (removal rows and family ids partitioned by shard,
    the global funnel rows, the hit table). Returns near-dedup statistics per source."""
    nd = cfg.near_dedup
    n = int(con.execute("SELECT coalesce(sum(docs), 0) FROM _totals").fetchone()[0])
    con.execute("CREATE TABLE removed (pos BIGINT, step INTEGER, rule VARCHAR, value DOUBLE, threshold DOUBLE, "
                "detail VARCHAR)")
    con.execute(f"INSERT INTO removed SELECT e.pos, {_EXACT}, 'dedup.exact', 1.0, 'NaN'::DOUBLE, "
                "'exact duplicate of ' || k.doc_id FROM exact e JOIN info k ON k.pos = e.first_pos")
    qm = cfg.quality_model
    if qm.action == "threshold":
        detail = f"'quality score ' || printf('%.4f', k.quality_score) || ' < threshold {qm.threshold:g}'"
        threshold = f"{qm.threshold}"
    else:  # sample: the threshold column holds the probability the document had of being kept
        detail = (f"'quality score ' || printf('%.4f', k.quality_score) || ': kept with probability ' || "
                  f"printf('%.4f', k.quality_keep_p) || ' (Pareto alpha {qm.pareto_alpha:g}), not drawn'")
        threshold = "k.quality_keep_p"
    con.execute(f"INSERT INTO removed SELECT q.pos, {_QUALITY}, 'quality_model.low_score', k.quality_score, "
                f"{threshold}, {detail} FROM quality_low q JOIN info k USING (pos) ORDER BY q.pos")
    near_stats: dict[str, dict[str, Any]] = {}
    if nd.enabled and n:
        con.execute(f"INSERT INTO removed SELECT p.j, {_NEAR}, 'dedup.near', p.sim, {nd.jaccard_threshold}, "
                    f"'near duplicate of ' || k.doc_id || ' (Jaccard ' || p.shown || ')' "
                    f"FROM near p JOIN info k ON k.pos = p.i")
        near_stats = _near_stats(con, n_pairs, nd.max_removal_share)
    con.execute("CREATE TABLE families AS SELECT f.pos, k.doc_id AS family_id FROM family_links f "
                "JOIN info k ON k.pos = f.root")
    hits = _decontaminate(con, cfg, index)
    funnel = _global_funnel(con)
    with atomic_dir(work / "decisions", replace=True) as tmp:
        con.execute(f"COPY (SELECT k.shard, k.row FROM removed r JOIN info k USING (pos)) TO '{tmp / 'removed'}' "
                    f"(FORMAT parquet, PARTITION_BY (shard), OVERWRITE_OR_IGNORE)")
        con.execute(f"COPY (SELECT k.shard, k.row, f.family_id FROM families f JOIN info k USING (pos)) TO "
                    f"'{tmp / 'families'}' (FORMAT parquet, PARTITION_BY (shard), OVERWRITE_OR_IGNORE)")
        stage = "CASE r.step " + " ".join(f"WHEN {i} THEN '{name}'" for i, name in enumerate(GLOBAL_STEPS)) + " END"
        con.execute(f"COPY (SELECT k.shard, k.doc_id, k.source, {stage} AS stage, "
                    f"r.rule, r.value, r.threshold, r.detail "
                    f"FROM removed r JOIN info k USING (pos)) TO '{tmp / 'removals'}' "
                    f"(FORMAT parquet, PARTITION_BY (shard), OVERWRITE_OR_IGNORE)")
        funnel.to_parquet(tmp / "funnel.parquet", index=False)
        hits.astype(_HIT_TYPES).to_parquet(tmp / "decontamination.parquet", index=False)
    return near_stats


_SPANS_DDL = "(pos BIGINT, start BIGINT, \"end\" BIGINT, first_pos BIGINT, first_start BIGINT)"
_SUB_DOCS_DDL = ("(pos BIGINT, n_spans BIGINT, bytes_before BIGINT, bytes_cut BIGINT, left_bytes BIGINT, "
                 "chars_after BIGINT)")


def _substring_pass(work: Path, names: list[str], cfg: CorpusConfig,
                    shard_pass: Callable[[str, Callable[..., Any], list[dict[str, Any]]], None]
                    ) -> dict[str, dict[str, Any]]:
    """Pass 9, exact-substring dedup (``[corpus.substring_dedup]``) of the documents every earlier step kept:
    the partition plan (DuckDB), one suffix-array call per partition (:func:`substring_partition`), then the cuts
    and removals per shard in ``work/substring`` (:func:`_substring_decide`). Returns statistics per source and
    ``_all`` (the partitions)."""
    with _duckdb(work, "decide.duckdb", cfg.execution.memory_limit, fresh=False) as con:
        n_parts = _substring_plan(con, work, cfg)
    sd = cfg.substring_dedup
    shard_pass("substring", substring_partition,
               [dict(plan=str(work / "substring_plan.parquet"), part=p, work=str(work), names=",".join(names),
                     out_dir=str(work / "substring_parts" / f"{p:05d}"), min_len=sd.min_repeat_bytes)
                for p in range(n_parts)])
    with _duckdb(work, "decide.duckdb", cfg.execution.memory_limit, fresh=False) as con:
        return _substring_decide(con, work, cfg, n_parts)


def _substring_plan(con: duckdb.DuckDBPyConnection, work: Path, cfg: CorpusConfig) -> int:
    """Table ``sub_plan`` (part, pos, shard, row, n_bytes) of the surviving documents, written to
    ``work/substring_plan.parquet`` sorted by (part, pos); returns the number of partitions.

    Partition: within the scope's group (a source, or all documents), in corpus order, the documents whose bytes
    before them in the group fall in the same ``partition_bytes`` block; so it holds less than ``partition_bytes``
    plus one document, and does not depend on the shard size."""
    sd = cfg.substring_dedup
    grp = "source" if sd.scope == "source" else "''"
    con.execute(f"""CREATE OR REPLACE TABLE sub_plan AS
        SELECT (dense_rank() OVER (ORDER BY grp, block) - 1)::BIGINT AS part, pos, shard, row, n_bytes FROM (
            SELECT pos, shard, row, n_bytes, grp,
                   (coalesce(sum(n_bytes) OVER (PARTITION BY grp ORDER BY pos
                                                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                    // {sd.partition_bytes})::BIGINT AS block
            FROM (SELECT pos, shard, row, n_bytes, {grp} AS grp FROM keys
                  WHERE pos NOT IN (SELECT pos FROM removed)))""")
    con.execute(f"COPY (SELECT part, pos, shard, row FROM sub_plan ORDER BY part, pos) TO "
                f"'{work / 'substring_plan.parquet'}' (FORMAT parquet)")
    return int(con.execute("SELECT count(DISTINCT part) FROM sub_plan").fetchone()[0])


def substring_partition(plan: str, part: int, work: str, names: str, out_dir: str, min_len: int) -> bool:
    """Pass 9 on one partition: its documents' texts (read from the keyed shards, in corpus order), the spans to
    cut (:func:`tasks.corpus.substring.repeated_spans`), and per touched document its bytes before, cut and left
    (without surrounding whitespace) and characters after. Writes ``spans.parquet`` and ``docs.parquet``."""

    def write(tmp: Path) -> None:
        rows = pq.read_table(plan, columns=["pos", "shard", "row"], filters=[("part", "==", part)]).to_pandas()
        rows = rows.sort_values("pos", kind="stable").reset_index(drop=True)
        texts: list[bytes] = [b""] * len(rows)
        shard_names = names.split(",")
        for shard, idx in rows.groupby("shard").indices.items():
            column = pq.read_table(Path(work) / "keyed" / shard_names[int(shard)] / "docs.parquet",
                                   columns=["text"]).column("text")
            for i, text in zip(idx, column.take(rows.row.to_numpy()[idx]).to_pylist()):
                texts[i] = text.encode("utf-8")
            del column
        cuts = substring.repeated_spans(texts, min_len)
        pos = rows.pos.to_numpy(dtype=np.int64)
        pd.DataFrame({"pos": pos[cuts.doc], "start": cuts.start, "end": cuts.end, "first_pos": pos[cuts.first_doc],
                      "first_start": cuts.first_start}).to_parquet(tmp / "spans.parquet", index=False)
        cut = cuts.bytes_per_doc(len(texts))
        touched = np.flatnonzero(cut)
        bounds = np.searchsorted(cuts.doc, touched), np.searchsorted(cuts.doc, touched, side="right")
        left, chars = [], []
        for d, lo, hi in zip(touched, *bounds):
            kept = substring.apply_cuts(texts[d], cuts.start[lo:hi], cuts.end[lo:hi]).decode("utf-8")
            left.append(len(kept.strip().encode("utf-8")))
            chars.append(len(kept))
        pd.DataFrame({"pos": pos[touched], "n_spans": (bounds[1] - bounds[0]).astype(np.int64),
                      "bytes_before": np.array([len(texts[d]) for d in touched], dtype=np.int64),
                      "bytes_cut": cut[touched], "left_bytes": np.array(left, dtype=np.int64),
                      "chars_after": np.array(chars, dtype=np.int64)}).to_parquet(tmp / "docs.parquet", index=False)

    done = _atomic_dir(Path(out_dir), write)
    release_memory()
    return done


def _substring_decide(con: duckdb.DuckDBPyConnection, work: Path, cfg: CorpusConfig,
                      n_parts: int) -> dict[str, dict[str, Any]]:
    """The substring step's decisions in ``work/substring``: ``removed`` and ``cuts`` partitioned by shard (the
    write pass applies them), ``removals/`` (rule ``dedup.substring``: a touched document left with fewer
    than ``min_doc_bytes`` bytes; partitioned by shard), ``funnel.parquet`` and ``spans.parquet`` (``SPAN_COLUMNS``). Returns per
    source: documents and bytes in, documents touched and removed, spans cut, bytes cut from spans and bytes of
    the removed documents' remainders; and ``_all``: the partitions and the settings."""
    sd = cfg.substring_dedup
    folders = [work / "substring_parts" / f"{p:05d}" for p in range(n_parts)]
    con.execute(f"CREATE OR REPLACE TABLE sub_spans {_SPANS_DDL}")
    con.execute(f"CREATE OR REPLACE TABLE sub_docs {_SUB_DOCS_DDL}")
    if folders:
        con.execute("INSERT INTO sub_spans SELECT pos, start, \"end\", first_pos, first_start FROM read_parquet(?)",
                    [[str(f / "spans.parquet") for f in folders]])
        con.execute("INSERT INTO sub_docs SELECT pos, n_spans, bytes_before, bytes_cut, left_bytes, chars_after "
                    "FROM read_parquet(?)", [[str(f / "docs.parquet") for f in folders]])
    con.execute(f"CREATE OR REPLACE TABLE sub_gone AS SELECT pos FROM sub_docs WHERE left_bytes < {sd.min_doc_bytes}")
    funnel = con.execute(f"""
        SELECT k.source, '{SUBSTRING_STEP}' AS stage, count(*)::BIGINT AS docs_in,
               count(*) FILTER (WHERE g.pos IS NULL)::BIGINT AS docs_out, sum(k.n_chars)::BIGINT AS chars_in,
               sum(CASE WHEN g.pos IS NOT NULL THEN 0 WHEN d.pos IS NOT NULL THEN d.chars_after
                        ELSE k.n_chars END)::BIGINT AS chars_out
        FROM keys k LEFT JOIN sub_docs d ON d.pos = k.pos LEFT JOIN sub_gone g ON g.pos = k.pos
        WHERE k.pos NOT IN (SELECT pos FROM removed) GROUP BY k.source ORDER BY k.source""").df()
    rows = con.execute("""
        SELECT k.source, count(*), sum(k.n_bytes), count(d.pos), count(g.pos), coalesce(sum(d.n_spans), 0),
               coalesce(sum(d.bytes_cut), 0),
               coalesce(sum(d.bytes_before - d.bytes_cut) FILTER (WHERE g.pos IS NOT NULL), 0)
        FROM keys k LEFT JOIN sub_docs d ON d.pos = k.pos LEFT JOIN sub_gone g ON g.pos = k.pos
        WHERE k.pos NOT IN (SELECT pos FROM removed) GROUP BY k.source ORDER BY k.source""").fetchall()
    stats: dict[str, dict[str, Any]] = {}
    for source, n_in, b_in, touched, gone, spans, cut, dropped in rows:
        stats[source] = {"docs_in": int(n_in), "bytes_in": int(b_in), "docs_touched": int(touched),
                         "docs_removed": int(gone), "spans_cut": int(spans), "bytes_cut": int(cut),
                         "bytes_removed_with_docs": int(dropped),
                         "bytes_out": int(b_in) - int(cut) - int(dropped)}
    largest = con.execute("SELECT coalesce(max(b), 0) FROM (SELECT sum(n_bytes) AS b FROM sub_plan GROUP BY part)"
                          ).fetchone()[0]
    stats["_all"] = {"partitions": int(n_parts), "largest_partition_bytes": int(largest),
                     "repeats_across_partitions_searched": False, **sd.model_dump()}
    with atomic_dir(work / "substring", replace=True) as tmp:
        con.execute(f"COPY (SELECT k.shard, k.row FROM sub_gone g JOIN keys k USING (pos)) TO '{tmp / 'removed'}' "
                    f"(FORMAT parquet, PARTITION_BY (shard), OVERWRITE_OR_IGNORE)")
        con.execute(f"COPY (SELECT k.shard, k.row, s.start, s.\"end\" FROM sub_spans s JOIN keys k USING (pos) "
                    f"WHERE s.pos NOT IN (SELECT pos FROM sub_gone)) TO '{tmp / 'cuts'}' "
                    f"(FORMAT parquet, PARTITION_BY (shard), OVERWRITE_OR_IGNORE)")
        con.execute(f"""COPY (
            SELECT k.shard, k.doc_id, k.source, '{SUBSTRING_STEP}' AS stage, 'dedup.substring' AS rule,
                   d.left_bytes::DOUBLE AS value, {sd.min_doc_bytes}::DOUBLE AS threshold,
                   d.n_spans || ' repeated spans of >= {sd.min_repeat_bytes} bytes cut (' || d.bytes_cut || ' of '
                   || d.bytes_before || ' bytes), the first a repeat of ' || f.doc_id || '; ' || d.left_bytes
                   || ' bytes left < {sd.min_doc_bytes}' AS detail
            FROM sub_docs d JOIN sub_gone g USING (pos) JOIN keys k ON k.pos = d.pos
            JOIN (SELECT pos, arg_min(first_pos, start) AS first_pos FROM sub_spans GROUP BY pos) s ON s.pos = d.pos
            JOIN keys f ON f.pos = s.first_pos) TO '{tmp / 'removals'}'
            (FORMAT parquet, PARTITION_BY (shard), OVERWRITE_OR_IGNORE)""")
        con.execute(f"""COPY (
            SELECT k.doc_id, k.source, s.start, s."end", s."end" - s.start AS n_bytes, f.doc_id AS first_doc_id,
                   s.first_start, s.pos IN (SELECT pos FROM sub_gone) AS doc_removed
            FROM sub_spans s JOIN keys k ON k.pos = s.pos JOIN keys f ON f.pos = s.first_pos
            ORDER BY s.pos, s.start) TO '{tmp / 'spans.parquet'}' (FORMAT parquet)""")
        funnel[FUNNEL_COLUMNS].to_parquet(tmp / "funnel.parquet", index=False)
    return stats


def _cut_texts(texts: np.ndarray, folder: Path, shard: int) -> np.ndarray:
    """``texts`` of one shard with the substring step's cuts for the shard (``folder/cuts``) taken out."""
    cuts = _read_partition(folder / "cuts" / f"shard={shard}", ["row", "start", "end"])
    if cuts is None:
        return texts
    out = texts.copy()
    for row, part in cuts.sort_values(["row", "start"]).groupby("row", sort=True):
        text = out[int(row)].encode("utf-8")
        out[int(row)] = substring.apply_cuts(text, part.start.tolist(), part.end.tolist()).decode("utf-8")
    return out


# Length buckets of the blind-spot audit, in characters of the scored text: [lower, upper).
LENGTH_BUCKETS = ((0, 200), (200, 1_000), (1_000, 5_000), (5_000, 20_000), (20_000, None))
AUDIT_COLUMNS = ["group_kind", "group_name", "docs_scored", "removed", "removed_share", "score_mean", "score_p10",
                 "score_p50", "score_p90"]
EXAMPLE_COLUMNS = ["group_kind", "group_name", "fate", "doc_id", "source", "language", "quality_score", "snippet"]
SCORE_COLUMNS = ["doc_id", "source", "language", "length_bucket", "host", "quality_score", "removed"]
QUALITY_REMOVED_COLUMNS = ["doc_id", "source", "language", "quality_score", "text"]
EXAMPLES_PER_GROUP, SNIPPET_CHARS = 3, 300


def _length_bucket_sql() -> str:
    cases = " ".join(f"WHEN n_chars < {hi} THEN '{lo}-{hi}'" for lo, hi in LENGTH_BUCKETS if hi is not None)
    return f"CASE {cases} ELSE '{LENGTH_BUCKETS[-1][0]}+' END"


def _quality_audit(con: duckdb.DuckDBPyConnection, work: Path, names: list[str], cfg: CorpusConfig,
                   out: Path) -> None:
    """The blind-spot audit of the quality classifier (docs/methods.md §7): over the documents it scored (those
    surviving exact dedup), removal share and score quantiles for the whole corpus and per source, language, length
    bucket and host (documents with a URL), to ``out/quality_audit.parquet`` (``AUDIT_COLUMNS``); and for each
    source and language the ``EXAMPLES_PER_GROUP`` lowest-scoring kept and removed documents, to
    ``out/quality_examples.parquet`` (``EXAMPLE_COLUMNS``); every scored document's score and fate, in corpus
    order, to ``out/quality_scores.parquet`` (``SCORE_COLUMNS``); the text of the documents it removed, to
    ``out/quality_removed.parquet`` (:func:`_write_quality_removed`). All are empty without a classifier."""
    out.mkdir(parents=True, exist_ok=True)
    if not cfg.quality_model.enabled:
        pd.DataFrame(columns=AUDIT_COLUMNS).to_parquet(out / "quality_audit.parquet", index=False)
        pd.DataFrame(columns=EXAMPLE_COLUMNS).to_parquet(out / "quality_examples.parquet", index=False)
        pd.DataFrame(columns=SCORE_COLUMNS).to_parquet(out / "quality_scores.parquet", index=False)
        pd.DataFrame(columns=QUALITY_REMOVED_COLUMNS).to_parquet(out / "quality_removed.parquet", index=False)
        return
    con.execute(f"""CREATE OR REPLACE TEMP VIEW scored AS
        SELECT k.pos, k.shard, k.row, k.doc_id, k.source, k.language, k.host, k.quality_score,
               {_length_bucket_sql()} AS length_bucket, q.pos IS NOT NULL AS removed
        FROM keys k LEFT JOIN quality_low q USING (pos) WHERE k.pos NOT IN (SELECT pos FROM exact)""")
    parts = [("all", "'all'"), ("source", "source"), ("language", "language"), ("length", "length_bucket"),
             ("host", "host")]
    selects = [f"""SELECT '{kind}' AS group_kind, {expr}::VARCHAR AS group_name, count(*)::BIGINT AS docs_scored,
                          count(*) FILTER (WHERE removed)::BIGINT AS removed,
                          (count(*) FILTER (WHERE removed) / count(*))::DOUBLE AS removed_share,
                          avg(quality_score) AS score_mean, quantile_cont(quality_score, 0.1) AS score_p10,
                          quantile_cont(quality_score, 0.5) AS score_p50,
                          quantile_cont(quality_score, 0.9) AS score_p90
                   FROM scored {"WHERE host IS NOT NULL" if kind == "host" else ""} GROUP BY {expr}"""
               for kind, expr in parts]
    audit = con.execute(" UNION ALL ".join(selects) + " ORDER BY group_kind, group_name").df()
    con.execute(f"COPY (SELECT doc_id, source, language, length_bucket, host, quality_score, removed FROM scored "
                f"ORDER BY pos) TO '{out / 'quality_scores.parquet'}' (FORMAT parquet)")
    audit[AUDIT_COLUMNS].to_parquet(out / "quality_audit.parquet", index=False)
    chosen = con.execute(f"""
        SELECT * FROM (
            SELECT g.kind AS group_kind, g.name AS group_name, CASE WHEN s.removed THEN 'removed' ELSE 'kept' END
                   AS fate, s.shard, s.row, s.doc_id, s.source, s.language, s.quality_score,
                   row_number() OVER (PARTITION BY g.kind, g.name, s.removed ORDER BY s.quality_score, s.pos) AS rank
            FROM scored s, LATERAL (SELECT 'source' AS kind, s.source AS name UNION ALL
                                    SELECT 'language', s.language) g)
        WHERE rank <= {EXAMPLES_PER_GROUP} ORDER BY group_kind, group_name, fate, rank""").df()
    snippets = {}
    for shard, rows in chosen.groupby("shard"):
        texts = pd.read_parquet(work / "keyed" / names[int(shard)] / "docs.parquet", columns=["text"]).text
        for row in rows.row.unique():
            snippets[(int(shard), int(row))] = texts.iloc[int(row)][:SNIPPET_CHARS]
    chosen["snippet"] = [snippets[(int(a), int(b))] for a, b in zip(chosen.shard, chosen.row)]
    chosen[EXAMPLE_COLUMNS].to_parquet(out / "quality_examples.parquet", index=False)
    _write_quality_removed(con, work, names, out / "quality_removed.parquet")


def _write_quality_removed(con: duckdb.DuckDBPyConnection, work: Path, names: list[str], path: Path) -> None:
    """The whole text of every document the classifier removed (``QUALITY_REMOVED_COLUMNS``), in corpus order, in
    the form it was scored (after the boilerplate cut): for review beyond the audit's examples, and for the
    ``quality_ablation`` stage, which trains a proxy with these documents put back. Streamed shard by shard."""
    with _ParquetStream(path, _QUALITY_REMOVED_SCHEMA) as sink:
        for shard, name in enumerate(names):
            part = con.execute("SELECT k.row, k.doc_id, k.source, k.language, k.quality_score FROM quality_low q "
                               "JOIN keys k USING (pos) WHERE k.shard = ? ORDER BY q.pos", [shard]).df()
            if part.empty:
                continue
            texts = pd.read_parquet(work / "keyed" / name / "docs.parquet", columns=["text"]).text.to_numpy()
            sink.write(part.assign(text=texts[part.row.to_numpy(dtype=np.int64)])[QUALITY_REMOVED_COLUMNS])
            del texts


def _near_stats(con: duckdb.DuckDBPyConnection, n_pairs: int, warn_share: float) -> dict[str, dict[str, Any]]:
    """Per source: documents entering near dedup, removed, clusters (leaders with a removed copy), largest cluster."""
    rows = con.execute("""
        WITH gone AS (SELECT k.source, count(*) AS n FROM (SELECT pos FROM exact UNION ALL SELECT pos FROM quality_low) r
                      JOIN info k USING (pos) GROUP BY k.source),
        ent AS (SELECT t.source, t.docs - coalesce(g.n, 0) AS docs_in FROM _totals t LEFT JOIN gone g USING (source)
                WHERE t.docs - coalesce(g.n, 0) > 0),
        per_leader AS (SELECT k.source, n.i, count(*) AS copies FROM near n JOIN info k ON k.pos = n.j
                       GROUP BY k.source, n.i),
        agg AS (SELECT source, sum(copies)::BIGINT AS removed, count(*)::BIGINT AS clusters,
                       max(copies)::BIGINT + 1 AS largest FROM per_leader GROUP BY source)
        SELECT e.source, e.docs_in, coalesce(a.removed, 0), coalesce(a.clusters, 0), coalesce(a.largest, 1)
        FROM ent e LEFT JOIN agg a USING (source) ORDER BY e.source""").fetchall()
    stats: dict[str, dict[str, Any]] = {}
    for source, n_in, gone, clusters, largest in rows:
        share = gone / n_in if n_in else 0.0
        stats[source] = {"docs_in": int(n_in), "removed": int(gone), "removal_share": share,
                         "clusters": int(clusters), "largest_cluster": int(largest),
                         "warning": (f"near dedup removed {share:.1%} of {source}, above {warn_share:.0%}"
                                     if share > warn_share else "")}
    verified = int(con.execute("SELECT count(*) FROM verified").fetchone()[0])
    stats["_all"] = {"candidate_pairs": int(n_pairs), "verified_pairs": verified}
    return stats


def _stream(con: duckdb.DuckDBPyConnection, sql: str) -> pa.RecordBatchReader:
    """Batches of ``sql``'s result read through a cursor of its own, so ``con`` stays free for other statements."""
    return con.cursor().sql(sql).to_arrow_reader(_BATCH_ROWS)


def _leaders(con: duckdb.DuckDBPyConnection) -> None:
    """Table ``near`` (j, i, sim, shown): leader clustering (:func:`near_dedup.iter_leaders`) over the verified
    pairs, streamed in (j, i) order, on the ranks of the documents in any pair (8 bytes each: O(pairs))."""
    con.execute("CREATE TABLE near (j BIGINT, i BIGINT, sim DOUBLE, shown VARCHAR)")
    nodes = con.execute("SELECT i AS pos FROM verified UNION SELECT j FROM verified ORDER BY pos").fetchnumpy()["pos"]
    reader = _stream(con, "SELECT i, j, sim FROM verified ORDER BY j, i")
    batches = ((np.searchsorted(nodes, b.column("i").to_numpy()), np.searchsorted(nodes, b.column("j").to_numpy()),
                b.column("sim").to_numpy()) for b in reader)
    for removed_j, leader_i, sims in near_dedup.iter_leaders(batches, len(nodes)):
        con.register("_near_part", pa.table({"j": nodes[removed_j], "i": nodes[leader_i], "sim": sims,
                                             "shown": [f"{s:.3f}" for s in sims.tolist()]}))
        con.execute("INSERT INTO near SELECT j, i, sim, shown FROM _near_part")
        con.unregister("_near_part")


def _families(con: duckdb.DuckDBPyConnection) -> None:
    """Table ``family_links`` (pos, root): each document whose family root (:func:`near_dedup.family_roots` over
    the verified pairs) is another document, with that root; connected components on the ranks of the documents
    in any pair, so memory is O(pairs)."""
    pairs = con.execute("SELECT i, j FROM verified").fetchnumpy()
    nodes, ranks = np.unique(np.concatenate([pairs["i"], pairs["j"]]).astype(np.int64), return_inverse=True)
    ranks = ranks.reshape(-1)
    m = len(pairs["i"])
    roots = nodes[near_dedup.family_roots([(ranks[:m], ranks[m:])], len(nodes))]
    moved = roots != nodes
    con.register("_links", pa.table({"pos": nodes[moved], "root": roots[moved].astype(np.int64)}))
    con.execute("CREATE TABLE family_links AS SELECT pos, root FROM _links")
    con.unregister("_links")


def _decontaminate(con: duckdb.DuckDBPyConnection, cfg: CorpusConfig, index: EvalIndex) -> pd.DataFrame:
    """Remove surviving documents sharing a non-common evaluation n-gram (``hit_rows``); returns every hit
    (``HIT_COLUMNS``) of the surviving documents, in corpus order."""
    dc = cfg.decontamination
    if not dc.enabled:
        return pd.DataFrame(columns=HIT_COLUMNS)
    con.execute("CREATE TABLE hits AS SELECT h.pos, k.doc_id, k.source, h.k, h.length, h.hash "
                "FROM hit_rows h JOIN info k USING (pos)")
    found = con.execute("""
        SELECT pos, doc_id, source, length, hash,
               count(DISTINCT pos) OVER (PARTITION BY length, hash) >= ? AS common
        FROM hits ORDER BY pos, k""", [dc.common_min_docs]).df()
    if not len(found):
        return pd.DataFrame(columns=HIT_COLUMNS)
    rows = []
    for doc_id, source, length, h, common in zip(found.doc_id, found.source, found.length, found.hash, found.common):
        text, item = index.describe(int(length), int(h))
        rows.append(dict(doc_id=doc_id, source=source, ngram=text, eval_set=item.set_name, item_id=item.item_id,
                         common=bool(common)))
    table = pd.DataFrame(rows, columns=HIT_COLUMNS)
    flagged = table.assign(pos=found.pos.to_numpy())[~table.common]
    removals = []
    for pos, mine in flagged.groupby("pos", sort=True):
        first = mine.iloc[0]
        removals.append(dict(pos=int(pos), value=float(len(mine)),
                             detail=f"shares {dc.ngram}-gram {first.ngram!r} with {first.eval_set} item "
                                    f"{first.item_id} ({len(mine)} hits)"))
    if removals:
        con.register("_dc", pd.DataFrame(removals))
        con.execute(f"INSERT INTO removed SELECT pos, {_DECONTAM}, 'decontam.ngram_overlap', value, 1.0, detail "
                    "FROM _dc")
        con.unregister("_dc")
    return table


def _global_funnel(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Funnel rows of the global steps per source: documents and characters before and after each, from the
    sources' totals (``_totals``) less the removals of the earlier steps (O(removed documents))."""
    totals = con.execute("SELECT source, docs, chars FROM _totals ORDER BY source").df()
    gone = con.execute("SELECT k.source, r.step, count(*)::BIGINT AS docs, sum(k.n_chars)::BIGINT AS chars "
                       "FROM removed r JOIN info k USING (pos) GROUP BY k.source, r.step").df()
    steps = len(GLOBAL_STEPS)
    rows = []
    for source, docs, chars in zip(totals.source, totals.docs.tolist(), totals.chars.tolist()):
        mine = gone[gone.source == source]
        by_step = np.zeros((steps, 2), dtype=np.int64)
        by_step[mine.step.to_numpy(dtype=np.int64)] = mine[["docs", "chars"]].to_numpy(dtype=np.int64)
        after = np.array([docs, chars], dtype=np.int64) - np.cumsum(by_step, axis=0)  # (steps, 2)
        before = np.vstack([[docs, chars], after[:-1]])
        rows += [(step, source, *before[step], *after[step]) for step in range(steps)]
    frame = pd.DataFrame(sorted(rows), columns=["step", "source", "docs_in", "chars_in", "docs_out", "chars_out"])
    frame = frame.astype({c: "int64" for c in ("docs_in", "docs_out", "chars_in", "chars_out")})
    frame["stage"] = [GLOBAL_STEPS[s] for s in frame.pop("step")]
    return frame[FUNNEL_COLUMNS]


def write_shard(keyed_dir: str, decisions: str, shard: int, out_path: str, substring: str = "",
                filtered_dir: str = "", slices: str = "", removals_path: str = "") -> bool:
    """Pass 10 on one shard: its kept documents (``KEPT_COLUMNS``, in corpus order) with their family ids into
    ``out_path``, and every removal row of its documents (``REMOVAL_COLUMNS``, one per removed document, in corpus
    order: the filter and key passes', the global decisions' and, with ``substring``, the substring step's, whose
    cuts are applied to the kept texts) into ``removals_path``. The two files are this shard's parts of the
    artifact's ``kept/`` and ``removals/``: nothing joins them later."""
    out, removals_out = Path(out_path), Path(removals_path)
    if out.exists() and removals_out.exists():
        return False
    docs = pd.read_parquet(Path(keyed_dir) / "docs.parquet")
    keep = np.ones(len(docs), dtype=bool)
    folders = [Path(decisions)] + ([Path(substring)] if substring else [])
    for folder in folders:
        gone = _read_partition(folder / "removed" / f"shard={shard}", ["row"])
        if gone is not None:
            keep[gone.row.to_numpy(dtype=np.int64)] = False
    if substring:
        docs = docs.assign(text=_cut_texts(docs.text.to_numpy(dtype=object), Path(substring), shard))
    family_ids = docs.doc_id.to_numpy(dtype=object).copy()
    fams = _read_partition(Path(decisions) / "families" / f"shard={shard}", ["row", "family_id"])
    if fams is not None:
        family_ids[fams.row.to_numpy(dtype=np.int64)] = fams.family_id.to_numpy(dtype=object)
    kept = _kept_frame(docs[keep].reset_index(drop=True), family_ids[keep])
    del docs
    rows = [pd.read_parquet(Path(filtered_dir) / "removals.parquet"), pd.read_parquet(Path(keyed_dir) / "removals.parquet")]
    rows += [part for folder in folders
             if (part := _read_partition(folder / "removals" / f"shard={shard}", REMOVAL_COLUMNS)) is not None]
    removals = pd.concat([r[REMOVAL_COLUMNS] for r in rows if len(r)] or [rows[0][REMOVAL_COLUMNS]], ignore_index=True)
    # Corpus order, as the kept part: the parts of any shard size then concatenate to the same ledger.
    order = pd.Series(np.arange(0, dtype=np.int64))
    if len(removals):
        ids = read_slices(json.loads(slices), columns=["doc_id"]).doc_id
        order = pd.Series(np.arange(len(ids), dtype=np.int64), index=ids.astype(str).to_numpy())
        removals = removals.iloc[np.argsort(order.loc[removals.doc_id.astype(str)].to_numpy(), kind="stable")]
    for path, frame, schema in ((out, kept, _KEPT_SCHEMA), (removals_out, removals, _REMOVAL_SCHEMA)):
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path) as f:
            pq.write_table(pa.Table.from_pandas(frame, schema=schema, preserve_index=False), f)
    del kept, removals, order
    release_memory()
    return True


def _write_outputs(work: Path, names: list[str], out: Path, substring: bool = False) -> None:
    """The shards' parts into ``out/kept/part-NNNNN.parquet`` and ``out/removals/part-NNNNN.parquet`` (hard links
    where the filesystem allows, else copies: O(shards), no document is read), an empty part when there are no
    shards; the funnel summed over every pass; the decontamination hits; with ``substring``, its spans."""
    for folder in (KEPT_DIR, REMOVALS_DIR):
        (out / folder).mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(names):
            _link_or_copy(work / folder / f"{name}.parquet", out / folder / f"part-{i:05d}.parquet")
    if not names:
        pq.write_table(_KEPT_SCHEMA.empty_table(), out / KEPT_DIR / "part-00000.parquet")
        pq.write_table(_REMOVAL_SCHEMA.empty_table(), out / REMOVALS_DIR / "part-00000.parquet")
    files = [work / pass_ / name / "funnel.parquet" for name in names for pass_ in ("filtered", "keyed")]
    files.append(work / "decisions" / "funnel.parquet")
    if substring:
        files.append(work / "substring" / "funnel.parquet")
        shutil.copyfile(work / "substring" / "spans.parquet", out / "substring_spans.parquet")
    funnel = _read_funnels(files)
    funnel = funnel.groupby(["source", "stage"], sort=False, as_index=False).sum()
    order = {stage: i for i, stage in enumerate(ALL_STEPS)}
    funnel = funnel.sort_values(["source", "stage"], key=lambda s: s.map(order) if s.name == "stage" else s)
    funnel.reset_index(drop=True).to_parquet(out / "funnel.parquet", index=False)
    shutil.copyfile(work / "decisions" / "decontamination.parquet", out / "decontamination.parquet")


def _read_funnels(files: Sequence[Path]) -> pd.DataFrame:
    """The funnel rows (``FUNNEL_COLUMNS``) of ``files``, stacked in order: one multi-threaded pyarrow read rather
    than a read per file, since the main process reads two per shard."""
    if not files:
        return pd.DataFrame(columns=FUNNEL_COLUMNS)
    # One schema for all: a shard whose funnel is empty wrote untyped (null) columns.
    schema = pa.schema([("source", pa.string()), ("stage", pa.string())]
                       + [(c, pa.int64()) for c in FUNNEL_COLUMNS[2:]])
    return pq.read_table([str(f) for f in files], schema=schema).to_pandas()


def _link_or_copy(source: Path, target: Path) -> None:
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)  # the work folder keeps its copy until the artifact is committed
    except OSError:
        shutil.copyfile(source, target)


class _ParquetStream:
    """Appends frames to one Parquet file with a fixed schema; an empty file with that schema when none came."""

    def __init__(self, path: Path, schema: pa.Schema):
        self.path, self.schema = path, schema
        self.writer = pq.ParquetWriter(path, schema)

    def write(self, frame: pd.DataFrame) -> None:
        if len(frame):
            self.writer.write_table(pa.Table.from_pandas(frame, schema=self.schema, preserve_index=False))

    def write_table(self, table: pa.Table) -> None:
        if table.num_rows:
            self.writer.write_table(table.cast(self.schema))

    def __enter__(self) -> "_ParquetStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.writer.close()


_REMOVAL_SCHEMA = pa.schema([("doc_id", pa.string()), ("source", pa.string()), ("stage", pa.string()),
                             ("rule", pa.string()), ("value", pa.float64()), ("threshold", pa.float64()),
                             ("detail", pa.string())])
_QUALITY_REMOVED_SCHEMA = pa.schema([("doc_id", pa.string()), ("source", pa.string()), ("language", pa.string()),
                                     ("quality_score", pa.float64()), ("text", pa.string())])
_KEPT_SCHEMA = pa.schema([("doc_id", pa.string()), ("source", pa.string()), ("language", pa.string()),
                          ("lang_score", pa.float64()), ("text", pa.string()), ("n_chars", pa.int64()),
                          ("n_bytes", pa.int64()), ("n_words", pa.int64()), ("family_id", pa.string()),
                          ("pii_replacements", pa.int64()), ("lines_dropped", pa.int64()), ("fixes", pa.string()),
                          ("quality_score", pa.float64())])


def _kept_frame(docs: pd.DataFrame, family_ids: np.ndarray) -> pd.DataFrame:
    by_chars = _by_chars(docs.language.tolist())
    return docs.assign(
        n_chars=np.array([len(t) for t in docs.text], dtype=np.int64),
        n_bytes=[len(t.encode("utf-8")) for t in docs.text],
        n_words=[_count_words(t, c) for t, c in zip(docs.text, by_chars)],
        lang_score=docs.lang_score.astype(float),
        quality_score=docs.quality_score.astype(float),
        family_id=family_ids,
    )[KEPT_COLUMNS]


def _count_words(text: str, by_chars: bool) -> int:
    """Whitespace tokens; for character languages each CJK ideograph counts as a word."""
    if not by_chars:
        return len(text.split())
    return cjk_count(text) + sum(1 for tok in text.split() if cjk_count(tok) == 0)
