"""The filter audit flow: docs/methods.md §7 (TinyStories filter audit) on any configured source, tracked in MLflow and DuckDB.

    pretrain audit configs/demo.toml                          # every source, 5,000 originals each (the filter audit mix)
    pretrain audit configs/demo.toml --source python_doc      # one source
    pretrain audit configs/smoke.toml --originals 50 --runs-dir /tmp/smoke-runs
    pretrain audit configs/demo.toml --lsh-layout 20x10 --lsh-design s1=0.8,p1=0.95,s2=0.5,p2=0.05

Per source: inject labelled junk into its first N documents, run the real corpus build with the experiment's
``[corpus]`` config, and measure (``tasks.audit``). When that build scores with a trained quality classifier the
runs folder does not hold yet, ``pretrain audit`` first runs ``pretrain run CONFIG --until quality_model`` itself
and says so. When the pipeline's corpus stage has already produced an
artifact, up to K of its removed documents per rule are listed for review as well. Outputs go to
``<runs>/audit/<experiment>/<source>/``; each source gets an MLflow run (experiment = config name, tag
``audit_source``) with the figures as metrics and the folder as artifacts, and its crosstab goes to DuckDB
``audit_crosstab`` (one row per label × rule with n_docs > 0; ``artifact_key`` identifies the audit's inputs and
code, and a rerun with the same key replaces its rows), its HTML extractor comparison to ``audit_extractors``
(one row per extractor, for a source with HTML pages) and its detector comparison on the mock benchmark to
``audit_detectors`` (one row per form × detector). This module must be imported after
``RunsLayout.prepare_environment()`` (Prefect reads PREFECT_HOME on import).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.context import get_run_context
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flows.config import ExperimentConfig, load_config
from flows.keys import chain_keys
from infra.artifacts import Artifact, ArtifactStore, artifact_key, code_version_closure
from infra.errors import ConfigError
from infra.runs import RunsLayout
from infra.tracking import Tracker
from infra.warehouse import Warehouse
from tasks.audit.config import AuditConfig
from tasks.audit.review import review_corpus_removals
from tasks.audit.run import load_documents, load_pages, run_audit, write_audit
from tasks.readers import load_removals

AUDIT_CODE = "tasks.audit.run"  # the audit is keyed by the import closure of its entry, as stages are


def audit_dir(layout: RunsLayout, experiment: str, source: str) -> Path:
    return layout.root / "audit" / experiment / source


@task(name="audit-source", cache_policy=NO_CACHE, persist_result=False)
def audit_source(cfg: ExperimentConfig, source: str, layout: RunsLayout, audit_cfg: AuditConfig) -> dict[str, Any]:
    """Inject, build, measure and write one source's audit folder; returns {out_dir, report}."""
    docs, counts = load_documents(cfg.sources[source], layout.source_cache, cfg.corpus.extractor)
    originals, held_out = docs.head(audit_cfg.num_originals), docs.iloc[audit_cfg.num_originals:]
    pages = load_pages(cfg.sources[source], layout.source_cache, audit_cfg.extractor_pages, audit_cfg.seed)
    result = run_audit(originals, cfg.sources[source], cfg.corpus, audit_cfg, pages=pages,
                       quality_model=_quality_model(cfg, layout), held_out=held_out)
    result.report["source_read"] = counts
    out = audit_dir(layout, cfg.name, source)
    write_audit(result, out, f"{cfg.name} · {source}: LSH detection vs S-curve")
    return {"out_dir": str(out), "report": result.report}


def quality_model_missing(cfg: ExperimentConfig, layout: RunsLayout) -> bool:
    """Whether the audit needs the classifier the pipeline trains (``corpus.quality_model`` enabled, not
    ``pretrained``) and ``layout`` holds no quality_model artifact of the current config and code yet."""
    qm = cfg.corpus.quality_model
    if not qm.enabled or qm.kind == "pretrained":
        return False
    return _quality_artifact(cfg, layout) is None


