"""What a corpus artifact puts into DuckDB and MLflow: the manifest, the removal ledger, the funnel, the
decontamination and boilerplate tables, each source's kept documents as a dataset input, and the LSH S-curve."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from infra.stage import Dataset, PublishContext, Published
from tasks.corpus.stage import manifest_rows
from tasks.readers import KEPT_DIR, kept_files, removal_files


def publish(ctx: PublishContext) -> Published:
    path = ctx.artifact.path
    body = json.loads((path / "manifest.json").read_text())
    manifest = manifest_rows(body).assign(experiment=ctx.cfg.name, tokens=pd.NA).astype({"tokens": "Int64"})
    near = body["near_dedup"]
    return Published(
        tables={"manifest": manifest, "removals": removal_files(path),  # read by DuckDB, out of core
                "funnel": pd.read_parquet(path / "funnel.parquet"),
                "decontamination": pd.read_parquet(path / "decontamination.parquet"),
                "boilerplate": pd.read_parquet(path / "boilerplate.parquet").astype({"unit_hash": "string"}),
                **_quality_tables(path), **_substring_tables(path)},
        datasets=source_datasets(path, body),
        tags={"manifest_hash": body["manifest_hash"]},
        params={"near_dedup.implied_threshold": round(near["implied_threshold"], 4)},
        # The LSH S-curve: P(candidate) at Jaccard s, with step = round(100·s) (step unit: Jaccard percent).
        series=[("near_dedup.p_candidate", p, int(round(100 * s))) for s, p in near["s_curve"]],
        files=["manifest.json", "funnel.parquet", "decontamination.parquet", "boilerplate.parquet",
               "quality_audit.parquet", "quality_examples.parquet"],
        metrics=_quality_metrics(body))


def source_datasets(corpus: Path, manifest: dict) -> list[Dataset]:
    """One MLflow dataset input per source, ``corpus/<source>``, read from the kept parts of the corpus artifact
    ``corpus`` (``tasks.readers.kept_files``); the dataset's source is the artifact's ``kept/`` folder.

    Digest: the XOR over the source's kept documents of MD5(UTF-8 of doc_id NUL text) read as a little-endian
    128-bit integer (DuckDB ``md5_number``), as 32 hex digits: a multiset hash (Bellare & Micciancio 1997, XHASH),
    so the same documents give the same digest in any order or corpus, computed by DuckDB out of core. Profile: the kept documents, characters, bytes and words (what the digest covers, so one
    digest always has one profile), the role and the snapshot. Tokens do not exist yet: the tokenizer stage logs
    ``token_shards/<source>`` with them and DuckDB ``tokenizer_sources`` holds them.
    """
    import duckdb

    with duckdb.connect() as con:
        rows = con.execute("SELECT source, count(*), bit_xor(md5_number(doc_id || chr(0) || text)) "
                           "FROM read_parquet(?) GROUP BY source ORDER BY source",
                           [[str(f) for f in kept_files(corpus)]]).fetchall()
    datasets = []
    for source, n_docs, digest in rows:
        info = manifest["sources"].get(source, {})
        profile = {"source": source, "docs": int(n_docs), "chars": int(info.get("n_chars", 0)),
                   "bytes": int(info.get("n_bytes", 0)), "words": int(info.get("n_words", 0)),
                   "role": info.get("role", ""), "snapshot": info.get("snapshot", "")}
        datasets.append(Dataset(f"corpus/{source}", f"{int(digest):032x}", Path(corpus) / KEPT_DIR, "training",
                                profile))
    return datasets


def _quality_tables(path) -> dict:
    """The quality classifier's audit and per-document scores (``tasks.corpus.build._quality_audit``), when it ran."""
    if not (path / "quality_audit.parquet").exists() or not len(pd.read_parquet(path / "quality_audit.parquet")):
        return {}
    return {"quality_model_audit": pd.read_parquet(path / "quality_audit.parquet"),
            "quality_scores": path / "quality_scores.parquet"}


def _substring_tables(path) -> dict:
    """The spans exact-substring dedup cut (``tasks.corpus.build.SPAN_COLUMNS``), when it ran."""
    spans = path / "substring_spans.parquet"
    return {"substring_spans": spans} if spans.exists() else {}  # read by DuckDB, out of core


def _quality_metrics(manifest: dict) -> dict[str, float]:
    """``quality_model.removed_share.<kind>.<group>`` per audited group of the manifest."""
    groups = manifest.get("quality_model", {}).get("groups", [])
    return {f"quality_model.removed_share.{g['group_kind']}.{g['group_name']}": float(g["removed_share"])
            for g in groups}
