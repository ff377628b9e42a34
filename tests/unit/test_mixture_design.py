"""Mixture design: generated candidates, rank agreement between proxy sizes, and the regression proposal."""

import math

import numpy as np
import pandas as pd
import pytest

from infra.errors import ConfigError, DataError
from tasks.mixture.candidates import resolve_candidates
from tasks.mixture.config import MixtureConfig
from tasks.mixture.design import EPSILON, grid_mixtures, propose_mixture, rank_agreement, simplex_mixtures


def test_grid_is_the_simplex_lattice_thinned_to_the_budget():
    full = grid_mixtures(["a", "b", "c"], 0.5, count=100)
    assert len(full) == 6  # compositions of 2 into 3 parts
    assert all(math.isclose(sum(m.values()), 1.0) for m in full)
    thinned = grid_mixtures(["a", "b", "c"], 0.25, count=4)
    assert len(thinned) == 4 and thinned[0] == {"a": 0.0, "b": 0.0, "c": 1.0} and thinned[-1]["a"] == 1.0
    with pytest.raises(DataError, match="step dividing 1"):
        grid_mixtures(["a", "b"], 0.3, count=3)


def test_simplex_draws_are_seeded_and_sum_to_one():
    first, again = simplex_mixtures(["a", "b", "c"], 5, seed=7), simplex_mixtures(["a", "b", "c"], 5, seed=7)
    assert first == again and len(first) == 5
    assert all(abs(sum(m.values()) - 1.0) < 1e-9 and min(m.values()) >= 0 for m in first)
    assert simplex_mixtures(["a", "b", "c"], 5, seed=8) != first


def test_generated_candidates_join_the_listed_ones():
    cfg = MixtureConfig(candidates=[{"name": "natural", "alpha": 1.0}],
                        generate={"kind": "grid", "count": 3, "step": 0.5})
    resolved = resolve_candidates(cfg, {"a": 100, "b": 50, "empty": 0})
    assert [c.name for c in resolved] == ["natural", "grid-1", "grid-2", "grid-3"]
    assert resolved[1].weights == {"a": 0.0, "b": 1.0, "empty": 0.0}  # no weight on a source without tokens
    with pytest.raises(ConfigError, match="reserved"):
        MixtureConfig(candidates=[{"name": "natural", "alpha": 1.0}, {"name": "grid-1", "alpha": 0.5}])
    with pytest.raises(ConfigError, match="at least 2"):
        MixtureConfig(candidates=[{"name": "natural", "alpha": 1.0}])


def test_rank_agreement_counts_flipped_pairs():
    small = pd.Series({"x": 1.0, "y": 2.0, "z": 3.0, "w": 4.0})
    assert rank_agreement(small, small * 2).tau == pytest.approx(1.0)
    swapped = pd.Series({"x": 2.0, "y": 1.0, "z": 3.0, "w": 4.0})
    agreement = rank_agreement(small, swapped)
    assert agreement.flipped_pairs == [("x", "y")] and agreement.winner_flips
    assert agreement.tau == pytest.approx(4 / 6)  # 5 concordant, 1 discordant of 6 pairs
    with pytest.raises(DataError, match="≥ 2 candidates"):
        rank_agreement(small[["x"]], small)


def test_proposal_recovers_the_law_it_was_fitted_on():
    """Trials drawn from L_s = c_s − k_s·ln(w_s + ε): the fit returns k and the optimum w_s ∝ τ_s·k_s."""
    law = {"a": (1.2, 0.10), "b": (1.5, 0.30)}
    rows = []
    for w_a in (0.1, 0.3, 0.5, 0.8):
        for source, w in (("a", w_a), ("b", 1 - w_a)):
            c, k = law[source]
            rows.append({"source": source, "weight": w, "bits_per_byte": c - k * np.log(w + EPSILON)})
    proposal = propose_mixture(pd.DataFrame(rows), {"a": 1.0, "b": 1.0})
    fit = proposal.fit.set_index("source")
    assert fit.loc["b", "k"] == pytest.approx(0.30, rel=1e-6) and fit.loc["a", "r2"] == pytest.approx(1.0)
    assert proposal.weights["a"] == pytest.approx(0.25, abs=2e-3)  # 0.1 / (0.1 + 0.3)
    assert sum(proposal.weights.values()) == pytest.approx(1.0)
    with pytest.raises(DataError, match="only one weight"):
        propose_mixture(pd.DataFrame(rows[:2]), {"a": 1.0, "b": 1.0})
