"""Exact-substring dedup (Lee et al. 2022; tasks/corpus/substring.py): the suffix-array spans equal a brute-force
scan, the first copy is kept, and the opt-in corpus step records its ledger rule and counts."""

import random
from pathlib import Path

import pandas as pd
import pytest

from infra.errors import ConfigError
from infra.section import key_dump
from tasks.corpus.build import CURATION_STEPS, SUBSTRING_STEP, build_corpus
from tasks.corpus.config import CorpusConfig, SubstringDedupConfig
from tasks.corpus.stage import build_manifest, reconcile
from tasks.corpus.substring import apply_cuts, repeated_spans
from tasks.readers import kept_files, removal_files

ROOT = Path(__file__).resolve().parents[2]


def brute_force(texts: list[bytes], min_len: int, quadratic: bool = True) -> list[tuple[int, int, int]]:
    """(doc, start, end) spans by definition: a window of ``min_len`` bytes inside one document is a repeat when
    the same bytes occur as such a window at an earlier position (compared with every earlier window when
    ``quadratic``, else looked up among those seen); a character is cut when all its bytes lie in repeats."""
    data, bounds, at = b"".join(texts), [], 0
    for t in texts:
        bounds.append((at, at + len(t)))
        at += len(t)
    windows = [a + s for a, b in bounds for s in range(b - a - min_len + 1)]
    covered = [False] * len(data)
    seen: set[bytes] = set()
    for i, s in enumerate(windows):
        w = data[s:s + min_len]
        earlier = any(data[p:p + min_len] == w for p in windows[:i]) if quadratic else w in seen
        seen.add(w)
        if earlier:
            covered[s:s + min_len] = [True] * min_len
    spans = []
    for d, (a, b) in enumerate(bounds):
        run, at = None, a
        for ch in texts[d].decode("utf-8"):
            n = len(ch.encode("utf-8"))
            full = all(covered[at:at + n])
            if full and run is None:
                run = at - a
            elif not full and run is not None:
                spans.append((d, run, at - a))
                run = None
            at += n
        if run is not None:
            spans.append((d, run, b - a))
    return spans


def _spans(cuts) -> list[tuple[int, int, int]]:
    return list(zip(cuts.doc.tolist(), cuts.start.tolist(), cuts.end.tolist()))


@pytest.mark.parametrize("seed", range(4))
def test_suffix_array_spans_equal_brute_force(seed):
    rng = random.Random(seed)
    for _ in range(60):
        alphabet = rng.choice(["ab", "abc", "xyzé", "a中b", "hello wörld"])
        min_len = rng.randint(1, 9)
        planted = "".join(rng.choice(alphabet) for _ in range(30))
        texts = []
        for _ in range(rng.randint(1, 6)):
            t = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 25)))
            if rng.random() < 0.6:  # a planted repeat, copied into several documents
                i = rng.randint(0, len(t))
                t = t[:i] + planted[:rng.randint(0, 30)] + t[i:]
            texts.append(t.encode("utf-8"))
        cuts = repeated_spans(texts, min_len)
        assert _spans(cuts) == brute_force(texts, min_len), (texts, min_len)
        for d, s, e, fd, fs in zip(cuts.doc, cuts.start, cuts.end, cuts.first_doc, cuts.first_start):
            # The recorded first occurrence is an earlier in-document window equal to one inside the span's reach.
            first = texts[fd][fs:fs + min_len]
            assert len(first) == min_len and (fd, fs) < (d, s)
            assert any(texts[d][s - k:s - k + min_len] == first for k in range(4) if s - k >= 0)
        for d in range(len(texts)):  # what is left is valid UTF-8
            mine = [(s, e) for dd, s, e in _spans(cuts) if dd == d]
            apply_cuts(texts[d], [s for s, _ in mine], [e for _, e in mine]).decode("utf-8")


