"""Corpus stage: curate the raw documents into the kept corpus, the removal ledger and the manifest.

Outputs: ``kept.parquet`` (one row per kept document), ``removals.parquet`` (exactly one row per removed
document, including read rejects), ``funnel.parquet`` (documents and characters in/out per source and stage),
``boilerplate.parquet`` (lines/paragraphs cut as cross-document boilerplate), ``decontamination.parquet`` (every
evaluation n-gram hit) and ``manifest.json`` (per source: snapshot, licence, filters with thresholds, counts per
stage, repairs, dedup clusters, decontamination hits; plus its SHA-256 ``manifest_hash``, which downstream stages
carry). Shards run through ``ctx.shard_map_for`` and their work folder survives a crash, so a rerun skips them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from infra.errors import DataError
from infra.stage import StageContext
from tasks.corpus.build import CURATION_STEPS, curate, split_sources
from tasks.corpus.config import CorpusConfig
from evals.contamination import EvalItem
from tasks.corpus.minhash import s_curve

MANIFEST_VERSION = 2


def run(ctx: StageContext, cfg: CorpusConfig, *, eval_items: Sequence[EvalItem] = ()) -> dict[str, Any]:
    """Build the corpus from the sources artifact; returns totals, the manifest hash and any warnings."""
    src = ctx.inputs["sources"]
    described = json.loads((src / "sources.json").read_text())
    work = ctx.scratch
    n_shards = split_sources([src / "docs" / f"{name}.parquet" for name in described], work,
                             cfg.execution.shard_docs)
    with ctx.progress.task(f"corpus: {n_shards} shards × 2 passes", 2 * n_shards + 1) as advance:
        shard_map = ctx.shard_map_for(cfg.execution.task_runner, cfg.execution.workers)
        result = curate(work, ctx.out, cfg, eval_items=eval_items,
                        shard_map=_counting(shard_map, advance))
        advance(1)
    rejects = pd.read_parquet(src / "rejects.parquet")
    removals = result.removals
    if len(rejects):
        removals = pd.concat([rejects, removals], ignore_index=True)
        removals.to_parquet(ctx.out / "removals.parquet", index=False)
    kept = result.kept
    read_ids = _read_ids(src, described)
    reconcile(read_ids, rejects, kept, result.removals)
    manifest = build_manifest(described, read_ids, rejects, kept, removals, result, cfg, eval_items)
    (ctx.out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    shutil.rmtree(work, ignore_errors=True)
    warnings = [w for s in manifest["sources"].values() for w in s["warnings"]]
    return {"docs_in": int(len(read_ids) + len(rejects)), "docs_out": int(len(kept)), "removed": int(len(removals)),
            "shards": n_shards, "manifest_hash": manifest["manifest_hash"], "warnings": warnings}


def _counting(shard_map, advance):
    def run(fn, calls, label):
        results = shard_map(fn, calls, label)
        advance(len(calls))
        return results
    return run


def _read_ids(src: Path, described: dict) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(src / "docs" / f"{name}.parquet", columns=["doc_id", "source"])
                      for name in described], ignore_index=True)


def reconcile(docs: pd.DataFrame, rejects: pd.DataFrame, kept: pd.DataFrame, removals: pd.DataFrame) -> None:
    """Every document read is either kept or removed with one reason: nothing is silently lost or counted twice.

    Raises:
        DataError: a document is neither kept nor removed, has two removal rows, or is both kept and removed.
    """
    lost = set(docs["doc_id"]) - set(kept["doc_id"]) - set(removals["doc_id"])
    if lost:
        raise DataError(f"{len(lost)} documents neither kept nor removed, e.g. {sorted(lost)[:3]}")
    twice = removals["doc_id"][removals["doc_id"].duplicated()]
    if len(twice):
        raise DataError(f"{twice.nunique()} documents have more than one removal row, e.g. {list(twice[:3])}")
    both = set(kept["doc_id"]) & set(removals["doc_id"])
    if both:
        raise DataError(f"{len(both)} documents are both kept and removed, e.g. {sorted(both)[:3]}")


def build_manifest(described: dict, docs: pd.DataFrame, rejects: pd.DataFrame, kept: pd.DataFrame,
                   removals: pd.DataFrame, result, cfg: CorpusConfig,
                   eval_items: Sequence[EvalItem]) -> dict[str, Any]:
    """The corpus manifest (docs/methods.md §7: per component source, snapshot, licence, filters, counts) and its hash.

    Per source: documents and characters in/out of every stage, removals by rule, repairs by fix name, PII
    placeholders, boilerplate lines cut, near-dedup clusters and decontamination hits. Corpus-wide ``near_dedup``:
    the LSH threshold, S-curve, unused signature values, candidate probability at ``jaccard_threshold`` and the
    config's warnings (``MinHashConfig.lsh_figures``, ``lsh_warnings``). Token counts are added by
    the tokenizer stage (tokens do not exist before it). ``manifest_hash`` is the SHA-256 of the manifest without it.
    """
    funnel = result.funnel
    hits = result.hits
    sources = {}
    for name, info in described.items():
        mine = kept[kept["source"] == name]
        gone = removals[removals["source"] == name]
        fixes = Counter(f.split(":")[-1] for cell in mine["fixes"] for f in cell.split(",") if f)
        rules_gopher, rules_chinese = cfg.rules_for(name)
        near = result.near.get(name, {})
        sources[name] = {
            "role": info["role"], "snapshot": info["snapshot"], "licence": info["licence"],
            "filters": {"languages": cfg.languages, "langid_threshold": cfg.langid_threshold,
                        "langid_thresholds": cfg.langid_thresholds, "gopher": rules_gopher.model_dump(),
                        "chinese": rules_chinese.model_dump(), "pii": cfg.pii, "exact_dedup": cfg.exact_dedup,
                        "near_dedup": cfg.near_dedup.model_dump(), "boilerplate": cfg.boilerplate.model_dump(),
                        "decontamination": cfg.decontamination.model_dump()},
            "docs_in": int((docs["source"] == name).sum() + (rejects["source"] == name).sum()),
            "docs_out": int(len(mine)), "n_chars": int(mine["n_chars"].sum()), "n_bytes": int(mine["n_bytes"].sum()),
            "n_words": int(mine["n_words"].sum()),
            "stages": {row.stage: {"docs_in": int(row.docs_in), "docs_out": int(row.docs_out),
                                   "chars_in": int(row.chars_in), "chars_out": int(row.chars_out)}
                       for row in funnel[funnel["source"] == name].itertuples()},
            "removed_by_rule": {str(k): int(v) for k, v in gone["rule"].value_counts().sort_index().items()},
            "repairs": dict(sorted(fixes.items())),
            "pii_replacements": int(mine["pii_replacements"].sum()),
            "lines_dropped": int(mine["lines_dropped"].sum()),
            "near_dedup": {k: v for k, v in near.items() if k != "warning"},
            "decontamination_hits": int((hits["source"] == name).sum()) if len(hits) else 0,
            "warnings": [near["warning"]] if near.get("warning") else [],
        }
        if (docs["source"] == name).sum() and not len(mine):
            sources[name]["warnings"].append(f"source {name} has no kept document")
    body = {
        "version": MANIFEST_VERSION, "stages": CURATION_STEPS, "sources": sources,
        "boilerplate_units": int(len(result.boilerplate)),
        "near_dedup": {**result.near.get("_all", {}),
                       **cfg.near_dedup.lsh_figures(), "warnings": cfg.near_dedup.lsh_warnings(),
                       "s_curve": [[s, p] for s, p in s_curve(cfg.near_dedup.bands, cfg.near_dedup.rows)]},
        "eval_sets": sorted({item.set_name for item in eval_items}),
        "eval_items": len(eval_items),
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return {**body, "manifest_hash": digest}



def manifest_rows(manifest: dict[str, Any]) -> pd.DataFrame:
    """One row per source of a manifest (for DuckDB's ``manifest`` table and summaries); nested parts as JSON."""
    rows = []
    for name, info in manifest["sources"].items():
        flat = {k: v for k, v in info.items() if not isinstance(v, (dict, list))}
        nested = {k: json.dumps(v, sort_keys=True) for k, v in info.items() if isinstance(v, (dict, list))}
        rows.append({"source": name, **flat, **nested, "manifest_hash": manifest["manifest_hash"]})
    return pd.DataFrame(rows)
