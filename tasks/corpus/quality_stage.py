"""The quality-model stage: the corpus build's classifier, trained on declared examples before the corpus is built
(docs/methods.md §7, model-based quality filtering).

Inputs: the sources artifact. Examples are declared in ``[corpus.quality_model]``, never implicit:

- ``positive`` / ``negative`` ``sources``: documents of those sources, a seeded sample (MD5 of ``seed:doc_id``
  order, so the sample does not depend on file order), passed through the corpus's own per-document stages
  (extraction, repair, language ID, the heuristic rules, PII), so the classifier learns on text in the form it
  will score;
- ``files``: text files or JSON-lines files, taken as they are;
- ``negative.corpus_sample``: the same seeded sample over every source that is not a positive source;
- ``negative.junk``: synthetic navigation, spam and repeated-line pages (``tasks.corpus.junk``) made from the
  text of a seeded sample of every source, per language.

Outputs: ``model/`` (the classifier, ``tasks.corpus.quality_model``), ``metrics.json`` (held-out accuracy, ROC
AUC with its 95% interval, spread of the scores, Brier score, calibration bins, example counts by origin, the
class balancing of training), ``reliability.png`` and ``examples.parquet``
(every held-out example, for review: ``EXAMPLE_COLUMNS``). An example's ``doc_id`` finds where it came from: the
source document's id (with ``source``) for source and corpus-sample examples, ``<file>:<line>`` for a JSON-lines
record and ``<file>`` for a whole text file, and ``junk:<kind>:<i>`` for the i-th generated junk page (its text
is only here, in ``snippet``). The ids are outputs: they are not in the stage's key and do not change what the
classifier is trained on. A disabled model writes ``metrics.json`` with ``enabled: false`` only, and the corpus
build then scores nothing. A classifier whose held-out ROC AUC is below ``min_auc``, or whose held-out scores have
no spread (``min_score_spread``), fails the stage (``quality_model.check_heldout``) and writes no artifact.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any, Callable

import duckdb
import pandas as pd
import pyarrow.parquet as pq

from infra.errors import ConfigError, DataError
from infra.stage import StageContext

MODEL_DIR = "model"
METRICS = "metrics.json"
# Raw documents sampled per declared class before the per-document rules: some are removed by them.
OVERSAMPLE = 2
# examples.parquet: where each held-out example came from, its class, its position in that class's list, its score.
EXAMPLE_COLUMNS = ["origin", "doc_id", "source", "label", "index", "score", "snippet"]
SNIPPET_CHARS = 300


def model_path(artifact: Path) -> Path | None:
    """The saved classifier of a quality-model artifact, or None when the model is disabled."""
    metrics = json.loads((Path(artifact) / METRICS).read_text())
    return Path(artifact) / metrics["model_file"] if metrics.get("enabled") else None


def sample_sources(src: Path, names: list[str], n: int, seed: int) -> pd.DataFrame:
    """Up to ``n`` raw documents of the sources ``names`` from the sources artifact ``src``, the first in the order
    of MD5(``seed:doc_id``): a seeded sample, the same whatever the order of the files (DuckDB, out of core)."""
    files = [str(src / "docs" / f"{name}.parquet") for name in names if (src / "docs" / f"{name}.parquet").exists()]
    missing = [name for name in names if not (src / "docs" / f"{name}.parquet").exists()]
    if missing:
        raise ConfigError(f"corpus.quality_model: {missing} are not sources of this experiment's sources artifact")
    if not files or n <= 0:
        return pd.DataFrame()
    present = {c for f in files for c in pq.ParquetFile(f).schema_arrow.names}
    with duckdb.connect() as con:
        cols = ", ".join(c for c in ("doc_id", "source", "language_hint", "content", "content_type", "url")
                         if c in present)
        return con.execute(f"SELECT {cols} FROM read_parquet(?, union_by_name = true) "
                           f"ORDER BY md5(? || ':' || doc_id) LIMIT ?", [files, str(seed), int(n)]).df()


def _survivors(docs: pd.DataFrame, corpus_cfg: Any) -> pd.DataFrame:
    """``docs`` after the corpus's per-document stages (extraction, rules), in sample order (``SURVIVOR_COLUMNS``)."""
    from tasks.corpus.filters import Ledger, filter_documents, sanitise

    if docs.empty:
        return pd.DataFrame({c: pd.Series(dtype=str) for c in ("doc_id", "source", "text", "language")})
    return filter_documents(sanitise(docs), corpus_cfg, Ledger())


