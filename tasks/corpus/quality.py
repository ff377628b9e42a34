"""Document quality rules (docs/methods.md §7): Gopher rules for space-separated languages, character rules for Chinese and
Japanese, and the opt-in C4 line rules.

Every filter returns ``(keep, reason)``; ``reason`` is None when kept, else a ``Reason`` whose ``rule`` names the
rule (``gopher.min_words``, ``zh.min_cjk_share``, ``c4.page_pattern``, ...), with the measured value and the
threshold it crossed. Every share is a fraction in [0, 1] by construction (characters counted once even where
repeated spans overlap); only the Gopher symbol-to-word ratio is a ratio of counts and can exceed 1.

Sources: Gopher quality and repetition rules — Rae et al. 2021, "Scaling Language Models: Methods, Analysis &
Insights from Training Gopher", Appendix A (A.1.1 quality filters, Table A1 repetition filters). C4 line rules —
Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer", §2.2, as
implemented in TensorFlow Datasets ``c4_utils.clean_page``.

Rules run cheapest first and stop at the first failure, so the reported reason is the first failing rule in that
order; the keep/remove decision does not depend on the order.
"""

import re
from collections import Counter
from collections.abc import Sequence
from itertools import accumulate, compress, filterfalse, repeat
from typing import NamedTuple

import numpy as np

from tasks.corpus.config import C4Config, ChineseRulesConfig, GopherConfig


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
_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_KANA = "\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff\uff66-\uff9f"
_CJK_RE = re.compile(f"[{_HAN}]")
_HAN_KANA_RE = re.compile(f"[{_HAN}{_KANA}]")
_FROM_KANA_UP_RE = re.compile("[\u3040-\U0010ffff]")
_PUNCT_STRIP = "\"'()[]{}<>.,;:!?«»“”‘’`"
_PARAGRAPH_RE = re.compile(r"\n\s*\n")
# Languages written without spaces between words: word-based Gopher rules do not apply to them.
CHARACTER_LANGUAGES = frozenset({"zh", "ja", "wuu", "yue"})
# Text not identified as a character language is still judged by character rules when at least this share of its
# non-space characters are Han or kana: word rules would measure whole sentences as "words".
_CJK_ROUTING_SHARE = 0.5
_ROUTING_PREFIX_CHARS = 4000


def _reason(rule: str, value: float, threshold: float, what: str) -> Reason:
    return Reason(rule, float(value), float(threshold), f"{what} {value:.4g} vs threshold {threshold:.4g}")


def _verdict(reason: Reason | None) -> Verdict:
    return KEEP if reason is None else (False, reason)


def words_of(text: str) -> list[str]:
    """Whitespace tokens with surrounding punctuation stripped; punctuation-only tokens dropped."""
    return list(filter(None, map(str.strip, text.split(), repeat(_PUNCT_STRIP))))


def _lines(text: str) -> list[str]:
    return list(filter(None, map(str.strip, text.split("\n"))))


def _paragraphs(text: str) -> list[str]:
    return list(filter(None, map(str.strip, _PARAGRAPH_RE.split(text))))


def duplicate_share(items: Sequence[str]) -> float:
    """Share of ``items`` that repeat an earlier item, in [0, 1] (0 for an empty list)."""
    return _duplicates(items)[0]


def _duplicates(items: Sequence[str]) -> tuple[float, float]:
    """(share of items repeating an earlier item, share of characters in those repeats), both in [0, 1]."""
    if len(set(items)) == len(items):
        return 0.0, 0.0
    seen: set[str] = set()
    n_dup = chars_dup = 0
    for item in items:
        if item in seen:
            n_dup += 1
            chars_dup += len(item)
        else:
            seen.add(item)
    total_chars = sum(map(len, items))
    return n_dup / len(items), (chars_dup / total_chars if total_chars else 0.0)


# --- n-gram repetition -------------------------------------------------------------------------------------------

