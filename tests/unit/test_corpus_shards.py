"""The sharded corpus build: same result whatever the shard size, crash resume, boilerplate, decontamination."""

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from infra.errors import DataError
from infra.shard_map import prefect_shard_map, process_map, sequential_map
from tasks.corpus.boilerplate import count_units, frequent_units, strip_units
from tasks.corpus.build import build_corpus, curate, filter_shard, split_sources
from tasks.corpus.config import CorpusConfig
from evals.contamination import EvalIndex, EvalItem, window_hashes
from tasks.corpus.stage import reconcile

WORDS = ("river stone garden window paper letter morning evening bridge market village harbour forest meadow "
         "kitchen teacher student doctor engine signal winter summer autumn spring coffee bread butter").split()
FUNCTION = "the of and to with that have be in on for a is was".split()
NAV = "Home | Products | Support | Contact us | Sign in to your account | Privacy policy"
LICENCE = ("This page is licensed under the Creative Commons Attribution Share Alike licence, version four, "
           "and may be copied freely.")


def prose(rng: random.Random, n_words: int) -> str:
    """English-like sentences that pass Gopher rules (stop words, word lengths, no repetition)."""
    sentences = []
    while sum(len(s.split()) for s in sentences) < n_words:
        words = [rng.choice(FUNCTION if i % 2 else WORDS) for i in range(rng.randint(8, 14))]
        sentences.append(" ".join(words).capitalize() + ".")
    return " ".join(sentences)


def docs_frame(n: int, seed: int = 0) -> pd.DataFrame:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        body = prose(rng, 120)
        if i % 3 == 0:
            body = f"{NAV}\n\n{body}\n\n{LICENCE}"
        rows.append(dict(doc_id=f"web/{i}", source="web" if i % 2 else "news", language_hint="en", content=body,
                         content_type="text"))
    # Exact and near copies at fixed positions so shards split them.
    rows.append(dict(rows[5], doc_id="web/copy5"))
    near = rows[7]["content"].split()
    near[10] = "lighthouse"
    rows.append(dict(rows[7], doc_id="web/near7", content=" ".join(near)))
    return pd.DataFrame(rows)


CFG = dict(boilerplate={"min_docs": 5}, near_dedup={"scope": "global"})


@pytest.fixture(scope="module")
def one_shard(tmp_path_factory):
    cfg = CorpusConfig(**CFG, execution={"shard_docs": 10_000})
    return build_corpus(docs_frame(60), cfg, out=tmp_path_factory.mktemp("one"))


@pytest.mark.parametrize("shard_docs, workers, memory_limit, partitions",
                         [(7, 0, "1GB", 1), (5, 2, "1GB", 16), (6, 0, "48MB", 5)])
def test_result_does_not_depend_on_shard_size_workers_memory_limit_or_partitions(one_shard, tmp_path, shard_docs,
                                                                                 workers, memory_limit, partitions):
    shard_map = process_map(workers) if workers else sequential_map
    execution = {"shard_docs": shard_docs, "memory_limit": memory_limit, "partitions": partitions}
    small = build_corpus(docs_frame(60), CorpusConfig(**CFG, execution=execution), out=tmp_path, shard_map=shard_map)
    assert len(json.loads((tmp_path / "_work" / "shards.json").read_text())["shards"]) > 8
    assert len(list((tmp_path / "_work" / f"boilerplate_p{partitions}").iterdir())) == partitions
    assert small.boilerplate_units == one_shard.boilerplate_units > 0
    for name in ("kept", "removals", "funnel", "hits", "boilerplate"):
        pd.testing.assert_frame_equal(getattr(one_shard, name), getattr(small, name))
    assert small.near == one_shard.near


def test_resume_after_a_crash_in_the_global_passes(tmp_path):
    cfg = CorpusConfig(**CFG, execution={"shard_docs": 9})
    fresh = build_corpus(docs_frame(50), cfg, out=tmp_path / "a")
    work = tmp_path / "a" / "_work"
    assert (work / "verified").exists() and len(list((work / "verified").iterdir())) > 2
    # A run killed after verifying some shards: later passes' outputs are gone, earlier ones stay.
    for name in sorted(p.name for p in (work / "verified").iterdir())[1:]:
        shutil.rmtree(work / "verified" / name)
    for folder in ("decisions", "kept"):
        shutil.rmtree(work / folder)
    resumed = curate(work, tmp_path / "b", cfg)
    for name in ("kept", "removals", "funnel", "hits"):
        pd.testing.assert_frame_equal(getattr(fresh, name), getattr(resumed, name))


