"""The figures' math and inputs: the LSH S-curve at known points, the funnel's counts per rule, the PNG files."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flows.registry import get_stage
from tasks.corpus.plots import funnel_counts, s_curve_grid as s_curve
from tasks.main.plots import plot_training_curves
from tasks.mixture.plots import plot_mixture


def _at(bands: int, rows: int, s: float) -> float:
    grid, p = s_curve(bands, rows, points=101)
    index = int(round(s * 100))
    assert grid[index] == pytest.approx(s)
    return float(p[index])


def test_s_curve_at_known_points():
    assert _at(14, 8, 0.0) == 0.0 and _at(14, 8, 1.0) == 1.0
    # 0.8^8 = 0.16777216; 1 − (1 − 0.16777216)^14 = 1 − 0.83222784^14 = 0.92354756 (FineWeb's 14 × 8 at J = 0.8)
    assert _at(14, 8, 0.8) == pytest.approx(0.92354756, abs=1e-8)
    assert _at(1, 1, 0.37) == pytest.approx(0.37)          # one band of one row: P = s
    assert _at(2, 1, 0.5) == pytest.approx(0.75)           # 1 − 0.5²
    assert _at(1, 2, 0.5) == pytest.approx(0.25)           # 0.5²
    assert _at(4, 2, 0.5) == pytest.approx(1 - 0.75 ** 4)  # 0.68359375


def test_s_curve_is_monotone_and_rejects_bad_bands():
    _, p = s_curve(20, 5)
    assert np.all(np.diff(p) >= 0)
    with pytest.raises(ValueError, match="bands=0"):
        s_curve(0, 8)
    with pytest.raises(ValueError, match="points=1"):
        s_curve(14, 8, points=1)


def test_funnel_counts_per_rule_and_source_without_removals():
    removals = pd.DataFrame({"source": ["a", "a", "a", "b"], "rule": ["dedup.exact", "langid.low_score",
                                                                     "langid.low_score", "dedup.exact"]})
    kept = pd.Series({"a": 10, "b": 5, "c": 7})
    table = funnel_counts(removals, kept)
    assert list(table.columns)[0] == "kept"
    assert table.loc["a"].to_dict() == {"kept": 10, "dedup.exact": 1, "langid.low_score": 2}
    assert table.loc["c"].to_dict() == {"kept": 7, "dedup.exact": 0, "langid.low_score": 0}
    # documents in = kept + removed, per source
    assert table.sum(axis=1).to_dict() == {"a": 13, "b": 6, "c": 7}
    empty = funnel_counts(removals.iloc[0:0], kept)
    assert list(empty.columns) == ["kept"] and empty["kept"].tolist() == [10, 5, 7]


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


def test_plots_write_png_files(tmp_path):
    history = pd.DataFrame({"step": [2, 4, 6], "loss_nats": [7.0, 6.5, 6.2], "lr": [1e-3, 8e-4, 1e-4]})
    assert _is_png(plot_training_curves(history, tmp_path / "curves.png"))
    scores = pd.DataFrame({"candidate": ["a", "b"], "score": [4.72, 4.73], "eligible": [True, False]})
    assert _is_png(plot_mixture(scores, "a", tmp_path / "mix.png"))
    with pytest.raises(ValueError, match="training history is empty"):
        plot_training_curves(pd.DataFrame(), tmp_path / "none.png")


def test_stage_plots_read_the_corpus_artifact_files(tmp_path):
    """A hand-built corpus artifact: the funnel and the S-curve of its recorded near-dedup configuration."""
    artifact = tmp_path / "corpus" / "k"
    artifact.mkdir(parents=True)
    (artifact / "manifest.json").write_text(json.dumps({"sources": {"a": {"docs_out": 3}, "b": {"docs_out": 1}}}))
    (artifact / "meta.json").write_text(json.dumps({"config": {"corpus": {"near_dedup": {
        "bands": 14, "rows": 8, "jaccard_threshold": 0.8}}}}))
    (artifact / "removals").mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"source": ["a"], "rule": ["dedup.exact"]}).to_parquet(artifact / "removals" / "part-00000.parquet")
    made = get_stage("corpus").figures(artifact, tmp_path / "plots", None)
    assert [p.name for p in made] == ["funnel.png", "s_curve.png"]
    assert all(_is_png(p) for p in made)
    assert get_stage("main").figures(artifact, tmp_path / "plots", pd.DataFrame()) == []
