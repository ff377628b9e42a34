"""The corpus build: documents of several sources in, curated documents + one removal row per loss out (SPEC §7).

Stages, cheap → expensive: extract (HTML main text) → repair (ftfy) → empty → langid → quality (Gopher or Chinese
rules, chosen by the identified language) → pii (placeholders) → dedup_exact → dedup_near (MinHash LSH).
Invariant: for every source, input documents = kept + removed; ``funnel`` shows docs in/out per stage and source.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from infra.errors import DataError
from tasks.corpus.config import CorpusConfig
from tasks.corpus.dedup import exact_duplicates
from tasks.corpus.extract import extract_many, one_line, repair, tidy
from tasks.corpus.langid import identify
from tasks.corpus.minhash import lsh_candidate_probability, lsh_threshold, near_duplicates
from tasks.corpus.pii import redact
from tasks.corpus.quality import CHARACTER_LANGUAGES, Reason, cjk_count, quality

__all__ = ["build_corpus", "CorpusResult", "STAGES", "lsh_candidate_probability", "lsh_threshold"]

STAGES = ["extract", "repair", "empty", "langid", "quality", "pii", "dedup_exact", "dedup_near"]
INPUT_COLUMNS = ["doc_id", "source", "language_hint", "content", "content_type"]
KEPT_COLUMNS = ["doc_id", "source", "language", "lang_score", "text", "n_chars", "n_bytes", "n_words",
                "family_id", "pii_replacements", "fixes"]
REMOVAL_COLUMNS = ["doc_id", "source", "stage", "rule", "value", "threshold", "detail"]
FUNNEL_COLUMNS = ["source", "stage", "docs_in", "docs_out"]
Progress = Callable[[str, int, int], None]
NAN = math.nan


@dataclass
class CorpusResult:
    """``kept``: curated documents (``KEPT_COLUMNS``); ``removals``: one row per removed document
    (``REMOVAL_COLUMNS``); ``funnel``: documents in/out per source and stage, in stage order (``FUNNEL_COLUMNS``)."""

    kept: pd.DataFrame
    removals: pd.DataFrame
    funnel: pd.DataFrame


class _Log:
    """Collects removal rows and funnel counts as stages run."""

    def __init__(self, sources: list[str], progress: Progress | None):
        self.sources, self.progress = sources, progress
        self.removals: list[dict] = []
        self.funnel: list[dict] = []

    def remove(self, doc_id: str, source: str, stage: str, reason: Reason) -> None:
        self.removals.append(dict(doc_id=doc_id, source=source, stage=stage, rule=reason.rule,
                                  value=reason.value, threshold=reason.threshold, detail=reason.detail))

    def stage(self, stage: str, before: pd.DataFrame, after: pd.DataFrame) -> None:
        n_in, n_out = before.source.value_counts(), after.source.value_counts()
        for source in self.sources:
            self.funnel.append(dict(source=source, stage=stage, docs_in=int(n_in.get(source, 0)),
                                    docs_out=int(n_out.get(source, 0))))
        self.tick(stage, len(before), len(before))

    def tick(self, stage: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(stage, done, total)


def build_corpus(docs: pd.DataFrame, cfg: CorpusConfig, *, progress: Progress | None = None,
                 workers: int = 1) -> CorpusResult:
    """Curate ``docs`` (the concatenated ``SourceDocs.docs`` frames) with ``cfg`` (SPEC §7).

    ``progress(stage, done, total)`` is called as stages advance (counts in documents); ``workers > 1`` extracts
    HTML in a process pool. Document order decides which duplicate is kept (the first).

    Raises:
        DataError: a required column (``INPUT_COLUMNS``) is missing or ``doc_id`` values are not unique.
    """
    _check_input(docs)
    log = _Log(sorted(docs.source.unique()), progress)
    frame = docs[INPUT_COLUMNS].reset_index(drop=True)
    for stage, step in _steps(cfg, workers):
        log.tick(stage, 0, len(frame))
        after = step(frame, log)
        log.stage(stage, frame, after)
        frame = after.reset_index(drop=True)
    return CorpusResult(kept=_kept(frame), removals=pd.DataFrame(log.removals, columns=REMOVAL_COLUMNS),
                        funnel=pd.DataFrame(log.funnel, columns=FUNNEL_COLUMNS))


def _check_input(docs: pd.DataFrame) -> None:
    missing = [c for c in INPUT_COLUMNS if c not in docs.columns]
    if missing:
        raise DataError(f"build_corpus input lacks columns {missing}; pass concatenated SourceDocs.docs frames")
    dupes = docs.doc_id[docs.doc_id.duplicated()].unique()
    if len(dupes):
        raise DataError(f"doc_id values repeat (e.g. {list(dupes[:3])}); give each source a distinct name")


def _steps(cfg: CorpusConfig, workers: int) -> list[tuple[str, Callable[[pd.DataFrame, _Log], pd.DataFrame]]]:
    return [
        ("extract", lambda f, log: _extract(f, log, workers)),
        ("repair", lambda f, log: _repair(f)),
        ("empty", _empty),
        ("langid", lambda f, log: _langid(f, log, cfg)),
        ("quality", lambda f, log: _quality(f, log, cfg)),
        ("pii", lambda f, log: _pii(f) if cfg.pii else f.assign(pii_replacements=0)),
        ("dedup_exact", lambda f, log: _dedup_exact(f, log) if cfg.exact_dedup else f),
        ("dedup_near", lambda f, log: _dedup_near(f, log, cfg, workers)),
    ]


def _filter(frame: pd.DataFrame, log: _Log, stage: str, verdicts: list[Reason | None]) -> pd.DataFrame:
    """Log a removal for every row with a reason; return the rows without one."""
    keep = [r is None for r in verdicts]
    for doc_id, source, reason in zip(frame.doc_id, frame.source, verdicts):
        if reason is not None:
            log.remove(doc_id, source, stage, reason)
    return frame[keep]


def _extract(frame: pd.DataFrame, log: _Log, workers: int) -> pd.DataFrame:
    is_html = (frame.content_type == "html").to_numpy()
    extracted = extract_many(frame.content[is_html].tolist(), workers)
    texts = frame.content.tolist()
    for i, text in zip(is_html.nonzero()[0], extracted):
        texts[i] = text
    no_text = Reason("extract.no_main_text", NAN, NAN, "trafilatura found no main text in the HTML")
    reasons = [None if isinstance(t, str) else no_text for t in texts]  # pandas may turn None into NaN
    frame = frame.assign(text=[tidy(t) if isinstance(t, str) else "" for t in texts])
    return _filter(frame, log, "extract", reasons)


def _repair(frame: pd.DataFrame) -> pd.DataFrame:
    fixed = [repair(t) for t in frame.text]
    return frame.assign(text=[t for t, _ in fixed], fixes=[f for _, f in fixed])


def _empty(frame: pd.DataFrame, log: _Log) -> pd.DataFrame:
    blank = Reason("empty.whitespace", 0.0, NAN, "no non-whitespace characters after extraction and repair")
    return _filter(frame, log, "empty", [blank if not t.strip() else None for t in frame.text])


def _langid(frame: pd.DataFrame, log: _Log, cfg: CorpusConfig) -> pd.DataFrame:
    labels, scores, reasons = [], [], []
    for text, hint in zip(frame.text, frame.language_hint):
        label, score, reason = _language_of(one_line(text), hint, cfg)
        labels.append(label)
        scores.append(score)
        reasons.append(reason)
    return _filter(frame.assign(language=labels, lang_score=scores), log, "langid", reasons)


def _language_of(line: str, hint: str | None, cfg: CorpusConfig) -> tuple[str, float, Reason | None]:
    """(language, score, removal reason or None); short texts take the source's hint (score NaN)."""
    kept = ", ".join(cfg.languages)
    if len(line) < cfg.langid_min_chars:
        if not isinstance(hint, str) or not hint:
            return "unknown", NAN, Reason("langid.too_short", len(line), cfg.langid_min_chars,
                                          f"{len(line)} chars is too short to identify and the source has no hint")
        label, score = hint, NAN
    else:
        label, score = identify(line)
        if score < cfg.langid_threshold:
            return label, score, Reason("langid.low_score", score, cfg.langid_threshold,
                                        f"top language {label} scored {score:.3f} < {cfg.langid_threshold}")
    if label not in cfg.languages:
        return label, score, Reason("langid.language", score, NAN, f"language {label} is not kept ({kept})")
    return label, score, None


