"""Per-document stages of the corpus build, cheap → expensive (docs/methods.md §7); they need no other document.

sanitise (NUL bytes, lone surrogates) → extract (HTML main text) → repair (ftfy) → empty → langid → quality
(optional C4 line rules, then Gopher or Chinese rules by the identified language) → pii (placeholders).
Every removal is one ``Reason`` row in the ledger; ``funnel`` rows give documents and characters in/out per stage.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tasks.corpus.config import CorpusConfig
from tasks.corpus.extract import extract_many, one_line, repair, tidy
from tasks.corpus.langid import identify
from tasks.corpus.pii import redact
from tasks.corpus.quality import Reason, c4_lines, quality

DOC_STEPS = ["sanitise", "extract", "repair", "empty", "langid", "quality", "pii"]
INPUT_COLUMNS = ["doc_id", "source", "language_hint", "content", "content_type"]
SURVIVOR_COLUMNS = ["doc_id", "source", "language", "lang_score", "text", "fixes", "pii_replacements",
                    "lines_dropped"]
REMOVAL_COLUMNS = ["doc_id", "source", "stage", "rule", "value", "threshold", "detail"]
FUNNEL_COLUMNS = ["source", "stage", "docs_in", "docs_out", "chars_in", "chars_out"]
NAN = math.nan
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
Tick = Callable[[str], None]


@dataclass
class Ledger:
    """Removal rows and funnel counts gathered while stages run over one shard."""

    removals: list[dict] = field(default_factory=list)
    funnel: list[dict] = field(default_factory=list)

    def remove(self, doc_id: str, source: str, stage: str, reason: Reason) -> None:
        self.removals.append(dict(doc_id=doc_id, source=source, stage=stage, rule=reason.rule,
                                  value=float(reason.value), threshold=float(reason.threshold), detail=reason.detail))

    def count(self, stage: str, before: pd.DataFrame, after: pd.DataFrame, text_before: str = "text") -> None:
        """Funnel rows for ``stage``: documents and characters per source before and after."""
        if not len(before):
            return
        chars_in = before[text_before].astype(str).str.len().groupby(before["source"]).sum()
        chars_out = (after["text"].astype(str).str.len().groupby(after["source"]).sum() if len(after)
                     else pd.Series(dtype="int64"))
        n_in = before["source"].value_counts()
        n_out = after["source"].value_counts() if len(after) else pd.Series(dtype="int64")
        for source in sorted(before["source"].unique()):
            self.funnel.append(dict(source=source, stage=stage, docs_in=int(n_in.get(source, 0)),
                                    docs_out=int(n_out.get(source, 0)), chars_in=int(chars_in.get(source, 0)),
                                    chars_out=int(chars_out.get(source, 0))))

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        return (pd.DataFrame(self.removals, columns=REMOVAL_COLUMNS),
                pd.DataFrame(self.funnel, columns=FUNNEL_COLUMNS))


def filter_documents(docs: pd.DataFrame, cfg: CorpusConfig, ledger: Ledger, workers: int = 1,
                     tick: Tick | None = None) -> pd.DataFrame:
    """Run the per-document stages over ``docs`` (columns ``INPUT_COLUMNS``); returns survivors
    (columns ``SURVIVOR_COLUMNS``) in input order. Removals and funnel rows go to ``ledger``."""
    frame = docs[INPUT_COLUMNS].reset_index(drop=True)
    fixes = docs["fixes"].fillna("").astype(str).to_numpy() if "fixes" in docs else ""
    frame = frame.assign(content=frame.content.fillna("").astype(str), fixes=fixes, pii_replacements=0,
                         lines_dropped=0)
    sanitised = sanitise(frame)
    ledger.count("sanitise", frame.assign(text=frame.content), sanitised.assign(text=sanitised.content))
    frame = sanitised
    steps: list[tuple[str, Callable[[pd.DataFrame], pd.DataFrame]]] = [
        ("extract", lambda f: _extract(f, ledger, workers)),
        ("repair", _repair if cfg.unicode_repair else (lambda f: f)),
        ("empty", lambda f: _empty(f, ledger)),
        ("langid", lambda f: _langid(f, ledger, cfg)),
        ("quality", lambda f: _quality(f, ledger, cfg)),
        ("pii", lambda f: _pii(f) if cfg.pii else f),
    ]
    for stage, step in steps:
        after = step(frame).reset_index(drop=True)
        ledger.count(stage, frame.assign(text=frame.content) if stage == "extract" else frame, after)
        frame = after
        if tick is not None:
            tick(stage)
    return frame[SURVIVOR_COLUMNS]


def _keep(frame: pd.DataFrame, ledger: Ledger, stage: str, verdicts: list[Reason | None]) -> pd.DataFrame:
    """Log a removal for every row with a reason; return the rows without one."""
    for doc_id, source, reason in zip(frame.doc_id, frame.source, verdicts):
        if reason is not None:
            ledger.remove(doc_id, source, stage, reason)
    return frame.loc[np.array([r is None for r in verdicts], dtype=bool)]


def _add_fix(fixes: str, fix: str) -> str:
    return f"{fixes},{fix}" if fixes else fix


def sanitise(frame: pd.DataFrame) -> pd.DataFrame:
    """NUL bytes dropped and lone surrogates replaced by U+FFFD before any other stage sees the text.

    Adds (or extends) the ``fixes`` column with ``sanitise:nul_removed`` / ``sanitise:lone_surrogate_replaced``;
    idempotent, so the shard writer can apply it (Parquet needs valid UTF-8) and the filter pass again.
    """
    if "fixes" not in frame:
        frame = frame.assign(fixes="")
    contents, fixes = [], []
    for content, fix in zip(frame.content.tolist(), frame.fixes.tolist()):
        content = content if isinstance(content, str) else ""
        if "\x00" in content:
            content, fix = content.replace("\x00", ""), _add_fix(fix, "sanitise:nul_removed")
        if _SURROGATE_RE.search(content):
            content, fix = _SURROGATE_RE.sub("\ufffd", content), _add_fix(fix, "sanitise:lone_surrogate_replaced")
        contents.append(content)
        fixes.append(fix)
    return frame.assign(content=contents, fixes=fixes)


def _extract(frame: pd.DataFrame, ledger: Ledger, workers: int) -> pd.DataFrame:
    is_html = (frame.content_type == "html").to_numpy()
    texts: list[str | None] = frame.content.tolist()
    for i, text in zip(is_html.nonzero()[0], extract_many(frame.content[is_html].tolist(), workers)):
        texts[i] = text
    no_text = Reason("extract.no_main_text", NAN, NAN, "trafilatura found no main text in the HTML")
    reasons = [None if isinstance(t, str) else no_text for t in texts]
    frame = frame.assign(text=[tidy(t) if isinstance(t, str) else "" for t in texts]).drop(columns="content")
    return _keep(frame, ledger, "extract", reasons)


def _repair(frame: pd.DataFrame) -> pd.DataFrame:
    texts, fixes = [], []
    for text, fix in zip(frame.text, frame.fixes):
        repaired, applied = repair(text)
        texts.append(repaired)
        fixes.append(_add_fix(fix, applied) if applied else fix)
    return frame.assign(text=texts, fixes=fixes)


def _empty(frame: pd.DataFrame, ledger: Ledger) -> pd.DataFrame:
    blank = Reason("empty.whitespace", 0.0, NAN, "no visible characters after extraction and repair")
    return _keep(frame, ledger, "empty", [None if _visible(t) else blank for t in frame.text])


def _visible(text: str) -> bool:
    """True when ``text`` has a character other than whitespace and zero-width/format characters."""
    return bool(text.strip()) and any(not ch.isspace() and ch not in _INVISIBLE for ch in text)


# Zero-width and formatting characters that render as nothing (ZWSP, ZWNJ, ZWJ, word joiner, BOM, soft hyphen).
_INVISIBLE = frozenset("\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e")


def _langid(frame: pd.DataFrame, ledger: Ledger, cfg: CorpusConfig) -> pd.DataFrame:
    found = [language_of(one_line(t), hint, cfg) for t, hint in zip(frame.text, frame.language_hint)]
    frame = frame.assign(language=[f[0] for f in found], lang_score=[f[1] for f in found])
    return _keep(frame, ledger, "langid", [f[2] for f in found])


def language_of(line: str, hint: object, cfg: CorpusConfig) -> tuple[str, float, Reason | None]:
    """(language, lid.176 score, removal reason or None) of whitespace-normalised text ``line``.

    Below ``cfg.langid_min_chars`` characters the identifier is unreliable (docs/methods.md §7): the source's language hint is
    used (score NaN), or the language is ``unknown`` — kept or removed by ``cfg.unknown_language``.
    """
    if len(line) < cfg.langid_min_chars:
        if not isinstance(hint, str) or not hint:
            if cfg.unknown_language == "keep":
                return "unknown", NAN, None
            return "unknown", NAN, Reason("langid.too_short", len(line), cfg.langid_min_chars,
                                          f"{len(line)} chars is too short to identify and the source has no hint")
        label, score = hint, NAN
    else:
        label, score = identify(line)
        threshold = cfg.langid_threshold_for(label)
        if score < threshold:
            return label, score, Reason("langid.low_score", score, threshold,
                                        f"top language {label} scored {score:.3f} < {threshold}")
    if label not in cfg.languages:
        return label, score, Reason("langid.language", score, NAN,
                                    f"language {label} is not kept ({', '.join(cfg.languages)})")
    return label, score, None


def _quality(frame: pd.DataFrame, ledger: Ledger, cfg: CorpusConfig) -> pd.DataFrame:
    rules = {source: cfg.rules_for(source) for source in frame.source.unique()}
    c4 = cfg.c4
    texts, dropped, verdicts = [], [], []
    for text, lang, src, n in zip(frame.text, frame.language, frame.source, frame.lines_dropped):
        reason = None
        if c4.enabled:
            text, n_dropped, reason = c4_lines(text, c4, language=lang)
            n += n_dropped
        if reason is None:
            reason = quality(text, lang, *rules[src])[1]
        texts.append(text)
        dropped.append(n)
        verdicts.append(reason)
    return _keep(frame.assign(text=texts, lines_dropped=dropped), ledger, "quality", verdicts)


def _pii(frame: pd.DataFrame) -> pd.DataFrame:
    redacted = [redact(t) for t in frame.text]
    return frame.assign(text=[t for t, _ in redacted], pii_replacements=[n for _, n in redacted])