def test_copies_removed_across_shards(one_shard):
    removals = one_shard.removals.set_index("doc_id")
    assert removals.loc["web/copy5", "rule"] == "dedup.exact"
    assert "web/5" in removals.loc["web/copy5", "detail"]
    assert removals.loc["web/near7", "rule"] == "dedup.near"
    kept = one_shard.kept.set_index("doc_id")
    assert "web/5" in kept.index and "web/7" in kept.index


def test_boilerplate_cut_from_every_page_but_its_first(one_shard):
    kept = one_shard.kept.set_index("doc_id").text
    # The first page holding the units keeps them (C4, Dolma); every later page loses them.
    assert kept["web/0"].startswith(NAV) and kept["web/0"].endswith(LICENCE)
    assert not kept.drop("web/0").str.contains("Sign in to your account", regex=False).any()
    assert not kept.drop("web/0").str.contains("Creative Commons", regex=False).any()
    cut = one_shard.boilerplate.example.tolist()
    assert NAV in cut and LICENCE in cut
    assert (one_shard.kept.lines_dropped > 0).sum() >= 15


def test_ledger_reconciles(one_shard):
    docs = docs_frame(60)
    reconcile(docs[["doc_id", "source"]], pd.DataFrame(columns=["doc_id", "source"]), one_shard.kept,
              one_shard.removals)
    funnel = one_shard.funnel
    for source, rows in funnel.groupby("source", sort=False):
        assert (rows.docs_out.iloc[:-1].to_numpy() == rows.docs_in.iloc[1:].to_numpy()).all()
        assert rows.docs_in.iloc[0] - rows.docs_out.iloc[-1] == (one_shard.removals.source == source).sum()


def test_reconcile_refuses_lost_and_double_counted():
    docs = pd.DataFrame({"doc_id": ["a", "b"], "source": ["s", "s"]})
    kept = pd.DataFrame({"doc_id": ["a"]})
    empty = pd.DataFrame(columns=["doc_id", "source"])
    with pytest.raises(DataError, match="neither kept nor removed"):
        reconcile(docs, empty, kept, pd.DataFrame({"doc_id": []}))
    with pytest.raises(DataError, match="more than one removal"):
        reconcile(docs, empty, kept, pd.DataFrame({"doc_id": ["b", "b"]}))
    with pytest.raises(DataError, match="both kept and removed"):
        reconcile(docs, empty, kept, pd.DataFrame({"doc_id": ["a", "b"]}))


def test_crash_resume_skips_finished_shards(tmp_path):
    cfg = CorpusConfig(**CFG, execution={"shard_docs": 10})
    docs = docs_frame(40)
    docs.to_parquet(tmp_path / "docs.parquet", index=False)
    work, out = tmp_path / "work", tmp_path / "out"
    assert split_sources([tmp_path / "docs.parquet"], work, 10) == 5
    # A first run died after two filtered shards, one of them half-written.
    plan = json.loads((work / "shards.json").read_text())["shards"]
    assert [sum(n for _, _, n in spec) for spec in plan] == [10, 10, 10, 10, 2]
    assert plan[1] == [[str(tmp_path / "docs.parquet"), 10, 10]]  # slices of the file: nothing is copied
    for i, spec in enumerate(plan[:2]):
        assert filter_shard(json.dumps(spec), str(work / "filtered" / f"{i:05d}"), cfg.model_dump_json())
    torn = work / "filtered" / ".00002.tmp-1-0badf00d"  # the killed attempt's temporary (infra.atomic)
    torn.mkdir()
    (torn / "survivors.parquet").write_text("truncated")
    (torn / "units.parquet").write_text("truncated")  # would break the */units.parquet glob if left
    stamp = (work / "filtered" / "00000" / "survivors.parquet").stat().st_mtime_ns
    calls = []

    def spy(fn, kwargs_list, label):
        calls.append((label, [fn(**kw) for kw in kwargs_list]))
        return calls[-1][1]

    resumed = curate(work, out, cfg, shard_map=spy)
    assert calls[0] == ("corpus-filter", [False, False, True, True, True])
    assert not torn.exists()
    assert (work / "filtered" / "00000" / "survivors.parquet").stat().st_mtime_ns == stamp
    fresh = build_corpus(docs, cfg, out=tmp_path / "fresh")
    pd.testing.assert_frame_equal(resumed.kept, fresh.kept)


