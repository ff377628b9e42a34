"""The corpus stage's face: key (settings plus a digest of the evaluation texts), run, expectations, publish."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from infra.stage import Stage, StageContext, lazy


def eval_items(cfg: Any) -> list:
    """Every evaluation text the platform reports on, for decontamination: the gate's cloze items (context plus
    correct option) and the files in ``corpus.decontamination.eval_files``."""
    from evals.cloze import cloze_files, load_cloze_items
    from evals.contamination import EvalItem, load_eval_files

    cloze = [EvalItem(f"cloze:{path.name}", item.item_id, item.context + item.options[item.answer])
             for path in cloze_files(cfg.gate.cloze_paths) for item in load_cloze_items(path)]
    return cloze + load_eval_files(cfg.corpus.decontamination.eval_files)


def _checked_items(cfg: Any) -> list:
    return eval_items(cfg) if cfg.corpus.decontamination.enabled else []


def key_eval_items(cfg: Any) -> dict[str, str]:
    """A digest of every evaluation text the corpus is checked against, and one of the URL blocklist files."""
    items = _checked_items(cfg)
    digest = hashlib.sha256(json.dumps([[i.set_name, i.item_id, i.text] for i in items]).encode()).hexdigest()[:16]
    return {"eval_items": digest, "url_blocklist_files": cfg.corpus.urls.files_digest()}


def run_corpus(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.corpus.stage import run

    return run(ctx, cfg.corpus, eval_items=_checked_items(cfg))


def check_corpus(out: Path, cfg: Any) -> None:
    """Great Expectations on the kept table (sources, languages), the ledger (in = kept + removed), read from
    their Parquet files in batches (DuckDB aggregates the rest), so a corpus of any size is checked in bounded
    memory; and the quality classifier's blind-spot budget (``quality_stage.check_budget``)."""
    import duckdb

    from infra.expectations import check_kept_corpus, check_ledger
    from tasks.readers import kept_files, removal_files
    from tasks.corpus.stage import manifest_rows

    from tasks.corpus.quality_stage import check_budget

    # The classifier's narrowing first: a source it emptied fails here with the budget's figures and examples.
    check_budget(out, cfg.corpus.quality_model)
    languages = cfg.corpus.languages + (["unknown"] if cfg.corpus.unknown_language == "keep" else [])
    with duckdb.connect() as con:
        counts = con.execute("SELECT source, rule, count(*) AS n FROM read_parquet(?) GROUP BY source, rule "
                             "ORDER BY source, n DESC, rule", [[str(f) for f in removal_files(out)]]).fetchall()
    why: dict[str, list[str]] = {}
    removed: dict[str, int] = {}
    by_classifier: set[str] = set()
    for source, rule, n in counts:
        why.setdefault(str(source), []).append(f"{rule} ×{n}")
        removed[str(source)] = removed.get(str(source), 0) + int(n)
        if rule == CLASSIFIER_RULE:
            by_classifier.add(str(source))
    why_removed = {src: "removed by " + ", ".join(rules[:4]) for src, rules in why.items()}
    _check_classifier_emptied(kept_files(out), list(cfg.sources), why_removed, by_classifier)
    check_kept_corpus(kept_files(out), list(cfg.sources), languages, why_removed)
    rows = manifest_rows(json.loads((out / "manifest.json").read_text()))
    check_ledger(rows.assign(removed=[removed.get(s, 0) for s in rows["source"]]), removal_files(out))


CLASSIFIER_RULE = "quality_model.low_score"