def _quality_artifact(cfg: ExperimentConfig, layout: RunsLayout) -> Artifact | None:
    key = chain_keys(cfg, until="quality_model")["quality_model"].key
    return ArtifactStore(layout.artifacts).get("quality_model", key)


def _quality_model(cfg: ExperimentConfig, layout: RunsLayout) -> Path | None:
    """The classifier the audited build scores with: the quality_model artifact of the current config (or, for a
    pretrained classifier, its file); None when the model is disabled.

    Raises:
        ConfigError: the model is enabled and no artifact of the current config exists yet (``pretrain audit``
            runs the chain up to it first: ``quality_model_missing``).
    """
    from tasks.corpus.quality_stage import model_path

    qm = cfg.corpus.quality_model
    if not qm.enabled:
        return None
    if qm.kind == "pretrained":
        return Path(qm.path)
    artifact = _quality_artifact(cfg, layout)
    if artifact is None:
        raise ConfigError(f"corpus.quality_model is enabled and the audit scores with the trained classifier: run "
                          f"`pretrain run CONFIG --until quality_model --runs-dir {layout.root}` first")
    return model_path(artifact.path)


@task(name="audit-corpus-review", cache_policy=NO_CACHE, persist_result=False)
def review_corpus(cfg: ExperimentConfig, source: str, layout: RunsLayout, k: int, out_dir: str) -> dict[str, Any]:
    """List up to ``k`` removed documents per rule of the experiment's corpus artifact into corpus_review.csv.

    The artifact is the one the current config and code would use; failing that, the newest corpus artifact
    DuckDB ``stage_runs`` records for this experiment (``matches_current_config`` false). Returns what was found.
    """
    store = ArtifactStore(layout.artifacts)
    artifact, current = find_corpus_artifact(cfg, layout, store)
    if artifact is None:
        return {"found": False, "note": f"no corpus artifact of experiment {cfg.name!r} under {layout.artifacts}; "
                                        f"run `pretrain run` first to review real removals"}
    removals = load_removals(artifact.path)
    docs_path = _sources_docs(store, artifact, source)
    docs = pd.read_parquet(docs_path) if docs_path else pd.DataFrame(columns=["doc_id", "content", "content_type"])
    review = review_corpus_removals(removals, docs, source, k, cfg.seed, cfg.corpus.extractor)
    review.to_csv(Path(out_dir) / "corpus_review.csv", index=False)
    found = {"found": True, "artifact_key": artifact.key, "path": str(artifact.path),
             "matches_current_config": current, "rows": len(review),
             "removed_in_source": int((removals["source"] == source).sum())}
    _add_to_report(Path(out_dir), {"corpus_review": found})
    return found


def find_corpus_artifact(cfg: ExperimentConfig, layout: RunsLayout,
                         store: ArtifactStore) -> tuple[Artifact | None, bool]:
    """(corpus artifact, whether its key is the one the current config and code give) or (None, False)."""
    return find_stage_artifact(cfg, layout, store, "corpus")


def find_stage_artifact(cfg: ExperimentConfig, layout: RunsLayout, store: ArtifactStore,
                        name: str) -> tuple[Artifact | None, bool]:
    """(artifact of stage ``name``, whether its key is the one the current config and code give): the current
    key's artifact when it exists, else the newest one this experiment recorded, else (None, False)."""
    current = store.get(name, chain_keys(cfg, until=name)[name].key)
    if current is not None:
        return current, True
    warehouse = Warehouse(layout.duckdb)
    if not warehouse.has_table("stage_runs"):
        return None, False
    recorded = warehouse.query("SELECT DISTINCT artifact_key FROM stage_runs WHERE experiment = ? AND stage = ?",
                               [cfg.name, name])
    found = [a for a in (store.get(name, k) for k in recorded.get("artifact_key", [])) if a is not None]
    newest = max(found, key=lambda a: a.meta.get("committed_at", 0.0), default=None)
    return newest, False


def _sources_docs(store: ArtifactStore, corpus: Artifact, source: str) -> Path | None:
    sources = store.get("sources", corpus.meta.get("input_keys", {}).get("sources", ""))
    path = sources.path / "docs" / f"{source}.parquet" if sources else None
    return path if path is not None and path.is_file() else None


