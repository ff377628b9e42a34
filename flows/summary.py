"""The end-of-run summary: what the evidence says at each stage, and where to look next.

Reads only the artifact store (paths returned by the pipeline), so it works the same for a cold run and a
fully cached rerun. Each stage's section comes from its ``Stage.summary``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from rich.console import Console
from rich.markup import escape

from evals.decision import DecisionRecord
from flows.registry import STAGES
from infra.runs import RunsLayout
from infra.stage import SummaryContext
from infra.tracking import DEFAULT_UI, runs_page_url


def print_summary(result: dict[str, Any], layout: RunsLayout, console: Console | None = None, *,
                  max_epochs: float = 4.0, cfg: Any = None) -> None:
    """Print the per-stage evidence and the pointers to MLflow, DuckDB and the artifacts.

    Args:
        result: the pipeline's result (``experiment``, ``experiment_id``, ``paths`` and ``cached`` by stage).
        layout: the runs folder.
        console: where to print; a new ``Console`` when None.
        max_epochs: the config's ``mixture.max_epochs``: sources the main run repeats more often get a warning.
        cfg: the experiment config, handed to the stages' sections (None: they get none).
    """
    console = console or Console()
    # No line here sets soft_wrap: a terminal's console word-wraps at its width, a log file's keeps one line a record
    # (flows.cli.make_console).
    paths = {k: Path(v) for k, v in result["paths"].items()}
    cached = result["cached"]
    console.rule(f"[bold]pretrain · {result['experiment']}")
    console.print("stages: " + "  ".join(f"{s}={'cached' if c else 'ran'}" for s, c in cached.items()))
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
            console.print(f"[{colour}]{escape(record.line())}[/]")  # "[proxy] budget" is no markup
    missing = [stage.name for stage in with_section if stage.name not in paths]
    if missing:
        console.print(f"[bold]Stopped early[/] (--until): not run this time: {', '.join(missing)}")
    console.rule("where to look next")
    if layout.remote_tracking:
        console.print(f"MLflow UI:   {layout.tracking_uri}")
    else:
        console.print(f"MLflow UI:   {mlflow_ui_command(layout)}")
    if result.get("experiment_id"):  # the training runs, not the GenAI overview MLflow 3.17's UI opens on by default
        base = layout.tracking_uri if layout.remote_tracking else DEFAULT_UI
        console.print(f"Runs:        {runs_page_url(result['experiment_id'], base)}")
    console.print(f"DuckDB:      {duckdb_command(layout)}   (tables, columns and example queries: docs/duckdb.md)")
    console.print(f"Artifacts:   {layout.artifacts}")


DUCKDB_CLI = Path(".venv-duckdb-cli/bin/duckdb")  # where `make duckdb-cli` installs the DuckDB shell


def as_typed(path: Path) -> str:
    """``path`` as one would type it here: relative to the working directory when under it (``.venv/bin/mlflow``),
    else absolute."""
    path = path.absolute()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def mlflow_ui_command(layout: RunsLayout) -> str:
    """The ``mlflow ui`` command for the runs folder's store, with the ``mlflow`` beside this Python
    (``.venv/bin/mlflow``: the venv's bin folder need not be on PATH)."""
    exe = Path(sys.executable).parent / "mlflow"
    program = as_typed(exe) if exe.is_file() else "mlflow"
    return f"{program} ui --backend-store-uri {layout.tracking_uri} --host 127.0.0.1"


def duckdb_command(layout: RunsLayout) -> str:
    """A read-only DuckDB shell on the warehouse: ``$PRETRAIN_DUCKDB_CLI``, else the one ``make duckdb-cli``
    installs; when it is not there, the line says how to install it."""
    cli = Path(os.environ.get("PRETRAIN_DUCKDB_CLI") or DUCKDB_CLI)
    command = f"{as_typed(cli)} -readonly {as_typed(layout.duckdb)}"
    return command if cli.is_file() else f"{command}   (`make duckdb-cli` installs that shell)"


def collect_decisions(paths: dict[str, Path]) -> list[DecisionRecord]:
    """Every settled decision record (``evals.decision``) the run's artifacts hold, in pipeline order: the
    ``"decision"`` entry of any top-level JSON file of a stage's artifact folder, with what happened downstream
    (:func:`downstream`): the peak LR the main run trained at, the forecast's check against the measured loss."""
    return [downstream(record, paths) for record in _records(paths)]


def downstream(record: DecisionRecord, paths: dict[str, Path]) -> DecisionRecord:
    """``record`` with ``used`` and ``check`` filled from the run's main artifact (none: unchanged).

    ``peak_lr`` records: the LR the main run trained at, and which swept width it came from (the main run takes
    the swept width nearest its d_model, so a sweep at another width decides an LR that is not used).
    ``forecast`` records: ``covered`` or ``missed`` with the measured loss and the relative error
    (``tasks.ladder.fit.forecast_check`` on the main run's held-out loss over the general sources the ladder's
    ``forecast.json`` names).
    """
    main = paths.get("main")
    if main is None or not (main / "run.json").is_file():
        return record
    run = json.loads((main / "run.json").read_text())
    if record.kind == "peak_lr" and "peak_lr" in run:
        source = run.get("peak_lr_source") or {}
        width = record.evidence.get("d_model")
        if source.get("from") == "config":
            used = f"{run['peak_lr']:.4g}, set in [main] (not the sweep's)"
        elif width is not None and source.get("d_model") not in (None, width):
            used = (f"not this width's: the main run (d_model {source.get('main_d_model')}) trained at "
                    f"{run['peak_lr']:.4g}, the sweep at d_model {source['d_model']}")
        else:
            used = f"the main run trained at {run['peak_lr']:.4g}"
        return dataclasses.replace(record, used=used)
    forecast_file = paths["ladder"] / "forecast.json" if "ladder" in paths else None
    if record.kind == "forecast" and forecast_file is not None and forecast_file.is_file() \
            and (main / "heldout.parquet").is_file():
        from tasks.ladder.fit import forecast_check, token_weighted_loss

        sources = json.loads(forecast_file.read_text()).get("target", {}).get("general_sources")
        if not sources or not all(isinstance(v, float) and v == v for v in (record.estimate, record.low,
                                                                            record.high)):
            return record
        actual = token_weighted_loss(pd.read_parquet(main / "heldout.parquet"), sources)
        check = forecast_check(record.estimate, record.low, record.high, actual)
        word = "covered" if check["covered"] else "missed"
        return dataclasses.replace(record, check=f"{word}: measured {actual:.4f} nats/token, error "
                                                 f"{check['relative_error']:+.1%}")
    return record


def _records(paths: dict[str, Path]) -> list[DecisionRecord]:
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
