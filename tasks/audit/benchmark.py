"""Contamination detectors side by side on a planted mock benchmark (docs/methods.md §7, "Near dedup: MinHash + LSH"
and "Decontamination").

The mock benchmark is a set of passages of the source's own text, each planted in the corpus in one form:

- ``verbatim``: the passage as it is;
- ``wrapped``: the passage inside other page text, ``benchmark_wrap_passages`` unrelated passages before and after
  it (with one on each side the item is a third of the page);
- ``edited_<q>``: paraphrase-like edits at rate q: each unit (whitespace word, or non-space character for languages
  written without spaces) is edited with probability q, by substitution with a unit of the source's vocabulary,
  deletion, or a swap with the next unit (reordering), each with probability 1/3;
- ``control``: a passage that is not in the benchmark (a flag there is a false positive of the planting: the
  passage shares text with an item by chance or because the source repeats itself).

A passage is a window of ``benchmark_words`` consecutive units of one document (a shorter document gives its whole
text when it has at least half as many). Passages come from documents drawn at random, held-out documents of the
source (after the audit's originals) first, then originals (at most half of them), spread over as many documents as
those allow; the documents they come from are left out of the background corpus, so a planted document's only
designed relative in the corpus is its benchmark item. Text the source itself repeats across pages (release notes
that restate each other, shared licence paragraphs) still links passages: that shows in the control row above all.

Each detector runs as the corpus build runs it (``tasks.corpus.build.build_corpus`` with the experiment's corpus
config), over the background originals and the planted documents, in its own build so that neither sees only what
the other left:

- ``near_dedup`` (MinHash LSH with the configured layout, verification at ``jaccard_threshold``, leader clustering):
  the benchmark items are put in the corpus first, so a planted document is flagged when the build removes it as a
  near duplicate (``dedup.near``). Exact dedup and decontamination are off in this build, so verbatim copies reach
  near dedup.
- ``ngram_overlap`` (the decontamination step's n-gram index, ``corpus.decontamination``): the benchmark items are
  the evaluation set; a planted document is flagged when the build removes it for sharing a non-common n-gram
  (``decontam.ngram_overlap``). Near dedup is off in this build.

A planted document counts for a detector when it reached the detector's step (earlier rules of that build did not
remove it; for near dedup, its benchmark item reached the step too). Shares carry a 95% Wilson score interval
(Wilson 1927, ``scipy.stats.binomtest``).
"""

from __future__ import annotations

import math
import random
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from evals.contamination import EvalItem
from tasks.audit.config import AuditConfig
from tasks.audit.inject import vocabulary
from tasks.audit.measure import KEPT, wilson_interval
from tasks.corpus.build import CURATION_STEPS, build_corpus
from tasks.corpus.config import CorpusConfig

VERBATIM, WRAPPED, CONTROL = "verbatim", "wrapped", "control"
# detector → (build step, removal rule)
DETECTORS = {"near_dedup": ("dedup_near", "dedup.near"), "ngram_overlap": ("decontam", "decontam.ngram_overlap")}
PLANT_COLUMNS = ["doc_id", "item_id", "form", "edit_rate", "content"]
ITEM_COLUMNS = ["item_id", "form", "text"]
TABLE_COLUMNS = ["form", "edit_rate", "detector", "planted", "reached", "flagged", "share", "ci_low", "ci_high"]
OUTCOME_COLUMNS = ["doc_id", "item_id", "form", "edit_rate", "detector", "stage", "rule", "reached", "flagged"]
_WORD_RE = re.compile(r"\S+")
_CHAR_RE = re.compile(r"\S")


def edited_form(q: float) -> str:
    """Form label of paraphrase-like edits at rate ``q``: ``edited_0.05`` … ``edited_0.3``."""
    return f"edited_{q:g}"


def forms(cfg: AuditConfig) -> list[str]:
    """Every form in report order: verbatim, wrapped, one edited form per rate, control."""
    return [VERBATIM, WRAPPED, *(edited_form(q) for q in cfg.benchmark_edit_rates), CONTROL]


def unit_spans(text: str, by_chars: bool) -> list[tuple[int, int]]:
    """(start, end) character offsets of the units of ``text``: non-space characters when ``by_chars``, else
    whitespace-separated words."""
    return [m.span() for m in (_CHAR_RE if by_chars else _WORD_RE).finditer(text)]


def passages(text: str, n_units: int, by_chars: bool) -> list[str]:
    """Non-overlapping windows of ``n_units`` consecutive units of ``text``, whitespace inside kept; a text shorter
    than ``n_units`` gives itself when it has at least ``n_units // 2`` units (and at least one), else nothing."""
    spans = unit_spans(text, by_chars)
    if len(spans) < n_units:
        return [text[spans[0][0]:spans[-1][1]]] if spans and len(spans) >= n_units // 2 else []
    return [text[spans[k][0]:spans[k + n_units - 1][1]] for k in range(0, len(spans) - n_units + 1, n_units)]


