"""Tokenizer report: counts against hand-computed and brute-force figures; fragmentation pieces."""

import pandas as pd
import pytest

from infra.errors import ConfigError
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.fit import fit_tokenizer
from tasks.tokenizer.report import fragmentation, tokenizer_report

DOCS = pd.DataFrame([
    dict(text="the cat sat", language="en", source="web"),
    dict(text="a dog  ran\nfar", language="en", source="books"),
    dict(text="你好，世界 今天", language="zh", source="web"),
    dict(text="東京 タワー", language="ja", source="books"),
])


@pytest.fixture(scope="module")
def tok():
    corpus = ["the cat sat on the mat, a dog ran far"] * 30 + ["你好世界今天东京"] * 30
    return fit_tokenizer(corpus, TokenizerConfig(vocab_size=320))


def test_language_rows_match_hand_counts(tok):
    report = tokenizer_report(tok, DOCS, by="language").set_index("group")
    assert list(report.index) == ["en", "ja", "zh"]
    assert report.loc["en", "n_words"] == 3 + 4
    assert report.loc["zh", "n_words"] == 7  # 你好，世界今天: non-space characters
    assert report.loc["ja", "n_words"] == 5
    assert report.loc["en", "n_chars"] == len("the cat sat") + len("a dog  ran\nfar")
    assert report.loc["zh", "n_bytes"] == 3 * 7 + 1  # seven 3-byte characters, one space
    assert list(report["word_unit"]) == ["word", "char", "char"]


def test_ratios_match_brute_force_count(tok):
    report = tokenizer_report(tok, DOCS, by="language").set_index("group")
    for language, group in DOCS.groupby("language"):
        n_tokens = sum(len(tok.encode(t).ids) for t in group["text"])
        n_chars = sum(len(list(t)) for t in group["text"])
        assert report.loc[language, "n_tokens"] == n_tokens
        assert report.loc[language, "chars_per_token"] == pytest.approx(n_chars / n_tokens)
        assert report.loc[language, "tokens_per_word"] == pytest.approx(n_tokens / report.loc[language, "n_words"])


def test_source_rows_flag_mixed_units(tok):
    report = tokenizer_report(tok, DOCS, by="source").set_index("group")
    assert report.loc["web", "n_docs"] == 2
    assert report.loc["web", "word_unit"] == "mixed"
    assert report["n_tokens"].sum() == tokenizer_report(tok, DOCS, by="language")["n_tokens"].sum()


def test_unknown_grouping_refused(tok):
    with pytest.raises(ConfigError, match="by"):
        tokenizer_report(tok, DOCS, by="domain")


def test_fragmentation_pieces_rebuild_term(tok):
    frame = fragmentation(tok, ["cat", "2024", "photosynthesis"]).set_index("term")
    assert frame.loc["2024", "pieces"] == ["2", "0", "2", "4"]
    for term, row in frame.iterrows():
        assert "".join(row["pieces"]) == term
        assert row["n_tokens"] == len(row["pieces"])
    assert frame.loc["cat", "n_tokens"] < frame.loc["photosynthesis", "n_tokens"]
