"""Gopher and Chinese rules: each rule fires with its reason; n-gram shares match brute-force oracles."""

import random
from collections import Counter

import pytest

from tasks.corpus.config import ChineseRulesConfig, GopherConfig
from tasks.corpus.quality import chinese, dup_ngram_char_share, gopher, quality, top_ngram_char_share

G = GopherConfig()
# 60 distinct words plus stop words: passes every Gopher rule with the SPEC §7 defaults.
FILLER = [f"token{c}{i}" for i, c in enumerate("abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefgh")]
GOOD = " ".join(["the", "and", "of"] + FILLER)


def lines_of(words, per_line=6, prefix="", suffix=""):
    return "\n".join(prefix + " ".join(words[i:i + per_line]) + suffix for i in range(0, len(words), per_line))


def rule(text, cfg=G):
    keep, reason = gopher(text, cfg)
    assert keep == (reason is None)
    return reason.rule if reason else None


def test_good_text_passes():
    assert gopher(GOOD, G) == (True, None)


@pytest.mark.parametrize("text,expected", [
    ("the and of few words", "gopher.min_words"),
    (" ".join(["the", "and"] + ["ab"] * 10 + [f"x{i}" for i in range(50)]), "gopher.mean_word_length"),
    (GOOD + " " + " ".join(["#tag"] * 10), "gopher.symbol_word_ratio"),
    (lines_of(GOOD.split(), prefix="• "), "gopher.bullet_lines"),
    (GOOD + " " + " ".join(str(1000 + i) for i in range(30)), "gopher.alpha_words"),
    (" ".join(FILLER), "gopher.stop_words"),
    (lines_of(GOOD.split()) + "\nsame line again" * 9, "gopher.dup_lines"),  # 8 of 20 lines repeat
    (GOOD + " " + "the cat " * 30, "gopher.top_2gram"),
    (GOOD + " " + " ".join(FILLER[:8]), "gopher.dup_5gram"),
])
def test_each_gopher_rule_names_itself(text, expected):
    assert rule(text) == expected


def test_ellipsis_lines_and_max_words():
    words = GOOD.split()
    text = "\n".join(" ".join(words[i:i + 12]) + (" ..." if i < 48 else "") for i in range(0, len(words), 12))
    assert rule(text) == "gopher.ellipsis_lines"  # 4 of 6 lines, yet only 4 ellipses per 67 words
    assert rule(GOOD, GopherConfig(max_words=55)) == "gopher.max_words"


def test_reason_carries_value_and_threshold():
    _, reason = gopher("the and of few words", G)
    assert (reason.value, reason.threshold) == (5.0, 50.0)
    assert "words" in reason.detail


def _oracle_dup_share(tokens, n):
    grams = Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
    covered = set()
    for i in range(len(tokens) - n + 1):
        if grams[tuple(tokens[i:i + n])] > 1:
            covered.update(range(i, i + n))
    total = sum(map(len, tokens))
    return sum(len(tokens[i]) for i in covered) / total if total else 0.0


def _oracle_top_shares(tokens, n):
    """Every share a most-frequent n-gram can give (ties between equally frequent n-grams are allowed)."""
    grams = Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
    top = max(grams.values(), default=0)
    if top < 2:
        return {0.0}
    return {round(sum(map(len, g)) * c / sum(map(len, tokens)), 12) for g, c in grams.items() if c == top}


@pytest.mark.parametrize("seed", range(20))
def test_ngram_shares_match_brute_force(seed):
    rng = random.Random(seed)
    tokens = [rng.choice(["a", "bb", "ccc", "dddd", "e"]) for _ in range(rng.randrange(0, 80))]
    for n in (2, 3, 5, 8):
        assert dup_ngram_char_share(tokens, n) == pytest.approx(_oracle_dup_share(tokens, n))
        assert round(top_ngram_char_share(tokens, n), 12) in _oracle_top_shares(tokens, n)


ZH = ("开源软件的发展离不开社区的贡献，这是许多项目能够长期维护的原因。我们在学习编程时，"
      "也常常阅读别人写好的代码，并从中发现新的思路和方法。")
C = ChineseRulesConfig()


def test_chinese_rules():
    assert chinese(ZH, C) == (True, None)
    assert chinese(ZH[:20], C)[1].rule == "zh.min_chars"
    assert chinese(ZH[:12] + " plain ascii words here" * 5, C)[1].rule == "zh.min_cjk_share"
    assert chinese(ZH[:15] * 6, C)[1].rule == "zh.repeated_ngrams"
    assert chinese(ZH, ChineseRulesConfig(stop_words=["喵"], min_stop_words=1))[1].rule == "zh.stop_words"


def test_language_selects_rule_family():
    assert quality(ZH, "zh", G, C) == (True, None)
    assert quality(ZH, "en", G, C)[1].rule.startswith("gopher.")
