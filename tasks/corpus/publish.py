"""What a corpus artifact puts into DuckDB and MLflow: the manifest, the removal ledger, the funnel, the
decontamination and boilerplate tables, the kept corpus as a dataset input, and the LSH S-curve."""

from __future__ import annotations

import json

import pandas as pd

from infra.stage import Dataset, PublishContext, Published
from tasks.corpus.stage import manifest_rows


def publish(ctx: PublishContext) -> Published:
    path, key = ctx.artifact.path, ctx.artifact.key
    body = json.loads((path / "manifest.json").read_text())
    manifest = manifest_rows(body).assign(experiment=ctx.cfg.name, tokens=pd.NA).astype({"tokens": "Int64"})
    docs = {r["source"]: int(r["docs_out"]) for r in manifest.to_dict("records")}
    near = body["near_dedup"]
    return Published(
        tables={"manifest": manifest, "removals": path / "removals.parquet",  # read by DuckDB, out of core
                "funnel": pd.read_parquet(path / "funnel.parquet"),
                "decontamination": pd.read_parquet(path / "decontamination.parquet"),
                "boilerplate": pd.read_parquet(path / "boilerplate.parquet").astype({"unit_hash": "string"}),
                **_quality_tables(path)},
        datasets=[Dataset("kept_corpus", key, path / "kept.parquet", "training", docs)],
        tags={"manifest_hash": body["manifest_hash"]},
        params={"near_dedup.implied_threshold": round(near["implied_threshold"], 4)},
        # The LSH S-curve: P(candidate) at Jaccard s, with step = round(100·s) (step unit: Jaccard percent).
        series=[("near_dedup.p_candidate", p, int(round(100 * s))) for s, p in near["s_curve"]],
        files=["manifest.json", "funnel.parquet", "decontamination.parquet", "boilerplate.parquet",
               "quality_audit.parquet", "quality_examples.parquet"],
        metrics=_quality_metrics(body))


def _quality_tables(path) -> dict:
    """The quality classifier's audit and per-document scores (``tasks.corpus.build._quality_audit``), when it ran."""
    if not (path / "quality_audit.parquet").exists() or not len(pd.read_parquet(path / "quality_audit.parquet")):
        return {}
    return {"quality_model_audit": pd.read_parquet(path / "quality_audit.parquet"),
            "quality_scores": path / "quality_scores.parquet"}


def _quality_metrics(manifest: dict) -> dict[str, float]:
    """``quality_model.removed_share.<kind>.<group>`` per audited group of the manifest."""
    groups = manifest.get("quality_model", {}).get("groups", [])
    return {f"quality_model.removed_share.{g['group_kind']}.{g['group_name']}": float(g["removed_share"])
            for g in groups}
