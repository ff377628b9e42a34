"""The continued-pretraining stage's face: key (grid, packing, seed, the cloze files' bytes), run, publish."""

from __future__ import annotations

import hashlib
from typing import Any

from infra.stage import Stage, StageContext, lazy


def key_cloze_files(cfg: Any) -> dict[str, list[str]]:
    from evals.cloze import cloze_files

    return {"cloze_items": [hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in cloze_files(cfg.gate.cloze_paths)]}


def run_cpt(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from evals.cloze import cloze_files, load_cloze_sets
    from tasks.cpt.stage import run

    return run(ctx, cfg.cpt, general=cfg.general_sources, cloze_items=load_cloze_sets(cloze_files(cfg.gate.cloze_paths)),
               packing=cfg.packing, samples=cfg.samples)


STAGE = Stage(name="cpt", inputs=("tokenizer", "mixture", "main"), code="tasks.cpt", run=run_cpt,
              sections=("cpt", "packing"), seeded=True, key_extra=key_cloze_files, publish=lazy("tasks.cpt.publish:publish"),
              step_unit="optimiser steps (metrics prefixed by candidate)",
              summary=lazy("tasks.cpt.views:summary"), report=lazy("tasks.cpt.views:report"))
