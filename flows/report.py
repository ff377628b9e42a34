"""``pretrain report CONFIG``: one self-contained account of an experiment's evidence, from sources to the kept
checkpoint.

The artifacts are the ones the config's keys name (``flows.status.stage_statuses``), so the report describes
exactly what ``pretrain run CONFIG`` would reuse. A stage without a complete artifact is listed as missing and
its sections are left out; the rest is reported. Figures come from each stage's ``figures``; the main run's curves from
the metrics its MLflow run logged. DuckDB adds what only it holds: token counts per source, gate declarations,
and the MLflow runs that published each artifact (``stage_runs``).

The content is one list of blocks rendered three ways: rich tables in the terminal, Markdown with PNG files in
``plots/`` beside it, and one HTML file with the same figures embedded as base64.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Union

import pandas as pd
from rich.console import Console
from rich.markup import escape

from flows.config import ExperimentConfig
from flows.publish import training_history
from flows.registry import get_stage
from tasks.corpus.plots import funnel_counts
from flows.status import StageStatus, stage_statuses
from flows.summary import _fmt, _table, decision_frame, funnel_frame, inconclusive_lines
from infra.errors import ConfigError
from infra.runs import RunsLayout, ensure_folder
from infra.warehouse import Warehouse

FORMATS = ("md", "html")


@dataclass
class Heading:
    text: str


@dataclass
class Text:
    text: str


@dataclass
class TableBlock:
    title: str
    frame: pd.DataFrame


@dataclass
class Figure:
    path: Path
    caption: str


Block = Union[Heading, Text, TableBlock, Figure]


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
    sections = [("corpus", _corpus), ("tokenizer", _tokenizer), ("mixture", _mixture), ("sweep", _sweep),
                ("main", _main), ("cpt", _cpt), ("gate", _gate)]
    for stage, section in sections:
        if stage in paths:
            blocks.extend(section(paths[stage], paths, layout, warehouse, plots_dir))
    blocks.extend(_lineage(report, paths, layout, warehouse))
    return report


def _corpus(path: Path, paths, layout, warehouse: Warehouse, plots_dir: Path) -> list[Block]:
    manifest = json.loads((path / "manifest.json").read_text())
    out: list[Block] = [Heading("Sources and corpus")]
    funnel = funnel_frame(path)
    tokens = warehouse.query("SELECT source, tokens FROM manifest WHERE artifact_key = ?", [path.name]) \
        if warehouse.has_table("manifest") else pd.DataFrame()
    if not tokens.empty:
        funnel = funnel.merge(tokens, on="source", how="left")
    out.append(Text(f"Manifest `{manifest['manifest_hash'][:16]}` · {len(manifest['sources'])} sources · "
                    f"boilerplate units cut {manifest['boilerplate_units']:,}"))
    out.append(TableBlock("Documents per source (tokens: train + held-out after tokenization)", funnel))
    kept = pd.Series({name: int(info["docs_out"]) for name, info in manifest["sources"].items()})
    by_rule = funnel_counts(pd.read_parquet(path / "removals.parquet"), kept)
    out.append(TableBlock("Documents kept and removed by rule, per source",
                          by_rule.reset_index().rename(columns={"index": "source"})))
    figures = {p.name: p for p in get_stage("corpus").figures(path, plots_dir, None)}
    out.append(Figure(figures["funnel.png"], "Corpus funnel per source: kept, and removed by each rule"))
    near = json.loads((path / "meta.json").read_text())["config"]["corpus"]["near_dedup"]
    found = manifest["near_dedup"]
    out.append(Text(f"Near dedup: {near['bands']} bands × {near['rows']} rows of {near['num_perm']} MinHash values "
                    f"({near['family']}, {near['shingle_size']}-word shingles, scope {near['scope']}); the S-curve is "
                    f"steepest at s = {found['implied_threshold']:.3f}, candidates are removed at exact Jaccard ≥ "
                    f"{near['jaccard_threshold']:g}. Candidate pairs {found.get('candidate_pairs', 0):,}, verified "
                    f"{found.get('verified_pairs', 0):,}."))
    out.append(Figure(figures["s_curve.png"], "LSH S-curve of the configured bands and rows"))
    for name, info in manifest["sources"].items():
        out.extend(Text(f"Warning ({name}): {w}") for w in info.get("warnings", []))
    return out


def _tokenizer(path: Path, paths, layout, warehouse, plots_dir) -> list[Block]:
    meta = json.loads((path / "tokenizer.meta.json").read_text())
    report = pd.read_parquet(path / "report.parquet")
    out: list[Block] = [Heading("Tokenizer"), Text(
        f"Byte-level BPE, vocabulary {meta['vocab_size']:,} (embedding padded to {meta['padded_vocab_size']:,}), "
        f"hash `{meta['tokenizer_hash'][:16]}`. Fit sample weights: "
        + ", ".join(f"{s} {w:.3f}" for s, w in meta.get("fit_weights", {}).items()))]
    columns = ["group", "split", "n_docs", "n_tokens", "chars_per_token", "tokens_per_word", "word_unit"]
    for group_by in ("language", "source"):
        rows = report[report["group_by"] == group_by]
        out.append(TableBlock(f"Characters per token per {group_by} (a Chinese 'word' is a character)",
                              rows[[c for c in columns if c in rows]].sort_values(["group", "split"])))
    if (path / "fragmentation.parquet").exists():
        frag = pd.read_parquet(path / "fragmentation.parquet")
        frag["pieces"] = frag["pieces"].map(lambda p: " · ".join(map(str, p)))
        out.append(TableBlock("Fragmentation of domain terms", frag))
    return out


def _mixture(path: Path, paths, layout, warehouse, plots_dir) -> list[Block]:
    choice = json.loads((path / "choice.json").read_text())
    trials = pd.read_parquet(path / "trials.parquet")
    at_proxy = trials[trials["proxy"] == "proxy"] if "proxy" in trials else trials
    weights = at_proxy.pivot_table(index="candidate", columns="source", values="weight", aggfunc="first")
    scores = pd.DataFrame(choice["scores"]).merge(weights.round(3).reset_index(), on="candidate", how="left")
    scores.insert(1, "chosen", scores["candidate"].eq(choice["name"]).map({True: "yes", False: ""}))
    if "eligible" in scores:
        scores["eligible"] = scores["eligible"].map({True: "yes", False: "no"})
    out: list[Block] = [Heading("Mixture decision"), Text(f"Rule: {choice['rule']}."),
                        Text(f"**Chosen:** {choice['name']} (" + ", ".join(f"{s} {w:.3f}" for s, w in
                                                                            choice["weights"].items()) + ")")]
    if choice.get("runner_up"):
        out.append(Text(f"Runner-up {choice['runner_up']} ({choice['runner_up_score']:.4f}); margin "
                        f"{choice['margin']:.4f}."))
    for row in choice["scores"]:
        if not row.get("eligible", True):
            out.append(Text(f"Ineligible: {row['candidate']}, {row.get('reason', '')}"))
    if choice.get("transfer"):
        t = choice["transfer"]
        out.append(Text(f"Kendall τ between proxy sizes d_model {t['d_model']['proxy']} and "
                        f"{t['d_model']['transfer']}: {t['tau']:.3f} (p = {t['p_value']:.3g}); winner "
                        f"{'flips' if t['winner_flips'] else 'stays'}; {len(t['flipped_pairs'])} pair(s) swap order."))
    out.append(TableBlock("Candidates: score under the rule, eligibility, weights", scores))
    (figure,) = get_stage("mixture").figures(path, plots_dir, None)
    out.append(Figure(figure, "Score per candidate; the chosen one in orange, ineligible ones hatched"))
    return out


def _sweep(path: Path, paths, layout, warehouse, plots_dir) -> list[Block]:
    best = json.loads((path / "best.json").read_text())
    out: list[Block] = [Heading("Learning-rate sweep"), Text(
        f"**Best peak LR** {best['best_lr']:.3e} (proxy held-out {best['best_value']:.4f} nats/token), study "
        f"`{best['study_name']}`.")]
    if best.get("widths"):
        out.append(TableBlock("Best LR per width", pd.DataFrame(best["widths"])[["d_model", "best_lr", "best_value",
                                                                                "study_name"]]))
    if best.get("spread"):
        sp = best["spread"]
        out.append(Text(f"Spread: {sp['n_within']} of {sp['n_complete']} completed trials within "
                        f"{sp['tolerance']:.0%} of the best loss, LR {sp['lr_low']:.2e} – {sp['lr_high']:.2e}."))
    if best.get("lr_drift"):
        d = best["lr_drift"]
        out.append(Text(f"Drift across widths: ratio {d['ratio']:.2f}, lr* ∝ d_model^{d['exponent']:.2f}."))
    if isinstance(best.get("forecast"), list):
        out.append(TableBlock("Loss forecast of the best trial from the start of its curve",
                              pd.DataFrame(best["forecast"])))
    elif best.get("forecast"):
        out.append(Text(f"No loss forecast: {best['forecast']}"))
    if best.get("warning"):
        out.append(Text(f"Warning: {best['warning']}"))
    trials = pd.read_parquet(path / "trials.parquet")
    shown = [c for c in ("d_model", "number", "state", "peak_lr", "value", "last_step") if c in trials]
    if shown:
        out.append(TableBlock("Sweep trials", trials[shown]))
    return out


def _main(path: Path, paths, layout: RunsLayout, warehouse, plots_dir) -> list[Block]:
    run = json.loads((path / "run.json").read_text())
    out: list[Block] = [Heading("Main run"), Text(
        f"{run['steps']:,} steps, tokens_seen {run['tokens_seen']:,}, peak_lr {run['peak_lr']:.3e}, mixture "
        f"{run['mixture']}, final training loss {_fmt(run.get('final_loss_nats'), '{:.4f}')} nats/token, "
        f"{run.get('world_size', 1)} process(es) ({run.get('strategy', 'single')}).")]
    run_id = json.loads((path / "meta.json").read_text()).get("mlflow_run_id", "")
    history = _history(layout, run_id)
    figures = get_stage("main").figures(path, plots_dir, history)
    if figures:
        out.append(Figure(figures[0], f"Training loss and learning rate per step (MLflow run {run_id})"))
    else:
        out.append(Text(f"No loss or lr history found for MLflow run `{run_id or '?'}` in {layout.mlflow_db}."))
    heldout = pd.read_parquet(path / "heldout.parquet")
    out.append(TableBlock("Held-out loss per source", heldout[[c for c in ("source", "tokens", "loss_nats",
                                                                          "bits_per_byte") if c in heldout]]))
    if run.get("epochs"):
        out.append(Text("Epochs per source: " + ", ".join(f"{s} {e:.2f}" for s, e in run["epochs"].items())))
    return out


def _history(layout: RunsLayout, run_id: str) -> pd.DataFrame:
    if not run_id or not layout.mlflow_db.exists():  # a client on a missing file would create an empty store
        return pd.DataFrame()
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        return training_history(MlflowClient(layout.tracking_uri), run_id)
    except MlflowException:  # the run was deleted from the store: the report says the curves are absent
        return pd.DataFrame()


def _cpt(path: Path, paths, layout, warehouse, plots_dir) -> list[Block]:
    candidates = json.loads((path / "candidates.json").read_text())
    grid = pd.DataFrame([{"candidate": k, "replay_fraction": d.get("replay_fraction"),
                          "realised_replay": d.get("realised_replay_fraction"), "peak_lr": d.get("peak_lr"),
                          "general_loss_nats": d.get("general_loss_nats"),
                          "domain_loss_nats": d.get("domain_loss_nats"), "cloze_accuracy": d.get("cloze_accuracy")}
                         for k, d in candidates.items()])
    return [Heading("Continued pretraining grid"), TableBlock("CPT candidates (base first)", grid.fillna("-"))]


def _gate(path: Path, paths, layout, warehouse: Warehouse, plots_dir: Path) -> list[Block]:
    decision = json.loads((path / "decision.json").read_text())
    out: list[Block] = [Heading("Gate decision")]
    declared = warehouse.query("SELECT declared_at FROM gates WHERE gate_hash = ? ORDER BY declared_at LIMIT 1",
                               [decision["gate_hash"]]) if warehouse.has_table("gates") else pd.DataFrame()
    when = f", declared {declared['declared_at'].iloc[0]:%Y-%m-%d %H:%M:%S} UTC" if not declared.empty else ""
    gate_cfg = json.loads((path / "meta.json").read_text())["config"].get("gate", {})
    criteria = "; ".join(f"{c['name']}: {c['metric']} {c['op']} {c['threshold']:g} at {c['confidence']:.0%}"
                         for c in gate_cfg.get("criteria", []))
    out.append(Text(f"Gate `{decision['gate_hash'][:12]}`{when}. Criteria: {criteria or '(none recorded)'}."))
    table = pd.read_parquet(path / "decisions.parquet")
    counts = table["decision"].value_counts()
    out.append(Text(f"**Verdict:** kept `{decision['kept']}` ({len(table)} candidates: "
                    + ", ".join(f"{n} {d}" for d, n in counts.items()) + ")."))
    out.append(TableBlock("Decisions with intervals (domain reduction and general rise in nats, paired bootstrap)",
                          decision_frame(table)))
    out.extend(Text(line + ".") for line in inconclusive_lines(table))
    if (path / "gate_scatter.png").exists():
        shutil.copyfile(path / "gate_scatter.png", plots_dir / "gate_scatter.png")
        out.append(Figure(plots_dir / "gate_scatter.png", "Domain loss reduction against general loss rise, with "
                                                          "the thresholds"))
    return out


def _lineage(report: Report, paths: dict[str, Path], layout: RunsLayout, warehouse: Warehouse) -> list[Block]:
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
    if "gate" in paths:
        decision = json.loads((paths["gate"] / "decision.json").read_text())
        out.append(Text(f"Kept checkpoint: `{decision['kept_checkpoint']}` ({decision['kept']})."))
        out.append(Text(_registry_line(report.experiment, decision["kept_checkpoint"], layout)))
    return out


def _registry_line(experiment: str, checkpoint: str, layout: RunsLayout) -> str:
    name = f"{experiment}-base"
    if not layout.mlflow_db.exists():
        return f"Registry: no MLflow store at {layout.mlflow_db}."
    from mlflow import MlflowClient

    from mlflow.exceptions import MlflowException

    client = MlflowClient(layout.tracking_uri, registry_uri=layout.tracking_uri)
    try:
        kept = client.get_model_version_by_alias(name, "kept")
    except MlflowException:  # no such model or alias yet
        kept = None
    versions = [v for v in client.search_model_versions(f"name = '{name}'") if v.source == checkpoint]
    if not versions:
        return f"Registry: no version of `{name}` has this checkpoint as its source."
    version = max(versions, key=lambda v: int(v.version))
    alias = "alias `kept`" if kept is not None and kept.version == version.version else \
        f"alias `kept` points at version {kept.version} instead" if kept is not None else "no alias `kept`"
    return f"Registry: `{name}` version {version.version} ({alias}), registered by MLflow run {version.run_id}."


# ------------------------------------------------------------------------------------------------------------
# Rendering


def print_report(report: Report, console: Console) -> None:
    """The report in the terminal: headings as rules, tables as rich tables, figures as their file names."""
    console.rule(f"[bold]report · {report.experiment}")
    for block in report.blocks:
        if isinstance(block, Heading):
            console.rule(f"[bold]{escape(block.text)}", align="left")
        elif isinstance(block, Text):
            console.print(escape(block.text.replace("**", "").replace("`", "")), soft_wrap=True)
        elif isinstance(block, TableBlock):
            console.print(_table(block.title, block.frame))
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
        return _fmt(value, "{:.4f}").replace("|", "\\|").replace("\n", " ")

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