def _source_examples(docs: pd.DataFrame, corpus_cfg: Any, origin: str) -> tuple[list[str], list[tuple]]:
    """The survivors' texts and, for each, (origin, doc_id, source)."""
    kept = _survivors(docs, corpus_cfg)
    return kept.text.tolist(), [(origin, d, s) for d, s in zip(kept.doc_id.tolist(), kept.source.tolist())]


def file_example_ids(patterns: list[str]) -> list[tuple[str, str]]:
    """(doc_id, text) of each document ``quality_model.load_example_files`` reads from ``patterns``, in its order:
    ``<file>:<line>`` (1-based) for a ``.jsonl`` record, ``<file>`` for a whole file; the file as the pattern
    matched it. Call after ``load_example_files``, which refuses what cannot be read."""
    out: list[tuple[str, str]] = []
    seen: set[Path] = set()
    for pattern in patterns:
        for file in sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file()):
            if file.resolve() in seen:
                continue
            seen.add(file.resolve())
            content = file.read_bytes().decode("utf-8")
            if file.suffix == ".jsonl":
                docs = [(f"{file}:{n}", json.loads(line)["text"])
                        for n, line in enumerate(content.splitlines(), 1) if line.strip()]
            else:
                docs = [(str(file), content)]
            out += [(doc_id, text) for doc_id, text in docs if text.strip()]
    return out


def _sample_frame(src: Path, names: list[str], n: int, seed: int, corpus_cfg: Any) -> pd.DataFrame:
    return _survivors(sample_sources(src, names, n, seed), corpus_cfg)


# The junk kinds that survive the heuristic rules often enough to be worth learning (fragments do not).
JUNK_KINDS = ("navigation", "spam", "repeated")


def generate_junk(survivors: pd.DataFrame, n: int, seed: int) -> list[str]:
    """``n`` synthetic junk pages per language of ``survivors`` (columns text, language), the kinds of
    :data:`JUNK_KINDS` in turn, built by ``tasks.corpus.junk`` from that language's texts (so they share its
    vocabulary and are not separable by language alone). Seeded: the same survivors and seed give the same pages."""
    return [text for _, text in junk_pages(survivors, n, seed)]


def junk_pages(survivors: pd.DataFrame, n: int, seed: int) -> list[tuple[str, str]]:
    """(kind, text) of each page of ``generate_junk(survivors, n, seed)``, in the same order."""
    import random

    from tasks.corpus.junk import GENERATORS, Material, vocabulary
    from tasks.corpus.quality import CHARACTER_LANGUAGES

    rng = random.Random(seed)
    pages: list[tuple[str, str]] = []
    for language, group in sorted(survivors.groupby("language"), key=lambda item: str(item[0])):
        texts = group.text.tolist()
        material = Material(texts, vocabulary(texts, language in CHARACTER_LANGUAGES))
        for i in range(n):
            kind = JUNK_KINDS[i % len(JUNK_KINDS)]
            pages.append((kind, GENERATORS[kind](rng, str(language), material)))
    return pages


def gather_steps(qm: Any) -> int:
    """How many origins :func:`gather_examples` draws from (its progress steps): declared sources and files of each
    class, the negative corpus sample and the junk pages, those configured."""
    return (bool(qm.positive.sources) + bool(qm.positive.files) + bool(qm.negative.sources)
            + bool(qm.negative.files) + bool(qm.negative.corpus_sample) + bool(qm.negative.junk))