def test_strip_units_keeps_rare_and_short_lines():
    texts = [f"Intro {i} is a unique opening line for page number {i}.\n{NAV}\nOK" for i in range(4)]
    occurrences, examples = count_units(texts, min_chars=10)
    assert frequent_units(occurrences, examples, min_docs=5).empty  # only 4 distinct documents hold NAV
    more, more_examples = count_units([t.replace("Intro", "Preface") for t in texts], min_chars=10)
    frequent = frequent_units(pd.concat([occurrences, more]), pd.concat([examples, more_examples]), min_docs=6)
    assert frequent.example.tolist() == [NAV]
    copies = count_units([texts[0]] * 30, min_chars=10)
    assert frequent_units(*copies, min_docs=2).empty  # identical pages are one document: exact dedup decides
    stripped, cut = strip_units(texts, set(frequent.unit_hash.astype("uint64").tolist()), 10)
    assert cut == [1, 1, 1, 1]
    assert stripped[0] == "Intro 0 is a unique opening line for page number 0.\nOK"


def test_window_hash_equals_rehash_of_slice():
    words = "a b c d e f g h".split()
    assert window_hashes(words, 3)[2] == window_hashes(words[2:5], 3)[0]
    assert len(window_hashes(words, 9)) == 0


def test_decontamination_removes_overlap_across_line_wraps(tmp_path):
    rng = random.Random(3)
    item = ("the committee approved the new budget for the harbour bridge repairs after a long and "
            "heated debate on tuesday")
    docs = pd.DataFrame([
        dict(doc_id="d/0", source="d", language_hint="en", content_type="text",
             content=prose(rng, 80) + " The committee approved the new budget\nfor the harbour bridge repairs, "
                     "after a long and heated debate. " + prose(rng, 40)),
        dict(doc_id="d/1", source="d", language_hint="en", content_type="text", content=prose(rng, 120)),
    ])
    items = [EvalItem("heldout:news", "item-1", item), EvalItem("cloze:x", "c1", "too short to check")]
    res = build_corpus(docs, CorpusConfig(), eval_items=items, out=tmp_path)
    removal = res.removals.set_index("doc_id").loc["d/0"]
    assert removal.rule == "decontam.ngram_overlap" and "item-1" in removal.detail
    assert res.kept.doc_id.tolist() == ["d/1"]
    hits = res.hits
    assert set(hits.item_id) == {"item-1"} and len(hits.ngram.iloc[0].split()) == 13
    index = EvalIndex.build(items, 13)
    assert index.unchecked == [("cloze:x", "c1")]


def test_eval_index_round_trips_through_npz_without_pickle(tmp_path):
    items = [EvalItem("heldout:news", "item-1", "the committee approved the new budget for the harbour bridge "
                      "repairs after a long and heated debate on tuesday"),
             EvalItem("heldout:news", "item-2", "a b c d e f g h"), EvalItem("cloze:x", "c1", "too short")]
    index = EvalIndex.build(items, 13)
    index.save(tmp_path / "index.npz")
    again = EvalIndex.load(tmp_path / "index.npz")
    assert (again.ngram, again.items, again.unchecked) == (index.ngram, index.items, index.unchecked)
    assert sorted(again.grams) == sorted(index.grams) == [8, 13]
    for n in index.grams:
        np.testing.assert_array_equal(again.grams[n], index.grams[n])
        np.testing.assert_array_equal(again.owner[n], index.owner[n])
    text = "minutes say the committee approved the new budget for the harbour bridge repairs after a long debate"
    assert again.hits(text) == index.hits(text) != []


def test_common_ngrams_do_not_decontaminate(tmp_path):
    rng = random.Random(5)
    phrase = "all rights reserved by the authors and the publishers of this fine little volume of essays"
    docs = pd.DataFrame([dict(doc_id=f"d/{i}", source="d", language_hint="en", content_type="text",
                              content=prose(rng, 100) + " " + phrase.capitalize() + ".") for i in range(4)])
    cfg = CorpusConfig(decontamination={"common_min_docs": 3}, boilerplate={"enabled": False})
    res = build_corpus(docs, cfg, eval_items=[EvalItem("eval", "e1", phrase)], out=tmp_path)
    assert len(res.kept) == 4
    assert res.hits.common.all() and res.hits.doc_id.nunique() == 4


