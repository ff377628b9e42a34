"""Quality rules: each Gopher, Chinese and C4 rule fires with its reason; shares stay in [0, 1]; the fast
implementation gives the same verdicts as a direct transcription of the rules."""

import random
from collections import Counter

import pytest

from infra.errors import ConfigError
from tasks.corpus.config import C4Config, ChineseRulesConfig, GopherConfig
from tasks.corpus.quality import (
    c4_lines,
    chinese,
    dup_ngram_char_share,
    gopher,
    gopher_quality,
    gopher_repetition,
    quality,
    repeated_char_share,
    top_ngram_char_share,
    words_of,
)

G = GopherConfig()
# 60 distinct words plus stop words: passes every Gopher rule with the defaults of docs/methods.md §7.
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
    assert gopher_quality(GOOD, G) == gopher_repetition(GOOD, G) == (True, None)


PARA = lines_of(GOOD.split(), per_line=12)  # 6 distinct lines
LONG_LINE = " ".join(FILLER[:30])


@pytest.mark.parametrize("text,expected", [
    ("the and of few words", "gopher.min_words"),
    (" ".join(["the", "and"] + ["ab"] * 10 + [f"x{i}" for i in range(50)]), "gopher.mean_word_length"),
    (" ".join(["the", "and"] + [f"{'x' * 14}{i}" for i in range(60)]), "gopher.mean_word_length"),
    (GOOD + " " + " ".join(["#tag"] * 10), "gopher.symbol_word_ratio"),
    (lines_of(GOOD.split(), prefix="• "), "gopher.bullet_lines"),
    (GOOD + " " + " ".join(str(1000 + i) for i in range(30)), "gopher.alpha_words"),
    (" ".join(FILLER), "gopher.stop_words"),
    (lines_of(GOOD.split()) + "\nsame line again" * 9, "gopher.dup_lines"),  # 8 of 20 lines repeat
    # 1 repeat of 7 lines (14% by count) but the long line is 40% of the characters
    (lines_of(GOOD.split(), per_line=12) + "\n" + LONG_LINE + "\n" + LONG_LINE, "gopher.dup_line_chars"),
    (GOOD + " " + "the cat " * 30, "gopher.top_2gram"),
    (GOOD + " " + "the cat sat " * 12, "gopher.top_3gram"),
    (GOOD + " " + " ".join(FILLER[:8]), "gopher.dup_5gram"),
])
def test_each_gopher_rule_names_itself(text, expected):
    assert rule(text) == expected


def test_duplicate_paragraph_rules():
    # Lines repeat within paragraphs too, so the line rules are relaxed to reach the paragraph rules.
    relaxed = dict(max_dup_lines=1.0, max_dup_line_chars=1.0, top_ngram_max_share={}, dup_ngram_max_share={})
    paras = [lines_of(FILLER[i:i + 12], per_line=6) for i in range(0, 60, 12)]
    repeated = "\n\n".join(["the and of"] + paras + paras[:2])  # 2 of 8 paragraphs repeat: 25%, 27.6% of chars
    assert rule(repeated, GopherConfig(**relaxed)) == "gopher.dup_paragraph_chars"  # Table A1: 20% of chars
    assert rule(repeated, GopherConfig(**relaxed, max_dup_paragraphs=0.2)) == "gopher.dup_paragraphs"
    _, reason = gopher(repeated, GopherConfig(**relaxed))
    assert reason.value == pytest.approx(0.27604871)
    assert rule(repeated, GopherConfig(**relaxed, max_dup_paragraph_chars=0.3)) is None


def test_ellipsis_lines_and_max_words():
    words = GOOD.split()
    text = "\n".join(" ".join(words[i:i + 12]) + (" ..." if i < 48 else "") for i in range(0, len(words), 12))
    assert rule(text) == "gopher.ellipsis_lines"  # 4 of 6 lines, yet only 4 ellipses per 67 words
    assert rule(GOOD, GopherConfig(max_words=55)) == "gopher.max_words"


def test_reason_carries_value_and_threshold():
    _, reason = gopher("the and of few words", G)
    assert (reason.value, reason.threshold) == (5.0, 50.0)
    assert "words" in reason.detail
    _, empty = gopher("  \n ", GopherConfig(min_words=0))
    assert empty.rule == "gopher.min_words" and empty.value == 0