def _check_classifier_emptied(kept: list[Path], sources: list[str], why_removed: dict[str, str],
                              by_classifier: set[str]) -> None:
    """The kept-corpus expectation's failure when the quality classifier removed documents of a source that kept
    none: its advice names the classifier's settings, not the rules' ``source_overrides``; sources emptied by the
    rules alone are left to ``check_kept_corpus``.

    Raises:
        DataError: a source kept no document and the classifier (``quality_model.low_score``) removed some of them.
    """
    import duckdb

    from infra.errors import DataError

    with duckdb.connect() as con:
        kept_sources = {r[0] for r in con.execute("SELECT DISTINCT source FROM read_parquet(?)",
                                                  [[str(f) for f in kept]]).fetchall()}
    empty = [s for s in sources if s not in kept_sources]
    classified = [s for s in empty if s in by_classifier]
    if not classified:
        return
    why = "; ".join(f"{s}: {why_removed.get(s) or 'no documents read'}" for s in empty)
    others = [s for s in empty if s not in by_classifier]
    rules = (f" For {others}: fix the inputs (empty or unreadable files), relax the rule that removed them with "
             "[corpus.source_overrides.<source>], or drop the source." if others else "")
    raise DataError(
        f"expectation suite 'kept_corpus' failed: sources with no kept document: {empty} ({why}). The quality "
        f"classifier ({CLASSIFIER_RULE}) removed the last documents of {classified}, and its budget check let it "
        "(accept_narrowing names them, or max_removed_share_by gives them room). Lower corpus.quality_model."
        "threshold, give the classifier examples like their text (positive.sources, positive.files) or take "
        "them out of its negative examples, or take them out of accept_narrowing / max_removed_share_by so that "
        "the budget check stops on them; the quality_model artifact's examples.parquet and the corpus "
        f"artifact's quality_examples.parquet show how it scored.{rules}")


STAGE = Stage(name="corpus", inputs=("sources", "quality_model"), code="tasks.corpus", run=run_corpus,
              sections=("corpus",), key_extra=key_eval_items, validate=check_corpus, publish=lazy("tasks.corpus.publish:publish"),
              figures=lazy("tasks.corpus.plots:corpus_figures"),
              summary=lazy("tasks.corpus.views:summary"), report=lazy("tasks.corpus.views:report"))


# The corpus fields that do not shape the text a quality-model example is turned into (they act after the
# per-document stages), and the model fields that act only when the corpus is scored.
_NOT_EXAMPLE_FIELDS = ("near_dedup", "exact_dedup", "boilerplate", "decontamination", "substring_dedup",
                       "quality_model")
_SCORING_ONLY = ("action", "pareto_alpha", "max_removed_share", "max_removed_share_by", "accept_narrowing",
                 "ablate")


def key_quality_model(cfg: Any) -> dict[str, Any]:
    """The quality model's key: its training settings, the per-document corpus settings its source examples pass
    through, and the bytes of every example file and of a pretrained classifier (not only their paths)."""
    from infra.section import key_dump
    from tasks.corpus.quality_model import example_files

    qm = cfg.corpus.quality_model
    if not qm.enabled:
        return {"quality_model": {"enabled": False}}
    corpus = {k: v for k, v in key_dump(cfg.corpus).items() if k not in _NOT_EXAMPLE_FIELDS}
    model = {k: v for k, v in key_dump(qm).items() if k not in _SCORING_ONLY}
    files = [*example_files(qm.positive.files), *example_files(qm.negative.files)] + (
        [Path(qm.path)] if qm.kind == "pretrained" else [])
    digests = [hashlib.sha256(Path(f).read_bytes()).hexdigest()[:16] for f in files]
    return {"quality_model": model, "example_corpus_rules": corpus, "files": digests}


def run_quality_model(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.corpus.quality_stage import run

    return run(ctx, cfg)


def check_quality_model(out: Path, cfg: Any) -> None:
    """An enabled model's file exists and its held-out figures are numbers in range."""
    from infra.errors import DataError
    from tasks.corpus.quality_stage import METRICS, model_path

    metrics = json.loads((out / METRICS).read_text())
    if not metrics.get("enabled"):
        return
    path = model_path(out)
    if path is None or not path.exists():
        raise DataError(f"quality model artifact {out} lacks its model file ({metrics.get('model_file')})")
    for name in ("accuracy", "roc_auc"):
        value = metrics.get(name)
        if value is not None and value == value and not 0.0 <= value <= 1.0:
            raise DataError(f"quality model artifact {out}: {name} = {value} outside [0, 1]")


QUALITY_STAGE = Stage(name="quality_model", inputs=("sources",), code="tasks.corpus", run=run_quality_model,
                      key_extra=key_quality_model, validate=check_quality_model,
                      publish=lazy("tasks.corpus.quality_publish:publish"),
                      figures=lazy("tasks.corpus.quality_publish:figures"),
                      summary=lazy("tasks.corpus.quality_publish:summary"))
