"""What a decay-branch artifact puts into DuckDB (``decay_branches``) and MLflow: held-out bits per byte per branch
and source, with the deltas to the branch point and to the main-mixture branch, each row with the corpus
``manifest_hash`` of the tokenizer input whose held-out shards were scored."""

from __future__ import annotations

import json
import math

import pandas as pd

from infra.stage import PublishContext, Published
from tasks.readers import recorded_manifest_hash


def publish(ctx: PublishContext) -> Published:
    path = ctx.artifact.path
    record = json.loads((path / "branches.json").read_text())
    if not record.get("requested"):
        return Published(tags={"branches": "not requested"})
    table = pd.read_parquet(path / "branches.parquet")
    metrics = {}
    for r in table.itertuples():
        for name in ("bits_per_byte", "delta_bpb_vs_branch_point", "delta_bpb_vs_main_mixture"):
            value = getattr(r, name)
            if value is not None and math.isfinite(value):  # no main-mixture delta on the main-mixture branch
                metrics[f"{r.branch}.{r.source}.{name}"] = float(value)
    return Published(
        tables={"decay_branches": table.assign(run_id=ctx.artifact.meta.get("mlflow_run_id", ""),
                                               manifest_hash=recorded_manifest_hash(ctx.inputs.get("tokenizer")))
                .astype({"manifest_hash": "string"})},
        metrics=metrics,
        params={"trunk_key": record["trunk_key"], "decay_shape": record["decay_shape"],
                "min_lr_ratio": record["min_lr_ratio"], "main_decay_start": record["main_decay_start"]},
        tags={"branches": ", ".join(b["branch"] for b in record["branches"])},
        files=["branches.json", "branches.parquet"],
    )
