"""The mixture stage's face: key (mixture, proxy, packing, seed), run, publish, figures."""

from __future__ import annotations

from typing import Any

from infra.stage import Stage, StageContext, lazy


def run_mixture(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.mixture.stage import run

    return run(ctx, cfg.mixture, cfg.proxy, general=cfg.general_sources, packing=cfg.packing,
               languages=source_languages(cfg))


def source_languages(cfg: Any) -> dict[str, str | None]:
    """Each general source's declared language (``sources.<name>.language``), which a temperature over languages
    (``alpha_over = "language"``) groups sources by."""
    return {name: cfg.sources[name].language for name in cfg.general_sources}


def key_languages(cfg: Any) -> dict[str, Any]:
    """The source languages, in the key only when some candidate's temperature is over languages (its weights then
    depend on them); otherwise nothing, so other keys stay as they were."""
    if any(c.alpha_over == "language" for c in cfg.mixture.candidates):
        return {"source_languages": source_languages(cfg)}
    return {}


STAGE = Stage(name="mixture", inputs=("tokenizer",), code="tasks.mixture", run=run_mixture,
              sections=("mixture", "proxy", "packing"), seeded=True, key_extra=key_languages, publish=lazy("tasks.mixture.publish:publish"), figures=lazy("tasks.mixture.plots:mixture_figures"),
              step_unit="candidate index",
              summary=lazy("tasks.mixture.views:summary"), report=lazy("tasks.mixture.views:report"))
