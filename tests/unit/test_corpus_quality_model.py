"""The quality classifier inside the corpus build: scored in the key pass, removed after exact dedup and before near
dedup with a ledger row, ``quality_score`` on every kept document, the blind-spot audit and its budget."""

from __future__ import annotations

import random
from pathlib import Path

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

    with pytest.raises(DataError, match=r"(?s)quality_model_budget.*source 'forum': removed 7 of 7 scored documents "
                                         r"\(100\.0%\), budget 50%.*examples.*source 'forum': removed forum/"):
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


ROOT = Path(__file__).resolve().parents[2]


def _experiment(sources: dict[str, str], corpus: dict):
    """An experiment config (the smoke config's other sections) with local JSON-lines ``sources`` (name → file,
    English; the first a general source, the others domain sources) and the ``[corpus]`` table ``corpus``."""
    import tomllib

    from flows.config import parse_config

    raw = tomllib.loads((ROOT / "configs" / "smoke.toml").read_text())
    names = list(sources)
    raw["sources"] = {name: {"kind": "local", "include": [path], "language": "en",
                             "role": "general" if name == names[0] else "domain"} for name, path in sources.items()}
    raw["cpt"]["domain_sources"] = names[1:]
    raw["corpus"] = corpus
    return parse_config(raw)


def test_the_examples_file_names_where_each_held_out_example_came_from(model_file, tmp_path, monkeypatch):
    """examples.parquet: every held-out example with its origin and an id that finds its text (a source document,
    a line of an example file, a whole file, or a generated junk page), scored as that text."""
    import json

    from infra.runs import RunsLayout
    from infra.stage import StageContext
    from tasks.corpus.quality_model import load_model
    from tasks.corpus.quality_stage import EXAMPLE_COLUMNS, JUNK_KINDS
    from tasks.corpus.quality_stage import run as run_quality_model
    from tasks.sources.stage import run as run_sources

    monkeypatch.chdir(ROOT)  # the smoke config's relative paths
    rng = random.Random(3)
    data, ref = tmp_path / "data", tmp_path / "ref"
    data.mkdir(), ref.mkdir()
    for name, vocab in (("manual", _MANUAL), ("forum", _FORUM)):
        (data / f"{name}.jsonl").write_text("".join(json.dumps({"text": _page(rng, vocab)}) + "\n" for _ in range(12)))
    lines = [_page(rng, _MANUAL), _page(rng, _MANUAL)]
    (ref / "lines.jsonl").write_text(json.dumps({"text": lines[0]}) + "\n\n" + json.dumps({"text": lines[1]}) + "\n")
    (ref / "whole.txt").write_text(_page(rng, _MANUAL))
    cfg = _experiment({name: str(data / f"{name}.jsonl") for name in ("manual", "forum")}, {
        "languages": ["en"], "gopher": _cfg(model_file).gopher.model_dump(), "quality_model": {
            "enabled": True, "kind": "pretrained", "path": str(model_file), "max_examples": 1000,  # all held out
            "positive": {"sources": ["manual"], "files": [str(ref / "*")]},
            "negative": {"corpus_sample": True, "junk": 4}}})
    layout = RunsLayout(tmp_path / "runs")
    src, out = tmp_path / "sources", tmp_path / "qm"
    src.mkdir(), out.mkdir()
    run_sources(StageContext(out=src, inputs={}, layout=layout, key="s", experiment="t"), cfg.sources)
    from recording_progress import RecordingProgress

    progress = RecordingProgress()
    run_quality_model(StageContext(out=out, inputs={"sources": src}, layout=layout, key="q", experiment="t",
                                   progress=progress), cfg)
    # One bar: a step per origin the examples are drawn from (the four below), then one for the training.
    (bar,) = progress.bars
    assert bar.description.startswith("quality model: pretrained: gathering examples (4 origin(s))")
    assert (bar.total, bar.finished) == (5, True)

    examples = pd.read_parquet(out / "examples.parquet")
    assert list(examples.columns) == EXAMPLE_COLUMNS
    assert examples.groupby("origin").size().to_dict() == {
        "positive.sources": 12, "positive.files": 3, "negative.corpus_sample": 12, "negative.junk": 4}
    docs = pd.concat([pd.read_parquet(src / "docs" / f"{n}.parquet") for n in ("manual", "forum")]).set_index("doc_id")
    by_origin = {origin: rows for origin, rows in examples.groupby("origin")}
    for origin, source in (("positive.sources", "manual"), ("negative.corpus_sample", "forum")):
        rows = by_origin[origin]
        assert (rows.source == source).all() and rows.doc_id.str.startswith(f"{source}/{source}.jsonl#").all()
        assert rows.doc_id.is_unique and set(rows.doc_id) <= set(docs.index)
    files = by_origin["positive.files"]
    assert sorted(files.doc_id) == [f"{ref}/lines.jsonl:1", f"{ref}/lines.jsonl:3", f"{ref}/whole.txt"]
    assert files.source.isna().all() and (files.label == "positive").all()
    junk = by_origin["negative.junk"]
    assert set(junk.doc_id) == {f"junk:{JUNK_KINDS[i % 3]}:{i}" for i in range(4)} and junk.source.isna().all()

    # Each id leads to the very text that got the score.
    def text_of(row):
        if not pd.isna(row.source):
            return docs.loc[row.doc_id, "content"]
        path, _, line = row.doc_id.rpartition(":")
        if path.endswith(".jsonl"):
            return json.loads(Path(path).read_text().splitlines()[int(line) - 1])["text"]
        return Path(row.doc_id).read_text()

    model = load_model(model_file)
    known = examples[examples.origin != "negative.junk"]
    texts = [text_of(row) for row in known.itertuples()]
    np.testing.assert_allclose(model.score(texts), known.score, rtol=0, atol=1e-12)
    assert [t[:300] for t in texts] == known.snippet.tolist()