def _covered_chars(starts: Sequence[int], n: int, cum: Sequence[int]) -> int:
    """Characters of the tokens covered by n-grams starting at ``starts`` (ascending), each token once; ``cum``
    holds the prefix sums of token lengths."""
    covered = 0
    for a, b in zip(starts, starts[1:]):
        covered += cum[min(a + n, b)] - cum[a]
    if starts:
        covered += cum[starts[-1] + n] - cum[starts[-1]]
    return covered


_NO_REPEATS: tuple[list[int], list, list[int]] = ([], [], [])


class _Repeats:
    """Repeated token n-grams of one document for n = 1, 2, ..., built on demand.

    Level n lists, in position order, the start positions whose n-gram occurs more than once, with that n-gram
    (the token for n = 1, else a tuple; compared exactly) and its count. Level 2 is counted over all positions;
    an (n+1)-gram can repeat only where the n-grams at i and i+1 both repeat, so each further level looks only at
    survivors of the previous one; in clean text few survive past n = 2.
    """

    def __init__(self, tokens: Sequence[str]):
        self.tokens = tokens
        self.total = sum(map(len, tokens))
        self._cum: list[int] | None = None
        self._levels: dict[int, tuple[list[int], list, list[int]]] = {}

    @staticmethod
    def _repeated(grams: Sequence) -> tuple[list[int], list, list[int]]:
        """Level entries for ``grams`` (one per start position), counted over all positions."""
        counts = Counter(grams)
        if len(counts) == len(grams):
            return _NO_REPEATS
        # itertools and bound methods keep this per-position pass in C
        pos = list(compress(range(len(grams)), map((1).__lt__, map(counts.__getitem__, grams))))
        kept = list(map(grams.__getitem__, pos))
        return pos, kept, list(map(counts.__getitem__, kept))

    @property
    def cum(self) -> list[int]:
        if self._cum is None:
            self._cum = list(accumulate(map(len, self.tokens), initial=0))
        return self._cum

    def _level(self, n: int) -> tuple[list[int], list, list[int]]:
        """(positions, n-grams, counts) of the repeated n-grams, positions ascending."""
        levels, tokens = self._levels, self.tokens
        if n in levels:
            return levels[n]
        if n < 1:
            return _NO_REPEATS
        if n <= 2:
            levels[n] = self._repeated(tokens if n == 1 else list(zip(tokens, tokens[1:])))
            return levels[n]
        self._level(2)
        for k in range(max(m for m in levels if 2 <= m < n), n):  # extend level k to k + 1
            pos, grams, _ = levels[k]
            if len(pos) < 2:
                levels[k + 1] = _NO_REPEATS
                continue
            repeated = set(pos)
            last = len(tokens) - k  # a (k+1)-gram starts before this
            new = [(i, g + (tokens[i + k],)) for i, g in zip(pos, grams) if i + 1 in repeated and i < last]
            counts = Counter(g for _, g in new)
            kept = [(i, g, c) for (i, g), c in zip(new, map(counts.__getitem__, (g for _, g in new))) if c > 1]
            levels[k + 1] = tuple(map(list, zip(*kept))) if kept else _NO_REPEATS
        return levels[n]

    def top_share(self, n: int, limit: float = -1.0) -> float:
        """Share of characters covered by the most frequent n-gram (the first seen among ties), each token once.

        When occurrences × characters of that n-gram (an upper bound: overlaps counted twice) is at most ``limit``,
        the bound is returned instead; callers that only ask "above ``limit``?" get the same answer.
        """
        if n < 1 or not self.total:
            return 0.0
        pos, grams, counts = self._level(n)
        if not pos:
            return 0.0
        count = max(counts)
        top = grams[counts.index(count)]  # earliest position holding the highest count
        bound = count * (len(top) if n == 1 else sum(map(len, top))) / self.total
        if bound <= limit:
            return bound
        starts = [i for i, g in zip(pos, grams) if g == top]
        return _covered_chars(starts, n, self.cum) / self.total

    def dup_share(self, n: int) -> float:
        """Share of characters covered by n-grams occurring more than once (every occurrence), each token once."""
        if n < 1 or not self.total:
            return 0.0
        pos = self._level(n)[0]
        return _covered_chars(pos, n, self.cum) / self.total if pos else 0.0