def paraphrase_units(text: str, q: float, rng: random.Random, vocab: list[str], by_chars: bool) -> str:
    """``text`` with each unit edited with probability ``q``: substituted by ``rng.choice(vocab)``, deleted (with the
    whitespace after it), or swapped with the next unit, each with probability 1/3. A swapped neighbour is not drawn
    again; a swap drawn for the last unit substitutes it instead. Whitespace between kept units is kept."""
    spans = unit_spans(text, by_chars)
    if not spans:
        return text
    units = [text[a:b] for a, b in spans]
    gaps = [text[b:a] for (_, b), (a, _) in zip(spans, spans[1:])] + [text[spans[-1][1]:]]
    deleted = [False] * len(units)
    k = 0
    while k < len(units):
        if rng.random() < q:
            op = rng.randrange(3)
            if op == 1:
                deleted[k] = True
            elif op == 2 and k + 1 < len(units):
                units[k], units[k + 1] = units[k + 1], units[k]
                k += 1
            else:
                units[k] = rng.choice(vocab)
        k += 1
    return text[:spans[0][0]] + "".join(u + g for u, g, gone in zip(units, gaps, deleted) if not gone)


@dataclass
class MockBenchmark:
    """``items``: the benchmark (``ITEM_COLUMNS``; item ids ``<source>/~bench/item/<k>``); ``planted``: the planted
    documents (``PLANT_COLUMNS``; control documents have item_id ""); ``background``: the originals the detectors
    run over (doc_id, text); ``per_form``: planted documents per form (scaled down when passages are short);
    ``pool_docs``: documents whose passages were used, left out of the background."""

    items: pd.DataFrame
    planted: pd.DataFrame
    background: pd.DataFrame
    per_form: int
    pool_docs: list[str] = field(default_factory=list)


