"""Corpus stage: curate the raw documents into the kept corpus, the removal ledger and the manifest.

Outputs: ``kept/part-NNNNN.parquet`` (one row per kept document, in corpus order, one part per input shard),
``removals/`` (exactly one row per removed document: ``rejects.parquet``, the documents the sources stage could not
read, then ``part-NNNNN.parquet`` in corpus order; ``tasks.readers`` lists them), ``funnel.parquet`` (documents and characters in/out per source and stage),
``boilerplate.parquet`` (lines/paragraphs cut as cross-document boilerplate), ``decontamination.parquet`` (every
evaluation n-gram hit), ``substring_spans.parquet`` (the spans exact-substring dedup cut, only when it is enabled)
and ``manifest.json`` (per source: snapshot, licence, filters with thresholds, counts per
stage, repairs, dedup clusters, decontamination hits; plus its SHA-256 ``manifest_hash``, which downstream stages
carry). Shards run through ``ctx.shard_map_for`` and their work folder survives a crash, so a rerun skips them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

import duckdb
import pandas as pd
import pyarrow.parquet as pq

from infra.atomic import atomic_file
from infra.errors import DataError
from infra.stage import StageContext
from tasks.corpus.build import curate, curation_steps, split_sources
from tasks.corpus.config import CorpusConfig
from evals.contamination import EvalItem
from tasks.corpus.minhash import s_curve
from tasks.readers import READ_REJECTS, REMOVALS_DIR, kept_files, removal_files

MANIFEST_VERSION = 2


def run(ctx: StageContext, cfg: CorpusConfig, *, eval_items: Sequence[EvalItem] = ()) -> dict[str, Any]:
    """Build the corpus from the sources artifact; returns totals, the manifest hash and any warnings."""
    src = ctx.inputs["sources"]
    described = json.loads((src / "sources.json").read_text())
    work = ctx.scratch
    n_shards = split_sources([src / "docs" / f"{name}.parquet" for name in described], work,
                             cfg.execution.shard_docs, cfg.execution.memory_limit)
    # At most seven shard passes (filter, key, key parts, shingle, verify, lookup, write; shingle, verify and
    # lookup only where there are candidate pairs) and the partition tasks (exact, candidates, and the boilerplate
    # count when it is on): an upper bound, topped up at the end.
    parts = cfg.execution.partitions * (3 if cfg.boilerplate.enabled else 2)
    total = 7 * n_shards + parts
    with ctx.progress.task(f"corpus: {n_shards} shard(s) × up to 7 passes + {parts} partition tasks",
                           total) as advance:
        shard_map = ctx.shard_map_for(cfg.execution)
        done = [0]
        result = curate(work, ctx.out, cfg, eval_items=eval_items,
                        shard_map=_counting(shard_map, advance, done), quality_model=_quality_model(ctx))
        advance(max(total - done[0], 0))  # the substring pass (opt-in) adds partitions
    rejects_path = src / "rejects.parquet"
    _add_rejects(rejects_path, ctx.out)
    docs_paths = [src / "docs" / f"{name}.parquet" for name in described]
    kept_paths, removal_paths = kept_files(ctx.out), removal_files(ctx.out)
    reconcile(docs_paths, [rejects_path], kept_paths, removal_paths)
    manifest = build_manifest(described, docs_paths, [rejects_path], kept_paths, removal_paths, result, cfg,
                              eval_items)
    (ctx.out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    warnings = [w for s in manifest["sources"].values() for w in s["warnings"]]
    n_docs = sum(_rows(f) for f in docs_paths) + _rows(rejects_path)
    return {"docs_in": int(n_docs), "docs_out": sum(map(_rows, kept_paths)), "removed": sum(map(_rows, removal_paths)),
            "shards": n_shards, "manifest_hash": manifest["manifest_hash"], "warnings": warnings}


def _quality_model(ctx: StageContext) -> Path | None:
    """The classifier file of the quality-model artifact this build reads, or None when it is disabled."""
    from tasks.corpus.quality_stage import model_path

    artifact = ctx.inputs.get("quality_model")
    return model_path(artifact) if artifact is not None else None


def _counting(shard_map, advance, done: list[int]):
    def run(fn, calls, label):
        advance(0, doing=f"{label.removeprefix('corpus-')} pass, {len(calls)} task(s)")
        results = shard_map(fn, calls, label)
        advance(len(calls))
        done[0] += len(calls)
        return results
    return run


def _rows(path: Path) -> int:
    return int(pq.ParquetFile(path).metadata.num_rows)


def _add_rejects(rejects: Path, out: Path) -> None:
    """The sources stage's rejects as the removal ledger's first part (``removals/rejects.parquet``), in the schema
    of the build's parts."""
    if not _rows(rejects):
        return
    schema = pq.ParquetFile(removal_files(out)[-1]).schema_arrow
    with atomic_file(out / REMOVALS_DIR / READ_REJECTS) as f:
        pq.write_table(pq.read_table(rejects).select(schema.names).cast(schema), f)


