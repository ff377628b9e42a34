"""Per-document stages of the corpus build, cheap → expensive (docs/methods.md §7); they need no other document.

url (``[corpus.urls]`` domain and substring rules on the optional ``url`` column) → sanitise (NUL bytes, lone
surrogates) → extract (HTML main text) → repair (ftfy) → empty → langid → quality (optional C4 line rules, then
Gopher or Chinese rules by the identified language) → pii (placeholders).

Each stage is a block: an object with a ``name`` and ``apply(frame) -> Verdicts``, which says per row whether it is
removed (a ``Reason``) and which columns the block sets. ``run_blocks`` runs the blocks in order and alone writes the
ledger: every removal is one ``Reason`` row; ``funnel`` rows give documents and characters in/out per stage.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pandas as pd

from tasks.corpus.config import CorpusConfig, UrlConfig
from tasks.corpus.extract import extract_many, one_line, repair, tidy
from tasks.corpus.langid import identify
from tasks.corpus.pii import redact
from tasks.corpus.quality import Reason, c4_lines, quality

DOC_STEPS = ["url", "sanitise", "extract", "repair", "empty", "langid", "quality", "pii"]
INPUT_COLUMNS = ["doc_id", "source", "language_hint", "content", "content_type"]
# Read where the input has them, all-null where it has not.
OPTIONAL_COLUMNS = ["url"]
SURVIVOR_COLUMNS = ["doc_id", "source", "language", "lang_score", "text", "fixes", "pii_replacements",
                    "lines_dropped", "url"]
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


@dataclass(frozen=True)
class Verdicts:
    """What one block decided about the ``n`` rows of the frame it was given.

    ``reasons``: ``n`` entries, None keeps the row and a ``Reason`` removes it; None when the block removes nothing.
    ``columns``: the columns the block sets (added or replaced), ``n`` values each, as the kept rows carry them on.
    ``drop``: columns the block consumes (extract turns ``content`` into ``text``).
    """

    reasons: Sequence[Reason | None] | None = None
    columns: Mapping[str, Sequence] = field(default_factory=dict)
    drop: tuple[str, ...] = ()


class Block(Protocol):
    """One per-document stage: ``apply`` reads a frame (``INPUT_COLUMNS`` plus what earlier blocks set) and writes
    nothing; the ledger and the frame handed on are ``run_blocks``'s."""

    name: str

    def apply(self, frame: pd.DataFrame) -> Verdicts: ...


def filter_documents(docs: pd.DataFrame, cfg: CorpusConfig, ledger: Ledger, workers: int = 1,
                     tick: Tick | None = None) -> pd.DataFrame:
    """Run the per-document stages over ``docs`` (columns ``INPUT_COLUMNS``, and ``url`` if it has one: otherwise
    no document has a URL); returns survivors (columns ``SURVIVOR_COLUMNS``) in input order. Removals and funnel
    rows go to ``ledger``; ``tick`` is called with each stage's name once it has run."""
    frame = docs[INPUT_COLUMNS].reset_index(drop=True)
    fixes = docs["fixes"].fillna("").astype(str).to_numpy() if "fixes" in docs else ""
    urls = docs["url"].to_numpy(dtype=object) if "url" in docs else None
    frame = frame.assign(content=frame.content.fillna("").astype(str), fixes=fixes, url=urls, pii_replacements=0,
                         lines_dropped=0)
    return run_blocks(frame, blocks_for(cfg, workers), ledger, tick)[SURVIVOR_COLUMNS]


def blocks_for(cfg: CorpusConfig, workers: int = 1) -> list[Block]:
    """The blocks of ``DOC_STEPS`` for ``cfg``, in order; a stage switched off stays in place and changes nothing,
    so the funnel always has a row per stage."""
    return [Url(cfg.urls) if cfg.urls.enabled else Unchanged("url"), Sanitise(), Extract(cfg.extractor, workers),
            Repair() if cfg.unicode_repair else Unchanged("repair"), Empty(), Langid(cfg), Quality(cfg),
            Pii() if cfg.pii else Unchanged("pii")]


def run_blocks(frame: pd.DataFrame, blocks: Sequence[Block], ledger: Ledger,
               tick: Tick | None = None) -> pd.DataFrame:
    """Apply ``blocks`` in order: each sees what the previous kept, with the columns it set. For each block, log a
    removal for every row it gave a reason (in row order) and the funnel rows of what went in and out, counting
    characters of ``text``, or of ``content`` before extraction has made a text.

    Raises:
        ValueError: a block returned a number of verdicts or column values other than its frame's row count.
    """
    for block in blocks:
        verdicts = block.apply(frame)
        for name, values in {"reasons": verdicts.reasons, **verdicts.columns}.items():
            if values is not None and len(values) != len(frame):
                raise ValueError(f"block {block.name!r} returned {len(values)} {name} for {len(frame)} rows")
        after = frame.assign(**verdicts.columns) if verdicts.columns else frame
        if verdicts.drop:
            after = after.drop(columns=list(verdicts.drop))
        if verdicts.reasons is not None:
            after = _keep(after, ledger, block.name, verdicts.reasons)
        after = after.reset_index(drop=True)
        ledger.count(block.name, _measured(frame), _measured(after))
        frame = after
        if tick is not None:
            tick(block.name)
    return frame