def top_ngram_char_share(tokens: Sequence[str], n: int) -> float:
    """Characters of the tokens covered by occurrences of the most frequent n-gram / characters of all tokens,
    in [0, 1]: a token inside two overlapping occurrences counts once. 0 when no n-gram occurs twice (a unique
    n-gram is no repetition). Among equally frequent n-grams the one occurring first is taken."""
    return _Repeats(tokens).top_share(n)


def dup_ngram_char_share(tokens: Sequence[str], n: int) -> float:
    """Characters of tokens covered by any n-gram occurring more than once (every occurrence, the first
    included) / characters in all tokens, in [0, 1]: each token counted once even where duplicated n-grams
    overlap (Rae et al. 2021, App. A: "taking care not to count characters that occur in overlapping n-grams
    more than once")."""
    return _Repeats(tokens).dup_share(n)


def repeated_char_share(chars: str, n: int) -> float:
    """``dup_ngram_char_share`` over the characters of ``chars``, in [0, 1].

    Candidates are found with a vectorised 64-bit polynomial hash of every character n-gram; only positions whose
    hash repeats are compared as strings, so a hash collision can never change the result.
    """
    m = len(chars) - n + 1
    if m < 2 or n < 1:
        return 0.0
    points = np.frombuffer(chars.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    keys = points[:m].copy()
    for k in range(1, n):  # uint64 arithmetic wraps modulo 2^64, as a hash should
        keys *= np.uint64(1_000_003)
        keys += points[k:k + m]
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    same = sorted_keys[1:] == sorted_keys[:-1]
    if not same.any():
        return 0.0
    flagged = np.zeros(m, dtype=bool)
    flagged[1:] = same
    flagged[:-1] |= same
    candidates = np.sort(order[flagged]).tolist()
    grams = [chars[i:i + n] for i in candidates]
    counts = Counter(grams)
    starts = [i for i, g in zip(candidates, grams) if counts[g] > 1]
    covered = sum(min(n, b - a) for a, b in zip(starts, starts[1:])) + (n if starts else 0)
    return covered / len(chars)


# --- Gopher ------------------------------------------------------------------------------------------------------

_STOP_SETS: dict[tuple[str, ...], frozenset[str]] = {}


def _stop_set(words: list[str]) -> frozenset[str]:
    key = tuple(words)
    found = _STOP_SETS.get(key)
    if found is None:
        found = _STOP_SETS[key] = frozenset(w.lower() for w in words)
    return found


def _word_rules(text: str, words: list[str], cfg: GopherConfig) -> Reason | None:
    n = len(words)
    if n < cfg.min_words or n == 0:
        return _reason("gopher.min_words", n, max(cfg.min_words, 1), "words")
    if n > cfg.max_words:
        return _reason("gopher.max_words", n, cfg.max_words, "words")
    mean_len = sum(map(len, words)) / n
    if mean_len < cfg.min_mean_word_length:
        return _reason("gopher.mean_word_length", mean_len, cfg.min_mean_word_length, "mean word length (chars)")
    if mean_len > cfg.max_mean_word_length:
        return _reason("gopher.mean_word_length", mean_len, cfg.max_mean_word_length, "mean word length (chars)")
    symbols = text.count("#") + text.count("...") + text.count("…")
    if symbols / n > cfg.max_symbol_word_ratio:
        return _reason("gopher.symbol_word_ratio", symbols / n, cfg.max_symbol_word_ratio, "(# + ellipses)/words")
    return None


def _line_rules(lines: list[str], cfg: GopherConfig) -> Reason | None:
    if not lines:
        return None
    bullets = sum(ln.startswith(_BULLETS) for ln in lines) / len(lines)
    if bullets > cfg.max_bullet_lines:
        return _reason("gopher.bullet_lines", bullets, cfg.max_bullet_lines, "share of lines starting with a bullet")
    ellipsis = sum(ln.endswith(_ELLIPSES) for ln in lines) / len(lines)
    if ellipsis > cfg.max_ellipsis_lines:
        return _reason("gopher.ellipsis_lines", ellipsis, cfg.max_ellipsis_lines,
                       "share of lines ending in an ellipsis")
    return None


def _vocabulary_rules(words: list[str], cfg: GopherConfig) -> Reason | None:
    n = len(words)
    # isalpha() settles most words in C; only the rest need a per-character look
    no_letter = sum(not any(map(str.isalpha, w)) for w in filterfalse(str.isalpha, words))
    alpha = (n - no_letter) / n
    if alpha < cfg.min_alpha_words:
        return _reason("gopher.alpha_words", alpha, cfg.min_alpha_words, "share of words with a letter")
    if cfg.min_stop_words > 0:
        stop_set, found = _stop_set(cfg.stop_words), set()
        for w in words:
            lw = w.lower()
            if lw in stop_set:
                found.add(lw)
                if len(found) >= cfg.min_stop_words:
                    return None
        return _reason("gopher.stop_words", len(found), cfg.min_stop_words, "distinct stop words")
    return None


def _duplicate_text_rules(text: str, lines: list[str], cfg: GopherConfig) -> Reason | None:
    line_share, line_chars = _duplicates(lines)
    if line_share > cfg.max_dup_lines:
        return _reason("gopher.dup_lines", line_share, cfg.max_dup_lines, "share of duplicate lines")
    if line_chars > cfg.max_dup_line_chars:
        return _reason("gopher.dup_line_chars", line_chars, cfg.max_dup_line_chars,
                       "char share of duplicate lines")
    if line_share == 0.0:
        return None  # a repeated paragraph repeats its lines, so there is none
    para_share, para_chars = _duplicates(_paragraphs(text))
    if para_share > cfg.max_dup_paragraphs:
        return _reason("gopher.dup_paragraphs", para_share, cfg.max_dup_paragraphs, "share of duplicate paragraphs")
    if para_chars > cfg.max_dup_paragraph_chars:
        return _reason("gopher.dup_paragraph_chars", para_chars, cfg.max_dup_paragraph_chars,
                       "char share of duplicate paragraphs")
    return None


def _ngram_rules(words: list[str], cfg: GopherConfig) -> Reason | None:
    if not cfg.top_ngram_max_share and not cfg.dup_ngram_max_share:
        return None
    repeats = _Repeats(words)
    for n, limit in sorted(cfg.top_ngram_max_share.items()):
        share = repeats.top_share(n, limit)
        if share > limit:
            return _reason(f"gopher.top_{n}gram", share, limit, f"char share of the top {n}-gram")
    dup_limits = sorted(cfg.dup_ngram_max_share.items())
    for k, (n, limit) in enumerate(dup_limits):
        share = repeats.dup_share(n)
        if share > limit:
            return _reason(f"gopher.dup_{n}gram", share, limit, f"char share of duplicated {n}-grams")
        # The covered share never grows with n (a repeated (n+1)-gram is two overlapping repeated n-grams), so
        # once it is within every remaining limit the remaining rules pass.
        if all(share <= later for _, later in dup_limits[k + 1:]):
            break
    return None


def gopher_quality(text: str, cfg: GopherConfig) -> Verdict:
    """Gopher quality rules (Rae et al. 2021, App. A.1.1): word count, mean word length (chars), (# + ellipses)
    per word, share of lines starting with a bullet, share of lines ending in an ellipsis, share of words with a
    letter, distinct ``cfg.stop_words`` present (case-insensitive). Words are ``words_of(text)``; lines are the
    non-blank lines. Each rule removes on its own."""
    words = words_of(text)
    return _verdict(_word_rules(text, words, cfg) or _line_rules(_lines(text), cfg)
                    or _vocabulary_rules(words, cfg))


def gopher_repetition(text: str, cfg: GopherConfig) -> Verdict:
    """Gopher repetition rules (Rae et al. 2021, App. A, Table A1): duplicate lines and paragraphs by count and by
    character share, top 2/3/4-gram and duplicated 5..10-gram character shares over ``words_of(text)``."""
    return _verdict(_duplicate_text_rules(text, _lines(text), cfg) or _ngram_rules(words_of(text), cfg))


def gopher(text: str, cfg: GopherConfig) -> Verdict:
    """All Gopher rules, cheapest first: word counts and symbols, line shapes, vocabulary, duplicate lines and
    paragraphs, then word n-grams. The text is tokenised once."""
    words = words_of(text)
    reason = _word_rules(text, words, cfg)
    if reason is None:
        lines = _lines(text)
        reason = (_line_rules(lines, cfg) or _vocabulary_rules(words, cfg)
                  or _duplicate_text_rules(text, lines, cfg) or _ngram_rules(words, cfg))
    return _verdict(reason)


# --- Chinese / Japanese ------------------------------------------------------------------------------------------

def cjk_count(text: str) -> int:
    """Number of CJK ideographs (Unified Ideographs, Extensions A–G, Compatibility)."""
    return len(_CJK_RE.findall(text))


def han_kana_count(text: str) -> int:
    """Number of Han ideographs and Japanese kana characters."""
    return len(_HAN_KANA_RE.findall(text))


def chinese(text: str, cfg: ChineseRulesConfig, language: str = "zh") -> Verdict:
    """Character rules for languages written without spaces (docs/methods.md §7), cheapest first: length in non-space
    characters, share of Han/kana characters, stop-word occurrences (``cfg.stop_words_for(language)``), share of
    characters covered by repeated character n-grams (the character analogue of Gopher's duplicated n-grams)."""
    chars = "".join(text.split())
    n = len(chars)
    if n < cfg.min_chars or n == 0:
        return False, _reason("zh.min_chars", n, max(cfg.min_chars, 1), "non-space characters")
    if n > cfg.max_chars:
        return False, _reason("zh.max_chars", n, cfg.max_chars, "non-space characters")
    cjk_share = han_kana_count(chars) / n
    if cjk_share < cfg.min_cjk_share:
        return False, _reason("zh.min_cjk_share", cjk_share, cfg.min_cjk_share, "share of Han/kana characters")
    if cfg.min_stop_words > 0:
        stops = 0
        for word in cfg.stop_words_for(language):
            stops += chars.count(word)
            if stops >= cfg.min_stop_words:
                break
        else:
            return False, _reason("zh.stop_words", stops, cfg.min_stop_words, "stop-word occurrences")
    repeated = repeated_char_share(chars, cfg.repeated_ngram_size)
    if repeated > cfg.max_repeated_ngram_share:
        return False, _reason("zh.repeated_ngrams", repeated, cfg.max_repeated_ngram_share,
                              f"char share of repeated {cfg.repeated_ngram_size}-char n-grams")
    return KEEP


def written_without_spaces(text: str, language: str) -> bool:
    """True when ``text`` takes the character rules: ``language`` is in ``CHARACTER_LANGUAGES``, or at least half
    of the non-space characters of its first 4,000 characters are Han or kana (a mis-identified or hinted language
    must not send an unspaced CJK paragraph to word rules)."""
    if language in CHARACTER_LANGUAGES:
        return True
    if text.isascii():
        return False
    sample = text[:_ROUTING_PREFIX_CHARS]
    if _FROM_KANA_UP_RE.search(sample) is None:  # one range test per character: cheaper than the Han/kana set
        return False
    sample = "".join(sample.split())
    return bool(sample) and han_kana_count(sample) >= _CJK_ROUTING_SHARE * len(sample)


def quality(text: str, language: str, gopher_cfg: GopherConfig, chinese_cfg: ChineseRulesConfig) -> Verdict:
    """The rule family the text calls for: character rules when ``written_without_spaces(text, language)``,
    else Gopher rules."""
    if written_without_spaces(text, language):
        return chinese(text, chinese_cfg, language)
    return gopher(text, gopher_cfg)


# --- C4 ----------------------------------------------------------------------------------------------------------

_CITATION_RE = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]", re.IGNORECASE)
# A sentence end: terminal marks, then optional closing quotes/brackets, then whitespace or the end of the line.
_SENTENCE_END_RE = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s|$)")
_BLOCKLIST_RES: dict[tuple[str, ...], re.Pattern[str]] = {}