Table = pd.DataFrame | Sequence[Path]


def _register(con: duckdb.DuckDBPyConnection, name: str, table: Table, columns: dict[str, str]) -> None:
    """View ``name`` over a frame or Parquet files, with ``columns`` ({name: DuckDB type}); missing ones are NULL."""
    if isinstance(table, pd.DataFrame):
        frame = table.reindex(columns=[c for c in columns if c in table.columns])
        con.register(f"_{name}", frame if len(frame.columns) else pd.DataFrame({"_": []}))
        source = f"_{name}"
        present = set(frame.columns)
    else:
        files = [str(f) for f in table]
        present = {c for f in files for c in pq.ParquetFile(f).schema_arrow.names}
        source = f"read_parquet({files!r}, union_by_name = true)"
    select = ", ".join(f"{c}::{t} AS {c}" if c in present else f"NULL::{t} AS {c}" for c, t in columns.items())
    con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT {select} FROM {source}")


def reconcile(docs: Table, rejects: Table, kept: Table, removals: Table) -> None:
    """Every document read is either kept or removed with one reason: nothing is silently lost or counted twice.

    Each table is a frame or Parquet files with a ``doc_id`` column; DuckDB checks them out of core.

    Raises:
        DataError: a document is neither kept nor removed, has two removal rows, or is both kept and removed.
    """
    with duckdb.connect() as con:
        for name, table in (("docs", docs), ("kept", kept), ("removals", removals)):
            _register(con, name, table, {"doc_id": "VARCHAR"})
        lost = con.execute("SELECT doc_id FROM (SELECT doc_id FROM docs EXCEPT SELECT doc_id FROM kept "
                           "EXCEPT SELECT doc_id FROM removals) ORDER BY doc_id").fetchall()
        if lost:
            raise DataError(f"{len(lost)} documents neither kept nor removed, e.g. {[r[0] for r in lost[:3]]}")
        twice = con.execute("SELECT doc_id, count(*) FROM removals GROUP BY doc_id HAVING count(*) > 1 "
                            "ORDER BY doc_id").fetchall()
        if twice:
            raise DataError(f"{len(twice)} documents have more than one removal row, e.g. "
                            f"{[r[0] for r in twice[:3]]}")
        both = con.execute("SELECT doc_id FROM (SELECT doc_id FROM kept INTERSECT SELECT doc_id FROM removals) "
                           "ORDER BY doc_id").fetchall()
        if both:
            raise DataError(f"{len(both)} documents are both kept and removed, e.g. {[r[0] for r in both[:3]]}")


_KEPT_AGG = {"doc_id": "VARCHAR", "source": "VARCHAR", "n_chars": "BIGINT", "n_bytes": "BIGINT",
             "n_words": "BIGINT", "pii_replacements": "BIGINT", "lines_dropped": "BIGINT", "fixes": "VARCHAR"}


