"""The gate stage's face: key (the declared gate, seed), run, publish."""

from __future__ import annotations

from typing import Any

from infra.stage import Stage, StageContext, lazy


def run_gate(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.gate.stage import run

    return run(ctx, cfg.gate)


STAGE = Stage(name="gate", inputs=("main", "cpt"), code="tasks.gate", run=run_gate, sections=("gate",),
              seeded=True, publish=lazy("tasks.gate.publish:publish"),
              summary=lazy("tasks.gate.views:summary"), report=lazy("tasks.gate.views:report"))
