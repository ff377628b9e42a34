"""The filter audit of one source (docs/methods.md §7 (TinyStories filter audit)), as plain functions.

    originals, _ = load_originals(source_cfg, layout.source_cache, 5000, corpus_cfg.extractor)
    pages = load_pages(source_cfg, layout.source_cache, AuditConfig().extractor_pages, seed=0)
    result = run_audit(originals, source_cfg, corpus_cfg, AuditConfig(), pages=pages)
    write_audit(result, layout.root / "audit" / experiment / source_cfg.name, title="demo · python_doc")

Takes the source's first N documents with text (HTML reduced to its main text by the corpus config's extractor),
injects labelled junk (``tasks.audit.inject``), runs the real corpus build with the experiment's corpus config on
the mixed set, and measures what it removed and why (``tasks.audit.measure``). A mock benchmark planted in the
source's text compares the near-dedup and n-gram contamination detectors (``tasks.audit.benchmark``). Given a
sample of the source's HTML pages, it also runs both HTML extractors on them and compares what each keeps
(``tasks.audit.extractors``).

Files written: crosstab.csv (label × first failing rule), pairs.parquet (near-dedup pairs), s_curve.png,
originals_removed.csv (every removed original with its rule and opening text), documents.parquet (the mixed set
with labels and rules), report.json (the headline figures) and, when pages were compared, extractors.parquet (the
extractor comparison) and extractor_lines.csv (lines only one extractor kept); with the mock benchmark,
detectors.csv (share flagged per form × detector) and detector_outcomes.parquet (each planted document's fate in
each detector's build); with listed layouts or design constraints, lsh_layouts.csv and lsh_layouts.png (their
S-curves beside the configured one, constraint box shaded).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from infra.atomic import atomic_dir
from infra.errors import DataError
from infra.runs import ensure_folder
from tasks.audit.benchmark import DetectorComparison, MockBenchmark, compare_detectors, make_benchmark
from tasks.audit.config import AuditConfig
from tasks.audit.extractors import ExtractorComparison, compare_extractors, sample_pages
from tasks.audit.inject import copy_counts, inject, labels, theoretical_jaccard
from tasks.audit.measure import (KEPT, crosstab, detection_by_bin, first_rules, minhash_error, pair_table,
                                 precision_recall, wilson_interval)
from tasks.audit.layouts import layout_table
from tasks.audit.plot import plot_lsh_layouts, plot_s_curve
from tasks.audit.review import with_excerpts
from tasks.corpus.build import build_corpus
from tasks.corpus.config import CorpusConfig
from tasks.corpus.extract import extract_many, tidy
from tasks.corpus.lsh_design import LshConstraints
from tasks.corpus.minhash import lsh_threshold
from tasks.corpus.quality import CHARACTER_LANGUAGES
from tasks.sources.config import SourceConfig
from tasks.sources.read import read_small_source

ShardProgress = Callable[[str, int, int], None]
EXTRACTOR_DEFINITION = (
    "the same sampled HTML pages through each extractor, outputs tidied as the corpus build's extract stage does. "
    "lines: distinct non-empty lines per page, whitespace collapsed. line_overlap: sum over pages of lines also kept "
    "by the other extractor on that page / sum of lines kept. seconds: wall time of the extractor calls in this run; "
    "seconds_per_mb: per 10^6 bytes of UTF-8 HTML."
)
DETECTOR_DEFINITION = (
    "a mock benchmark of passages of the source's own held-out text, planted verbatim, wrapped between unrelated "
    "passages, with paraphrase-like edits at rate q (each unit substituted, deleted or swapped with the next with "
    "probability q), and unrelated control passages (false positives). near_dedup: the corpus build with the "
    "benchmark items first in the corpus, exact dedup and decontamination off; flagged = removed as dedup.near. "
    "ngram_overlap: the corpus build with the items as evaluation set, near dedup off; flagged = removed as "
    "decontam.ngram_overlap. reached: not removed by an earlier rule of that build (near_dedup: nor its item). "
    "share = flagged / reached with a 95% Wilson interval."
)
PR_DEFINITION = (
    "pairs: every (near copy, its original) pair plus every LSH candidate pair of documents with different "
    "originals, among originals and near copies. predicted duplicate: LSH candidate (configured bands x rows) and "
    "exact Jaccard >= t. truth 'theory': a copy-original pair with J = s/(2-s) >= t, s = (1-q)^n (docs/methods.md §7). "
    "truth 'exact': a copy-original pair with exact Jaccard >= t."
)


@dataclass
class AuditResult:
    """Everything one audit measured.

    ``documents``: the mixed set with ``label``, ``original_id``, ``edit_rate``, ``stage`` and ``rule`` of the
    first removal (rule "kept" when kept); ``crosstab``: documents per label × rule; ``pairs``:
    ``measure.PAIR_COLUMNS``; ``bins``: LSH detection per Jaccard bin; ``precision_recall``: per truth and
    threshold; ``originals_removed``: ``review.REVIEW_COLUMNS``; ``report``: JSON-able headline figures;
    ``extractors``: both HTML extractors on a sample of the source's pages, None when no pages were given;
    ``detectors``: near dedup and n-gram decontamination on the planted mock benchmark, None when skipped;
    ``layouts``: the LSH layouts compared (``layouts.LAYOUT_COLUMNS``).
    """

    source: str
    documents: pd.DataFrame
    crosstab: pd.DataFrame
    pairs: pd.DataFrame
    bins: pd.DataFrame
    precision_recall: pd.DataFrame
    originals_removed: pd.DataFrame
    report: dict[str, Any]
    extractors: ExtractorComparison | None = None
    detectors: DetectorComparison | None = None
    layouts: pd.DataFrame | None = None


def load_originals(source: SourceConfig, cache_dir: Path, n: int,
                   extractor: str = "trafilatura") -> tuple[pd.DataFrame, dict[str, int]]:
    """The first ``n`` documents of ``source`` that have text, in the source's (sorted path) order
    (:func:`load_documents`, first ``n`` rows).

    Returns:
        (frame with columns doc_id, text; {"docs_read", "docs_without_text"}).

    Raises:
        SourceError: the source cannot be read (see ``read_source``).
        DataError: no document of the source has text.
    """
    docs, counts = load_documents(source, cache_dir, extractor)
    return docs.head(n).reset_index(drop=True), counts


def load_documents(source: SourceConfig, cache_dir: Path,
                   extractor: str = "trafilatura") -> tuple[pd.DataFrame, dict[str, int]]:
    """Every document of ``source`` that has text, in the source's (sorted path) order: the audit's originals
    first, the rest held out (the mock benchmark's passages come from them, ``tasks.audit.benchmark``).

    HTML pages are reduced to their main text with the corpus extractor ``extractor`` (``[corpus] extractor``);
    documents without text are skipped.

    Returns:
        (frame with columns doc_id, text; {"docs_read", "docs_without_text"}).

    Raises:
        SourceError: the source cannot be read (see ``read_source``).
        DataError: no document of the source has text.
    """
    docs = read_small_source(source, cache_dir).docs
    html = (docs["content_type"] == "html").to_numpy()
    texts = docs["content"].tolist()
    for i, main in zip(html.nonzero()[0], extract_many(docs["content"][html].tolist(), extractor=extractor)):
        texts[i] = main
    texts = [tidy(t) if isinstance(t, str) else "" for t in texts]
    frame = pd.DataFrame({"doc_id": docs["doc_id"], "text": texts})
    with_text = frame[frame["text"].str.strip() != ""]
    if with_text.empty:
        raise DataError(f"source {source.name!r}: none of its {len(docs)} documents has text to audit")
    counts = {"docs_read": int(len(docs)), "docs_without_text": int(len(frame) - len(with_text))}
    return with_text.reset_index(drop=True), counts


def load_pages(source: SourceConfig, cache_dir: Path, n: int, seed: int) -> pd.DataFrame:
    """Up to ``n`` of ``source``'s HTML pages (doc_id, content: decoded HTML), drawn with ``seed``
    (``extractors.sample_pages``); empty when the source has no HTML or ``n`` is 0.

    Raises:
        SourceError: the source cannot be read (see ``read_source``).
    """
    if n == 0:
        return pd.DataFrame(columns=["doc_id", "content"])
    return sample_pages(read_small_source(source, cache_dir).docs, n, seed)


def run_audit(originals: pd.DataFrame, source: SourceConfig, corpus: CorpusConfig, cfg: AuditConfig,
              progress: ShardProgress | None = None, pages: pd.DataFrame | None = None,
              quality_model: Path | None = None, held_out: pd.DataFrame | None = None) -> AuditResult:
    """Inject labelled junk into ``originals`` (doc_id, text), run ``build_corpus`` with ``corpus``, measure;
    compare the HTML extractors on ``pages`` (doc_id, content) when given (``extractors.compare_extractors``);
    with ``cfg.benchmark_items`` > 0, plant a mock benchmark cut from ``held_out`` (doc_id, text: the source's
    documents after the originals) and the last originals, and compare the near-dedup and n-gram contamination
    detectors on it (``tasks.audit.benchmark``, two more builds); tabulate the LSH layouts
    (``tasks.audit.layouts``).

    The source's language hint picks the junk language and the shingle unit (characters for languages written
    without spaces); a source without a hint is treated as English. The build writes into a temporary folder
    that is removed afterwards; no evaluation sets are passed, so its decontamination stage removes nothing.
    ``quality_model``: the trained classifier file when ``corpus.quality_model`` is enabled (the pipeline's
    quality_model artifact); the report then measures it (:func:`quality_model_report`).

    Raises:
        DataError: ``originals`` is empty.
    """
    if originals.empty:
        raise DataError(f"source {source.name!r}: no originals to audit")
    language = source.language or "en"
    by_chars = language in CHARACTER_LANGUAGES
    mixed = inject(originals, source.name, language, by_chars, cfg)
    with tempfile.TemporaryDirectory(prefix="audit-corpus-") as build_dir:
        built = build_corpus(mixed, corpus, out=Path(build_dir), progress=progress, quality_model=quality_model)
        removals, funnel = built.removals, built.funnel
    stage_of = dict(zip(removals["doc_id"], removals["stage"]))
    documents = mixed.assign(stage=mixed["doc_id"].map(lambda d: stage_of.get(d, KEPT)),
                             rule=first_rules(mixed["doc_id"], removals))
    rule_order = list(removals.assign(order=removals["stage"].map(_stage_rank(funnel)))
                      .sort_values(["order", "rule"])["rule"].drop_duplicates())
    table = crosstab(documents["label"], documents["rule"], labels(cfg), rule_order)
    near = documents[documents["label"].str.startswith(("original", "near_copy"))]
    pairs = pair_table(pd.DataFrame({"doc_id": near["doc_id"], "text": near["content"], "label": near["label"],
                                     "family": near["original_id"], "edit_rate": near["edit_rate"].fillna(0.0)}),
                       by_chars, corpus.near_dedup)
    mh = corpus.near_dedup
    bins = detection_by_bin(pairs, cfg.bin_edges, mh.bands, mh.rows)
    pr = precision_recall(pairs, cfg.thresholds)
    removed = removals[removals["doc_id"].isin(originals["doc_id"])]
    originals_removed = with_excerpts(removed, dict(zip(originals["doc_id"], originals["text"])))
    report = _report(source, language, by_chars, cfg, corpus, documents, funnel, pairs, bins, pr,
                     originals_removed)
    if corpus.quality_model.enabled:
        report["quality_model"] = _json_safe({**quality_model_report(documents, originals_removed),
                                              "model": str(quality_model), "threshold": corpus.quality_model.threshold,
                                              "action": corpus.quality_model.action})
    extractors = None
    if pages is not None:
        extractors = compare_extractors(pages, source.name, cfg.extractor_examples, cfg.seed)
        report["extractors"] = _json_safe(_extractor_summary(extractors, corpus.extractor))
    layouts = layout_table(mh, cfg)
    report["lsh_layouts"] = _json_safe({"design": cfg.lsh_design.model_dump() if cfg.lsh_design else None,
                                        "rows": layouts.to_dict("records")})
    detectors = None
    if cfg.benchmark_items:
        bench = make_benchmark(originals, held_out, source.name, by_chars, cfg)
        if bench.per_form:
            detectors = compare_detectors(bench, source.name, language, corpus, cfg, quality_model)
        report["detectors"] = _json_safe(_detector_summary(bench, detectors, corpus, cfg))
    return AuditResult(source.name, documents, table, pairs, bins, pr, originals_removed, report, extractors,
                       detectors, layouts)


def _detector_summary(bench: MockBenchmark, detectors: DetectorComparison | None, corpus: CorpusConfig,
                      cfg: AuditConfig) -> dict[str, Any]:
    mh = corpus.near_dedup
    out = {"definition": DETECTOR_DEFINITION, "per_form": bench.per_form, "wanted_per_form": cfg.benchmark_items,
           "items": len(bench.items), "item_units": cfg.benchmark_words, "pool_docs": len(bench.pool_docs),
           "background_docs": len(bench.background),
           "near_dedup": {"enabled": mh.enabled, "bands": mh.bands, "rows": mh.rows,
                          "jaccard_threshold": mh.jaccard_threshold, "shingle_size": mh.shingle_size},
           "ngram_overlap": {"enabled": corpus.decontamination.enabled, "ngram": corpus.decontamination.ngram,
                             "common_min_docs": corpus.decontamination.common_min_docs}}
    if detectors is None:
        return {**out, "rows": [], "note": "too few passages of benchmark_words units for one document per form"}
    return {**out, "unchecked_items": detectors.unchecked_items, "rows": detectors.table.to_dict("records")}


QUALITY_RULE = "quality_model.low_score"


def quality_model_report(documents: pd.DataFrame, originals_removed: pd.DataFrame) -> dict[str, Any]:
    """How the quality classifier treats the injected junk (docs/methods.md §7, filter audit): among the documents
    that reached it (not removed by an earlier step; near and exact copies are left out, they are dedup's), its
    precision (junk share of what it removed) and recall (share of the junk it removed) with Wilson 95% intervals
    (``scipy.stats.binomtest``),
    per junk kind, and the originals it removed, for review.

    ``documents``: the audit's documents (label, stage, rule); ``originals_removed``: its removed originals with
    excerpts (columns doc_id, rule, excerpt, ...).
    """
    from tasks.audit.inject import JUNK_KINDS

    reached = documents[documents["label"].isin(["original", *JUNK_KINDS])
                        & documents["stage"].isin(["quality_model", "dedup_near", "decontam", KEPT])]
    flagged = reached["rule"] == QUALITY_RULE
    junk = reached["label"] != "original"

    def share(hits: int, n: int) -> dict[str, Any]:
        if not n:
            return {"value": float("nan"), "hits": 0, "n": 0, "ci95": [float("nan"), float("nan")]}
        return {"value": hits / n, "hits": int(hits), "n": int(n), "ci95": list(wilson_interval(hits, n))}

    by_kind = {kind: share(int((flagged & (reached["label"] == kind)).sum()), int((reached["label"] == kind).sum()))
               for kind in JUNK_KINDS}
    removed = originals_removed[originals_removed["rule"] == QUALITY_RULE]
    return {"rule": QUALITY_RULE, "reached": int(len(reached)),
            "precision": share(int((flagged & junk).sum()), int(flagged.sum())),
            "recall": share(int((flagged & junk).sum()), int(junk.sum())),
            "recall_by_kind": by_kind,
            "originals_removed": removed.drop(columns=[c for c in ("source",) if c in removed]).to_dict("records")}


def _extractor_summary(comparison: ExtractorComparison, configured: str) -> dict[str, Any]:
    return {"configured": configured, "definition": EXTRACTOR_DEFINITION,
            "rows": comparison.table.drop(columns="source").to_dict("records"),
            "only_in_one": comparison.examples.drop(columns="source").to_dict("records")}


def _stage_rank(funnel: pd.DataFrame) -> dict[str, int]:
    return {stage: i for i, stage in enumerate(funnel["stage"].drop_duplicates())}


def _report(source: SourceConfig, language: str, by_chars: bool, cfg: AuditConfig, corpus: CorpusConfig,
            documents: pd.DataFrame, funnel: pd.DataFrame, pairs: pd.DataFrame, bins: pd.DataFrame,
            pr: pd.DataFrame, originals_removed: pd.DataFrame) -> dict[str, Any]:
    mh = corpus.near_dedup
    removed = documents[documents["rule"] != KEPT]
    exact_copies = documents[documents["label"] == "exact_copy"]
    num_originals = int((documents["label"] == "original").sum())
    return _json_safe({
        "source": source.name, "language": language, "shingle_unit": "character" if by_chars else "word",
        "counts": documents["label"].value_counts().reindex(labels(cfg), fill_value=0).to_dict(),
        "copies": _copies_note(num_originals, cfg),
        "pipeline": {"docs_in": len(documents),
                     "removed_by_stage": removed["stage"].value_counts().reindex(
                         funnel["stage"].drop_duplicates(), fill_value=0).loc[lambda s: s > 0].to_dict(),
                     "docs_out": int((documents["rule"] == KEPT).sum())},
        "originals": {"num": num_originals, "removed": len(originals_removed),
                      "removed_share": len(originals_removed) / num_originals,
                      "removed_by_rule": originals_removed["rule"].value_counts().to_dict()},
        "exact_copies": {"injected": len(exact_copies),
                         "removed_by_exact_dedup": int((exact_copies["stage"] == "dedup_exact").sum()),
                         "exact_dedup_removals_all_labels": int((documents["stage"] == "dedup_exact").sum())},
        "minhash": {**minhash_error(pairs), "num_perm": mh.num_perm,
                    "estimate": "share of equal signature entries over num_perm permutations"},
        "lsh": {"bands": mh.bands, "rows": mh.rows, "s_curve_threshold": lsh_threshold(mh.bands, mh.rows),
                "jaccard_threshold": mh.jaccard_threshold, "bins": bins.to_dict("records")},
        "near_copies": _near_copy_summary(pairs, cfg, mh.shingle_size),
        "near_dedup": {"definition": PR_DEFINITION, "rows": pr.to_dict("records")},
        "audit_config": cfg.model_dump(), "near_dedup_config": mh.model_dump(),
    })


def _copies_note(num_originals: int, cfg: AuditConfig) -> dict[str, Any]:
    exact, near = copy_counts(num_originals, cfg)
    return {"max_copies_per_original": cfg.max_copies_per_original, "exact_copies": exact, "near_per_rate": near,
            "scaled_down": (exact, near) != (cfg.num_exact_copies, cfg.num_near_per_rate)}


def _near_copy_summary(pairs: pd.DataFrame, cfg: AuditConfig, n: int) -> list[dict[str, Any]]:
    """Per edit rate: copy-original pairs, mean exact Jaccard beside J = s/(2 − s), and LSH detection rate."""
    rows = []
    copy_original = pairs[pairs["kind"] == "copy-original"]
    for q in cfg.edit_rates:
        mine = copy_original[(copy_original["edit_rate_a"] == q) | (copy_original["edit_rate_b"] == q)]
        rows.append({"edit_rate": q, "num_pairs": len(mine), "theory_jaccard": theoretical_jaccard(q, n),
                     "mean_exact_jaccard": float(mine["exact_jaccard"].mean()) if len(mine) else math.nan,
                     "lsh_detection_rate": float(mine["lsh_candidate"].mean()) if len(mine) else math.nan})
    return rows


def _json_safe(obj: Any) -> Any:
    """Plain Python types with NaN → None, so report.json is strict JSON."""
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, "item"):  # numpy scalar
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_audit(result: AuditResult, out_dir: Path, title: str) -> list[Path]:
    """Write the audit's files into ``out_dir``, replacing an earlier audit there; returns the file paths.

    The files are written into a sibling temporary folder first, so an interrupted write never leaves a
    mixture of two audits.

    Raises:
        RunsFolderError: ``out_dir`` or a folder above it is a file.
    """
    out_dir = ensure_folder(out_dir)  # also refuses a file at out_dir itself, which would be replaced below
    with atomic_dir(out_dir, replace=True) as tmp:
        result.crosstab.to_csv(tmp / "crosstab.csv", index_label="label")
        result.pairs.to_parquet(tmp / "pairs.parquet", index=False)
        result.documents.to_parquet(tmp / "documents.parquet", index=False)
        result.originals_removed.to_csv(tmp / "originals_removed.csv", index=False)
        lsh = result.report["lsh"]
        plot_s_curve(result.bins, lsh["bands"], lsh["rows"], lsh["jaccard_threshold"], tmp / "s_curve.png", title)
        if result.extractors is not None:
            result.extractors.table.to_parquet(tmp / "extractors.parquet", index=False)
            result.extractors.examples.to_csv(tmp / "extractor_lines.csv", index=False)
        if result.detectors is not None:
            result.detectors.table.to_csv(tmp / "detectors.csv", index=False)
            result.detectors.outcomes.to_parquet(tmp / "detector_outcomes.parquet", index=False)
        layouts = result.layouts
        if layouts is not None and (len(layouts) > 1 or result.report["lsh_layouts"]["design"] is not None):
            layouts.to_csv(tmp / "lsh_layouts.csv", index=False)
            design = result.report["lsh_layouts"]["design"]
            plot_lsh_layouts(layouts, LshConstraints(**design) if design else None, lsh["jaccard_threshold"],
                             tmp / "lsh_layouts.png", f"LSH layouts · {result.source}")
        (tmp / "report.json").write_text(json.dumps(result.report, indent=2, ensure_ascii=False))
    return sorted(out_dir.iterdir())