def build_manifest(described: dict, docs: Table, rejects: Table, kept: Table, removals: Table, result,
                   cfg: CorpusConfig, eval_items: Sequence[EvalItem]) -> dict[str, Any]:
    """The corpus manifest (docs/methods.md §7: per component source, snapshot, licence, filters, counts) and its hash.

    Per source: documents and characters in/out of every stage (the ``url`` stage also counts ``no_url``, the
    documents without a URL), removals by rule, repairs by fix name, PII placeholders, boilerplate lines cut,
    near-dedup clusters and decontamination hits; with ``[corpus.substring_dedup]`` enabled also ``substring_dedup``
    (documents touched and removed, spans and bytes cut, ``tasks.corpus.build._substring_decide``) per source and
    corpus-wide (partitions, settings). Corpus-wide ``near_dedup``: the LSH threshold, S-curve, unused
    signature values, candidate probability at ``jaccard_threshold`` and the config's warnings
    (``MinHashConfig.lsh_figures``, ``lsh_warnings``). Token counts are added by the tokenizer stage (tokens do not
    exist before it). ``manifest_hash`` is the SHA-256 of the manifest without it.
    The tables (frames or Parquet files) are aggregated by DuckDB, so the kept corpus is never loaded whole.
    """
    funnel = result.funnel
    hits = result.hits
    with duckdb.connect() as con:
        _register(con, "docs", docs, {"doc_id": "VARCHAR", "source": "VARCHAR", "url": "VARCHAR"})
        _register(con, "rejects", rejects, {"doc_id": "VARCHAR", "source": "VARCHAR"})
        _register(con, "kept", kept, _KEPT_AGG)
        _register(con, "removals", removals, {"doc_id": "VARCHAR", "source": "VARCHAR", "rule": "VARCHAR"})
        read = dict(con.execute("SELECT source, count(*) FROM docs GROUP BY source").fetchall())
        no_url = dict(con.execute("SELECT source, count(*) FROM docs WHERE url IS NULL OR "
                                  "regexp_full_match(url, '\\s*') GROUP BY source").fetchall())
        rejected = dict(con.execute("SELECT source, count(*) FROM rejects GROUP BY source").fetchall())
        totals = {r[0]: r[1:] for r in con.execute(
            "SELECT source, count(*), coalesce(sum(n_chars), 0), coalesce(sum(n_bytes), 0), "
            "coalesce(sum(n_words), 0), coalesce(sum(pii_replacements), 0), coalesce(sum(lines_dropped), 0) "
            "FROM kept GROUP BY source").fetchall()}
        fixes: dict[str, dict[str, int]] = {}
        for source, fix, n in con.execute(
                "SELECT source, string_split(f, ':')[-1] AS fix, count(*) FROM "
                "(SELECT source, unnest(string_split(fixes, ',')) AS f FROM kept WHERE fixes <> '') "
                "WHERE f <> '' GROUP BY source, fix ORDER BY source, fix").fetchall():
            fixes.setdefault(source, {})[fix] = int(n)
        by_rule: dict[str, dict[str, int]] = {}
        for source, rule, n in con.execute("SELECT source, rule, count(*) FROM removals GROUP BY source, rule "
                                           "ORDER BY source, rule").fetchall():
            by_rule.setdefault(source, {})[str(rule)] = int(n)
    url_filters = {**cfg.urls.model_dump(), "blocklist_files_digest": cfg.urls.files_digest()}
    sources = {}
    for name, info in described.items():
        n_kept, n_chars, n_bytes, n_words, pii, dropped = totals.get(name, (0, 0, 0, 0, 0, 0))
        rules_gopher, rules_chinese = cfg.rules_for(name)
        near = result.near.get(name, {})
        sources[name] = {
            "role": info["role"], "snapshot": info["snapshot"], "licence": info["licence"],
            "filters": {"languages": cfg.languages, "langid_threshold": cfg.langid_threshold,
                        "langid_thresholds": cfg.langid_thresholds, "gopher": rules_gopher.model_dump(),
                        "chinese": rules_chinese.model_dump(), "pii": cfg.pii, "exact_dedup": cfg.exact_dedup,
                        "near_dedup": cfg.near_dedup.model_dump(), "boilerplate": cfg.boilerplate.model_dump(),
                        "decontamination": cfg.decontamination.model_dump(),
                        "urls": url_filters},
            "docs_in": int(read.get(name, 0) + rejected.get(name, 0)),
            "docs_out": int(n_kept), "n_chars": int(n_chars), "n_bytes": int(n_bytes), "n_words": int(n_words),
            "stages": {row.stage: {"docs_in": int(row.docs_in), "docs_out": int(row.docs_out),
                                   "chars_in": int(row.chars_in), "chars_out": int(row.chars_out)}
                       for row in funnel[funnel["source"] == name].itertuples()},
            "removed_by_rule": by_rule.get(name, {}),
            "repairs": fixes.get(name, {}),
            "pii_replacements": int(pii),
            "lines_dropped": int(dropped),
            "near_dedup": {k: v for k, v in near.items() if k != "warning"},
            "decontamination_hits": int((hits["source"] == name).sum()) if len(hits) else 0,
            "warnings": [near["warning"]] if near.get("warning") else [],
        }
        if cfg.substring_dedup.enabled:  # absent when off, so a default build's manifest stays as it was
            sources[name]["filters"]["substring_dedup"] = cfg.substring_dedup.model_dump()
            sources[name]["substring_dedup"] = result.substring.get(name, {})
        if "url" in sources[name]["stages"]:  # documents the URL rules could not check
            sources[name]["stages"]["url"]["no_url"] = int(no_url.get(name, 0))
            sources[name]["stages"]["url"]["url_invalid"] = int(info.get("url_invalid", 0))  # counted in no_url
        if read.get(name, 0) and not n_kept:
            sources[name]["warnings"].append(f"source {name} has no kept document")
    body = {
        "version": MANIFEST_VERSION, "stages": curation_steps(cfg), "sources": sources,
        "boilerplate_units": int(result.boilerplate_units),
        "near_dedup": {**result.near.get("_all", {}),
                       **cfg.near_dedup.lsh_figures(), "warnings": cfg.near_dedup.lsh_warnings(),
                       "s_curve": [[s, p] for s, p in s_curve(cfg.near_dedup.bands, cfg.near_dedup.rows)]},
        "eval_sets": sorted({item.set_name for item in eval_items}),
        "eval_items": len(eval_items),
        "quality_model": _quality_manifest(result, cfg),
    }
    if cfg.substring_dedup.enabled:
        body["substring_dedup"] = result.substring.get("_all", {})
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return {**body, "manifest_hash": digest}



