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
AUC, Brier score, calibration bins, example counts by origin), ``reliability.png`` and ``examples.parquet``
(origin, label, held-out score of every held-out example, for review). A disabled model writes ``metrics.json``
with ``enabled: false`` only, and the corpus build then scores nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow.parquet as pq

from infra.errors import ConfigError, DataError
from infra.stage import StageContext

MODEL_DIR = "model"
METRICS = "metrics.json"
# Raw documents sampled per declared class before the per-document rules: some are removed by them.
OVERSAMPLE = 2


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
        return pd.DataFrame({"text": pd.Series(dtype=str), "language": pd.Series(dtype=str)})
    return filter_documents(sanitise(docs), corpus_cfg, Ledger())


def _texts(docs: pd.DataFrame, corpus_cfg: Any) -> list[str]:
    return _survivors(docs, corpus_cfg).text.tolist()


def _sample_frame(src: Path, names: list[str], n: int, seed: int, corpus_cfg: Any) -> pd.DataFrame:
    return _survivors(sample_sources(src, names, n, seed), corpus_cfg)


# The junk kinds that survive the heuristic rules often enough to be worth learning (fragments do not).
JUNK_KINDS = ("navigation", "spam", "repeated")


def generate_junk(survivors: pd.DataFrame, n: int, seed: int) -> list[str]:
    """``n`` synthetic junk pages per language of ``survivors`` (columns text, language), the kinds of
    :data:`JUNK_KINDS` in turn, built by ``tasks.corpus.junk`` from that language's texts (so they share its
    vocabulary and are not separable by language alone). Seeded: the same survivors and seed give the same pages."""
    import random

    from tasks.corpus.junk import GENERATORS, Material, vocabulary
    from tasks.corpus.quality import CHARACTER_LANGUAGES

    rng = random.Random(seed)
    pages: list[str] = []
    for language, group in sorted(survivors.groupby("language"), key=lambda item: str(item[0])):
        texts = group.text.tolist()
        material = Material(texts, vocabulary(texts, language in CHARACTER_LANGUAGES))
        pages += [GENERATORS[JUNK_KINDS[i % len(JUNK_KINDS)]](rng, str(language), material) for i in range(n)]
    return pages


def gather_examples(src: Path, corpus_cfg: Any) -> tuple[list[str], list[str], dict[str, int]]:
    """(positive texts, negative texts, examples per origin) for ``corpus_cfg.quality_model`` (module docstring).

    Raises:
        ConfigError: a declared source is not in the sources artifact.
        DataError: a class ends up with fewer than 10 examples after the rules (the message gives the counts).
    """
    from tasks.corpus.quality_model import load_example_files

    qm = corpus_cfg.quality_model
    want = qm.max_examples * OVERSAMPLE
    origins: dict[str, int] = {}
    classes: dict[str, list[str]] = {}
    described = list(json.loads((src / "sources.json").read_text()))
    for label, examples in (("positive", qm.positive), ("negative", qm.negative)):
        texts: list[str] = []
        if examples.sources:
            got = _texts(sample_sources(src, list(examples.sources), want, qm.seed), corpus_cfg)
            origins[f"{label}.sources"] = len(got)
            texts += got
        if examples.files:
            got = load_example_files(list(examples.files))
            origins[f"{label}.files"] = len(got)
            texts += got
        pool = [name for name in described if name not in set(qm.positive.sources)]
        if label == "negative" and examples.corpus_sample:
            got = _texts(sample_sources(src, pool, want, qm.seed + 1), corpus_cfg)
            origins["negative.corpus_sample"] = len(got)
            texts += got
        if label == "negative" and examples.junk:
            # Material from every source: junk that borrowed only the non-reference sources' words would teach
            # the classifier those sources' vocabulary rather than the junk's structure.
            got = generate_junk(_sample_frame(src, described, want, qm.seed + 2, corpus_cfg), examples.junk, qm.seed)
            origins["negative.junk"] = len(got)
            texts += got
        classes[label] = texts
    small = {label: len(texts) for label, texts in classes.items() if len(texts) < 10}
    if small and qm.kind != "pretrained":
        raise DataError(f"corpus.quality_model: too few examples after the corpus rules ({small}; by origin "
                        f"{origins}); declare more sources or files, or relax the rules for them")
    return classes["positive"], classes["negative"], origins


