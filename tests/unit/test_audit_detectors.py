"""Contamination detectors on the planted mock benchmark (docs/methods.md §7): passages and paraphrase-like edits
against brute-force counts, and a small audit where the real corpus build's near dedup and 13-gram decontamination
flag verbatim, wrapped and control documents; the LSH layout table and its figure."""

import random
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats

from flows.audit import detectors_for_display, headline_metrics
from flows.config import load_config
from tasks.audit.benchmark import (CONTROL, TABLE_COLUMNS, VERBATIM, WRAPPED, edited_form, forms, make_benchmark,
                                   paraphrase_units, passages)
from tasks.audit.config import AuditConfig
from tasks.audit.layouts import layout_table
from tasks.audit.run import load_documents, run_audit, write_audit
from tasks.corpus.config import MinHashConfig

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(num_navigation=2, num_spam=2, num_repeated=2, num_short=2, num_exact_copies=2, num_near_per_rate=1,
             extractor_pages=0, benchmark_items=3, benchmark_edit_rates=[0.01, 0.3])


def test_passages_are_consecutive_word_windows():
    text = "\n".join(" ".join(f"w{i}" for i in range(k, k + 10)) for k in range(0, 250, 10))  # w0 … w249
    got = passages(text, 100, by_chars=False)
    assert [p.split() for p in got] == [[f"w{i}" for i in range(k, k + 100)] for k in (0, 100)]
    assert "\n" in got[0]  # line breaks inside a window are kept
    assert passages("a b c d e f", 10, False) == ["a b c d e f"]  # 6 >= 10 // 2: the whole text
    assert passages("a b c d", 10, False) == []
    assert passages("甲乙 丙丁戊", 4, by_chars=True) == ["甲乙 丙丁"]


def test_paraphrase_edits_match_their_expected_counts():
    n, q = 30_000, 0.3
    words = [f"w{i}" for i in range(n)]
    vocab = [f"v{i}" for i in range(50)]
    out = paraphrase_units(" ".join(words), q, random.Random(0), vocab, by_chars=False).split()
    kept = [int(w[1:]) for w in out if w.startswith("w")]
    substituted = sum(w.startswith("v") for w in out)
    deleted = n - len(kept) - substituted  # a substituted unit is gone from the originals too
    swapped = sum(a == b + 1 for a, b in zip(kept, kept[1:]))  # an original pair now in reverse order
    # A unit is drawn unless the unit before it was drawn and swapped: visit share v = 1 / (1 + q/3); each drawn unit
    # is edited with probability q, by each of the three operations with probability 1/3.
    expected = n * q / 3 / (1 + q / 3)  # 2,727; Poisson spread about 52
    for count in (substituted, deleted, swapped):
        assert count == pytest.approx(expected, rel=0.06)
    assert sorted(kept) == sorted(set(kept))  # nothing duplicated


def test_benchmark_is_deterministic_and_keeps_its_sources_out_of_the_background():
    rng = random.Random(1)
    docs = pd.DataFrame({"doc_id": [f"d{i}" for i in range(20)],
                         "text": [" ".join(f"t{i}x{rng.randrange(10**6)}" for _ in range(250)) for i in range(20)]})
    cfg = AuditConfig(benchmark_items=4, benchmark_edit_rates=[0.1], benchmark_words=50)
    bench = make_benchmark(docs.head(12), docs.iloc[12:], "src", False, cfg)
    again = make_benchmark(docs.head(12), docs.iloc[12:], "src", False, cfg)
    assert bench.planted.equals(again.planted) and bench.items.equals(again.items)
    assert bench.per_form == 4
    assert bench.planted["form"].value_counts().to_dict() == dict.fromkeys(forms(cfg), 4)
    item_text = dict(zip(bench.items["item_id"], bench.items["text"]))
    for row in bench.planted.itertuples():
        if row.form == VERBATIM:
            assert row.content == item_text[row.item_id]
        elif row.form == WRAPPED:
            before, middle, after = row.content.split("\n\n")
            assert middle == item_text[row.item_id] and len(before.split()) == len(after.split()) == 50
        elif row.form == CONTROL:
            assert row.item_id == "" and row.content not in item_text.values()
    # 6 passages a round (4 forms + 2 wrappers) × 4 = 24 passages, over 8 held-out + 6 (half the originals)
    # documents: ⌈24 / 14⌉ = 2 per document, so all 8 held-out documents and then 4 originals.
    held, originals = {f"d{i}" for i in range(12, 20)}, {f"d{i}" for i in range(12)}
    assert set(bench.pool_docs[:8]) == held and len(bench.pool_docs) == 12
    assert set(bench.pool_docs[8:]) <= originals
    assert set(bench.background["doc_id"]) == originals - set(bench.pool_docs)


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    import os

    cwd = os.getcwd()
    os.chdir(ROOT)  # smoke sources are globs relative to the repository
    try:
        cfg = load_config(ROOT / "configs" / "smoke.toml")
        source = cfg.sources["handbook_en"]
        docs, _ = load_documents(source, tmp_path_factory.mktemp("cache"))
    finally:
        os.chdir(cwd)
    # The rules alone (the smoke config's quality classifier needs its trained artifact, tested end to end).
    corpus = cfg.corpus.model_copy(update={"quality_model": type(cfg.corpus.quality_model)()})
    audit_cfg = AuditConfig(**SMALL, num_originals=8, lsh_layouts=["20x10"],
                            lsh_design="s1=0.8,p1=0.95,s2=0.5,p2=0.05")
    result = run_audit(docs.head(8), source, corpus, audit_cfg, held_out=docs.iloc[8:])
    return result, audit_cfg, corpus