def _quality_manifest(result: Any, cfg: CorpusConfig) -> dict[str, Any]:
    """The quality classifier's part of the manifest: its action and threshold, the budget, the groups whose
    narrowing was accepted, and each group's removal share and verdict (``quality_stage.budget_verdicts``)."""
    from tasks.corpus.quality_stage import budget_verdicts

    qm = cfg.quality_model
    if not qm.enabled:
        return {"enabled": False}
    audit = pd.read_parquet(Path(result.out) / "quality_audit.parquet")
    verdicts = budget_verdicts(audit, qm) if len(audit) else pd.DataFrame()
    return {"enabled": True, "kind": qm.kind, "action": qm.action, "threshold": qm.threshold,
            "pareto_alpha": qm.pareto_alpha if qm.action == "sample" else None,
            "max_removed_share": qm.max_removed_share, "max_removed_share_by": dict(qm.max_removed_share_by),
            "accept_narrowing": list(qm.accept_narrowing),
            "groups": [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
                       for row in verdicts.to_dict("records")]}


def manifest_rows(manifest: dict[str, Any]) -> pd.DataFrame:
    """One row per source of a manifest (for DuckDB's ``manifest`` table and summaries); nested parts as JSON."""
    rows = []
    for name, info in manifest["sources"].items():
        flat = {k: v for k, v in info.items() if not isinstance(v, (dict, list))}
        nested = {k: json.dumps(v, sort_keys=True) for k, v in info.items() if isinstance(v, (dict, list))}
        rows.append({"source": name, **flat, **nested, "manifest_hash": manifest["manifest_hash"]})
    return pd.DataFrame(rows)
