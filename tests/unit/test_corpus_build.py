"""The whole corpus build on a small frame: reasons, dedup details, funnel reconciliation, no lost documents."""

import pandas as pd
import pytest

from infra.errors import ConfigError, DataError
from tasks.corpus.build import CURATION_STEPS, build_corpus
from tasks.corpus.config import CorpusConfig
from tasks.corpus.minhash import jaccard, shingles

EN_A = (
    "Gardeners who keep a small vegetable plot learn quickly that the soil matters more than any single seed. "
    "They add compost in the autumn, turn it over with a fork, and leave it to rest through the cold months. "
    "When spring arrives the beds are dark and crumbly, and the first rows of peas go in with very little effort. "
    "Watering early in the morning keeps the leaves dry, which helps to prevent mould, and a thin layer of straw "
    "between the rows holds moisture in the ground during the hot weeks of summer that follow."
)
EN_B = (
    "The old railway line that once carried coal from the valley has become a quiet path for walkers and cyclists. "
    "Along the way there are iron bridges, a tunnel lit by small lamps, and a station building that now serves tea. "
    "Local volunteers clear fallen branches after storms and repair the wooden benches with timber they have saved. "
    "On weekends families come with bicycles and picnic baskets, and the children count the mileposts as they ride "
    "toward the river where the line used to end at a loading dock."
)
NEAR_A = EN_A.replace("very little effort", "hardly any effort")
ZH = ("开源软件的发展离不开社区的贡献，这是许多项目能够长期维护的原因。我们在学习编程时，"
      "也常常阅读别人写好的代码，并从中发现新的思路和方法。")
HTML_B = f"<html><head><title>Walk</title></head><body><nav>Home | About</nav><article><p>{EN_B}</p></article></body></html>"


def frame(rows):
    return pd.DataFrame(
        [dict(doc_id=f"{src}/{i}", source=src, language_hint=hint, content=c, content_type=t)
         for i, (src, c, t, hint) in enumerate(rows)])


@pytest.fixture(scope="module")
def result():
    docs = frame([
        ("web", EN_A, "text", None),
        ("web", HTML_B, "html", None),
        ("web", EN_A.upper().replace("  ", " "), "text", None),  # exact duplicate after lower-casing
        ("web", NEAR_A, "text", None),
        ("web", "   \n\t  ", "text", None),
        ("web", "", "text", None),
        ("web", "<html><body></body></html>", "html", None),
        ("web", "Too short.", "text", None),
        ("quotes", "Too short.", "text", "en"),
        ("quotes", "The secret of getting ahead is to start and to keep going.", "text", "en"),
        ("zh", ZH, "text", "zh"),
    ])
    cfg = CorpusConfig(source_overrides={"quotes": {"min_words": 5}})
    return docs, build_corpus(docs, cfg)


def test_every_input_is_kept_or_removed_once(result):
    docs, res = result
    assert set(res.kept.doc_id).isdisjoint(res.removals.doc_id)
    assert not res.removals.doc_id.duplicated().any()
    assert sorted(res.kept.doc_id.tolist() + res.removals.doc_id.tolist()) == sorted(docs.doc_id)
    for source, n in docs.source.value_counts().items():
        assert n == (res.kept.source == source).sum() + (res.removals.source == source).sum()


def test_funnel_reconciles(result):
    docs, res = result
    for source, f in res.funnel.groupby("source"):
        assert f.stage.tolist() == CURATION_STEPS
        assert f.docs_in.iloc[0] == (docs.source == source).sum()
        assert f.docs_out.iloc[-1] == (res.kept.source == source).sum()
        assert (f.docs_in.iloc[1:].to_numpy() == f.docs_out.iloc[:-1].to_numpy()).all()
        removed = res.removals[res.removals.source == source].stage.value_counts()
        for _, row in f.iterrows():
            assert row.docs_in - row.docs_out == removed.get(row.stage, 0)


def test_reasons(result):
    _, res = result
    by_id = res.removals.set_index("doc_id")
    assert by_id.loc["web/4", "rule"] == "empty.whitespace"
    assert by_id.loc["web/5", "rule"] == "empty.whitespace"
    assert by_id.loc["web/6", "rule"] == "extract.no_main_text"
    assert by_id.loc["web/7", "rule"] == "langid.too_short"
    assert by_id.loc["quotes/8", "rule"] == "gopher.min_words"
    assert by_id.loc["web/2", "rule"] == "dedup.exact" and "web/0" in by_id.loc["web/2", "detail"]


def test_near_duplicate_names_kept_doc_and_true_jaccard(result):
    _, res = result
    row = res.removals.set_index("doc_id").loc["web/3"]
    assert row.rule == "dedup.near" and "web/0" in row.detail
    assert row.value == pytest.approx(jaccard(shingles(EN_A, 5, False), shingles(NEAR_A, 5, False)))


def test_kept_columns(result):
    _, res = result
    kept = res.kept.set_index("doc_id")
    assert set(kept.index) == {"web/0", "web/1", "quotes/9", "zh/10"}
    assert kept.loc["zh/10", "language"] == "zh" and kept.loc["web/1", "language"] == "en"
    assert "Home | About" not in kept.loc["web/1", "text"]
    assert kept.loc["zh/10", "n_bytes"] == len(kept.loc["zh/10", "text"].encode("utf-8"))
    assert (kept.family_id == kept.index).all()
    assert kept.loc["web/0", "lang_score"] > 0.65


def test_bad_input_and_config_errors():
    with pytest.raises(DataError, match="content_type"):
        build_corpus(pd.DataFrame({"doc_id": ["a"], "source": ["s"], "content": ["x"], "language_hint": [None]}),
                     CorpusConfig())
    with pytest.raises(ConfigError, match="xx"):
        CorpusConfig(languages=["en", "xx"])
    with pytest.raises(ConfigError, match="min_wordz"):
        CorpusConfig(source_overrides={"quotes": {"min_wordz": 3}})
    with pytest.raises(ConfigError):
        CorpusConfig(source_overrides={"quotes": {"gopher": {"min_words": -1}}})


def test_overrides_merge_flat_and_nested():
    cfg = CorpusConfig(source_overrides={"f": {"min_stop_words": 0, "chinese": {"min_chars": 8}}})
    gopher, zh = cfg.rules_for("f")
    assert (gopher.min_stop_words, zh.min_stop_words, zh.min_chars) == (0, 0, 8)
    assert cfg.rules_for("other")[0].min_words == 50 and cfg.langid_threshold == 0.65