def _blocklist_re(words: list[str]) -> re.Pattern[str] | None:
    if not words:
        return None
    key = tuple(words)
    found = _BLOCKLIST_RES.get(key)
    if found is None:
        alternatives = "|".join(re.escape(w.lower()) for w in sorted(words, key=len, reverse=True))
        found = _BLOCKLIST_RES[key] = re.compile(rf"(?<![a-z])(?:{alternatives})(?![a-z])")
    return found


def c4_lines(text: str, cfg: C4Config, language: str | None = None) -> tuple[str, int, Reason | None]:
    """C4 line rules (Raffel et al. 2020, §2.2; TFDS ``c4_utils.clean_page``), opt-in via ``cfg.enabled``.

    Per non-blank line, in order: drop it if a whitespace word is longer than ``cfg.max_word_length`` chars;
    remove citation markers ("[1]", "[edit]", "[citation needed]") when ``cfg.remove_citations``; drop it unless it
    ends with one of ``cfg.end_marks`` (a trailing "..." is not an end); drop it if it has fewer than
    ``cfg.min_words_per_line`` whitespace words; remove the page if the lower-cased line contains one of
    ``cfg.page_substrings`` ("lorem ipsum", "{"); drop the line if it contains one of ``cfg.line_substrings``
    ("javascript", cookie and policy notices); remove the page if a ``cfg.blocklist`` word stands on its own. As in
    the reference, page patterns are looked for only in lines that passed the line tests. Finally the page is
    removed when fewer than ``cfg.min_sentences`` sentence ends (".", "!", "?" before a space or the line end)
    remain, or when no line remains.

    Returns ``(text, lines_dropped, reason)``: the kept lines (a blank line kept between lines that were in
    different paragraphs) and the number of non-blank lines dropped; with a reason the page is removed and the
    input text is returned unchanged. Disabled, or for text taking the character rules (the C4 rules assume
    space-separated words; see ``written_without_spaces``, with ``language`` "" when not given), the input comes
    back unchanged with 0 and None.
    """
    if not cfg.enabled or written_without_spaces(text, language or ""):
        return text, 0, None
    end_marks, page_subs, line_subs = tuple(cfg.end_marks), cfg.page_substrings, cfg.line_substrings
    blocklist = _blocklist_re(cfg.blocklist)
    kept: list[str] = []
    dropped = sentences = 0
    gap = False
    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            gap = bool(kept)
            continue
        words = line.split()
        if cfg.max_word_length > 0 and max(map(len, words)) > cfg.max_word_length:
            dropped += 1
            continue
        if cfg.remove_citations and "[" in line:
            line = _CITATION_RE.sub("", line).strip()
            words = line.split()
        if not line.endswith(end_marks) or line.endswith("..."):
            dropped += 1
            continue
        if len(words) < cfg.min_words_per_line:
            dropped += 1
            continue
        lower = line.lower()
        for pattern in page_subs:
            if pattern.lower() in lower:
                return text, dropped, Reason("c4.page_pattern", 1.0, float("nan"),
                                             f"page contains {pattern!r} in a kept line")
        if any(p.lower() in lower for p in line_subs):
            dropped += 1
            continue
        if blocklist is not None:
            hit = blocklist.search(lower)
            if hit is not None:
                return text, dropped, Reason("c4.blocklist", 1.0, float("nan"),
                                             f"page contains the blocklisted word {hit.group(0)!r}")
        sentences += len(_SENTENCE_END_RE.findall(line))
        if gap:
            kept.append("")
        kept.append(line)
        gap = False
    if not kept:
        return text, dropped, Reason("c4.no_lines", dropped, 1.0,
                                     f"all {dropped} lines dropped by the C4 line rules")
    if sentences < cfg.min_sentences:
        return text, dropped, _reason("c4.min_sentences", sentences, cfg.min_sentences,
                                      "sentences in kept lines")
    return "\n".join(kept), dropped, None