def gather_examples(src: Path, corpus_cfg: Any, advance: Callable[[int], None] = lambda n: None
                    ) -> tuple[list[str], list[str], dict[str, int], dict[str, list]]:
    """(positive texts, negative texts, examples per origin, provenance) for ``corpus_cfg.quality_model`` (module
    docstring). ``provenance["positive"]`` and ``["negative"]`` hold, for each text of that class in order,
    (origin, doc_id, source): origin as in the counts, doc_id and source as in ``examples.parquet`` (source None
    for files and junk). ``advance(1)`` is called as each origin is drawn (:func:`gather_steps` in all).

    Raises:
        ConfigError: a declared source is not in the sources artifact.
        DataError: a class ends up with fewer than 10 examples after the rules (the message gives the counts); an
            example file changed while it was read.
    """
    from tasks.corpus.quality_model import load_example_files

    qm = corpus_cfg.quality_model
    want = qm.max_examples * OVERSAMPLE
    origins: dict[str, int] = {}
    classes: dict[str, list[str]] = {}
    provenance: dict[str, list[tuple]] = {}
    described = list(json.loads((src / "sources.json").read_text()))
    for label, examples in (("positive", qm.positive), ("negative", qm.negative)):
        texts: list[str] = []
        where: list[tuple] = []
        if examples.sources:
            got, ids = _source_examples(sample_sources(src, list(examples.sources), want, qm.seed), corpus_cfg,
                                        f"{label}.sources")
            origins[f"{label}.sources"] = len(got)
            texts += got
            where += ids
            advance(1)
        if examples.files:
            got = load_example_files(list(examples.files))
            named = file_example_ids(list(examples.files))
            if [text for _, text in named] != got:
                raise DataError(f"quality model examples: {list(examples.files)} changed while they were read; "
                                "run again once they are written")
            origins[f"{label}.files"] = len(got)
            texts += got
            where += [(f"{label}.files", doc_id, None) for doc_id, _ in named]
            advance(1)
        pool = [name for name in described if name not in set(qm.positive.sources)]
        if label == "negative" and examples.corpus_sample:
            got, ids = _source_examples(sample_sources(src, pool, want, qm.seed + 1), corpus_cfg,
                                        "negative.corpus_sample")
            origins["negative.corpus_sample"] = len(got)
            texts += got
            where += ids
            advance(1)
        if label == "negative" and examples.junk:
            # Material from every source: junk that borrowed only the non-reference sources' words would teach
            # the classifier those sources' vocabulary rather than the junk's structure.
            pages = junk_pages(_sample_frame(src, described, want, qm.seed + 2, corpus_cfg), examples.junk, qm.seed)
            origins["negative.junk"] = len(pages)
            texts += [text for _, text in pages]
            where += [("negative.junk", f"junk:{kind}:{i}", None) for i, (kind, _) in enumerate(pages)]
            advance(1)
        classes[label] = texts
        provenance[label] = where
    small = {label: len(texts) for label, texts in classes.items() if len(texts) < 10}
    if small and qm.kind != "pretrained":
        raise DataError(f"corpus.quality_model: too few examples after the corpus rules ({small}; by origin "
                        f"{origins}); declare more sources or files, or relax the rules for them")
    return classes["positive"], classes["negative"], origins, provenance


def heldout_examples(heldout: dict[str, list], positives: list[str], negatives: list[str],
                     provenance: dict[str, list]) -> pd.DataFrame:
    """``examples.parquet`` (``EXAMPLE_COLUMNS``) from a trained model's ``heldout`` (label, index into that class's
    list, score) and ``gather_examples``' texts and provenance; ``snippet``: the first ``SNIPPET_CHARS``
    characters of the text."""
    texts = {"positive": positives, "negative": negatives}
    rows = []
    for label, index, score in zip(heldout["label"], heldout["index"], heldout["score"]):
        origin, doc_id, source = provenance[label][index]
        rows.append(dict(origin=origin, doc_id=doc_id, source=source, label=label, index=int(index),
                         score=float(score), snippet=texts[label][index][:SNIPPET_CHARS]))
    return pd.DataFrame(rows, columns=EXAMPLE_COLUMNS).astype({"source": object})


# Fewer held-out examples of a class than this make its accuracy and AUC too noisy to read (a Wilson interval on
# 20 items is about ±0.2 wide at p = 0.5).
MIN_HELDOUT_PER_CLASS = 20