# Fewer held-out examples of a class than this make its accuracy and AUC too noisy to read (a Wilson interval on
# 20 items is about ±0.2 wide at p = 0.5).
MIN_HELDOUT_PER_CLASS = 20


def classifier_warnings(metrics: dict[str, Any]) -> list[str]:
    """What makes a trained classifier's held-out figures weak evidence: too few held-out examples of a class, or
    an accuracy no better than always answering the larger class (the all-one-class baseline)."""
    pos, neg = int(metrics.get("n_heldout_pos", 0)), int(metrics.get("n_heldout_neg", 0))
    out = [f"only {n} held-out {label} examples (fewer than {MIN_HELDOUT_PER_CLASS}): accuracy and ROC AUC are "
           "noisy; declare more examples or a larger holdout_fraction"
           for label, n in (("positive", pos), ("negative", neg)) if 0 < n < MIN_HELDOUT_PER_CLASS]
    accuracy = metrics.get("accuracy")
    if pos and neg and accuracy is not None and accuracy == accuracy:
        baseline = max(pos, neg) / (pos + neg)
        if accuracy <= baseline:
            larger = "negative" if neg >= pos else "positive"
            out.append(f"held-out accuracy {accuracy:.3f} is no better than calling every example {larger} "
                       f"({baseline:.3f}): the classifier does not separate the classes at its threshold")
    return out


def run(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    """Train (or load) and evaluate the classifier; write the artifact (module docstring)."""
    from tasks.corpus.quality_model import load_model, reliability_plot, train

    qm = cfg.corpus.quality_model
    out = ctx.out
    if not qm.enabled:
        (out / METRICS).write_text(json.dumps({"enabled": False}))
        return {"enabled": False}
    with ctx.progress.task(f"quality model: {qm.kind} on declared examples", None):
        positives, negatives, origins = gather_examples(ctx.inputs["sources"], cfg.corpus)
        model = train(positives, negatives, qm)
    saved = model.save(out / MODEL_DIR)
    load_model(saved)  # what the corpus build will load: refused here rather than in every shard worker
    metrics = {"enabled": True, "kind": qm.kind, "model_file": str(saved.relative_to(out)), "origins": origins,
               **model.metrics, "metrics_note": model.metrics_note,
               "warnings": classifier_warnings(model.metrics)}
    (out / METRICS).write_text(json.dumps(metrics, indent=2, default=float))
    reliability_plot(model.metrics, out / "reliability.png")
    heldout = getattr(model, "heldout", None)
    if heldout is not None:
        pd.DataFrame(heldout).to_parquet(out / "examples.parquet", index=False)
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


def check_budget(out: Path, qm: Any) -> pd.DataFrame:
    """The corpus artifact's expectation on the quality classifier's narrowing: every group's removal share is
    within its budget or explicitly accepted (Great Expectations on :func:`budget_verdicts`).

    Raises:
        DataError: a group is over its budget and not accepted; the message gives each such group's share, budget
            and documents, the lowest-scoring kept and removed examples of the group (``quality_examples.parquet``)
            and how to accept it.
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
        examples = pd.read_parquet(out / "quality_examples.parquet")
        lines = []
        for row in verdicts[verdicts.verdict == "over"].itertuples():
            group = examples[(examples.group_kind == row.group_kind) & (examples.group_name == row.group_name)]
            shown = "; ".join(f"{e.fate} {e.doc_id} (score {e.quality_score:.3f}): {e.snippet[:120]!r}"
                              for e in group.itertuples())
            lines.append(f"{row.group_kind} {row.group_name!r}: the quality model removed {row.removed:,} of "
                         f"{row.docs_scored:,} documents ({row.removed_share:.1%}), over its budget "
                         f"{row.budget:.0%}" + (f"; lowest-scoring examples: {shown}" if shown else ""))
        raise DataError("expectation suite 'quality_model_budget' failed: " + " | ".join(lines)
                        + ". Review them; to accept the narrowing, list the group in corpus.quality_model."
                        "accept_narrowing (it is recorded in the manifest), or raise its max_removed_share_by "
                        "budget, or change the classifier's examples or threshold") from None
    return verdicts
