"""Labelled junk injection (docs/methods.md §7 (TinyStories filter audit)): originals first, then junk, exact copies and near copies.

Near copies edit each shingle unit (a whitespace word, or a non-space character for languages written without
spaces) with probability q: half of the edits substitute a unit drawn from the source's vocabulary, half delete it.
A shingle of n units survives when none of its units is edited, so the surviving share is s = (1 − q)^n and the
copy's Jaccard similarity to its original is J ≈ s / (2 − s) (docs/methods.md §7; deletions shrink the copy by a share q/2 of
its shingles, which raises J by up to 0.015 over q ∈ [.01, .20]).
"""

from __future__ import annotations

import random
import re

import pandas as pd

from tasks.audit.config import AuditConfig
from tasks.corpus.junk import GENERATORS, Material, vocabulary  # noqa: F401  (vocabulary: audit API)

MIX_COLUMNS = ["doc_id", "source", "language_hint", "content", "content_type", "label", "original_id", "edit_rate"]
JUNK_KINDS = ["navigation", "spam", "repeated", "short"]
_SPACE_SPLIT_RE = re.compile(r"(\s+)")


def near_label(q: float) -> str:
    """Label of a near copy at edit rate ``q``: ``near_copy_0.01`` … ``near_copy_0.2``."""
    return f"near_copy_{q:g}"


def labels(cfg: AuditConfig) -> list[str]:
    """Every label in report order: original, the junk kinds, exact_copy, then one near-copy label per rate."""
    return ["original", *JUNK_KINDS, "exact_copy", *(near_label(q) for q in cfg.edit_rates)]


def theoretical_jaccard(q: float, n: int) -> float:
    """J ≈ s / (2 − s) with s = (1 − q)^n: a copy with unit edit rate ``q`` vs its original, n-unit shingles
    (docs/methods.md §7). Two copies at rates q1, q2 of one original: pass q = 1 − (1 − q1)(1 − q2)."""
    s = (1.0 - q) ** n
    return s / (2.0 - s)


def edit_units(text: str, q: float, rng: random.Random, vocab: list[str], by_chars: bool) -> str:
    """``text`` with each unit substituted (probability q/2) or deleted (probability q/2); whitespace kept.

    Units are non-space characters when ``by_chars``, else whitespace-separated words (line breaks survive, so
    line-based quality rules see the same layout as the original).
    """
    if by_chars:
        out = []
        for ch in text:
            if ch.isspace() or rng.random() >= q:
                out.append(ch)
            elif rng.random() < 0.5:
                out.append(rng.choice(vocab))
        return "".join(out)
    parts = _SPACE_SPLIT_RE.split(text)  # word, space, word, space, ...
    out, drop_space = [], False
    for part in parts:
        if not part or part.isspace():
            if not drop_space:
                out.append(part)
            drop_space = False
        elif rng.random() >= q:
            out.append(part)
        elif rng.random() < 0.5:
            out.append(rng.choice(vocab))
        else:
            drop_space = True  # deleted word: drop the whitespace after it too
    return "".join(out)


def copy_counts(num_originals: int, cfg: AuditConfig) -> tuple[int, int]:
    """(exact copies, near copies per rate): the configured counts, scaled down alike when ``num_originals`` cannot
    take them all at ``cfg.max_copies_per_original`` copies each."""
    wanted = cfg.num_exact_copies + cfg.num_near_per_rate * len(cfg.edit_rates)
    room = num_originals * cfg.max_copies_per_original
    if wanted <= room:
        return cfg.num_exact_copies, cfg.num_near_per_rate
    scale = room / wanted
    return int(cfg.num_exact_copies * scale), int(cfg.num_near_per_rate * scale)


def _spread(rng: random.Random, n: int, k: int) -> list[int]:
    """``k`` indices of ``range(n)`` drawn in shuffled rounds, so no index is drawn more than ⌈k/n⌉ times."""
    picks: list[int] = []
    while len(picks) < k:
        picks += rng.sample(range(n), n)
    return picks[:k]


def inject(originals: pd.DataFrame, source: str, language: str, by_chars: bool, cfg: AuditConfig) -> pd.DataFrame:
    """The mixed set: ``originals`` (columns doc_id, text) in order, then labelled junk and copies, shuffled.

    Originals come first so that the corpus build, which keeps the first of each duplicate group, removes the
    copies rather than their originals. Copies are spread over the originals (see ``copy_counts``). Injected ids
    are ``<source>/~audit/<label>/<k>``. Same inputs and ``cfg.seed`` → identical frame.

    Returns:
        frame with ``MIX_COLUMNS``: build input columns (content_type "text", language_hint ``language``) plus
        ``label``, ``original_id`` (copies: the copied original; others: their own id for originals, "" for junk)
        and ``edit_rate`` (near copies: q; exact copies 0.0; others NaN).
    """
    rng = random.Random(cfg.seed)
    texts, ids = originals["text"].tolist(), originals["doc_id"].tolist()
    material = Material(texts, vocabulary(texts, by_chars))
    injected: list[tuple[str, str, str, float]] = []  # label, text, original_id, edit_rate
    for kind in JUNK_KINDS:
        count = getattr(cfg, "num_short" if kind == "short" else f"num_{kind}")
        injected += [(kind, GENERATORS[kind](rng, language, material), "", float("nan")) for _ in range(count)]
    num_exact, num_near = copy_counts(len(texts), cfg)
    picks = iter(_spread(rng, len(texts), num_exact + num_near * len(cfg.edit_rates)))
    for _ in range(num_exact):
        i = next(picks)
        injected.append(("exact_copy", texts[i], ids[i], 0.0))
    for q in cfg.edit_rates:
        for _ in range(num_near):
            i = next(picks)
            injected.append((near_label(q), edit_units(texts[i], q, rng, material.vocab, by_chars), ids[i], q))
    rng.shuffle(injected)
    counters: dict[str, int] = {}
    rows = [dict(doc_id=d, label="original", content=t, original_id=d, edit_rate=float("nan"))
            for d, t in zip(ids, texts)]
    for label, text, original_id, q in injected:
        k = counters[label] = counters.get(label, -1) + 1
        rows.append(dict(doc_id=f"{source}/~audit/{label}/{k:05d}", label=label, content=text,
                         original_id=original_id, edit_rate=q))
    frame = pd.DataFrame(rows)
    return frame.assign(source=source, language_hint=language, content_type="text")[MIX_COLUMNS]