def test_repetition_shares_stay_within_one():
    tokens = ["a"] * 40  # every 2-gram overlaps the next: counted naively this would be 39 * 2 / 40
    assert top_ngram_char_share(tokens, 2) == 1.0
    assert dup_ngram_char_share(tokens, 5) == 1.0
    _, reason = gopher(" ".join(["the", "of"] + ["spam"] * 80), G)
    assert reason.rule == "gopher.top_2gram" and 0 <= reason.value <= 1


def _oracle_dup_share(tokens, n):
    grams = Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
    covered = set()
    for i in range(len(tokens) - n + 1):
        if grams[tuple(tokens[i:i + n])] > 1:
            covered.update(range(i, i + n))
    total = sum(map(len, tokens))
    return sum(len(tokens[i]) for i in covered) / total if total else 0.0


def _oracle_top_share(tokens, n):
    grams = Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))  # insertion order = first seen
    top = max(grams.values(), default=0)
    total = sum(map(len, tokens))
    if top < 2 or not total:
        return 0.0
    gram = next(g for g, c in grams.items() if c == top)
    covered = set()
    for i in range(len(tokens) - n + 1):
        if tuple(tokens[i:i + n]) == gram:
            covered.update(range(i, i + n))
    return sum(len(tokens[i]) for i in covered) / total


@pytest.mark.parametrize("seed", range(30))
def test_ngram_shares_match_brute_force(seed):
    rng = random.Random(seed)
    tokens = [rng.choice(["a", "bb", "ccc", "dddd", "e"]) for _ in range(rng.randrange(0, 80))]
    for n in (1, 2, 3, 4, 5, 8, 10):
        assert dup_ngram_char_share(tokens, n) == pytest.approx(_oracle_dup_share(tokens, n))
        assert top_ngram_char_share(tokens, n) == pytest.approx(_oracle_top_share(tokens, n))


@pytest.mark.parametrize("seed", range(10))
def test_repeated_char_share_matches_brute_force(seed):
    rng = random.Random(seed)
    phrases = ["".join(rng.choice("的是在不了有和人这中大为上个国我以要他") for _ in range(rng.randrange(1, 14)))
               for _ in range(12)]
    text = "".join(rng.choice(phrases) for _ in range(rng.randrange(0, 40)))
    for n in (2, 5, 10):
        assert repeated_char_share(text, n) == pytest.approx(_oracle_dup_share(list(text), n))
    assert repeated_char_share(ZH_300, 10) == 0.0


P = "\"'()[]{}<>.,;:!?«»“”‘’`"


def _oracle_gopher(text, cfg):
    """The Gopher rules transcribed directly, in the order ``gopher`` applies them: (rule, value) or None."""
    words = [w for w in (t.strip(P) for t in text.split()) if w]
    n = len(words)
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    paras = [p.strip() for p in text.replace("\r", "").split("\n\n") if p.strip()]

    def dups(items):
        seen, n_dup, chars = set(), 0, 0
        for x in items:
            n_dup, chars = (n_dup + 1, chars + len(x)) if x in seen else (n_dup, chars)
            seen.add(x)
        return (n_dup / len(items) if items else 0.0), (chars / sum(map(len, items)) if items else 0.0)

    mean = sum(map(len, words)) / n if n else 0.0
    checks = [
        ("gopher.min_words", n, n < max(cfg.min_words, 1)),
        ("gopher.max_words", n, n > cfg.max_words),
        ("gopher.mean_word_length", mean, not cfg.min_mean_word_length <= mean <= cfg.max_mean_word_length),
        ("gopher.symbol_word_ratio", lambda: (text.count("#") + text.count("...") + text.count("…")) / n,
         lambda v: v > cfg.max_symbol_word_ratio),
        ("gopher.bullet_lines", lambda: sum(ln[0] in "•‣○●◦▪-*·–" for ln in lines) / len(lines) if lines else 0,
         lambda v: v > cfg.max_bullet_lines),
        ("gopher.ellipsis_lines", lambda: sum(ln.endswith(("...", "…")) for ln in lines) / len(lines) if lines else 0,
         lambda v: v > cfg.max_ellipsis_lines),
        ("gopher.alpha_words", lambda: sum(any(c.isalpha() for c in w) for w in words) / n,
         lambda v: v < cfg.min_alpha_words),
        ("gopher.stop_words", lambda: len({w.lower() for w in words} & set(cfg.stop_words)),
         lambda v: v < cfg.min_stop_words),
        ("gopher.dup_lines", lambda: dups(lines)[0], lambda v: v > cfg.max_dup_lines),
        ("gopher.dup_line_chars", lambda: dups(lines)[1], lambda v: v > cfg.max_dup_line_chars),
        ("gopher.dup_paragraphs", lambda: dups(paras)[0], lambda v: v > cfg.max_dup_paragraphs),
        ("gopher.dup_paragraph_chars", lambda: dups(paras)[1], lambda v: v > cfg.max_dup_paragraph_chars),
    ]
    checks += [(f"gopher.top_{k}gram", lambda k=k: _oracle_top_share(words, k), lambda v, lim=lim: v > lim)
               for k, lim in sorted(cfg.top_ngram_max_share.items())]
    checks += [(f"gopher.dup_{k}gram", lambda k=k: _oracle_dup_share(words, k), lambda v, lim=lim: v > lim)
               for k, lim in sorted(cfg.dup_ngram_max_share.items())]
    for name, value, failed in checks:
        value = value() if callable(value) else value
        if failed(value) if callable(failed) else failed:
            return name, value
    return None