def test_the_budget_error_is_a_line_per_group_short_examples_and_the_advice_once(built, model_file):
    """Eight groups over budget with long documents: one line each, at most two short snippets per group, no
    document twice, the advice once, naming every group to accept."""
    audit = pd.read_parquet(built.out / "quality_audit.parquet")
    strict = _cfg(model_file, max_removed_share=0.0).quality_model  # every group that lost a document is over
    over = budget_verdicts(audit, strict).query("verdict == 'over'")
    with pytest.raises(DataError) as err:
        check_budget(built.out, strict)
    message = str(err.value)
    lines = message.splitlines()
    assert lines[0] == ("expectation suite 'quality_model_budget' failed: the quality model removed more than the "
                        f"budget of {len(over)} group(s):")
    group_lines = lines[1:1 + len(over)]
    assert group_lines[0] == "  the whole corpus ('all'): removed 7 of 19 scored documents (36.8%), budget 0%"
    assert "  source 'forum': removed 7 of 7 scored documents (100.0%), budget 0%" in group_lines
    header = 1 + len(over)
    assert lines[header].startswith("Lowest-scoring examples")
    examples = lines[header + 1:-1]
    assert 1 <= len(examples) <= 10 and all(len(line) < 160 for line in examples)
    ids = [line.split(": ", 1)[1].split()[1] for line in examples]
    assert len(ids) == len(set(ids)) and all(i.split("/")[0] in ("forum", "manual") for i in ids)
    assert max(sum(line.startswith(f"  {g}:") for line in examples) for g in ("source 'forum'", "language 'en'")) <= 2
    assert message.count("accept_narrowing") == 1 and message.count("max_removed_share_by") == 1
    assert lines[-1].startswith("Review them.") and all(f'"{name}"' in lines[-1] for name in over.group_name)
    assert len(message) < 2000, message


def test_a_source_the_classifier_emptied_gets_the_classifiers_advice_not_the_rules(model_file, tmp_path, monkeypatch):
    """The budget accepts the forum's narrowing, so the kept-corpus expectation is what stops the build: its advice
    names the classifier's settings. A source emptied by a rule still gets the rules' advice."""
    from tasks.corpus.definition import check_corpus

    monkeypatch.chdir(ROOT)
    sources = {"manual": "manual.jsonl", "forum": "forum.jsonl"}  # only their names matter to the check
    gopher = _cfg(model_file).gopher.model_dump()
    cfg = _experiment(sources, {"languages": ["en"], "gopher": gopher, "quality_model": {
        "enabled": True, "kind": "pretrained", "path": str(model_file), "accept_narrowing": ["forum"]}})
    out = tmp_path / "classifier"
    build_corpus(_docs(), cfg.corpus, out=out)
    with pytest.raises(DataError) as err:
        check_corpus(out, cfg)
    message = str(err.value)
    assert message.startswith("expectation suite 'kept_corpus' failed: sources with no kept document: ['forum'] "
                              "(forum: removed by quality_model.low_score ×7, dedup.exact ×1). The quality "
                              "classifier (quality_model.low_score) removed the last documents of ['forum']")
    for setting in ("corpus.quality_model.threshold", "positive.sources", "accept_narrowing", "max_removed_share_by",
                    "examples.parquet"):
        assert setting in message
    assert "source_overrides" not in message

    rules = _experiment(sources, {"languages": ["en"], "gopher": gopher,
                                  "source_overrides": {"forum": {"min_words": 5000}}})
    out = tmp_path / "rules"
    build_corpus(_docs(), rules.corpus, out=out)
    with pytest.raises(DataError, match=r"\['forum'\] \(forum: removed by gopher\.\w+ ×8.*"
                                        r"\[corpus\.source_overrides\.<source>\]") as err:
        check_corpus(out, rules)
    assert "quality_model" not in str(err.value)