def _measured(frame: pd.DataFrame) -> pd.DataFrame:
    return frame if "text" in frame.columns else frame.assign(text=frame.content)


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
    idempotent, so the shard writer can apply it (Parquet needs valid UTF-8) and the filter pass again. A ``url``
    column gets lone surrogates replaced too, and values that are not strings become None.
    """
    if "fixes" not in frame:
        frame = frame.assign(fixes="")
    if "url" in frame:
        frame = frame.assign(url=[_SURROGATE_RE.sub("\ufffd", u) if isinstance(u, str) else None
                                  for u in frame.url.tolist()])
    return frame.assign(**Sanitise().apply(frame).columns)


@dataclass(frozen=True)
class Url:
    """Removes a document whose ``url`` a rule of ``cfg`` refuses (``url.blocklist``, ``url.not_allowed``; see
    ``tasks.corpus.urls.UrlRules.check``); a document without a URL, or a frame without the column, passes."""

    cfg: UrlConfig
    name: str = "url"

    def apply(self, frame: pd.DataFrame) -> Verdicts:
        rules = self.cfg.rules()
        if not rules.active or "url" not in frame:
            return Verdicts()
        found = [rules.check(u) for u in frame.url.tolist()]
        return Verdicts(reasons=[None if f is None else Reason(f[0], NAN, NAN, f[1]) for f in found])


@dataclass(frozen=True)
class Sanitise:
    """``content`` without NUL bytes and lone surrogates; each fix named in ``fixes`` (see ``sanitise``)."""

    name: str = "sanitise"

    def apply(self, frame: pd.DataFrame) -> Verdicts:
        contents, fixes = [], []
        for content, fix in zip(frame.content.tolist(), frame.fixes.tolist()):
            content = content if isinstance(content, str) else ""
            if "\x00" in content:
                content, fix = content.replace("\x00", ""), _add_fix(fix, "sanitise:nul_removed")
            if _SURROGATE_RE.search(content):
                content, fix = _SURROGATE_RE.sub("\ufffd", content), _add_fix(fix, "sanitise:lone_surrogate_replaced")
            contents.append(content)
            fixes.append(fix)
        return Verdicts(columns={"content": contents, "fixes": fixes})


@dataclass(frozen=True)
class Extract:
    """``text`` from ``content``: the main text of HTML pages with ``extractor`` (``tasks.corpus.extract``), other
    content as it is, tidied; a page without main text is removed (``extract.no_main_text``)."""

    extractor: str = "trafilatura"
    workers: int = 1
    name: str = "extract"

    def apply(self, frame: pd.DataFrame) -> Verdicts:
        is_html = (frame.content_type == "html").to_numpy()
        texts: list[str | None] = frame.content.tolist()
        pages = extract_many(frame.content[is_html].tolist(), self.workers, self.extractor)
        for i, text in zip(is_html.nonzero()[0], pages):
            texts[i] = text
        no_text = Reason("extract.no_main_text", NAN, NAN, f"{self.extractor} found no main text in the HTML")
        return Verdicts(reasons=[None if isinstance(t, str) else no_text for t in texts],
                        columns={"text": [tidy(t) if isinstance(t, str) else "" for t in texts]}, drop=("content",))


@dataclass(frozen=True)
class Repair:
    """``text`` repaired by ftfy; each fix named in ``fixes``."""

    name: str = "repair"

    def apply(self, frame: pd.DataFrame) -> Verdicts:
        texts, fixes = [], []
        for text, fix in zip(frame.text, frame.fixes):
            repaired, applied = repair(text)
            texts.append(repaired)
            fixes.append(_add_fix(fix, applied) if applied else fix)
        return Verdicts(columns={"text": texts, "fixes": fixes})


@dataclass(frozen=True)
class Unchanged:
    """A stage switched off in the config: every row passes as it is."""

    name: str

    def apply(self, frame: pd.DataFrame) -> Verdicts:
        return Verdicts()


@dataclass(frozen=True)
class Empty:
    """Removes a text with nothing visible (``empty.whitespace``)."""

    name: str = "empty"

    def apply(self, frame: pd.DataFrame) -> Verdicts:
        blank = Reason("empty.whitespace", 0.0, NAN, "no visible characters after extraction and repair")
        return Verdicts(reasons=[None if _visible(t) else blank for t in frame.text])


def _visible(text: str) -> bool:
    """True when ``text`` has a character other than whitespace and zero-width/format characters."""
    return bool(text.strip()) and any(not ch.isspace() and ch not in _INVISIBLE for ch in text)


# Zero-width and formatting characters that render as nothing (ZWSP, ZWNJ, ZWJ, word joiner, BOM, soft hyphen).
_INVISIBLE = frozenset("\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e")


@dataclass(frozen=True)
class Langid:
    """``language`` and ``lang_score`` of each text (``language_of``); removes what ``cfg`` does not keep."""

    cfg: CorpusConfig
    name: str = "langid"

    def apply(self, frame: pd.DataFrame) -> Verdicts:
        found = [language_of(one_line(t), hint, self.cfg) for t, hint in zip(frame.text, frame.language_hint)]
        return Verdicts(reasons=[f[2] for f in found],
                        columns={"language": [f[0] for f in found], "lang_score": [f[1] for f in found]})


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


@dataclass(frozen=True)
class Quality:
    """The optional C4 line rules (lines cut, counted in ``lines_dropped``), then the Gopher or Chinese rules of the
    text's language with its source's thresholds; the first rule that fires removes the text."""

    cfg: CorpusConfig
    name: str = "quality"

    def apply(self, frame: pd.DataFrame) -> Verdicts:
        rules = {source: self.cfg.rules_for(source) for source in frame.source.unique()}
        c4 = self.cfg.c4
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
        return Verdicts(reasons=verdicts, columns={"text": texts, "lines_dropped": dropped})


@dataclass(frozen=True)
class Pii:
    """E-mail, phone and IP replaced by placeholders in ``text``; their count in ``pii_replacements``."""

    name: str = "pii"

    def apply(self, frame: pd.DataFrame) -> Verdicts:
        redacted = [redact(t) for t in frame.text]
        return Verdicts(columns={"text": [t for t, _ in redacted], "pii_replacements": [n for _, n in redacted]})
