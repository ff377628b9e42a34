"""``pretrain report CONFIG``: one self-contained account of an experiment's evidence, from sources to the kept
checkpoint.

The artifacts are the ones the config's keys name (``flows.status.stage_statuses``), so the report describes
exactly what ``pretrain run CONFIG`` would reuse. A stage without a complete artifact is listed as missing and
its sections are left out; the rest is reported. Each stage's section comes from its ``Stage.report``; a stage
that ``wants_history`` gets the curves its MLflow run logged. DuckDB adds what only it holds: token counts per
source, gate declarations, and the MLflow runs that published each artifact (``stage_runs``).

The content is one list of blocks rendered three ways: rich tables in the terminal, Markdown with PNG files in
``plots/`` beside it, and one HTML file with the same figures embedded as base64.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
from rich.console import Console
from rich.markup import escape

from flows.config import ExperimentConfig
from flows.publish import training_history
from flows.registry import STAGES
from flows.status import StageStatus, stage_statuses
from infra.errors import ConfigError
from infra.report_blocks import Block, Figure, Heading, TableBlock, Text, fmt_value, rich_table
from infra.runs import RunsLayout, ensure_folder
from infra.artifacts import ArtifactStore
from infra.stage import PublishContext, Registration, ReportContext
from infra.warehouse import Warehouse

__all__ = ["Block", "Figure", "Heading", "Report", "TableBlock", "Text", "build_report", "print_report",
           "resolve_formats", "to_html", "to_markdown", "write_report"]

FORMATS = ("md", "html")


@dataclass
class Report:
    """The blocks of one experiment's report, and which stages had no complete artifact."""

    experiment: str
    statuses: list[StageStatus]
    blocks: list[Block] = field(default_factory=list)

    @property
    def missing(self) -> list[str]:
        return [s.stage for s in self.statuses if not s.cached]