def _random_doc(rng):
    vocab = ["the", "of", "and", "to", "data", "model", "river", "stone", "#", "...", "2024", "-", "•", "walks",
             "quickly", "beneath", "(yes)", "north", "light", "a"] + [f"w{i}" for i in range(rng.randrange(5, 200))]
    lines = []
    for _ in range(rng.randrange(1, 40)):
        r = rng.random()
        if lines and r < 0.15:
            lines.append(rng.choice(lines))  # repeated line
        elif r < 0.2:
            lines.append("")  # paragraph break
        else:
            lines.append(" ".join(rng.choice(vocab) for _ in range(rng.randrange(1, 16))))
    return "\n".join(lines)


COUNT_RULES = {"gopher.min_words", "gopher.max_words", "gopher.mean_word_length", "gopher.symbol_word_ratio",
               "gopher.stop_words"}


def test_gopher_matches_direct_transcription():
    rng = random.Random(7)
    outcomes = Counter()
    for _ in range(600):
        text = _random_doc(rng)
        cfg = G if rng.random() < 0.5 else GopherConfig(min_words=5, min_alpha_words=0.5, max_symbol_word_ratio=0.5)
        _, reason = gopher(text, cfg)
        expected = _oracle_gopher(text, cfg)
        got = None if reason is None else (reason.rule, reason.value)
        assert (got is None) == (expected is None), text
        if got is not None:
            assert got[0] == expected[0] and got[1] == pytest.approx(expected[1]), text
            if reason.rule not in COUNT_RULES:
                assert 0.0 <= reason.value <= 1.0, reason
        outcomes[got[0] if got else "kept"] += 1
    assert len(outcomes) >= 8, outcomes  # the generator reaches most rules


def test_words_strip_punctuation():
    assert words_of('He said: "stop!" -- (ok) ...') == ["He", "said", "stop", "--", "ok"]


ZH = ("开源软件的发展离不开社区的贡献，这是许多项目能够长期维护的原因。我们在学习编程时，"
      "也常常阅读别人写好的代码，并从中发现新的思路和方法。")
C = ChineseRulesConfig()


def test_chinese_rules():
    assert chinese(ZH, C) == (True, None)
    assert chinese(ZH[:20], C)[1].rule == "zh.min_chars"
    assert chinese(ZH, ChineseRulesConfig(max_chars=60))[1].rule == "zh.max_chars"
    assert chinese(ZH[:12] + " plain ascii words here" * 5, C)[1].rule == "zh.min_cjk_share"
    assert chinese(ZH[:15] * 6, C)[1].rule == "zh.repeated_ngrams"
    assert chinese(ZH, ChineseRulesConfig(stop_words=["喵"], min_stop_words=1))[1].rule == "zh.stop_words"
    _, reason = chinese(ZH[:15] * 6, C)
    assert 0 < reason.value <= 1


# 300 characters of Chinese prose without spaces.
ZH_300 = (ZH + "每天早上，城市的街道上都会出现许多骑自行车上班的人。他们穿过公园和小巷，在路边的早餐店买一杯热豆浆，"
          "然后继续赶路。冬天的时候，风很大，路面也常常结冰，可是大家依旧按时出发。有人说这是习惯，也有人说这是"
          "生活的节奏。无论如何，这座城市因为这些普通人的坚持而显得格外有活力。傍晚回家的路上，天色渐渐暗下来，"
          "路灯一盏接一盏地亮起，孩子们在楼下追逐打闹，老人坐在长椅上聊着过去的故事，窗户里飘出饭菜的香味。"
          "这样的日子看起来平淡，却让人觉得踏实而温暖。周末的时候，很多家庭会去郊外走走，看看山上的树和田里的庄稼。")[:300]


