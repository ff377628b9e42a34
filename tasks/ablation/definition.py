"""The quality-ablation stage's face: key (the proxy, packing and seed, only when the ablation is requested), run,
expectations, publish, summary and report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra.stage import Stage, StageContext, lazy


def key_ablation(cfg: Any) -> dict[str, Any]:
    """Nothing but "not requested" when ``[corpus.quality_model]`` does not ask for the ablation (so the proxy
    settings do not re-key an empty artifact); else the proxy, packing, seed, general sources and the held-out
    decontamination the re-added documents pass."""
    from infra.section import key_dump
    from tasks.ablation.stage import requested

    if not requested(cfg):
        return {"quality_ablation": False}
    return {"quality_ablation": True, "proxy": key_dump(cfg.proxy), "packing": key_dump(cfg.packing),
            "seed": cfg.seed, "seeds": cfg.corpus.quality_model.ablate_seeds, "general_sources": sorted(cfg.general_sources),
            "decontam": [cfg.tokenizer.decontam_ngram, cfg.tokenizer.decontam_common_docs]}


def run_ablation(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.ablation.stage import run

    return run(ctx, cfg)


def check_ablation(out: Path, cfg: Any) -> None:
    """A requested ablation has one row per evaluated source with finite figures, an interval around its estimate
    and a known verdict (Great Expectations, ``infra.expectations``)."""
    record = json.loads((out / "ablation.json").read_text())
    if not record.get("requested"):
        return
    import pandas as pd

    from infra.expectations import check_quality_ablation

    check_quality_ablation(pd.read_parquet(out / "ablation.parquet"))


STAGE = Stage(name="quality_ablation", inputs=("corpus", "tokenizer"), code="tasks.ablation", run=run_ablation,
              key_extra=key_ablation, validate=check_ablation, publish=lazy("tasks.ablation.publish:publish"),
              figures=lazy("tasks.ablation.views:figures"), step_unit="arm index (0 with, 1 without the classifier)",
              summary=lazy("tasks.ablation.views:summary"), report=lazy("tasks.ablation.views:report"))