def _add_to_report(out_dir: Path, extra: dict[str, Any]) -> None:
    path = out_dir / "report.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **extra}, indent=2, ensure_ascii=False))


@task(name="audit-publish", cache_policy=NO_CACHE, persist_result=False)
def publish_audit(cfg: ExperimentConfig, source: str, layout: RunsLayout, audit_cfg: AuditConfig, out_dir: str,
                  flow_run_id: str) -> str:
    """One MLflow run with the audit's figures and files; the crosstab into DuckDB ``audit_crosstab`` and the
    extractor comparison into ``audit_extractors``. Returns the MLflow run id."""
    out = Path(out_dir)
    report = json.loads((out / "report.json").read_text())
    tracker = Tracker(layout.tracking_uri, layout.mlflow_artifacts, cfg.name)
    key = artifact_key("audit", {"source": cfg.sources[source].model_dump(), "corpus": cfg.corpus.model_dump(),
                                 "audit": audit_cfg.model_dump()}, {}, code_version_closure(AUDIT_CODE))
    review = report.get("corpus_review", {})
    run_id = tracker.start_run(f"audit:{source}", tags={
        "kind": "filter_audit", "audit_source": source, "audit_key": key, "prefect_flow_run_id": flow_run_id,
        "corpus_artifact": review.get("artifact_key", "none"), "audit_dir": str(out)})
    try:
        tracker.log_params(run_id, {"audit": audit_cfg.model_dump(), "near_dedup": cfg.corpus.near_dedup.model_dump(),
                                    "source": source})
        tracker.log_metrics(run_id, headline_metrics(report), step=0)
        tracker.log_artifact(run_id, out, "audit")
        crosstab = pd.read_csv(out / "crosstab.csv", index_col="label").drop(columns="total")
        long = crosstab.stack().rename("n_docs").reset_index().rename(columns={"level_1": "rule"})
        long = long.assign(experiment=cfg.name, source=source, mlflow_run_id=run_id,
                           audited_at=pd.Timestamp.now(tz="UTC"))
        Warehouse(layout.duckdb).replace("audit_crosstab", long[long["n_docs"] > 0].astype({"n_docs": int}), key)
        extractors = pd.read_parquet(out / "extractors.parquet") if (out / "extractors.parquet").exists() else None
        if extractors is not None and len(extractors):
            Warehouse(layout.duckdb).replace("audit_extractors", extractors.assign(
                experiment=cfg.name, mlflow_run_id=run_id, audited_at=pd.Timestamp.now(tz="UTC")), key)
        if (out / "detectors.csv").exists():
            detectors = pd.read_csv(out / "detectors.csv")
            Warehouse(layout.duckdb).replace("audit_detectors", detectors.assign(
                experiment=cfg.name, source=source, mlflow_run_id=run_id, audited_at=pd.Timestamp.now(tz="UTC")), key)
    except BaseException:
        tracker.end_run(run_id, "FAILED")
        raise
    tracker.end_run(run_id)
    return run_id


