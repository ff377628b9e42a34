"""Document quality rules (SPEC §7): Gopher rules for space-separated languages, character rules for Chinese.

Every filter returns ``(keep, reason)``; ``reason`` is None when kept, else a ``Reason`` whose ``rule`` names the
rule (``gopher.min_words``, ``zh.min_cjk_share``, ...), with the measured value and the threshold it crossed.
Gopher rules and thresholds: Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights from
Training Gopher", Appendix A (quality filters and Table A1 repetition filters).
"""

import re
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from tasks.corpus.config import ChineseRulesConfig, GopherConfig


class Reason(NamedTuple):
    """Why a document is removed: rule name, measured value, threshold crossed, human-readable detail."""

    rule: str
    value: float
    threshold: float
    detail: str


Verdict = tuple[bool, Reason | None]
KEEP: Verdict = (True, None)
# Bullet markers seen at line starts in web text (Gopher "bullet point" rule).
_BULLETS = ("•", "‣", "○", "●", "◦", "▪", "-", "*", "·", "–")
_ELLIPSES = ("...", "…")
_CJK_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]")
_PUNCT_STRIP = "\"'()[]{}<>.,;:!?«»“”‘’`"


def _drop(rule: str, value: float, threshold: float, what: str) -> Verdict:
    return False, Reason(rule, float(value), float(threshold), f"{what} {value:.4g} vs threshold {threshold:.4g}")


def words_of(text: str) -> list[str]:
    """Whitespace tokens with surrounding punctuation stripped; punctuation-only tokens dropped."""
    return [w for w in (t.strip(_PUNCT_STRIP) for t in text.split()) if w]


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.split("\n") if ln.strip()]


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


def gopher_quality(text: str, cfg: GopherConfig) -> Verdict:
    """Gopher quality rules: word count, mean word length, symbols, bullets, ellipses, alphabetic words,
    stop words (count of distinct ``cfg.stop_words`` present). Each rule removes on its own."""
    words = words_of(text)
    n = len(words)
    if n < cfg.min_words:
        return _drop("gopher.min_words", n, cfg.min_words, "words")
    if n > cfg.max_words:
        return _drop("gopher.max_words", n, cfg.max_words, "words")
    mean_len = sum(map(len, words)) / n
    if not cfg.min_mean_word_length <= mean_len <= cfg.max_mean_word_length:
        bound = cfg.min_mean_word_length if mean_len < cfg.min_mean_word_length else cfg.max_mean_word_length
        return _drop("gopher.mean_word_length", mean_len, bound, "mean word length (chars)")
    return _gopher_lines_and_words(text, words, cfg)


def _gopher_lines_and_words(text: str, words: list[str], cfg: GopherConfig) -> Verdict:
    n = len(words)
    symbols = text.count("#") + sum(text.count(e) for e in _ELLIPSES)
    if symbols / n > cfg.max_symbol_word_ratio:
        return _drop("gopher.symbol_word_ratio", symbols / n, cfg.max_symbol_word_ratio, "(# + ellipses)/words")
    lines = _lines(text) or [""]
    bullets = sum(ln.startswith(_BULLETS) for ln in lines) / len(lines)
    if bullets > cfg.max_bullet_lines:
        return _drop("gopher.bullet_lines", bullets, cfg.max_bullet_lines, "share of lines starting with a bullet")
    ellipsis = sum(ln.endswith(_ELLIPSES) for ln in lines) / len(lines)
    if ellipsis > cfg.max_ellipsis_lines:
        return _drop("gopher.ellipsis_lines", ellipsis, cfg.max_ellipsis_lines, "share of lines ending in an ellipsis")
    alpha = sum(any(c.isalpha() for c in w) for w in words) / n
    if alpha < cfg.min_alpha_words:
        return _drop("gopher.alpha_words", alpha, cfg.min_alpha_words, "share of words with a letter")
    stops = len({w.lower() for w in words} & set(cfg.stop_words))
    if stops < cfg.min_stop_words:
        return _drop("gopher.stop_words", stops, cfg.min_stop_words, "distinct stop words")
    return KEEP


def duplicate_share(items: list[str]) -> float:
    """Share of ``items`` that repeat an earlier item (0 for an empty list)."""
    return (len(items) - len(set(items))) / len(items) if items else 0.0