def test_keep_first_and_periodic_runs():
    shared = b"The committee meets on the first Tuesday of every month in the library hall. "
    a, b, c = b"Alpha opens here. " + shared, b"Bravo starts. " + shared + b"Bravo ends.", shared + b"Charlie."
    cuts = repeated_spans([a, b, c], 40)
    # a, the first copy, is whole; b's copy reaches back over ". ", which a has before the shared text too.
    assert _spans(cuts) == [(1, 12, 14 + len(shared)), (2, 0, len(shared))]
    assert set(cuts.first_doc.tolist()) == {0}
    cuts = repeated_spans([c, b, a], 40)  # the order decides which copy is first
    assert _spans(cuts) == [(1, 14, 14 + len(shared)), (2, 16, 18 + len(shared))]
    # A run of period 3 inside one document keeps one period: every later window repeats the one 3 bytes before.
    cuts = repeated_spans([b"x" + b"abc" * 40 + b"y"], 10)
    assert _spans(cuts) == [(0, 4, 121)]
    assert repeated_spans([b"short", b"short"], 10).doc.size == 0  # nothing as long as a window
    with pytest.raises(ValueError, match="min_len"):
        repeated_spans([b"abc"], 0)


def test_config_default_dump_unchanged():
    default, on = CorpusConfig(), CorpusConfig(substring_dedup={"enabled": True})
    assert "substring_dedup" not in default.model_dump() and "substring_dedup" not in default.model_dump_json()
    assert "substring_dedup" not in key_dump(default)
    rest = {k: v for k, v in on.model_dump().items() if k != "substring_dedup"}
    assert rest == default.model_dump()  # the other fields dump exactly as before
    assert key_dump(on)["substring_dedup"] == SubstringDedupConfig(enabled=True).model_dump()
    assert CorpusConfig.model_validate_json(on.model_dump_json()) == on
    # A non-default but disabled section is in the dump too: the dump shows what was configured.
    assert "substring_dedup" in CorpusConfig(substring_dedup={"min_repeat_bytes": 100}).model_dump()
    for bad, field in (({"min_repeat_bytes": 0}, "min_repeat_bytes"), ({"partition_bytes": 2**31}, "partition_bytes"),
                       ({"scope": "shard"}, "scope")):
        with pytest.raises(ConfigError, match=f"substring_dedup.{field}"):
            CorpusConfig.validate_strict({"substring_dedup": bad}, "test")


EN_A = ("Gardeners who keep a small vegetable plot learn quickly that the soil matters more than any single seed. "
        "They add compost in the autumn, turn it over with a fork, and leave it to rest through the cold months. "
        "When spring arrives the beds are dark and crumbly, and the first rows of peas go in with very little effort.")
EN_B = ("The old railway line that once carried coal from the valley has become a quiet path for walkers and "
        "cyclists. Along the way there are iron bridges, a tunnel lit by small lamps, and a station building that "
        "now serves tea. Local volunteers clear fallen branches after storms and repair the wooden benches.")
EN_C = ("A lighthouse keeper wrote in her log every evening, noting the wind, the colour of the sea and the ships "
        "that passed the point. Her entries were short, but over forty years they became a record of the coast.")
FOOT = ("Subscribe to the weekly newsletter of the allotment society for seasonal planting advice, tool reviews "
        "and notes from our members about what grew well this year.")
ZH_A = ("开源软件的发展离不开社区的贡献，这是许多项目能够长期维护的原因。"
        "我们在学习编程时，也常常阅读别人写好的代码，并从中发现新的思路和方法。")
ZH_B = ("春天来了，公园里的花都开了，很多人带着孩子出来散步。"
        "老人们在树下下棋，年轻人在湖边跑步，大家都觉得这是一年中最好的季节。")


