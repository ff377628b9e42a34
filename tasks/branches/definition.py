"""The decay-branch stage's face: key (the ``[main.branches]`` settings with the main run's, only when branches are
requested), run, expectations, publish, summary and report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra.stage import Stage, StageContext, lazy


def key_branches(cfg: Any) -> dict[str, Any]:
    """Nothing but "not requested" without ``[main.branches]``; else the branch settings, the main section's key
    fields, packing and the evaluated sources.

    Raises:
        ConfigError: ``main.branches.weights`` names a source the experiment does not have.
    """
    from infra.errors import ConfigError
    from infra.section import key_dump

    branches = cfg.main.branches
    if branches is None:
        return {"branches": False}
    unknown = sorted(set(branches.weights) - set(cfg.sources))
    if unknown:
        raise ConfigError(f"main.branches.weights: {unknown} are not sources of the experiment {sorted(cfg.sources)}")
    return {"branches": branches.model_dump(), "main": key_dump(cfg.main), "packing": key_dump(cfg.packing),
            "eval_sources": list(cfg.general_sources + cfg.domain_sources)}


def run_branches(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.branches.stage import run

    return run(ctx, cfg)


def check_branches(out: Path, cfg: Any) -> None:
    """Requested branches: one row per branch and evaluated source with finite, positive losses (Great
    Expectations ``heldout_loss`` suite) and every branch present."""
    record = json.loads((out / "branches.json").read_text())
    if not record.get("requested"):
        return
    import pandas as pd

    from infra.errors import DataError
    from infra.expectations import check_heldout

    table = pd.read_parquet(out / "branches.parquet")
    check_heldout(table)
    missing = sorted({b["branch"] for b in record["branches"]} - set(table["branch"]))
    if missing:
        raise DataError(f"branches.parquet lacks the rows of branches {missing}")


STAGE = Stage(name="branches", inputs=("tokenizer", "mixture", "sweep", "main"), code="tasks.branches",
              run=run_branches, seeded=True, key_extra=key_branches, validate=check_branches,
              publish=lazy("tasks.branches.publish:publish"), step_unit="branch index",
              summary=lazy("tasks.branches.views:summary"), report=lazy("tasks.branches.views:report"))