def headline_metrics(report: dict[str, Any]) -> dict[str, float]:
    """The audit's figures as flat MLflow metrics (counts, shares, MAE, detection rates, precision, recall)."""
    metrics = {
        "docs_in": report["pipeline"]["docs_in"], "docs_out": report["pipeline"]["docs_out"],
        "originals": report["originals"]["num"], "originals_removed": report["originals"]["removed"],
        "originals_removed_share": report["originals"]["removed_share"],
        "exact_copies_injected": report["exact_copies"]["injected"],
        "exact_copies_found": report["exact_copies"]["removed_by_exact_dedup"],
        "minhash_mae": report["minhash"]["mae"], "minhash_max_error": report["minhash"]["max_error"],
    }
    for row in report["lsh"]["bins"]:
        metrics[f"lsh_detection_rate_{row['lo']:g}_{row['hi']:g}"] = row["detection_rate"]
    for row in report["near_dedup"]["rows"]:
        metrics[f"precision_{row['truth']}_at_{row['threshold']:g}"] = row["precision"]
        metrics[f"recall_{row['truth']}_at_{row['threshold']:g}"] = row["recall"]
    for row in report.get("extractors", {}).get("rows", []):
        for figure in ("pages_without_text", "chars_kept", "line_overlap", "seconds_per_mb"):
            metrics[f"extractor_{row['extractor']}_{figure}"] = row[figure]
    for row in report.get("detectors", {}).get("rows", []):
        metrics[f"detector_{row['detector']}_{row['form']}_share"] = row["share"]
    quality = report.get("quality_model")
    if quality is not None:
        metrics["quality_model_precision"] = quality["precision"]["value"]
        metrics["quality_model_recall"] = quality["recall"]["value"]
        for kind, row in quality["recall_by_kind"].items():
            metrics[f"quality_model_recall_{kind}"] = row["value"]
        metrics["quality_model_originals_removed"] = len(quality["originals_removed"])
    return {k: float(v) for k, v in metrics.items() if v is not None}