def _docs() -> pd.DataFrame:
    rows = [("web", f"{EN_A} {FOOT}", None), ("web", f"{EN_B} {FOOT}", None),
            ("web", f"A short note before the copy. {EN_B}", None),  # left with its note only: removed
            ("web", EN_C, None), ("quotes", f"{EN_C} {FOOT}", "en"),  # another source: not compared (scope)
            ("zh", ZH_A, "zh"), ("zh", ZH_B + ZH_A[:40], "zh")]
    return pd.DataFrame([dict(doc_id=f"{src}/{i}", source=src, language_hint=hint, content=c, content_type="text")
                         for i, (src, c, hint) in enumerate(rows)])


def _cfg(shard_docs: int, **substring) -> CorpusConfig:
    return CorpusConfig(source_overrides={"web": {"min_words": 5}, "quotes": {"min_words": 5}},
                        execution={"shard_docs": shard_docs},
                        substring_dedup={"min_repeat_bytes": 100, "min_doc_bytes": 60, **substring})


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    docs = _docs()
    out = {name: build_corpus(docs, _cfg(shard_docs, **extra), out=tmp_path_factory.mktemp(name))
           for name, shard_docs, extra in [("off", 3, {}), ("on", 2, {"enabled": True}),
                                           ("one_shard", 100, {"enabled": True}),
                                           ("global", 3, {"enabled": True, "scope": "global"})]}
    return docs, out


def _reference(kept_off: pd.DataFrame, min_len: int, min_doc: int, scope: str):
    """Per document what the step must do, from the brute-force scan over the texts that enter it (the kept
    texts of the same build with the step off, in corpus order)."""
    groups = [kept_off] if scope == "global" else [g for _, g in kept_off.groupby("source", sort=False)]
    after, cut = {}, {}
    for group in groups:
        texts = [t.encode("utf-8") for t in group.text]
        spans = brute_force(texts, min_len, quadratic=False)
        for d, (doc_id, text) in enumerate(zip(group.doc_id, texts)):
            mine = [(s, e) for dd, s, e in spans if dd == d]
            after[doc_id] = apply_cuts(text, [s for s, _ in mine], [e for _, e in mine]).decode("utf-8")
            cut[doc_id] = (len(mine), sum(e - s for s, e in mine))
    dropped = {d for d, t in after.items() if cut[d][0] and len(t.strip().encode("utf-8")) < min_doc}
    return after, cut, dropped