@pytest.mark.parametrize("language", ["zh", "en", "unknown", "ko"])
def test_unspaced_chinese_never_meets_word_rules(language):
    assert len(ZH_300) == 300 and not any(c.isspace() for c in ZH_300)
    assert quality(ZH_300, language, G, C) == (True, None)
    _, reason = quality(ZH_300[:40], language, G, C)
    assert reason.rule == "zh.min_chars"


def test_language_selects_rule_family():
    assert quality(ZH, "zh", G, C) == (True, None)
    assert quality(GOOD, "en", G, C) == (True, None)
    assert quality(GOOD, "zh", G, C)[1].rule.startswith("zh.")
    ja = "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。何でも薄暗いじめじめした所でニャーニャー泣いていた事だけは記憶している。"
    assert quality(ja, "ja", G, C) == (True, None)  # Japanese stop words, kana counted as CJK script
    assert quality(ja, "ja", G, C.model_copy(update={"stop_words_by_language": {}}))[1].rule == "zh.stop_words"


# --- C4 ----------------------------------------------------------------------------------------------------------

C4 = C4Config(enabled=True)
SENTENCES = ["The river runs north past the old mill.", "Children walk along its banks every morning!",
             "Who built the stone bridge near the school?", "Nobody remembers the name of the first builder."]


def test_c4_keeps_terminal_lines_and_counts_drops():
    text = "\n".join(["Home | About | Contact", SENTENCES[0], "Share this", SENTENCES[1], "Read more...",
                      "", SENTENCES[2], "Too short.", "Please enable JavaScript to view the comments below."])
    out, dropped, reason = c4_lines(text, C4)
    assert reason is None and dropped == 5
    assert out == "\n".join(SENTENCES[:2]) + "\n\n" + SENTENCES[2]


def test_c4_disabled_or_character_language_is_identity():
    text = "menu\n{ code }\nlorem ipsum"
    assert c4_lines(text, C4Config()) == (text, 0, None)
    assert c4_lines(ZH, C4, language="zh") == (ZH, 0, None)
    assert c4_lines(ZH_300, C4) == (ZH_300, 0, None)  # unspaced CJK text without a language


@pytest.mark.parametrize("extra,rule", [
    ("Lorem ipsum dolor sit amet, consectetur.", "c4.page_pattern"),
    ("Call the function with { a: 1 } as options.", "c4.page_pattern"),
    ("This sentence contains the word badword here.", "c4.blocklist"),
])
def test_c4_page_removals(extra, rule):
    cfg = C4Config(enabled=True, blocklist=["badword"])
    text = "\n".join(SENTENCES + [extra])
    out, _, reason = c4_lines(text, cfg)
    assert reason.rule == rule and out == text
    assert c4_lines("\n".join(SENTENCES + ["The badwords list is long."]), cfg)[2] is None  # whole words only


def test_c4_page_pattern_only_counts_in_kept_lines():
    assert c4_lines("\n".join(SENTENCES + ["function f() {"]), C4)[2] is None  # that line is dropped first


def test_c4_empty_and_too_few_sentences():
    out, dropped, reason = c4_lines("menu\nsearch\nlogin", C4)
    assert reason.rule == "c4.no_lines" and dropped == 3 and out == "menu\nsearch\nlogin"
    _, _, reason = c4_lines(SENTENCES[0] + "\n" + SENTENCES[1], C4)
    assert (reason.rule, reason.value, reason.threshold) == ("c4.min_sentences", 2.0, 3.0)


def test_c4_citations_and_options():
    text = "\n".join(SENTENCES[:3] + ["The bridge opened in 1901 after two years of work.[1]"])
    out, dropped, reason = c4_lines(text, C4)
    assert reason is None and dropped == 0 and out.endswith("two years of work.")
    loose = C4Config(enabled=True, min_words_per_line=1, min_sentences=1, page_substrings=[], end_marks=["."])
    assert c4_lines("Short.\n{ fine }.\nNo mark", loose) == ("Short.\n{ fine }.", 1, None)


def test_c4_config_is_validated():
    with pytest.raises(ConfigError):
        C4Config(end_marks=[])
    with pytest.raises(ConfigError):
        C4Config(min_words_per_line=-1)
    with pytest.raises(ConfigError):
        GopherConfig(max_dup_line_chars=1.5)
    with pytest.raises(ConfigError):
        ChineseRulesConfig(stop_words=[], min_stop_words=1)