def build_report(cfg: ExperimentConfig, layout: RunsLayout, plots_dir: Path) -> Report:
    """Collect every section the config's complete artifacts allow; figures are written into ``plots_dir``.

    Reads the artifact store, DuckDB and MLflow under ``layout``; writes nothing else.
    """
    statuses = stage_statuses(cfg, layout)
    report = Report(cfg.name, statuses)
    paths = {s.stage: Path(s.path) for s in statuses if s.cached}
    warehouse = Warehouse(layout.duckdb)
    blocks = report.blocks
    blocks.append(Text(f"Experiment `{cfg.name}` · runs folder `{layout.root}` · generated "
                       f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}"))
    blocks.append(TableBlock("Stages (artifacts named by the config's keys)", pd.DataFrame(
        [{"stage": s.stage, "key": s.key, "state": "complete" if s.cached else "missing",
          "why missing": "" if s.cached else (s.reasons[0] if s.reasons else "")} for s in statuses])))
    if report.missing:
        blocks.append(Text(f"**Missing stages:** {', '.join(report.missing)}. Their sections are left out; "
                           "`pretrain run CONFIG` computes them (`pretrain status CONFIG --explain` says why)."))
    ensure_folder(plots_dir, fix="choose another --out or --runs-dir")
    for stage in STAGES:  # pipeline order
        if stage.report is not None and stage.name in paths:
            path = paths[stage.name]
            history = _history(layout, json.loads((path / "meta.json").read_text()).get("mlflow_run_id", "")) \
                if stage.wants_history else None
            blocks.extend(stage.report(ReportContext(path=path, paths=paths, layout=layout, warehouse=warehouse,
                                                     plots_dir=plots_dir, cfg=cfg, history=history)))
    blocks.extend(_lineage(report, paths, layout, warehouse, cfg))
    return report


def _history(layout: RunsLayout, run_id: str) -> pd.DataFrame:
    if not run_id or not layout.mlflow_db.exists():  # a client on a missing file would create an empty store
        return pd.DataFrame()
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        return training_history(MlflowClient(layout.tracking_uri), run_id)
    except MlflowException:  # the run was deleted from the store: the report says the curves are absent
        return pd.DataFrame()


def _lineage(report: Report, paths: dict[str, Path], layout: RunsLayout, warehouse: Warehouse,
             cfg: ExperimentConfig) -> list[Block]:
    published = warehouse.query(
        "SELECT stage, artifact_key, mlflow_run_id FROM stage_runs WHERE experiment = ? QUALIFY row_number() OVER "
        "(PARTITION BY stage, artifact_key ORDER BY recorded_at DESC) = 1", [report.experiment]) \
        if warehouse.has_table("stage_runs") else pd.DataFrame(columns=["stage", "artifact_key", "mlflow_run_id"])
    latest = {(r.stage, r.artifact_key): r.mlflow_run_id for r in published.itertuples()}
    rows = []
    for s in report.statuses:
        if s.stage not in paths:
            rows.append({"stage": s.stage, "key": s.key, "inputs": "", "code_version": "", "produced_by_run": "",
                         "last_published_run": "", "wall_s": None})
            continue
        meta = json.loads((paths[s.stage] / "meta.json").read_text())
        rows.append({"stage": s.stage, "key": s.key,
                     "inputs": ", ".join(f"{n}:{k}" for n, k in meta.get("input_keys", {}).items()),
                     "code_version": meta.get("code_version", ""), "produced_by_run": meta.get("mlflow_run_id", ""),
                     "last_published_run": latest.get((s.stage, s.key), ""), "wall_s": meta.get("wall_s")})
    out: list[Block] = [Heading("Lineage"), TableBlock("Each stage's key, input keys, code version and MLflow runs",
                                                       pd.DataFrame(rows).fillna("-"))]
    for reg in _aliased_registrations(cfg, paths, layout):
        out.append(Text(f"{reg.alias.capitalize()} checkpoint: `{reg.source}` ({reg.tags.get('candidate', reg.model)})."))
        out.append(Text(_registry_line(reg.model, reg.alias, reg.source, layout)))
    return out


def _aliased_registrations(cfg: ExperimentConfig, paths: dict[str, Path], layout: RunsLayout) -> list[Registration]:
    """The model versions behind an alias that the reported artifacts registered when they were published (each
    stage's ``publish`` says so; nothing is written here)."""
    store = ArtifactStore(layout.artifacts)
    found = []
    for stage in STAGES:
        artifact = store.get(stage.name, paths[stage.name].name) if stage.name in paths else None
        if artifact is None:
            continue
        inputs = {n: a for n, k in artifact.meta.get("input_keys", {}).items() if (a := store.get(n, k)) is not None}
        published = stage.publish(PublishContext(artifact, inputs, cfg, cached=True))
        found += [reg for reg in published.registrations if reg.alias]
    return found


def _registry_line(name: str, alias: str, checkpoint: str, layout: RunsLayout) -> str:
    if not layout.mlflow_db.exists():
        return f"Registry: no MLflow store at {layout.mlflow_db}."
    from mlflow import MlflowClient

    from mlflow.exceptions import MlflowException

    client = MlflowClient(layout.tracking_uri, registry_uri=layout.tracking_uri)
    try:
        kept = client.get_model_version_by_alias(name, alias)
    except MlflowException:  # no such model or alias yet
        kept = None
    versions = [v for v in client.search_model_versions(f"name = '{name}'") if v.source == checkpoint]
    if not versions:
        return f"Registry: no version of `{name}` has this checkpoint as its source."
    version = max(versions, key=lambda v: int(v.version))
    where = f"alias `{alias}`" if kept is not None and kept.version == version.version else \
        f"alias `{alias}` points at version {kept.version} instead" if kept is not None else f"no alias `{alias}`"
    return f"Registry: `{name}` version {version.version} ({where}), registered by MLflow run {version.run_id}."


# ------------------------------------------------------------------------------------------------------------
# Rendering


def print_report(report: Report, console: Console) -> None:
    """The report in the terminal: headings as rules, tables as rich tables, figures as their file names."""
    console.rule(f"[bold]report · {report.experiment}")
    for block in report.blocks:
        if isinstance(block, Heading):
            console.rule(f"[bold]{escape(block.text)}", align="left")
        elif isinstance(block, Text):
            console.print(escape(block.text.replace("**", "").replace("`", "")))
        elif isinstance(block, TableBlock):
            console.print(rich_table(block.title, block.frame))
        else:
            console.print(f"[dim]figure {block.path.name}: {escape(block.caption)}[/]")


def to_markdown(report: Report, image: Callable[[Path], str]) -> str:
    """The report as Markdown; ``image`` maps a figure's file to the link written for it."""
    lines = [f"# Report: {report.experiment}", ""]
    for block in report.blocks:
        if isinstance(block, Heading):
            lines += [f"## {block.text}", ""]
        elif isinstance(block, Text):
            lines += [block.text, ""]
        elif isinstance(block, TableBlock):
            lines += [f"**{block.title}**", "", _markdown_table(block.frame), ""]
        else:
            lines += [f"![{block.caption}]({image(block.path)})", ""]
    return "\n".join(lines)


def _markdown_table(frame: pd.DataFrame) -> str:
    def cell(value) -> str:
        return fmt_value(value, "{:.4f}").replace("|", "\\|").replace("\n", " ")

    header = "| " + " | ".join(cell(str(c)) for c in frame.columns) + " |"
    rule = "|" + "|".join("---:" if frame[c].dtype.kind in "if" else "---" for c in frame.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])


HTML_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Report: {title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; }}
th {{ background: #f3f3f3; }}
img {{ max-width: 100%; }}
code {{ background: #f5f5f5; padding: 0 0.2em; }}
</style></head>
<body>
{body}
</body></html>
"""


def to_html(report: Report) -> str:
    """The report as one HTML page; figures are embedded as base64 PNG data URIs, so the file stands alone."""
    import markdown

    def embed(path: Path) -> str:
        return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")

    body = markdown.markdown(to_markdown(report, embed), extensions=["tables"])
    return HTML_PAGE.format(title=report.experiment, body=body)


def resolve_formats(fmt: str | None) -> tuple[str, ...]:
    """The formats to write for ``--format``: ``("md", "html")`` when it is None.

    Raises:
        ConfigError: ``fmt`` is neither ``md`` nor ``html``.
    """
    if fmt is None:
        return FORMATS
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r} is not one of {list(FORMATS)}; leave it out to write both")
    return (fmt,)


def write_report(report: Report, out: Path, formats: tuple[str, ...] = FORMATS) -> list[Path]:
    """Write ``report.md`` (figures linked from ``plots/``) and/or ``report.html`` into ``out``.

    Raises:
        ConfigError: a format other than ``md`` or ``html``.
        RunsFolderError: ``out`` or a folder above it is a file.
    """
    for fmt in formats:
        resolve_formats(fmt)
    ensure_folder(out, fix="choose another --out or --runs-dir")
    written = []
    if "md" in formats:
        path = out / "report.md"
        path.write_text(to_markdown(report, lambda p: p.relative_to(out).as_posix() if p.is_relative_to(out)
                                    else p.as_posix()))
        written.append(path)
    if "html" in formats:
        path = out / "report.html"
        path.write_text(to_html(report))
        written.append(path)
    return written
