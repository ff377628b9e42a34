"""The quality classifier inside the corpus build: scored in the key pass, removed after exact dedup and before near
dedup with a ledger row, ``quality_score`` on every kept document, the blind-spot audit and its budget."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from infra.errors import DataError
from tasks.corpus.build import CURATION_STEPS, build_corpus
from tasks.corpus.config import CorpusConfig
from tasks.corpus.quality_model import QualityModelConfig, train
from tasks.corpus.quality_stage import budget_verdicts, check_budget

_MANUAL = {
    "subject": ["The package manager", "The configuration file", "The system administrator", "The installer",
                "The boot loader", "The network service", "The kernel module", "The security update"],
    "verb": ["reads", "writes", "checks", "installs", "removes", "updates", "describes", "lists"],
    "object": ["the dependencies of every package", "the settings of the service", "the list of mirrors",
               "the keys that sign the archive", "the partitions of the disk", "the logs of the last boot",
               "the version of each library", "the options that the daemon accepts"],
    "tail": ["before the upgrade begins", "when the machine starts", "with the help of the manual page",
             "and reports any error to the console", "so that the administrator can review it",
             "according to the documentation", "in the directory of the system", "without a network connection"],
}
_FORUM = {
    "subject": ["lol my cat", "honestly my brother", "omg the neighbours", "ngl my boss", "idk why my phone",
                "tbh the pizza place", "my roommate", "that guy at the gym"],
    "verb": ["totally ruined", "keeps stealing", "just texted me about", "was yelling about", "posted memes about",
             "cannot stop talking about", "spilled coffee on", "laughed so hard at"],
    "object": ["the weekend plans", "my favourite hoodie", "the group chat", "that silly video", "the last episode",
               "our road trip", "my birthday cake", "the parking spot"],
    "tail": ["and i was like whatever", "haha so random", "thanks guys for reading", "anyway that is my rant",
             "who does that", "send help please", "best day ever", "not even kidding"],
}


def _page(rng: random.Random, vocab: dict[str, list[str]], sentences: int = 9) -> str:
    return " ".join(f"{rng.choice(vocab['subject'])} {rng.choice(vocab['verb'])} {rng.choice(vocab['object'])} "
                    f"{rng.choice(vocab['tail'])}." for _ in range(sentences))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """A naive Bayes classifier trained on manual pages (reference) against forum chatter, saved as a file."""
    rng = random.Random(1)
    positives = [_page(rng, _MANUAL) for _ in range(80)]
    negatives = [_page(rng, _FORUM) for _ in range(80)]
    model = train(positives, negatives, QualityModelConfig(max_examples=80, seed=0))
    assert model.metrics["accuracy"] >= 0.95
    return model.save(tmp_path_factory.mktemp("qm"))


def _docs() -> pd.DataFrame:
    rng = random.Random(2)
    rows = [(f"manual/{i}", "manual", _page(rng, _MANUAL)) for i in range(12)]
    forum = [_page(rng, _FORUM) for _ in range(6)]
    rows += [(f"forum/{i}", "forum", text) for i, text in enumerate(forum)]
    rows.append(("forum/exact", "forum", forum[0].upper()))  # an exact copy: exact dedup comes first
    words = forum[1].split()
    rows.append(("forum/near", "forum", " ".join(words[:-3] + ["indeed", "truly", "so"])))  # a near copy
    hosts = {"manual": "https://www.debian.org/doc/", "forum": "https://Forum.Example.org:8443/t/"}
    frame = pd.DataFrame([dict(doc_id=d, source=s, language_hint="en", content=t, content_type="text",
                               url=hosts[s] + d.split("/")[1]) for d, s, t in rows])
    frame.loc[frame.doc_id == "manual/0", "url"] = None  # a document without a URL has no host row
    return frame


def _cfg(model_file, **qm) -> CorpusConfig:
    # Template pages repeat n-grams: the repetition rules are relaxed so the classifier is what removes them.
    relaxed = {"min_words": 20, "top_ngram_max_share": {n: 1.0 for n in (2, 3, 4)},
               "dup_ngram_max_share": {n: 1.0 for n in range(5, 11)}}
    return CorpusConfig(gopher=relaxed, quality_model={
        "enabled": True, "kind": "pretrained", "path": str(model_file), **qm})


@pytest.fixture(scope="module")
def built(model_file, tmp_path_factory):
    return build_corpus(_docs(), _cfg(model_file), out=tmp_path_factory.mktemp("corpus"))


def test_low_scores_are_removed_after_exact_dedup_and_before_near_dedup(built):
    removals = built.removals.set_index("doc_id")
    assert removals.loc["forum/exact", "rule"] == "dedup.exact"
    quality = removals[removals.rule == "quality_model.low_score"]
    assert set(quality.index) == {f"forum/{i}" for i in range(6)} | {"forum/near"}
    assert (quality.stage == "quality_model").all() and (quality.threshold == 0.5).all()
    assert (quality.value < 0.5).all() and quality.detail.str.match(r"quality score 0\.\d{4} < threshold 0\.5").all()
    assert "dedup.near" not in set(removals.rule)  # the near copy never reached near dedup
    kept = built.kept
    assert sorted(kept.doc_id) == sorted(f"manual/{i}" for i in range(12))
    assert kept.quality_score.between(0.5, 1.0).all()
    funnel = built.funnel
    assert [s for s in funnel[funnel.source == "forum"].stage] == CURATION_STEPS
    row = funnel[(funnel.source == "forum") & (funnel.stage == "quality_model")].iloc[0]
    assert (row.docs_in, row.docs_out) == (7, 0)


def test_the_result_does_not_depend_on_the_shard_size(built, model_file, tmp_path):
    cfg = _cfg(model_file)
    small = build_corpus(_docs(), cfg.model_copy(update={"execution": cfg.execution.model_copy(
        update={"shard_docs": 3})}), out=tmp_path)
    pd.testing.assert_frame_equal(small.kept, built.kept)
    pd.testing.assert_frame_equal(small.removals, built.removals)


def test_the_audit_finds_the_narrowing_and_the_budget_check_names_it(built, model_file):
    audit = pd.read_parquet(built.out / "quality_audit.parquet").set_index(["group_kind", "group_name"])
    assert audit.loc[("source", "forum"), "removed_share"] == 1.0
    assert audit.loc[("source", "manual"), "removed_share"] == 0.0
    assert audit.loc[("all", "all"), "docs_scored"] == 19  # every document but the exact copy
    assert audit.loc[("source", "forum"), "score_p90"] < 0.5 < audit.loc[("source", "manual"), "score_p10"]
    assert set(audit.loc["length"].index) <= {"0-200", "200-1000", "1000-5000", "5000-20000", "20000+"}
    hosts = audit.loc["host"]  # hosts in normal form: lower case, no port, no leading www.
    assert hosts.loc["forum.example.org", "removed_share"] == 1.0 and hosts.loc["debian.org", "docs_scored"] == 11
    examples = pd.read_parquet(built.out / "quality_examples.parquet")
    forum = examples[(examples.group_kind == "source") & (examples.group_name == "forum")]
    assert list(forum.fate) == ["removed"] * 3 and forum.quality_score.is_monotonic_increasing
    assert forum.snippet.str.len().between(1, 300).all()
    scores = pd.read_parquet(built.out / "quality_scores.parquet")
    assert len(scores) == 19 and scores.removed.sum() == 7

    with pytest.raises(DataError, match=r"quality_model_budget.*source 'forum'.*7 of 7 documents \(100\.0%\), over "
                                         r"its budget 50%.*lowest-scoring examples: removed forum/"):
        check_budget(built.out, _cfg(model_file).quality_model)
    accepted = _cfg(model_file, accept_narrowing=["forum"]).quality_model
    verdicts = check_budget(built.out, accepted).set_index(["group_kind", "group_name"]).verdict
    assert verdicts[("source", "forum")] == "accepted" and verdicts[("source", "manual")] == "within"
    assert verdicts[("all", "all")] == "within"  # 7 of 19
    own_budget = _cfg(model_file, max_removed_share_by={"forum": 1.0}).quality_model
    assert budget_verdicts(pd.read_parquet(built.out / "quality_audit.parquet"), own_budget).verdict.eq(
        "within").all()


def test_the_sample_action_is_seeded_per_document(model_file, tmp_path):
    cfg = _cfg(model_file, action="sample", pareto_alpha=1.0)
    first = build_corpus(_docs(), cfg, out=tmp_path / "a")
    docs = _docs()
    reordered = pd.concat([docs[docs.doc_id != "forum/exact"].iloc[::-1], docs[docs.doc_id == "forum/exact"]])
    again = build_corpus(reordered.reset_index(drop=True), cfg, out=tmp_path / "b")  # the copy stays last
    removed = first.removals[first.removals.rule == "quality_model.low_score"].set_index("doc_id")
    removed_again = again.removals[again.removals.rule == "quality_model.low_score"].set_index("doc_id")
    assert set(removed.index) == set(removed_again.index)  # the draw is the document's, not its position's
    # The threshold column holds the keep probability (2 - s)^-alpha the document had.
    expected = (2.0 - removed.value) ** -1.0
    np.testing.assert_allclose(removed.threshold, expected, rtol=1e-12)
    assert removed.detail.str.contains("kept with probability").all()


def test_an_enabled_model_without_its_file_is_refused(model_file):
    from tasks.corpus.build import curate

    with pytest.raises(DataError, match="no trained classifier"):
        curate(None, None, _cfg(model_file).model_copy(update={"quality_model": QualityModelConfig(
            enabled=True, positive={"files": ["x"]}, negative={"corpus_sample": True})}))


def test_the_whole_corpus_group_is_named_all(built, model_file):
    audit = pd.read_parquet(built.out / "quality_audit.parquet")
    strict = _cfg(model_file, max_removed_share=0.3, accept_narrowing=["forum"]).quality_model
    verdicts = budget_verdicts(audit, strict).set_index(["group_kind", "group_name"]).verdict
    assert verdicts[("all", "all")] == "over"  # 7 of 19 > 30%
    for relaxed in (dict(accept_narrowing=["forum", "all"]), dict(max_removed_share_by={"all": 0.5})):
        qm = _cfg(model_file, max_removed_share=0.3, **{"accept_narrowing": ["forum"], **relaxed}).quality_model
        assert budget_verdicts(audit, qm).set_index(["group_kind", "group_name"]).verdict[("all", "all")] != "over"


def test_weak_held_out_evidence_is_named():
    from tasks.corpus.quality_stage import classifier_warnings

    # A narrowed classifier: 40 of 45 held-out examples right by calling everything negative.
    weak = classifier_warnings({"accuracy": 40 / 45, "n_heldout_pos": 5, "n_heldout_neg": 40})
    assert len(weak) == 2 and "only 5 held-out positive examples" in weak[0]
    assert "no better than calling every example negative (0.889)" in weak[1]
    assert classifier_warnings({"accuracy": 0.95, "n_heldout_pos": 400, "n_heldout_neg": 120}) == []