def test_build_records_rule_and_counts(builds):
    docs, out = builds
    off, on = out["off"], out["on"]
    kept_off = off.kept
    after, cut, dropped = _reference(kept_off, 100, 60, "source")
    assert dropped == {"web/2"} and cut["web/1"][0] == 1 and cut["zh/6"][0] == 1 and cut["quotes/4"] == (0, 0)
    kept = on.kept.set_index("doc_id")
    assert sorted(kept.index) == sorted(set(kept_off.doc_id) - dropped)
    for doc_id in kept.index:  # the kept text is the text with the repeats cut
        assert kept.loc[doc_id, "text"] == after[doc_id]
        assert kept.loc[doc_id, "n_bytes"] == len(after[doc_id].encode("utf-8"))
    assert kept.loc["web/0", "text"] == kept_off.set_index("doc_id").loc["web/0", "text"]  # first copy whole
    row = on.removals.set_index("doc_id").loc["web/2"]
    assert (row.stage, row.rule, row.threshold) == (SUBSTRING_STEP, "dedup.substring", 60.0)
    assert row.value == len(after["web/2"].strip().encode("utf-8")) and "repeat of web/1" in row.detail
    reconcile(docs, pd.DataFrame({"doc_id": []}), kept_files(on.out), removal_files(on.out))

    spans = on.spans
    for source in ("web", "quotes", "zh"):
        ids = kept_off.doc_id[kept_off.source == source]
        stats = on.substring[source]
        assert stats["bytes_cut"] == sum(cut[d][1] for d in ids) == spans[spans.source == source].n_bytes.sum()
        assert stats["spans_cut"] == sum(cut[d][0] for d in ids)
        assert stats["docs_touched"] == sum(1 for d in ids if cut[d][0])
        assert stats["docs_removed"] == len(dropped & set(ids))
        assert stats["bytes_in"] == sum(len(t.encode("utf-8")) for t in kept_off.text[kept_off.source == source])
        assert stats["bytes_out"] == kept.n_bytes[kept.source == source].sum()
    assert spans.doc_removed.tolist() == [d in dropped for d in spans.doc_id]
    for f in spans.itertuples():  # every span names where its first copy is
        assert f.first_doc_id < f.doc_id or f.first_doc_id == f.doc_id

    funnel = on.funnel
    for source, f in funnel.groupby("source"):
        assert f.stage.tolist() == CURATION_STEPS + [SUBSTRING_STEP]
        last = f.iloc[-1]
        mine = kept.source == source
        assert last.docs_out == mine.sum() and last.chars_out == kept.n_chars[mine].sum()
        removed = (on.removals.source == source) & (on.removals.stage == SUBSTRING_STEP)
        assert last.docs_in - last.docs_out == removed.sum()

    described = {s: {"role": "general", "snapshot": "", "licence": ""} for s in ("web", "quotes", "zh")}
    manifest = build_manifest(described, docs, pd.DataFrame({"doc_id": [], "source": []}), kept_files(on.out),
                              removal_files(on.out), on, _cfg(2, enabled=True), [])
    web = manifest["sources"]["web"]
    assert web["removed_by_rule"]["dedup.substring"] == 1 and web["substring_dedup"] == on.substring["web"]
    assert web["filters"]["substring_dedup"]["min_repeat_bytes"] == 100
    assert manifest["stages"][-1] == SUBSTRING_STEP
    assert manifest["substring_dedup"]["partitions"] == 3 and not manifest["substring_dedup"][
        "repeats_across_partitions_searched"]


def test_result_does_not_depend_on_shards_and_scope_widens(builds):
    docs, out = builds
    on, one = out["on"], out["one_shard"]
    pd.testing.assert_frame_equal(on.kept, one.kept)
    pd.testing.assert_frame_equal(on.removals, one.removals)
    pd.testing.assert_frame_equal(on.spans, one.spans)
    after, cut, dropped = _reference(out["off"].kept, 100, 60, "global")
    glob = out["global"].kept.set_index("doc_id")
    assert cut["quotes/4"][0] == 1  # across sources the footer is found too
    assert {d: glob.loc[d, "text"] for d in glob.index} == {d: after[d] for d in glob.index}
    assert out["global"].substring["_all"]["partitions"] == 1


def test_default_build_is_unchanged(builds):
    _, out = builds
    off = out["off"]
    assert not (off.out / "substring_spans.parquet").exists() and off.substring == {}
    assert set(off.funnel.stage) == set(CURATION_STEPS) and SUBSTRING_STEP not in set(off.removals.stage)
    manifest = build_manifest({"web": {"role": "general", "snapshot": "", "licence": ""}}, _docs(),
                              pd.DataFrame({"doc_id": [], "source": []}), kept_files(off.out),
                              removal_files(off.out), off, _cfg(3), [])
    assert "substring_dedup" not in manifest and manifest["stages"] == CURATION_STEPS
    assert "substring_dedup" not in manifest["sources"]["web"] and "substring_dedup" not in manifest["sources"][
        "web"]["filters"]


def test_turning_it_on_moves_the_corpus_key_but_not_the_quality_models():
    from pathlib import Path

    from flows.config import load_config
    from flows.keys import chain_keys

    root = Path(__file__).resolve().parents[2]
    off = chain_keys(load_config(root / "configs" / "smoke.toml"), until="corpus")
    on = chain_keys(load_config(root / "configs" / "smoke.toml", {"corpus.substring_dedup.enabled": True}),
                    until="corpus")
    assert on["quality_model"].key == off["quality_model"].key  # it acts after the text the classifier learns from
    assert on["corpus"].key != off["corpus"].key
