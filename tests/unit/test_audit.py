"""Filter audit (docs/methods.md §7 (TinyStories filter audit)): labelled injection, the edit-rate → Jaccard formula, crosstab, precision/recall."""

import math
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flows.config import load_config
from infra.errors import ConfigError
from tasks.audit.config import EDIT_RATES, AuditConfig
from tasks.audit.inject import edit_units, inject, labels, near_label, theoretical_jaccard, vocabulary
from tasks.audit.measure import candidate_pairs, is_candidate, precision_recall
from tasks.audit.run import load_originals, run_audit, write_audit
from tasks.corpus.minhash import jaccard, shingles

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(num_navigation=4, num_spam=4, num_repeated=4, num_short=12, num_exact_copies=6, num_near_per_rate=3)


def _random_text(rng: random.Random, n_words: int, vocab_size: int = 20_000) -> str:
    return " ".join(f"w{rng.randrange(vocab_size)}" for _ in range(n_words))


@pytest.fixture(scope="module")
def originals() -> pd.DataFrame:
    rng = random.Random(7)
    return pd.DataFrame({"doc_id": [f"src/{i}" for i in range(6)], "text": [_random_text(rng, 150) for _ in range(6)]})


def test_injection_is_deterministic_and_labelled(originals):
    cfg = AuditConfig(**SMALL, seed=3)
    mixed = inject(originals, "src", "en", False, cfg)
    assert mixed.equals(inject(originals, "src", "en", False, cfg))
    assert not mixed.equals(inject(originals, "src", "en", False, AuditConfig(**SMALL, seed=4)))
    expected = {"original": 6, "navigation": 4, "spam": 4, "repeated": 4, "short": 12, "exact_copy": 6,
                **{near_label(q): 3 for q in EDIT_RATES}}
    assert mixed["label"].value_counts().to_dict() == expected
    assert set(mixed["label"]) == set(labels(cfg))
    assert mixed["doc_id"].is_unique
    assert mixed["label"].head(6).eq("original").all()  # originals first: the build keeps the first duplicate
    text_of = dict(zip(originals["doc_id"], originals["text"]))
    copies = mixed[mixed["label"] == "exact_copy"]
    assert (copies["content"] == copies["original_id"].map(text_of)).all()
    near = mixed[mixed["label"].str.startswith("near_copy")]
    assert near["original_id"].isin(originals["doc_id"]).all()
    assert pd.concat([copies, near])["original_id"].value_counts().max() <= cfg.max_copies_per_original
    assert (near["label"] == near["edit_rate"].map(near_label)).all()


def test_copies_are_scaled_down_when_originals_are_few(originals):
    cfg = AuditConfig(**{**SMALL, "num_near_per_rate": 10}, max_copies_per_original=2)
    mixed = inject(originals, "src", "en", False, cfg)
    copies = mixed[mixed["label"].str.contains("copy")]
    assert copies["original_id"].value_counts().max() <= 2
    assert len(copies) <= 6 * 2
    assert (mixed["label"] == near_label(0.01)).sum() == (mixed["label"] == near_label(0.2)).sum() > 0


@pytest.mark.parametrize("q", EDIT_RATES)
def test_near_copy_jaccard_follows_spec_formula(q):
    rng = random.Random(0)
    text = _random_text(rng, 10_000, vocab_size=10**6)
    vocab, original = vocabulary([text], False), shingles(text, 5, False)
    measured = np.mean([jaccard(original, shingles(edit_units(text, q, rng, vocab, False), 5, False))
                        for _ in range(8)])
    # docs/methods.md §7: s = (1 − q)^n, J ≈ s/(2 − s). Deletions shorten the copy and raise J by up to 0.015; the spread of
    # the mean of 8 copies of 10,000 words is about 0.004.
    assert measured == pytest.approx(theoretical_jaccard(q, 5), abs=0.03)


def test_theoretical_jaccard_matches_spec_numbers():
    # s = 0.99^5 = 0.95099 → J = 0.95099 / 1.04901 = 0.9066; s = 0.8^5 = 0.32768 → J = 0.1959
    assert theoretical_jaccard(0.01, 5) == pytest.approx(0.9066, abs=1e-4)
    assert theoretical_jaccard(0.20, 5) == pytest.approx(0.1959, abs=1e-4)


def test_character_edits_follow_the_formula_for_chinese():
    rng = random.Random(5)
    chars = [chr(0x4E00 + i) for i in range(3000)]
    text = "".join(rng.choice(chars) for _ in range(8000))
    copy = edit_units(text, 0.05, rng, vocabulary([text], True), by_chars=True)
    measured = jaccard(shingles(text, 5, True), shingles(copy, 5, True))
    assert measured == pytest.approx(theoretical_jaccard(0.05, 5), abs=0.03)