def classifier_warnings(metrics: dict[str, Any], min_auc: float | None = None) -> list[str]:
    """What makes a trained classifier's held-out figures weak evidence: too few held-out examples of a class, a
    ROC AUC that passes ``min_auc`` while its 95% interval (Hanley & McNeil 1982) reaches below it, or an accuracy
    no better than always answering the larger class (the all-one-class baseline)."""
    pos, neg = int(metrics.get("n_heldout_pos", 0)), int(metrics.get("n_heldout_neg", 0))
    out = [f"only {n} held-out {label} examples (fewer than {MIN_HELDOUT_PER_CLASS}): accuracy and ROC AUC are "
           "noisy; declare more examples or a larger holdout_fraction"
           for label, n in (("positive", pos), ("negative", neg)) if 0 < n < MIN_HELDOUT_PER_CLASS]
    auc, low = metrics.get("roc_auc"), metrics.get("roc_auc_low")
    if min_auc is not None and auc is not None and low is not None and low < min_auc <= auc:
        out.append(f"held-out ROC AUC {auc:.3f} passes min_auc {min_auc} but its 95% interval reaches down to "
                   f"{low:.3f}: the evidence that the classifier ranks reference text first is weak; declare more "
                   "examples")
    accuracy = metrics.get("accuracy")
    if pos and neg and accuracy is not None and accuracy == accuracy:
        baseline = max(pos, neg) / (pos + neg)
        if accuracy <= baseline:
            larger = "negative" if neg >= pos else "positive"
            out.append(f"held-out accuracy {accuracy:.3f} is no better than calling every example {larger} "
                       f"({baseline:.3f}): the classifier does not separate the classes at its threshold")
    return out


def run(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    """Train (or load) and evaluate the classifier; write the artifact (module docstring).

    Raises:
        DataError: the held-out check fails (``quality_model.check_heldout``: ROC AUC below ``min_auc`` or scores
            without spread), or the examples cannot be gathered (``gather_examples``).
        ConfigError: a declared source is not in the sources artifact.
    """
    from tasks.corpus.quality_model import check_heldout, load_model, reliability_plot, train

    qm = cfg.corpus.quality_model
    out = ctx.out
    if not qm.enabled:
        (out / METRICS).write_text(json.dumps({"enabled": False}))
        return {"enabled": False}
    steps = gather_steps(qm)
    with ctx.progress.task(f"quality model: {qm.kind}: gathering examples ({steps} origin(s)), then training",
                           steps + 1) as advance:
        positives, negatives, origins, provenance = gather_examples(ctx.inputs["sources"], cfg.corpus, advance)
        advance(0, doing="training")
        model = train(positives, negatives, qm)
        advance(1)
    # A classifier at chance, inverted or without spread would remove documents by noise: fail before the corpus
    # build scores anything with it.
    check_heldout(model.metrics, qm)
    saved = model.save(out / MODEL_DIR)
    load_model(saved, qm.positive_label)  # what the corpus build loads: refused here, not in every shard worker
    metrics = {"enabled": True, "kind": qm.kind, "model_file": str(saved.relative_to(out)), "origins": origins,
               **model.metrics, "metrics_note": model.metrics_note,
               "warnings": classifier_warnings(model.metrics, qm.min_auc)}
    (out / METRICS).write_text(json.dumps(metrics, indent=2, default=float))
    reliability_plot(model.metrics, out / "reliability.png")
    heldout = getattr(model, "heldout", None)
    if heldout is not None:
        heldout_examples(heldout, positives, negatives, provenance).to_parquet(out / "examples.parquet", index=False)
    return {"enabled": True, "kind": qm.kind, "warnings": metrics["warnings"],
            **{k: v for k, v in model.metrics.items() if isinstance(v, (int, float))}}


def budget_verdicts(audit: pd.DataFrame, qm: Any) -> pd.DataFrame:
    """The blind-spot budget per group (docs/methods.md §7): for the whole corpus and each source and language of
    the audit (``tasks.corpus.build.AUDIT_COLUMNS``), its removal share, its budget (``max_removed_share_by[name]``,
    else ``max_removed_share``), whether the excess is accepted (``accept_narrowing``), and the verdict
    ``within`` / ``accepted`` / ``over``. Columns: group_kind, group_name, docs_scored, removed, removed_share,
    budget, accepted, verdict."""
    rows = audit[audit.group_kind.isin(["all", "source", "language"])].copy()
    # The whole corpus is the group named "all": max_removed_share_by and accept_narrowing may name it too.
    rows["budget"] = [float(qm.max_removed_share_by.get(name, qm.max_removed_share)) for name in rows.group_name]
    rows["accepted"] = [name in set(qm.accept_narrowing) for name in rows.group_name]
    over = rows.removed_share > rows.budget
    rows["verdict"] = ["within" if not o else ("accepted" if a else "over") for o, a in zip(over, rows.accepted)]
    return rows[["group_kind", "group_name", "docs_scored", "removed", "removed_share", "budget", "accepted",
                 "verdict"]].reset_index(drop=True)


# The budget error's examples: at most this many per group and in all, each snippet cut to this many terminal
# columns (a CJK character takes two).
BUDGET_EXAMPLES_PER_GROUP = 2
BUDGET_EXAMPLES = 10
BUDGET_SNIPPET_CELLS = 60


def check_budget(out: Path, qm: Any) -> pd.DataFrame:
    """The corpus artifact's expectation on the quality classifier's narrowing: every group's removal share is
    within its budget or explicitly accepted (Great Expectations on :func:`budget_verdicts`).

    Raises:
        DataError: a group is over its budget and not accepted (``budget_message``).
    """
    import great_expectations as gx

    from infra.expectations import validate_frame

    audit = pd.read_parquet(out / "quality_audit.parquet")
    if not qm.enabled or audit.empty:
        return pd.DataFrame()
    verdicts = budget_verdicts(audit, qm)
    checked = verdicts[~verdicts.accepted]
    try:
        validate_frame("quality_model_budget", checked, [gx.expectations.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="budget", column_B="removed_share", or_equal=True)])
    except DataError:
        raise DataError(budget_message(verdicts, pd.read_parquet(out / "quality_examples.parquet"))) from None
    return verdicts


