"""Per-document stages: language ID on normalised text, per-language thresholds, the unknown-language policy."""

import math

import pandas as pd
import pytest

from infra.errors import ConfigError
from tasks.corpus.config import CorpusConfig
from tasks.corpus.extract import one_line
from tasks.corpus.filters import Ledger, filter_documents, language_of

EN = ("The harbour master checks the tide tables every morning before the fishing boats leave, and he writes the "
      "times on a board beside the gate so that everyone can see them.")


def test_newlines_never_change_the_language_answer():
    cfg = CorpusConfig()
    wrapped = EN.replace(" the ", "\nthe ").replace(", ", ",\n\n")
    assert language_of(one_line(wrapped), None, cfg)[:2] == language_of(one_line(EN), None, cfg)[:2]


def test_per_language_threshold_applies_to_that_language_only():
    label, score, _ = language_of(EN, None, CorpusConfig())
    assert label == "en" and score > 0.65
    strict = CorpusConfig(langid_thresholds={"en": 0.9999999})
    _, _, reason = language_of(EN, None, strict)
    assert reason is not None and reason.rule == "langid.low_score" and reason.threshold == 0.9999999
    assert strict.langid_threshold_for("zh") == 0.65


def test_short_text_takes_the_hint_or_follows_the_unknown_policy():
    assert language_of("Hi there", "en", CorpusConfig())[0] == "en"
    label, score, reason = language_of("Hi there", None, CorpusConfig())
    assert (label, reason.rule) == ("unknown", "langid.too_short") and math.isnan(score)
    assert language_of("Hi there", None, CorpusConfig(unknown_language="keep")) == ("unknown", pytest.approx(math.nan, nan_ok=True), None)


def test_unknown_language_codes_are_config_errors():
    with pytest.raises(ConfigError, match="not a lid.176 label"):
        CorpusConfig(langid_thresholds={"english": 0.5})
    with pytest.raises(ConfigError, match="not lid.176 labels"):
        CorpusConfig(languages=["en", "xx"])


def test_scores_are_kept_and_funnel_counts_characters():
    docs = pd.DataFrame([dict(doc_id="a", source="s", language_hint=None, content=EN, content_type="text"),
                         dict(doc_id="b", source="s", language_hint=None, content="   ", content_type="text")])
    ledger = Ledger()
    kept = filter_documents(docs, CorpusConfig(gopher={"min_words": 5}), ledger)
    assert kept.doc_id.tolist() == ["a"] and kept.lang_score.iloc[0] > 0.65
    removals, funnel = ledger.frames()
    assert removals.rule.tolist() == ["empty.whitespace"]
    extract = funnel.set_index("stage").loc["extract"]
    assert (extract.docs_in, extract.docs_out, extract.chars_in) == (2, 2, len(EN) + 3)


def test_c4_line_rules_run_inside_the_quality_stage_when_enabled():
    other = ("Our neighbours grow tomatoes and beans in a small garden behind the old mill, and they share the "
             "harvest with the school kitchen every autumn.")
    text = EN + "\nClick here\n" + other
    docs = pd.DataFrame([dict(doc_id="a", source="s", language_hint=None, content=text, content_type="text")])
    off = filter_documents(docs, CorpusConfig(gopher={"min_words": 5}), Ledger())
    on = filter_documents(docs, CorpusConfig(gopher={"min_words": 5}, c4={"enabled": True, "min_sentences": 1}),
                          Ledger())
    assert "Click here" in off.text.iloc[0] and off.lines_dropped.iloc[0] == 0
    assert "Click here" not in on.text.iloc[0] and on.lines_dropped.iloc[0] == 1
