"""Uncertainty helpers against docs/methods.md §10 figures, a hand-computed exact binomial, and bootstrap invariants."""

import numpy as np
import pytest

from evals.stats import binomial_se, items_needed, mcnemar_exact, paired_bootstrap_ci
from infra.errors import ConfigError, DataError


def test_binomial_se_matches_spec_figures():
    assert 100 * binomial_se(0.40, 500) == pytest.approx(2.19, abs=0.005)  # docs/methods.md §10: 2.19 points
    assert 100 * 1.96 * binomial_se(0.40, 500) == pytest.approx(4.3, abs=0.05)  # ±4.3 at 95%
    assert 100 * binomial_se(0.50, 24) == pytest.approx(10.2, abs=0.05)  # 24 items at 50%: 10.2 points


def test_items_needed_inverts_the_spec_figure():
    n = items_needed(0.40, 0.043)
    assert 490 <= n <= 510  # docs/methods.md §10: 500 items give ±4.3 points at 95%
    assert items_needed(0.40, 0.043 / 2) == pytest.approx(4 * n, rel=0.01)  # half the width, four times the items
    assert items_needed(0.40, 0.043, confidence=0.99) > n


def test_bootstrap_ci_contains_true_delta_on_synthetic_pairs():
    rng = np.random.default_rng(7)
    n = 400
    base = rng.normal(3.0, 0.4, n)  # nats/token per window
    cand = base - 0.25 + rng.normal(0.0, 0.1, n)  # true weighted delta cand - base = -0.25
    tokens = rng.integers(100, 500, n)
    ci = paired_bootstrap_ci(base, cand, weights=tokens, seed=1)
    assert ci.low < -0.25 < ci.high
    assert ci.low <= ci.delta <= ci.high
    assert ci.high - ci.low < 0.05  # pairing removes the shared 0.4-nat window spread
    assert ci.delta == pytest.approx(np.sum(tokens * (cand - base)) / tokens.sum())


def test_bootstrap_weights_make_the_mean_token_weighted():
    base = np.zeros(4)
    cand = np.array([1.0, 1.0, 0.0, 0.0])
    assert paired_bootstrap_ci(base, cand, weights=np.array([3, 1, 0, 0])).delta == pytest.approx(1.0)
    assert paired_bootstrap_ci(base, cand).delta == pytest.approx(0.5)


def test_bootstrap_ci_collapses_for_constant_differences():
    rng = np.random.default_rng(0)
    base = rng.normal(4.0, 1.0, 50)
    ci = paired_bootstrap_ci(base, base + 0.3, weights=rng.integers(1, 9, 50))
    assert ci.delta == pytest.approx(0.3)
    assert ci.low == pytest.approx(0.3) and ci.high == pytest.approx(0.3)


def test_bootstrap_is_reproducible_by_seed():
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=60), rng.normal(size=60)
    assert paired_bootstrap_ci(a, b, seed=5) == paired_bootstrap_ci(a, b, seed=5)


def test_mcnemar_exact_against_hand_computed_binomial():
    # 8 discordant items, 7 favour the candidate: p = 2 * (C(8,7) + C(8,8)) / 2^8 = 18 / 256
    base = np.array([0] * 7 + [1] + [1] * 5 + [0] * 3, dtype=bool)
    cand = np.array([1] * 7 + [0] + [1] * 5 + [0] * 3, dtype=bool)
    result = mcnemar_exact(base, cand)
    assert (result.b01, result.b10) == (7, 1)
    assert result.p_value == pytest.approx(18 / 256)


def test_mcnemar_without_discordant_items_is_one():
    same = np.array([True, False, True])
    assert mcnemar_exact(same, same).p_value == 1.0


def test_bad_inputs_raise_project_errors():
    with pytest.raises(DataError):
        binomial_se(1.2, 10)
    with pytest.raises(DataError):
        paired_bootstrap_ci(np.zeros(3), np.zeros(4))
    with pytest.raises(DataError):
        paired_bootstrap_ci(np.zeros(1), np.zeros(1))
    with pytest.raises(ConfigError):
        paired_bootstrap_ci(np.zeros(3), np.zeros(3), confidence=1.5)
    with pytest.raises(ConfigError):
        items_needed(0.5, 0.0)