def test_memory_limit_is_checked_at_load():
    with pytest.raises(Exception, match="memory_limit"):
        CorpusConfig(execution={"memory_limit": "lots"})


def test_shard_input_errors(tmp_path):
    docs = docs_frame(8)
    with pytest.raises(DataError, match="repeat"):
        build_corpus(pd.concat([docs, docs]), CorpusConfig(), out=tmp_path / "a")
    with pytest.raises(DataError, match="lacks columns"):
        build_corpus(docs.drop(columns="content_type"), CorpusConfig(), out=tmp_path / "b")
    empty = build_corpus(docs.iloc[:0], CorpusConfig(), out=tmp_path / "c")
    assert len(empty.kept) == 0 and len(empty.removals) == 0
    shutil.rmtree(tmp_path)


def test_a_shard_emptied_by_the_filters_does_not_break_the_global_passes(tmp_path):
    docs = docs_frame(20)
    docs.loc[:4, "content"] = ["", "   ", "\u200b", "", "\n"]
    res = build_corpus(docs, CorpusConfig(**CFG, execution={"shard_docs": 5}), out=tmp_path)
    assert set(res.removals.set_index("doc_id").loc[[f"web/{i}" for i in range(5)], "rule"]) == {"empty.whitespace"}
    assert len(res.kept) + len(res.removals) == len(docs)
    assert NAV in res.boilerplate.example.tolist()


def test_near_dedup_does_not_chain_and_families_join_the_chain(tmp_path):
    rng = random.Random(11)
    words = prose(rng, 100).split()[:100]
    b = words[:30] + ["lighthouse", "keeper", "quietly", "waved"] + words[34:]
    c = b[:70] + ["orchard", "ladder", "slowly", "tipped"] + b[74:]
    docs = pd.DataFrame([dict(doc_id=f"d/{name}", source="d", language_hint="en", content_type="text",
                              content=" ".join(text)) for name, text in (("a", words), ("b", b), ("c", c))])
    res = build_corpus(docs, CorpusConfig(boilerplate={"enabled": False}), out=tmp_path)
    removal = res.removals.set_index("doc_id")
    assert removal.rule.to_dict() == {"d/b": "dedup.near"} and "d/a" in removal.loc["d/b", "detail"]
    kept = res.kept.set_index("doc_id")
    assert kept.index.tolist() == ["d/a", "d/c"]
    assert kept.family_id.tolist() == ["d/a", "d/a"]  # C is kept, but held out or trained on with A


def test_identical_pages_are_deduplicated_not_erased_as_boilerplate(tmp_path):
    page = prose(random.Random(2), 120)
    docs = pd.DataFrame([dict(doc_id=f"d/{i}", source="d", language_hint="en", content_type="text", content=page)
                         for i in range(30)])
    res = build_corpus(docs, CorpusConfig(boilerplate={"min_docs": 5}), out=tmp_path)
    assert res.kept.doc_id.tolist() == ["d/0"]
    assert set(res.removals.rule) == {"dedup.exact"}