def test_edits_keep_line_breaks():
    rng = random.Random(0)
    text = "\n".join(_random_text(rng, 12) for _ in range(40))
    copy = edit_units(text, 0.05, rng, vocabulary([text], False), by_chars=False)
    assert abs(copy.count("\n") - text.count("\n")) <= 5  # only deleted line-final words merge lines


def test_precision_recall_on_hand_built_pairs():
    pairs = pd.DataFrame([
        # kind, theory J, exact J, LSH candidate
        ("copy-original", 0.90, 0.92, True),   # A
        ("copy-original", 0.75, 0.82, True),   # B
        ("copy-original", 0.63, 0.72, False),  # C: missed by LSH
        ("cross-family", math.nan, 0.85, True),  # D: two unrelated documents that match
        ("copy-copy", 0.80, 0.95, True),       # E: left out of precision/recall
    ], columns=["kind", "theory_jaccard", "exact_jaccard", "lsh_candidate"]).assign(
        same_family=lambda f: f["kind"] != "cross-family")
    got = precision_recall(pairs, [0.7, 0.8, 0.9]).set_index(["truth", "threshold"])
    expected = {("theory", 0.7): (3, 2, 2 / 3, 1.0), ("theory", 0.8): (3, 1, 1 / 3, 1.0),
                ("theory", 0.9): (1, 1, 1.0, 1.0), ("exact", 0.7): (3, 3, 2 / 3, 2 / 3),
                ("exact", 0.8): (3, 2, 2 / 3, 1.0), ("exact", 0.9): (1, 1, 1.0, 1.0)}
    for key, (predicted, positives, precision, recall) in expected.items():
        row = got.loc[key]
        assert (row["predicted"], row["positives"]) == (predicted, positives), key
        assert (row["precision"], row["recall"]) == pytest.approx((precision, recall)), key


def test_band_buckets_agree_with_pairwise_band_check():
    rng = np.random.default_rng(0)
    sigs = rng.integers(0, 3, size=(30, 8), dtype=np.uint32)  # few values: many shared bands
    has = np.ones(30, dtype=bool)
    has[4] = False
    brute = {(i, j) for i in range(30) for j in range(i + 1, 30)
             if has[i] and has[j] and is_candidate(sigs[i], sigs[j], bands=4, rows=2)}
    assert candidate_pairs(sigs, has, bands=4, rows=2) == brute
    assert not any(4 in p for p in brute)


def test_audit_config_names_the_bad_field():
    with pytest.raises(ConfigError, match="edit_rates"):
        AuditConfig(edit_rates=[0.0, 0.1])
    with pytest.raises(ConfigError, match="num_originals"):
        AuditConfig(num_originals=0)


def test_audit_of_smoke_source_puts_copies_and_fragments_under_their_rules(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # smoke sources are globs relative to the repository
    cfg = load_config(ROOT / "configs" / "smoke.toml")
    source = cfg.sources["handbook_en"]
    audit_cfg = AuditConfig(**SMALL, num_originals=10, seed=0)
    originals, counts = load_originals(source, tmp_path / "cache", audit_cfg.num_originals)
    assert len(originals) == 10 and counts["docs_read"] == 14
    # The rules alone here (the smoke config's quality classifier needs its trained artifact, tested end to end).
    corpus = cfg.corpus.model_copy(update={"quality_model": cfg.corpus.quality_model.model_copy(
        update={"enabled": False, "ablate": False})})
    result = run_audit(originals, source, corpus, audit_cfg)
    assert "quality_model" not in result.report
    table, docs = result.crosstab, result.documents
    kept_originals = set(docs.loc[(docs["label"] == "original") & (docs["rule"] == "kept"), "doc_id"])
    copies = docs[docs["label"] == "exact_copy"]
    assert (copies["stage"] == "dedup_exact").sum() == copies["original_id"].isin(kept_originals).sum()
    assert table.loc["exact_copy", "dedup.exact"] == copies["original_id"].isin(kept_originals).sum()
    short = docs[docs["label"] == "short"]
    assert set(short["stage"]) <= {"quality", "langid"}
    assert table.loc["short", "gopher.min_words"] >= 0.75 * len(short)
    assert (table["total"] == table.drop(columns="total").sum(axis=1)).all()
    assert result.report["minhash"]["mae"] < 0.08  # std of a 112-permutation estimate is ≤ 0.047
    files = {p.name for p in write_audit(result, tmp_path / "audit", "smoke · handbook_en")}
    assert {"crosstab.csv", "pairs.parquet", "s_curve.png", "report.json", "originals_removed.csv"} <= files