def budget_message(verdicts: pd.DataFrame, examples: pd.DataFrame) -> str:
    """The budget failure for people: one line per group over its budget (share, budget, documents removed of
    those scored), then at most ``BUDGET_EXAMPLES_PER_GROUP`` of each group's lowest-scoring examples
    (``quality_examples.parquet``), sources' first, then languages', then the whole corpus's; a document shown for
    one group is not repeated for another, ``BUDGET_EXAMPLES`` in all, each snippet on one line and cut to
    ``BUDGET_SNIPPET_CELLS`` terminal columns (``rich.cells``). Then the ways out, once."""
    from rich.cells import cell_len, set_cell_size

    over = verdicts[verdicts.verdict == "over"]
    lines = [f"expectation suite 'quality_model_budget' failed: the quality model removed more than the budget of "
             f"{len(over)} group(s):"]
    lines += [f"  {_group(row)}: removed {row.removed:,} of {row.docs_scored:,} scored documents "
              f"({row.removed_share:.1%}), budget {row.budget:.0%}" for row in over.itertuples()]
    shown: list[str] = []
    seen: set[str] = set()
    order = {"source": 0, "language": 1, "all": 2}
    for row in sorted(over.itertuples(), key=lambda r: order.get(r.group_kind, 3)):
        group = examples[(examples.group_kind == row.group_kind) & (examples.group_name == row.group_name)]
        # removed ones first: they are what the budget is about
        group = group.sort_values("fate", key=lambda f: f.ne("removed"), kind="stable")
        fresh = [e for e in group.itertuples() if e.doc_id not in seen][:BUDGET_EXAMPLES_PER_GROUP]
        for e in fresh[:max(0, BUDGET_EXAMPLES - len(shown))]:
            seen.add(e.doc_id)
            text = " ".join(str(e.snippet).split())
            if cell_len(text) > BUDGET_SNIPPET_CELLS:
                text = set_cell_size(text, BUDGET_SNIPPET_CELLS - 1).rstrip() + "…"
            shown.append(f"  {_group(row)}: {e.fate} {e.doc_id} (score {e.quality_score:.3f}) "
                         f"{text!r}")
    if shown:
        lines.append("Lowest-scoring examples (more in the corpus artifact's quality_examples.parquet; the figures of "
                     "every group in DuckDB quality_model_audit):")
        lines += shown
    names = ", ".join(f'"{name}"' for name in dict.fromkeys(over.group_name))
    lines.append("Review them. To accept the narrowing, add the groups to corpus.quality_model.accept_narrowing "
                 f"([{names}]; it is recorded in the manifest) or raise their max_removed_share_by budget; "
                 "otherwise change the classifier's examples (positive, negative) or its threshold.")
    return "\n".join(lines)


def _group(row: Any) -> str:
    return "the whole corpus ('all')" if row.group_kind == "all" else f"{row.group_kind} {row.group_name!r}"