def test_jsonl_eval_files_split_at_newline_only(tmp_path):
    import json

    from evals.contamination import load_eval_files

    path = tmp_path / "eval.jsonl"
    rows = [{"id": "a", "text": "one\u2028two"}, {"id": "b", "text": "three\u2029four"}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert [(i.item_id, i.text) for i in load_eval_files([str(path)])] == [("a", "one\u2028two"),
                                                                         ("b", "three\u2029four")]


def test_read_slices_returns_exactly_the_rows_of_each_slice_across_row_groups_and_files(tmp_path):
    from tasks.corpus.build import read_slices

    docs = docs_frame(30)
    docs.iloc[:20].to_parquet(tmp_path / "a.parquet", index=False, row_group_size=7)
    docs.iloc[20:].to_parquet(tmp_path / "b.parquet", index=False, row_group_size=4)
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    got = read_slices([[a, 5, 15], [b, 0, 3]], batch_rows=3)
    assert got.doc_id.tolist() == docs.doc_id.iloc[5:23].tolist()
    assert read_slices([[b, 9, 3]], batch_rows=2).doc_id.tolist() == docs.doc_id.iloc[29:32].tolist()
    assert read_slices([]).empty


def test_kept_and_removals_are_ordered_parts_one_per_shard_never_joined(tmp_path):
    from tasks.readers import iter_kept, kept_files, load_kept, load_removals, removal_files

    cfg = CorpusConfig(**CFG, execution={"shard_docs": 8})
    docs = docs_frame(40)
    result = build_corpus(docs, cfg, out=tmp_path)
    n_shards = len(json.loads((tmp_path / "_work" / "shards.json").read_text())["shards"])
    assert n_shards == 6
    assert [p.name for p in kept_files(tmp_path)] == [f"part-{i:05d}.parquet" for i in range(n_shards)]
    assert [p.name for p in removal_files(tmp_path)] == [f"part-{i:05d}.parquet" for i in range(n_shards)]
    assert not (tmp_path / "kept.parquet").exists() and not (tmp_path / "removals.parquet").exists()
    kept, removals = load_kept(tmp_path), load_removals(tmp_path)
    # Corpus order in both: the input's order restricted to the kept, and to the removed, documents.
    order = {doc_id: i for i, doc_id in enumerate(docs.doc_id)}
    assert [order[d] for d in kept.doc_id] == sorted(order[d] for d in kept.doc_id)
    assert [order[d] for d in removals.doc_id] == sorted(order[d] for d in removals.doc_id)
    assert len(kept) + len(removals) == len(docs)
    streamed = pd.concat(list(iter_kept(tmp_path, ["doc_id", "text"], batch_rows=3)), ignore_index=True)
    pd.testing.assert_frame_equal(streamed, kept[["doc_id", "text"]])
    pd.testing.assert_frame_equal(result.kept, kept)


def test_an_artifact_without_parts_is_a_clear_error(tmp_path):
    from tasks.readers import kept_files, load_removals

    with pytest.raises(DataError, match=r"no parts of the kept documents.*--refresh corpus"):
        kept_files(tmp_path)
    with pytest.raises(DataError, match="no parts of the removal ledger"):
        load_removals(tmp_path)


def test_read_rejects_are_the_ledgers_first_part(tmp_path):
    from tasks.corpus.stage import _add_rejects
    from tasks.readers import load_removals, removal_files

    build_corpus(docs_frame(20), CorpusConfig(**CFG, execution={"shard_docs": 8}), out=tmp_path / "out")
    rejects = tmp_path / "rejects.parquet"
    pd.DataFrame([{"doc_id": "web/bad", "source": "web", "stage": "read", "rule": "read.bad_compression",
                   "value": float("nan"), "threshold": float("nan"), "detail": "cut stream"}]).to_parquet(rejects)
    _add_rejects(rejects, tmp_path / "out")
    assert removal_files(tmp_path / "out")[0].name == "rejects.parquet"
    ledger = load_removals(tmp_path / "out")
    assert ledger.doc_id.iloc[0] == "web/bad" and ledger.doc_id.is_unique


def test_a_resume_with_another_partition_count_gives_the_same_result(one_shard, tmp_path):
    """A build stopped after the boilerplate partitions of one count, resumed with another: the new count's
    partitions are computed afresh (their own folder), never mixed with the old ones."""
    first = CorpusConfig(**CFG, execution={"shard_docs": 9, "partitions": 3})
    build_corpus(docs_frame(60), first, out=tmp_path)
    work = tmp_path / "_work"
    for folder in ("keyed", "decisions", "kept", "removals"):
        shutil.rmtree(work / folder, ignore_errors=True)
    resumed = curate(work, tmp_path / "b", CorpusConfig(**CFG, execution={"shard_docs": 9, "partitions": 4}))
    assert (work / "boilerplate_p3").is_dir() and (work / "boilerplate_p4").is_dir()
    for name in ("kept", "removals", "funnel", "hits", "boilerplate"):
        pd.testing.assert_frame_equal(getattr(one_shard, name), getattr(resumed, name))


class Crash(Exception):
    """The stand-in for a run killed mid-pass."""


@pytest.mark.parametrize("label", ["corpus-boilerplate", "corpus-key parts", "corpus-exact", "corpus-candidates"])
def test_a_crash_inside_a_partitioned_pass_resumes_to_the_same_result(one_shard, tmp_path, label):
    """A run killed after some calls of one pass, with a torn temporary of the next call left behind: the rerun
    skips the finished calls, clears the torn one and ends with the uninterrupted build's result."""
    cfg = CorpusConfig(**CFG, execution={"shard_docs": 9, "partitions": 4})
    docs = docs_frame(60)
    docs.to_parquet(tmp_path / "docs.parquet", index=False)
    work = tmp_path / "work"
    split_sources([tmp_path / "docs.parquet"], work, 9)
    torn: list = []

    def crashing(fn, calls, name):
        if name != label:
            return [fn(**kw) for kw in calls]
        assert len(calls) >= 3, (name, len(calls))
        done = [fn(**kw) for kw in calls[:2]]
        nxt = Path(calls[2].get("out_dir") or calls[2].get("out_path"))
        tmp = nxt.parent / f".{nxt.name}.tmp-1-0badf00d"
        tmp.mkdir(parents=True)
        (tmp / "exact.parquet").write_text("truncated")
        torn.append(tmp)
        raise Crash(f"killed after {len(done)} calls of {name}")

    with pytest.raises(Crash):
        curate(work, tmp_path / "out", cfg, shard_map=crashing)
    seen = []

    def spy(fn, calls, name):
        seen.append((name, [fn(**kw) for kw in calls]))
        return seen[-1][1]

    resumed = curate(work, tmp_path / "out", cfg, shard_map=spy)
    ran = dict(seen)[label]
    assert ran[:2] == [False, False] and all(ran[2:]), ran  # the finished calls are skipped, the rest done
    assert not torn[0].exists()
    for name in ("kept", "removals", "funnel", "hits", "boilerplate"):
        pd.testing.assert_frame_equal(getattr(one_shard, name), getattr(resumed, name))
    assert resumed.near == one_shard.near


def test_an_unreadable_shard_file_fails_its_partition_naming_the_shard_and_the_fix(tmp_path):
    cfg = CorpusConfig(**CFG, execution={"shard_docs": 9, "partitions": 3})
    build_corpus(docs_frame(40), cfg, out=tmp_path / "a")
    work = tmp_path / "a" / "_work"
    for folder in ("exact_p3", "candidates_p3", "verified", "shingles", "decisions", "lookup", "kept", "removals"):
        shutil.rmtree(work / folder, ignore_errors=True)
    broken = work / "key_parts_p3" / "00002" / "exact-00001.parquet"
    broken.write_bytes(b"PAR1 not parquet")
    with pytest.raises(DataError, match=r"^partition 1 cannot read shard 00002's file .*exact-00001\.parquet "
                                        r"\(.*\): remove .*key_parts_p3/00002 and run the same command again; the "
                                        r"key parts pass writes it again$"):
        curate(work, tmp_path / "b", cfg, shard_map=prefect_shard_map("sequential", 1, retries=2))
    shutil.rmtree(work / "key_parts_p3" / "00002")  # the fix the message gives
    fresh = build_corpus(docs_frame(40), cfg, out=tmp_path / "c")
    pd.testing.assert_frame_equal(fresh.kept, curate(work, tmp_path / "b", cfg).kept)


def test_a_family_of_near_copies_keeps_its_original_whole_and_loses_the_copies(tmp_path):
    """Twelve near copies (one word changed each) of a page put its lines in thirteen documents, past min_docs:
    the original keeps its body (first occurrence) and the copies go as near duplicates of it, found on the text
    before the cut. A nav line in many unrelated pages is still cut from all but the first."""
    rng = random.Random(3)
    original = "\n".join(prose(rng, 14) for _ in range(8))
    rows = []
    for i in range(30):
        rows.append(dict(doc_id=f"web/{i}", source="web", language_hint="en",
                         content=f"{NAV}\n\n{prose(rng, 110)}", content_type="text"))
        if i == 4:
            rows.append(dict(doc_id="web/original", source="web", language_hint="en", content=original,
                             content_type="text"))
    for k in range(12):
        lines = original.split("\n")
        words = lines[k % 8].split()
        words[(3 + k) % len(words)] = "lighthouse"
        lines[k % 8] = " ".join(words)
        rows.append(dict(doc_id=f"web/copy{k}", source="web", language_hint="en", content="\n".join(lines),
                         content_type="text"))
    res = build_corpus(pd.DataFrame(rows), CorpusConfig(**CFG, execution={"shard_docs": 7}), out=tmp_path)
    kept = res.kept.set_index("doc_id").text
    assert kept["web/original"] == original
    rule = res.removals.set_index("doc_id").rule
    assert [rule.get(f"web/copy{k}") for k in range(12)] == ["dedup.near"] * 12
    assert kept["web/0"].startswith(NAV)
    assert not kept.drop("web/0").str.contains(NAV, regex=False).any()
    assert len(kept) + len(res.removals) == len(rows)
