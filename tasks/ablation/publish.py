"""What a quality-ablation artifact puts into DuckDB (``quality_ablation``) and MLflow: Δ bits per byte per source
with its interval and verdict, and the overall row; its decision record (``evals.decision``) goes to DuckDB
``decisions`` and to the tags ``decision.quality_ablation.*``."""

from __future__ import annotations

import json
import math

import pandas as pd

from evals.decision import DecisionRecord, decisions_frame

from infra.stage import PublishContext, Published


def publish(ctx: PublishContext) -> Published:
    path = ctx.artifact.path
    record = json.loads((path / "ablation.json").read_text())
    if not record.get("requested"):
        return Published(tags={"quality_ablation": "not requested"})
    table = pd.read_parquet(path / "ablation.parquet")
    overall = record["overall"]
    metrics = {f"{r.source}.{name}": float(getattr(r, name)) for r in table.itertuples()
               for name in ("bpb_with", "bpb_without", "delta_bpb", "delta_low", "delta_high")}
    metrics |= {f"overall.{k}": float(overall[k]) for k in ("delta_bpb", "delta_low", "delta_high")}
    out = Published(
        tables={"quality_ablation": table},
        metrics={k: v for k, v in metrics.items() if math.isfinite(v)},  # no interval (one held-out document): NaN
        params={"readded_docs": record["readded_docs"], "removed_docs": record["removed_docs"],
                "decontaminated_docs": record["decontaminated_docs"], "proxy_tokens": record["proxy"]["tokens"],
                "confidence": record["confidence"]},
        tags={"quality_ablation.overall": overall["verdict"],
              **{f"quality_ablation.{s}": v for s, v in record["verdicts"].items()}},
        parent_tags={"quality_ablation": overall["verdict"]},
        files=["ablation.json", "ablation.parquet"],
    )
    if isinstance(record.get("decision"), dict):  # artifacts written before the record existed have none
        decision = DecisionRecord.from_dict(record["decision"])
        out.tables["decisions"] = decisions_frame([decision])
        out.tags |= {"decision.quality_ablation.verdict": decision.verdict,
                     "decision.quality_ablation.choice": decision.choice}
    return out