def _quality(frame: pd.DataFrame, log: _Log, cfg: CorpusConfig) -> pd.DataFrame:
    rules = {source: cfg.rules_for(source) for source in frame.source.unique()}
    verdicts = [quality(t, lang, *rules[src])[1] for t, lang, src in zip(frame.text, frame.language, frame.source)]
    return _filter(frame, log, "quality", verdicts)


def _pii(frame: pd.DataFrame) -> pd.DataFrame:
    redacted = [redact(t) for t in frame.text]
    return frame.assign(text=[t for t, _ in redacted], pii_replacements=[n for _, n in redacted])


def _dedup_exact(frame: pd.DataFrame, log: _Log) -> pd.DataFrame:
    firsts = exact_duplicates(frame.text.tolist())
    ids = frame.doc_id.tolist()
    reasons = [None if j is None else Reason("dedup.exact", 1.0, NAN, f"exact duplicate of {ids[j]}")
               for j in firsts]
    return _filter(frame, log, "dedup_exact", reasons)


def _dedup_near(frame: pd.DataFrame, log: _Log, cfg: CorpusConfig, workers: int) -> pd.DataFrame:
    by_chars = [lang in CHARACTER_LANGUAGES for lang in frame.language]
    found = near_duplicates(frame.text.tolist(), by_chars, cfg.near_dedup,
                            progress=lambda d, t: log.tick("dedup_near", d, t))
    ids = frame.doc_id.tolist()
    frame = frame.assign(family_id=[ids[r] for r in found.representative])
    reasons = [None if r == i else Reason("dedup.near", sim, cfg.near_dedup.jaccard_threshold,
                                          f"near duplicate of {ids[r]} (Jaccard {sim:.3f})")
               for i, (r, sim) in enumerate(zip(found.representative, found.jaccard_to_rep))]
    return _filter(frame, log, "dedup_near", reasons)


def _kept(frame: pd.DataFrame) -> pd.DataFrame:
    by_chars = frame.language.isin(CHARACTER_LANGUAGES)
    frame = frame.assign(
        n_chars=frame.text.str.len(),
        n_bytes=[len(t.encode("utf-8")) for t in frame.text],
        n_words=[_count_words(t, c) for t, c in zip(frame.text, by_chars)],
        lang_score=frame.lang_score.astype(float),
    )
    return frame[KEPT_COLUMNS].reset_index(drop=True)


def _count_words(text: str, by_chars: bool) -> int:
    """Whitespace tokens; for character languages each CJK ideograph counts as a word."""
    if not by_chars:
        return len(text.split())
    return cjk_count(text) + sum(1 for tok in text.split() if cjk_count(tok) == 0)