def make_benchmark(originals: pd.DataFrame, held_out: pd.DataFrame | None, source: str, by_chars: bool,
                   cfg: AuditConfig) -> MockBenchmark:
    """The mock benchmark and its planted forms (module docstring), drawn with ``cfg.seed``.

    ``originals`` and ``held_out``: frames with columns doc_id, text (``held_out`` may be None or empty). Documents
    are drawn at random, ``held_out`` first, then ``originals`` (at most half of them), and up to
    ⌈passages needed / documents available⌉ passages are drawn from each, until every form has
    ``cfg.benchmark_items`` documents or the documents run out; then ``per_form`` is what the passages allow (0: an
    empty benchmark). Same inputs and seed → identical frames.
    """
    rng = random.Random(cfg.seed)
    n_forms = len(forms(cfg))
    per_item = n_forms + 2 * cfg.benchmark_wrap_passages  # passages per planted round (one of each form)
    wanted = cfg.benchmark_items * per_item
    held = held_out if held_out is not None else pd.DataFrame(columns=["doc_id", "text"])
    # Documents in random order, held-out ones first, at most half of the originals; the passages are spread
    # over as many of them as that allows (a source's neighbouring pages, such as release notes, repeat each
    # other, and passages of one cluster would share text by construction).
    candidates = [*_shuffled(rng, held), *_shuffled(rng, originals)[:len(originals) // 2]]
    cap = max(1, math.ceil(wanted / max(1, len(candidates))))
    pool: list[str] = []
    used: list[str] = []
    for doc_id, text in candidates:
        if len(pool) >= wanted:
            break
        cut = passages(text, cfg.benchmark_words, by_chars)
        if cut:
            pool += [cut[k] for k in sorted(rng.sample(range(len(cut)), min(cap, len(cut))))]
            used.append(doc_id)
    per_form = min(cfg.benchmark_items, len(pool) // per_item)
    rng.shuffle(pool)
    draw = iter(pool)
    vocab = vocabulary(pool, by_chars)
    items, planted = [], []
    for form in forms(cfg)[:-1]:
        for _ in range(per_form):
            item_id = f"{source}/~bench/item/{len(items):05d}"
            text = next(draw)
            items.append((item_id, form, text))
            planted.append((item_id, form, text))
    for _ in range(per_form):
        planted.append(("", CONTROL, next(draw)))
    rows = []
    for item_id, form, text in planted:
        q = float(form.removeprefix("edited_")) if form.startswith("edited_") else 0.0
        if form == WRAPPED:
            before = [next(draw) for _ in range(cfg.benchmark_wrap_passages)]
            after = [next(draw) for _ in range(cfg.benchmark_wrap_passages)]
            text = "\n\n".join([*before, text, *after])
        elif q:
            text = paraphrase_units(text, q, rng, vocab, by_chars)
        rows.append((item_id, form, q, text))
    rng.shuffle(rows)
    counters: dict[str, int] = {}
    out = []
    for item_id, form, q, text in rows:
        k = counters[form] = counters.get(form, -1) + 1
        out.append((f"{source}/~bench/{form}/{k:05d}", item_id, form, q, text))
    background = originals[~originals["doc_id"].isin(used)].reset_index(drop=True)
    return MockBenchmark(pd.DataFrame(items, columns=ITEM_COLUMNS), pd.DataFrame(out, columns=PLANT_COLUMNS),
                         background[["doc_id", "text"]], per_form, used)


def _shuffled(rng: random.Random, docs: pd.DataFrame) -> list[tuple[str, str]]:
    rows = list(zip(docs["doc_id"], docs["text"]))
    rng.shuffle(rows)
    return rows


@dataclass
class DetectorComparison:
    """``table``: share flagged per form × detector (``TABLE_COLUMNS``); ``outcomes``: one row per planted document
    and detector (``OUTCOME_COLUMNS``); ``unchecked_items``: benchmark items the n-gram index could not check (fewer
    words than ``evals.contamination.MIN_ITEM_TOKENS``)."""

    table: pd.DataFrame
    outcomes: pd.DataFrame
    unchecked_items: int


def _frame(ids: list[str], texts: list[str], source: str, language: str) -> pd.DataFrame:
    return pd.DataFrame({"doc_id": ids, "source": source, "language_hint": language, "content": texts,
                         "content_type": "text"})


def _removed(docs: pd.DataFrame, corpus: CorpusConfig, quality_model: Path | None,
             eval_items: list[EvalItem] = ()) -> tuple[dict[str, str], dict[str, str]]:
    """(stage, rule) of each removed document of one build of ``docs``."""
    with tempfile.TemporaryDirectory(prefix="audit-detectors-") as build_dir:
        removals = build_corpus(docs, corpus, eval_items=eval_items, out=Path(build_dir),
                                quality_model=quality_model).removals
    return dict(zip(removals["doc_id"], removals["stage"])), dict(zip(removals["doc_id"], removals["rule"]))


def _reached(stage: str, step: str) -> bool:
    """Whether a document whose first removal was at ``stage`` (or ``KEPT``) got as far as ``step``; a stage the
    build's step list does not name counts as earlier."""
    order = {name: i for i, name in enumerate(CURATION_STEPS)}
    return stage == KEPT or order.get(stage, -1) >= order[step]


def compare_detectors(bench: MockBenchmark, source: str, language: str, corpus: CorpusConfig,
                      cfg: AuditConfig, quality_model: Path | None = None) -> DetectorComparison:
    """Run both detectors' builds on ``bench`` (module docstring) and tabulate what each flagged.

    ``language``: the source's language hint. ``table`` rows come in ``forms(cfg)`` order, near_dedup before
    ngram_overlap for each; ``share`` = flagged / reached (NaN when nothing reached), ``ci_low``/``ci_high`` its
    Wilson 95% interval.
    """
    from evals.contamination import EvalIndex

    background = (bench.background["doc_id"].tolist(), bench.background["text"].tolist())
    planted = (bench.planted["doc_id"].tolist(), bench.planted["content"].tolist())
    item_docs = (bench.items["item_id"].tolist(), bench.items["text"].tolist())
    near_cfg = corpus.model_copy(update={
        "exact_dedup": False, "decontamination": corpus.decontamination.model_copy(update={"enabled": False})})
    docs = _frame(item_docs[0] + background[0] + planted[0], item_docs[1] + background[1] + planted[1], source,
                  language)
    near_stage, near_rule = _removed(docs, near_cfg, quality_model)
    ngram_cfg = corpus.model_copy(update={"near_dedup": corpus.near_dedup.model_copy(update={"enabled": False})})
    eval_items = [EvalItem("mock_benchmark", i, t) for i, t in zip(*item_docs)]
    docs = _frame(background[0] + planted[0], background[1] + planted[1], source, language)
    ngram_stage, ngram_rule = _removed(docs, ngram_cfg, quality_model, eval_items)
    rows = []
    for detector, (stage_of, rule_of) in (("near_dedup", (near_stage, near_rule)),
                                          ("ngram_overlap", (ngram_stage, ngram_rule))):
        step, rule = DETECTORS[detector]
        for doc_id, item_id, form, q in zip(bench.planted["doc_id"], bench.planted["item_id"], bench.planted["form"],
                                            bench.planted["edit_rate"]):
            stage = stage_of.get(doc_id, KEPT)
            reached = _reached(stage, step)
            if detector == "near_dedup" and item_id:
                reached = reached and _reached(stage_of.get(item_id, KEPT), step)
            rows.append((doc_id, item_id, form, q, detector, stage, rule_of.get(doc_id, KEPT), reached,
                         reached and rule_of.get(doc_id) == rule))
    outcomes = pd.DataFrame(rows, columns=OUTCOME_COLUMNS)
    unchecked = len(EvalIndex.build(eval_items, corpus.decontamination.ngram).unchecked)
    return DetectorComparison(_tabulate(outcomes, cfg), outcomes, unchecked)


def _tabulate(outcomes: pd.DataFrame, cfg: AuditConfig) -> pd.DataFrame:
    rows = []
    for form in forms(cfg):
        q = float(form.removeprefix("edited_")) if form.startswith("edited_") else 0.0
        for detector in DETECTORS:
            mine = outcomes[(outcomes["form"] == form) & (outcomes["detector"] == detector)]
            n, k = int(mine["reached"].sum()), int(mine["flagged"].sum())
            low, high = wilson_interval(k, n)
            rows.append((form, q, detector, len(mine), n, k, k / n if n else float("nan"), low, high))
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)