@flow(name="pretrain-audit")
def audit(config_path: str, runs_dir: str, sources: list[str] | None = None,
          options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Audit the filters on each named source (default: every source of the config).

    ``options`` overrides ``AuditConfig`` fields (e.g. ``{"num_originals": 50, "lsh_layouts": ["20x10"]}``);
    the seed is the config's.
    Returns {experiment, sources: {name: {out_dir, mlflow_run_id, corpus_review}}}.

    Raises:
        ConfigError: a named source is not in the config, or an option is out of range.
    """
    cfg = load_config(config_path)
    layout = RunsLayout.resolve(runs_dir)
    names = list(sources or cfg.sources)
    unknown = [s for s in names if s not in cfg.sources]
    if unknown:
        raise ConfigError(f"--source {unknown} not in the config's sources {list(cfg.sources)}")
    audit_cfg = AuditConfig(**{"seed": cfg.seed, **(options or {})})
    flow_run_id = str(get_run_context().flow_run.id)
    done: dict[str, Any] = {}
    for name in names:
        built = audit_source(cfg, name, layout, audit_cfg)
        review = review_corpus(cfg, name, layout, audit_cfg.review_per_rule, built["out_dir"])
        run_id = publish_audit(cfg, name, layout, audit_cfg, built["out_dir"], flow_run_id)
        done[name] = {"out_dir": built["out_dir"], "mlflow_run_id": run_id, "corpus_review": review}
    return {"experiment": cfg.name, "sources": done}


def _quality_line(quality: dict[str, Any]) -> str:
    def shown(row: dict[str, Any]) -> str:
        if not row["n"]:
            return "n/a (none)"
        return f"{row['value']:.3f} [{row['ci95'][0]:.3f}, {row['ci95'][1]:.3f}] ({row['hits']}/{row['n']})"

    kinds = ", ".join(f"{kind} {shown(row)}" for kind, row in quality["recall_by_kind"].items())
    return (f"Quality classifier ({quality['rule']}) on the {quality['reached']:,} documents that reached it: "
            f"precision {shown(quality['precision'])}, recall of junk {shown(quality['recall'])}; by kind: {kinds}; "
            f"originals it removed: {len(quality['originals_removed'])} (in originals_removed.csv)")


def print_audit(result: dict[str, Any], console: Console | None = None) -> None:
    """Print each source's crosstab, headline figures, removed originals and the corpus review."""
    console = console or Console()
    for source, info in result["sources"].items():
        out = Path(info["out_dir"])
        report = json.loads((out / "report.json").read_text())
        console.rule(f"[bold]filter audit · {result['experiment']} · {source}")
        console.print(_table("First failing rule (rows) × injected label (columns; q.05 = near copy at word edit "
                             "rate 0.05), documents", crosstab_for_display(out / "crosstab.csv")))
        console.print(escape(_headline(report)))
        console.print(_table("LSH candidates among same-family pairs per exact-Jaccard bin, beside the S-curve",
                             _bins_for_display(report["lsh"]["bins"])))
        console.print(_table("Near dedup: predicted = LSH candidate and exact J ≥ t (definitions in report.json)",
                             pd.DataFrame(report["near_dedup"]["rows"])))
        extractors = report.get("extractors")
        if extractors is not None and extractors["rows"]:
            console.print(_table(f"HTML extractors on the same {extractors['rows'][0]['pages']:,} sampled pages "
                                 f"(corpus uses {extractors['configured']}; definitions in report.json)",
                                 _extractors_for_display(extractors["rows"])))
            if extractors["only_in_one"]:
                console.print(_table("Lines only one extractor kept (examples; all sampled in extractor_lines.csv)",
                                     pd.DataFrame(extractors["only_in_one"])))
        elif extractors is not None:
            console.print("HTML extractors: the source has no HTML pages to compare")
        detectors = report.get("detectors")
        if detectors is not None and detectors["rows"]:
            nd, ng = detectors["near_dedup"], detectors["ngram_overlap"]
            console.print(_table(
                f"Mock benchmark: share of planted documents each detector flags [95% Wilson] (flagged/reached); "
                f"{detectors['per_form']} per form, items of {detectors['item_units']} units; near_dedup "
                f"{nd['bands']}x{nd['rows']} verified at J >= {nd['jaccard_threshold']:g}, ngram_overlap "
                f"{ng['ngram']}-grams (definitions in report.json)", detectors_for_display(detectors["rows"])))
        elif detectors is not None:
            console.print(escape(f"Mock benchmark: skipped, {detectors['note']}"))
        layouts = report.get("lsh_layouts", {})
        if len(layouts.get("rows", [])) > 1 or layouts.get("design"):
            console.print(_table(_layouts_title(layouts["design"]), _layouts_for_display(layouts["rows"])))
        quality = report.get("quality_model")
        if quality is not None:
            console.print(escape(_quality_line(quality)))
        removed = pd.read_csv(out / "originals_removed.csv")
        if len(removed):
            console.print(_table(f"Originals removed ({len(removed):,}; first 20, all in originals_removed.csv): "
                                 "review for false positives",
                                 removed[["doc_id", "rule", "value", "threshold", "excerpt"]].head(20)))
        review = info["corpus_review"]
        if not review.get("found"):
            console.print(escape(review["note"]))
        else:
            frame = pd.read_csv(out / "corpus_review.csv")
            stale = "" if review["matches_current_config"] else " (built from an older config or code)"
            title = f"Corpus artifact {review['artifact_key']}{stale}: removed documents of {source} per rule"
            console.print(_table(title, frame[["doc_id", "rule", "value", "threshold", "excerpt"]]) if len(frame)
                          else escape(f"{title}: none"))
        console.print(f"files: {out}  (MLflow run {info['mlflow_run_id']}, DuckDB tables audit_crosstab, "
                      "audit_extractors, audit_detectors)")


def detectors_for_display(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The detector table turned wide: one row per form, one column per detector holding
    ``share [low, high] (flagged/reached)``."""
    table = pd.DataFrame(rows)

    def cell(row: pd.Series) -> str:
        if not row["reached"]:
            return f"n/a (0/{row['planted']} reached)"
        return f"{row['share']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}] ({row['flagged']}/{row['reached']})"

    wide = table.assign(cell=table.apply(cell, axis=1)).pivot(index="form", columns="detector", values="cell")
    forms = list(dict.fromkeys(table["form"]))
    return wide.reindex(forms).reset_index().rename_axis(columns=None)


def _layouts_title(design: dict[str, Any] | None) -> str:
    if design is None:
        return "LSH layouts: P(candidate) at the verification threshold (lsh_layouts.png)"
    return (f"LSH layouts against P({design['s1']:g}) >= {design['p1']:g} and P({design['s2']:g}) <= "
            f"{design['p2']:g} within {design['max_hashes']} hashes; designed: fewest hashes first "
            "(lsh_layouts.png)")


def _layouts_for_display(rows: list[dict[str, Any]]) -> pd.DataFrame:
    table = pd.DataFrame(rows)
    shown = table[["layout", "role", "hashes", "threshold", "p_at_jaccard_threshold"]].rename(
        columns={"threshold": "(1/b)^(1/r)", "p_at_jaccard_threshold": "P(verify J)"})
    if table["meets"].notna().any():
        shown = shown.assign(**{"P(s1)": table["p_at_s1"], "P(s2)": table["p_at_s2"], "margin": table["margin"],
                                "meets": table["meets"].map({True: "yes", False: "no"})})
    return shown


def _extractors_for_display(rows: list[dict[str, Any]]) -> pd.DataFrame:
    table = pd.DataFrame(rows)
    return pd.DataFrame({"extractor": table["extractor"], "pages": table["pages"],
                         "no text": table["pages_without_text"], "chars kept": table["chars_kept"],
                         "lines": table["lines_kept"], "share in other": table["line_overlap"],
                         "HTML MB": table["input_mb"], "s per MB": table["seconds_per_mb"]})


def _bins_for_display(rows: list[dict[str, Any]]) -> pd.DataFrame:
    bins = pd.DataFrame(rows)
    bins = bins[bins["num_pairs"] > 0]
    return pd.DataFrame({"Jaccard bin": [f"{lo:.1f}–{hi:.1f}" for lo, hi in zip(bins["lo"], bins["hi"])],
                         "pairs": bins["num_pairs"], "candidates": bins["num_candidates"],
                         "empirical": bins["detection_rate"], "S-curve": bins["theory_rate"]})


def crosstab_for_display(path: Path) -> pd.DataFrame:
    """crosstab.csv turned for a terminal: one row per rule, one short column per label."""
    table = pd.read_csv(path, index_col="label").T
    short = {"original": "orig", "navigation": "nav", "exact_copy": "exact"}
    table.columns = [short.get(c, c.replace("near_copy_0", "q")) for c in table.columns]
    return table.rename_axis("rule").reset_index()


def _headline(report: dict[str, Any]) -> str:
    o, e, m, p = report["originals"], report["exact_copies"], report["minhash"], report["pipeline"]
    stages = ", ".join(f"{n:,} {s}" for s, n in p["removed_by_stage"].items())
    lsh, c = report["lsh"], report["copies"]
    scaled = (f" (scaled down: {o['num']:,} originals take at most {c['max_copies_per_original']} copies each)"
              if c["scaled_down"] else "")
    return "\n".join([
        f"injected copies: {c['exact_copies']:,} exact + {c['near_per_rate']:,} near per edit rate{scaled}",
        f"pipeline: {p['docs_in']:,} in → {stages} → {p['docs_out']:,} out",
        f"originals removed: {o['removed']:,} / {o['num']:,} ({o['removed_share']:.2%})",
        f"exact copies found by exact dedup: {e['removed_by_exact_dedup']:,} / {e['injected']:,} "
        f"(exact-dedup removals, all labels: {e['exact_dedup_removals_all_labels']:,})",
        f"MinHash estimate vs exact Jaccard on {m['num_pairs']:,} copy-original pairs: MAE {_num(m['mae'])}, "
        f"max {_num(m['max_error'])} ({m['num_perm']} permutations)",
        f"LSH {lsh['bands']} bands × {lsh['rows']} rows: S-curve threshold (1/b)^(1/r) ≈ "
        f"{lsh['s_curve_threshold']:.2f}, candidates verified at J ≥ {lsh['jaccard_threshold']:g}",
    ])


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _table(title: str, frame: pd.DataFrame) -> Table:
    table = Table(title=escape(title), title_justify="left")
    for column in frame.columns:
        table.add_column(str(column), justify="right" if frame[column].dtype.kind in "if" else "left",
                         overflow="fold")
    for row in frame.itertuples(index=False):
        table.add_row(*[escape("-" if pd.isna(v) else f"{v:.3f}" if isinstance(v, float) else str(v)) for v in row])
    return table
