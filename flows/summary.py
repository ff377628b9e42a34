"""The end-of-run summary: what the evidence says at each stage, and where to look next.

Reads only the artifact store (paths returned by the pipeline), so it works the same for a cold run and a
fully cached rerun. Each stage's section comes from its ``Stage.summary``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from evals.decision import DecisionRecord
from flows.registry import STAGES
from infra.runs import RunsLayout
from infra.stage import SummaryContext


def print_summary(result: dict[str, Any], layout: RunsLayout, console: Console | None = None, *,
                  max_epochs: float = 4.0, cfg: Any = None) -> None:
    """Print the per-stage evidence and the pointers to MLflow, DuckDB and the artifacts.

    Args:
        result: the pipeline's result (``experiment``, ``paths`` and ``cached`` by stage).
        layout: the runs folder.
        console: where to print; a new ``Console`` when None.
        max_epochs: the config's ``mixture.max_epochs``: sources the main run repeats more often get a warning.
        cfg: the experiment config, handed to the stages' sections (None: they get none).
    """
    console = console or Console()
    paths = {k: Path(v) for k, v in result["paths"].items()}
    cached = result["cached"]
    console.rule(f"[bold]pretrain · {result['experiment']}")
    console.print("stages: " + "  ".join(f"{s}={'cached' if c else 'ran'}" for s, c in cached.items()), soft_wrap=True)
    # Sections in pipeline order; a run stopped by ``--until`` shows its prefix.
    with_section = [stage for stage in STAGES if stage.summary is not None]
    for stage in with_section:
        if stage.name in paths:
            ctx = SummaryContext(path=paths[stage.name], paths=paths, layout=layout, max_epochs=max_epochs, cfg=cfg)
            for item in stage.summary(ctx):
                console.print(item)
    decisions = collect_decisions(paths)
    if decisions:
        console.rule("decisions")
        for record in decisions:
            colour = "green" if record.verdict == "decided" else "yellow"
            console.print(f"[{colour}]{record.line()}[/]", soft_wrap=True)
    missing = [stage.name for stage in with_section if stage.name not in paths]
    if missing:
        console.print(f"[bold]Stopped early[/] (--until): not run this time: {', '.join(missing)}")
    console.rule("where to look next")
    if layout.remote_tracking:
        console.print(f"MLflow UI:   {layout.tracking_uri}")
    else:
        console.print(f"MLflow UI:   mlflow ui --backend-store-uri {layout.tracking_uri} --host 127.0.0.1")
    console.print(f"DuckDB:      {layout.duckdb}   (tables, columns and example queries: docs/duckdb.md)")
    console.print(f"Artifacts:   {layout.artifacts}")


def collect_decisions(paths: dict[str, Path]) -> list[DecisionRecord]:
    """Every settled decision record (``evals.decision``) the run's artifacts hold, in pipeline order: the
    ``"decision"`` entry of any top-level JSON file of a stage's artifact folder."""
    records = []
    for stage in STAGES:
        folder = paths.get(stage.name)
        if folder is None or not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            found = data.get("decision") if isinstance(data, dict) else None
            if isinstance(found, dict) and found.get("kind") and found.get("verdict"):
                records.append(DecisionRecord.from_dict(found))
            extra = data.get("decisions") if isinstance(data, dict) else None
            for item in extra if isinstance(extra, list) else []:
                if isinstance(item, dict) and item.get("kind") and item.get("verdict"):
                    records.append(DecisionRecord.from_dict(item))
    return records