class _Tokens:
    """Integer ids and character lengths of a token sequence, for vectorised n-gram statistics."""

    def __init__(self, tokens: Sequence[str]):
        vocab: dict[str, int] = {}
        self.ids = np.array([vocab.setdefault(t, len(vocab)) for t in tokens], dtype=np.uint64)
        self.lens = np.array([len(t) for t in tokens], dtype=np.int64)

    def ngram_counts(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(count of each start position's n-gram, shape (L-n+1,); key array) via a 64-bit polynomial hash."""
        m = len(self.ids) - n + 1
        keys = np.zeros(max(m, 0), dtype=np.uint64)
        for k in range(n):  # uint64 arithmetic wraps modulo 2^64 by design
            keys = keys * np.uint64(1_000_003) + self.ids[k:k + m]
        _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
        return counts[inverse], keys


def top_ngram_char_share(tokens: Sequence[str], n: int) -> float:
    """Characters in all occurrences of the most frequent n-gram / characters in all tokens; 0 when no
    n-gram occurs twice (a unique n-gram is no repetition, and short texts would otherwise always fail)."""
    return _top_share(_Tokens(tokens), n)


def _top_share(tok: _Tokens, n: int) -> float:
    total = int(tok.lens.sum())
    if len(tok.ids) < n or total == 0:
        return 0.0
    counts, _ = tok.ngram_counts(n)
    first = int(np.argmax(counts))
    if counts[first] < 2:
        return 0.0
    return int(tok.lens[first:first + n].sum()) * int(counts[first]) / total


def dup_ngram_char_share(tokens: Sequence[str], n: int) -> float:
    """Characters of tokens covered by any n-gram occurring more than once / characters in all tokens
    (each token counted once even when several duplicated n-grams overlap it)."""
    return _dup_share(_Tokens(tokens), n)


def _dup_share(tok: _Tokens, n: int) -> float:
    total = int(tok.lens.sum())
    if len(tok.ids) < n or total == 0:
        return 0.0
    counts, _ = tok.ngram_counts(n)
    starts = np.flatnonzero(counts > 1)
    edges = np.zeros(len(tok.ids) + 1, dtype=np.int64)  # +1 where a duplicated n-gram starts, -1 past its end
    np.add.at(edges, starts, 1)
    np.add.at(edges, starts + n, -1)
    covered = np.cumsum(edges)[:-1] > 0
    return int(tok.lens[covered].sum()) / total


def gopher_repetition(text: str, cfg: GopherConfig) -> Verdict:
    """Gopher repetition rules: duplicate lines and paragraphs, top 2/3/4-gram and duplicated 5..10-gram
    character shares (Table A1)."""
    lines, paras = _lines(text), _paragraphs(text)
    if duplicate_share(lines) > cfg.max_dup_lines:
        return _drop("gopher.dup_lines", duplicate_share(lines), cfg.max_dup_lines, "share of duplicate lines")
    if duplicate_share(paras) > cfg.max_dup_paragraphs:
        return _drop("gopher.dup_paragraphs", duplicate_share(paras), cfg.max_dup_paragraphs,
                     "share of duplicate paragraphs")
    tok = _Tokens(text.split())
    for n, limit in sorted(cfg.top_ngram_max_share.items()):
        share = _top_share(tok, n)
        if share > limit:
            return _drop(f"gopher.top_{n}gram", share, limit, f"char share of the top {n}-gram")
    for n, limit in sorted(cfg.dup_ngram_max_share.items()):
        share = _dup_share(tok, n)
        if share > limit:
            return _drop(f"gopher.dup_{n}gram", share, limit, f"char share of duplicated {n}-grams")
    return KEEP


def gopher(text: str, cfg: GopherConfig) -> Verdict:
    """All Gopher rules, quality first (cheaper), then repetition."""
    keep, reason = gopher_quality(text, cfg)
    return gopher_repetition(text, cfg) if keep else (keep, reason)


def cjk_count(text: str) -> int:
    """Number of CJK ideographs (Unified Ideographs, Extension A/B+, Compatibility)."""
    return len(_CJK_RE.findall(text))


def chinese(text: str, cfg: ChineseRulesConfig) -> Verdict:
    """Character rules for Chinese (SPEC §7): length, CJK share, repeated character n-grams, stop words."""
    chars = "".join(text.split())
    if len(chars) < cfg.min_chars:
        return _drop("zh.min_chars", len(chars), cfg.min_chars, "non-space characters")
    cjk_share = cjk_count(chars) / len(chars)
    if cjk_share < cfg.min_cjk_share:
        return _drop("zh.min_cjk_share", cjk_share, cfg.min_cjk_share, "share of CJK characters")
    repeated = dup_ngram_char_share(chars, cfg.repeated_ngram_size)
    if repeated > cfg.max_repeated_ngram_share:
        return _drop("zh.repeated_ngrams", repeated, cfg.max_repeated_ngram_share,
                     f"char share of repeated {cfg.repeated_ngram_size}-char n-grams")
    stops = sum(chars.count(w) for w in cfg.stop_words)
    if stops < cfg.min_stop_words:
        return _drop("zh.stop_words", stops, cfg.min_stop_words, "stop-word occurrences")
    return KEEP


# Languages written without spaces between words: word-based Gopher rules do not apply to them.
CHARACTER_LANGUAGES = frozenset({"zh", "wuu", "yue"})


def quality(text: str, language: str, gopher_cfg: GopherConfig, chinese_cfg: ChineseRulesConfig) -> Verdict:
    """The rule family the language calls for: Chinese character rules or Gopher rules."""
    if language in CHARACTER_LANGUAGES:
        return chinese(text, chinese_cfg)
    return gopher(text, gopher_cfg)