def test_cluster_bootstrap_widens_when_windows_of_a_document_share_its_shift():
    from evals.stats import cluster_bootstrap_ci

    rng = np.random.default_rng(3)
    docs, per_doc = 40, 10
    doc = np.repeat(np.arange(docs), per_doc)
    base = rng.normal(3.0, 0.3, docs * per_doc)
    # Each document shifts all its windows' difference together: 40 independent units, not 400.
    cand = base - 0.1 + np.repeat(rng.normal(0.0, 0.2, docs), per_doc) + rng.normal(0.0, 0.02, docs * per_doc)
    clustered = cluster_bootstrap_ci(base, cand, doc, seed=0)
    windows = paired_bootstrap_ci(base, cand, seed=0)
    assert clustered.delta == pytest.approx(windows.delta)
    assert (clustered.n_clusters, clustered.n_units) == (docs, docs * per_doc)
    assert clustered.high - clustered.low > 2.5 * (windows.high - windows.low)  # ≈ √10 wider
    assert clustered.low < -0.1 < clustered.high


def test_cluster_bootstrap_with_one_window_per_document_is_the_window_bootstrap():
    from evals.stats import cluster_bootstrap_ci

    rng = np.random.default_rng(5)
    base, cand = rng.normal(3.0, 0.3, 300), rng.normal(2.9, 0.3, 300)
    tokens = rng.integers(10, 100, 300)
    clustered = cluster_bootstrap_ci(base, cand, np.arange(300), weights=tokens, seed=2)
    windows = paired_bootstrap_ci(base, cand, weights=tokens, seed=2)
    assert clustered.delta == pytest.approx(windows.delta)
    assert clustered.high - clustered.low == pytest.approx(windows.high - windows.low, rel=0.15)


def test_cluster_bootstrap_refuses_a_single_cluster_and_mismatched_clusters():
    from evals.stats import cluster_bootstrap_ci

    with pytest.raises(DataError, match="2 clusters"):
        cluster_bootstrap_ci(np.zeros(5), np.ones(5), np.zeros(5))
    with pytest.raises(DataError, match="shape"):
        cluster_bootstrap_ci(np.zeros(5), np.ones(5), np.zeros(4))


def test_the_seed_bootstrap_widens_by_the_training_noise_that_one_seed_cannot_show():
    from evals.stats import cluster_bootstrap_ci, seed_cluster_bootstrap_ci

    rng = np.random.default_rng(11)
    docs, per_doc, seeds = 60, 3, 4
    doc = np.repeat(np.arange(docs), per_doc)
    base = rng.normal(3.0, 0.3, (seeds, docs * per_doc))
    # Each seed shifts the whole difference by its own training noise (sd 0.1) around a true Δ of 0.05.
    seed_shift = np.array([0.12, -0.08, 0.15, -0.04])
    cand = base + 0.05 + seed_shift[:, None] + rng.normal(0.0, 0.01, base.shape)
    both = seed_cluster_bootstrap_ci(base, cand, doc, seed=0)
    assert both.delta == pytest.approx(np.mean(cand - base))
    one = cluster_bootstrap_ci(base[0], cand[0], doc, seed=0)
    single = seed_cluster_bootstrap_ci(base[:1], cand[:1], doc, seed=0)
    assert single.delta == pytest.approx(one.delta) and single.high - single.low == pytest.approx(
        one.high - one.low, rel=0.2)
    assert both.high - both.low > 5 * (one.high - one.low)  # the seed spread dominates the held-out noise
    assert both.low < 0.05 + seed_shift.mean() < both.high
    with pytest.raises(DataError, match="shape"):
        seed_cluster_bootstrap_ci(base, cand[:, :-1], doc)
