"""Corpus stage: curate the raw documents into the kept corpus, the removal ledger and the manifest.

Outputs: ``kept.parquet`` (one row per kept document), ``removals.parquet`` (exactly one row per removed
document, including read rejects), ``funnel.parquet`` (docs in/out per source and stage) and
``manifest.json`` (per source: snapshot, licence, filters, docs in/out, characters, bytes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from infra.errors import DataError
from infra.stage import StageContext
from tasks.corpus.build import build_corpus
from tasks.corpus.config import CorpusConfig
from tasks.sources.stage import load_docs


def run(ctx: StageContext, cfg: CorpusConfig, *, workers: int = 2) -> dict[str, Any]:
    """Build the corpus from the sources artifact; returns the funnel totals per source."""
    src = ctx.inputs["sources"]
    docs = load_docs(src)
    with ctx.progress.task("corpus: curating", None) as advance:
        result = build_corpus(docs, cfg, workers=workers, progress=lambda stage, done, total: advance(0))
    rejects = pd.read_parquet(src / "rejects.parquet")
    removals = pd.concat([rejects, result.removals], ignore_index=True) if len(rejects) else result.removals
    _reconcile(docs, rejects, result.kept, result.removals)
    result.kept.to_parquet(ctx.out / "kept.parquet", index=False)
    removals.to_parquet(ctx.out / "removals.parquet", index=False)
    result.funnel.to_parquet(ctx.out / "funnel.parquet", index=False)
    manifest = build_manifest(json.loads((src / "sources.json").read_text()), docs, rejects, result.kept, cfg)
    (ctx.out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return {"docs_in": int(len(docs) + len(rejects)), "docs_out": int(len(result.kept)),
            "removed": int(len(removals))}


def _reconcile(docs: pd.DataFrame, rejects: pd.DataFrame, kept: pd.DataFrame, removals: pd.DataFrame) -> None:
    """Every document read is either kept or removed with a reason: nothing is silently lost."""
    lost = set(docs["doc_id"]) - set(kept["doc_id"]) - set(removals["doc_id"])
    if lost:
        raise DataError(f"{len(lost)} documents neither kept nor removed, e.g. {sorted(lost)[:3]}")


def build_manifest(described: dict, docs: pd.DataFrame, rejects: pd.DataFrame, kept: pd.DataFrame,
                   cfg: CorpusConfig) -> list[dict[str, Any]]:
    """One manifest row per source (SPEC §7: source, snapshot, licence, filters, counts; tokens added later)."""
    rows = []
    for name, info in described.items():
        mine = kept[kept["source"] == name]
        rows.append({
            "source": name, "role": info["role"], "snapshot": info["snapshot"], "licence": info["licence"],
            "filters": cfg.model_dump_json(),
            "docs_in": int((docs["source"] == name).sum() + (rejects["source"] == name).sum()),
            "docs_out": int(len(mine)), "n_chars": int(mine["n_chars"].sum()), "n_bytes": int(mine["n_bytes"].sum()),
        })
    return rows


def load_kept(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path / "kept.parquet")