def test_verbatim_copies_are_flagged_by_both_detectors_and_wrapped_ones_by_the_ngram_detector(audited):
    result, cfg, _ = audited
    table = result.detectors.table.set_index(["form", "detector"])
    assert result.report["detectors"]["per_form"] == 3
    for detector in ("near_dedup", "ngram_overlap"):
        row = table.loc[(VERBATIM, detector)]
        assert row["planted"] == row["reached"] == row["flagged"] == 3
        assert table.loc[(CONTROL, detector), "flagged"] == 0  # unrelated passages: no false positive here
    assert table.loc[(WRAPPED, "ngram_overlap"), "flagged"] == table.loc[(WRAPPED, "ngram_overlap"), "reached"] == 3
    # The item is a third of its page: Jaccard near 1/3, far below the 0.8 verification threshold.
    assert table.loc[(WRAPPED, "near_dedup"), "flagged"] == 0
    assert table.loc[(edited_form(0.01), "ngram_overlap"), "flagged"] == 3
    outcomes = result.detectors.outcomes
    verbatim = outcomes[outcomes["form"] == VERBATIM].set_index("detector")
    assert set(verbatim.loc["near_dedup", "rule"]) == {"dedup.near"}
    assert set(verbatim.loc["ngram_overlap", "rule"]) == {"decontam.ngram_overlap"}


def test_detector_table_has_one_row_per_form_and_detector_with_wilson_intervals(audited):
    result, cfg, _ = audited
    table = result.detectors.table
    assert list(table.columns) == TABLE_COLUMNS
    assert list(zip(table["form"], table["detector"])) == [(f, d) for f in forms(cfg)
                                                           for d in ("near_dedup", "ngram_overlap")]
    for row in table.itertuples():
        assert row.share == pytest.approx(row.flagged / row.reached)
        ci = stats.binomtest(row.flagged, row.reached).proportion_ci(confidence_level=0.95, method="wilson")
        assert (row.ci_low, row.ci_high) == pytest.approx((ci.low, ci.high))
    wide = detectors_for_display(result.report["detectors"]["rows"])
    assert list(wide.columns) == ["form", "near_dedup", "ngram_overlap"] and list(wide["form"]) == forms(cfg)
    assert wide.set_index("form").loc[VERBATIM, "ngram_overlap"].endswith("(3/3)")
    assert headline_metrics(result.report)["detector_ngram_overlap_wrapped_share"] == 1.0


def test_layouts_list_the_configured_banding_first_and_the_cheapest_designs(audited, tmp_path):
    result, cfg, corpus = audited
    table = result.layouts
    assert list(table["layout"][:4]) == ["14x8", "20x10", "21x9", "22x9"]
    assert list(table["role"][:3]) == ["configured", "listed", "designed"]
    configured = table.iloc[0]
    assert configured["p_at_s1"] == pytest.approx(1 - (1 - 0.8**8) ** 14) and not configured["meets"]
    assert table[table["role"] == "designed"]["meets"].all()
    # One drawn design per row count: 21x9 and 27x10 of the ten cheapest (r = 9 for b = 21..26, then r = 10).
    assert list(table[table["drawn"] & (table["role"] == "designed")]["layout"]) == ["21x9", "27x10"]
    files = {p.name for p in write_audit(result, tmp_path / "audit", "smoke · handbook_en")}
    assert {"detectors.csv", "detector_outcomes.parquet", "lsh_layouts.csv", "lsh_layouts.png"} <= files
    assert pd.read_csv(tmp_path / "audit" / "detectors.csv").shape == result.detectors.table.shape
    plain = layout_table(MinHashConfig(), AuditConfig())
    assert list(plain["layout"]) == ["14x8"] and plain["meets"].isna().all()
