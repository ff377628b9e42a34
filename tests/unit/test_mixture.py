"""Mixture candidates, epochs (docs/methods.md §8, §12 figures) and the selection rule."""

import math

import pandas as pd
import pytest

from infra.errors import ConfigError, DataError
from tasks.mixture.candidates import resolve_candidates, temperature_weights
from tasks.train.epochs import epoch_warnings, epochs
from tasks.mixture.config import MixtureCandidate, MixtureConfig
from tasks.mixture.select import select_mixture

SIZES = {"web": 900, "wiki": 20, "code": 150}


def _cfg(**kwargs) -> MixtureConfig:
    candidates = [
        MixtureCandidate(name="natural", alpha=1.0),
        MixtureCandidate(name="t03", alpha=0.3),
        MixtureCandidate(name="code_heavy", weights={"web": 0.5, "wiki": 0.1, "code": 0.4}),
    ]
    return MixtureConfig(candidates=candidates, **kwargs)


# --- temperature sampling p ∝ q^α (docs/methods.md §8) -------------------------------------------------------------------------


def test_alpha_one_is_natural_share():
    weights = temperature_weights(SIZES, 1.0)
    assert weights == pytest.approx({"web": 900 / 1070, "wiki": 20 / 1070, "code": 150 / 1070})


def test_alpha_zero_is_uniform_over_nonempty_sources():
    weights = temperature_weights({**SIZES, "empty": 0}, 0.0)
    assert weights == pytest.approx({"web": 1 / 3, "wiki": 1 / 3, "code": 1 / 3, "empty": 0.0})


def test_alpha_half_matches_hand_computation():
    # sizes 900 : 100 → q = 0.9, 0.1; sqrt → 0.948683, 0.316228; sum 1.264911 → 0.75, 0.25.
    weights = temperature_weights({"a": 900, "b": 100}, 0.5)
    assert weights == pytest.approx({"a": 0.75, "b": 0.25}, abs=1e-9)


def test_temperature_rejects_bad_alpha_and_sizes():
    with pytest.raises(ConfigError, match="alpha"):
        temperature_weights(SIZES, 1.5)
    with pytest.raises(DataError, match="all zero"):
        temperature_weights({"a": 0}, 0.5)


# --- epochs w·D/U (docs/methods.md §8), docs/methods.md §12 mixture example ---------------------------------------------------------------


def test_spec_12_epochs_and_warning():
    b = 10**9
    e = epochs({"web": 0.80, "wiki": 0.05, "code": 0.15}, 1000 * b, {"web": 900 * b, "wiki": 20 * b, "code": 150 * b})
    assert e["web"] == pytest.approx(0.89, abs=0.005)
    assert e["wiki"] == pytest.approx(2.5)
    assert e["code"] == pytest.approx(1.0)
    assert epoch_warnings(e, 4.0) == []
    unique = {"web": 900 * b, "wiki": 20 * b, "code": 150 * b}
    e_heavy = epochs({"web": 0.7, "wiki": 0.15, "code": 0.15}, 1000 * b, unique)
    warnings = epoch_warnings(e_heavy, 4.0)
    assert len(warnings) == 1 and "'wiki'" in warnings[0] and "7.50 epochs" in warnings[0]


def test_epochs_needs_unique_tokens_for_weighted_source():
    with pytest.raises(DataError, match="'wiki'"):
        epochs({"web": 0.9, "wiki": 0.1}, 1000, {"web": 900})


# --- candidate validation -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"weights": {"web": 1.0}, "alpha": 0.5}, "exactly one of `weights` or `alpha`"),
        ({}, "exactly one of `weights` or `alpha`"),
        ({"alpha": 1.2}, r"\.alpha"),
        ({"weights": {"web": 0.7, "wiki": 0.2}}, r"\.weights sums to"),
        ({"weights": {"web": 1.1, "wiki": -0.1}}, r"\.weights has negative"),
    ],
)
def test_candidate_errors_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        MixtureCandidate(name="bad", **kwargs)


def test_config_needs_natural_unique_names_and_two_candidates():
    with pytest.raises(ConfigError, match="no natural"):
        MixtureConfig(candidates=[MixtureCandidate(name="a", alpha=0.3), MixtureCandidate(name="b", alpha=0.5)])
    with pytest.raises(ConfigError, match="duplicate"):
        MixtureConfig(candidates=[MixtureCandidate(name="a", alpha=1.0), MixtureCandidate(name="a", alpha=0.5)])
    with pytest.raises(ConfigError, match="at least 2"):
        MixtureConfig(candidates=[MixtureCandidate(name="natural", alpha=1.0)])
    named = MixtureConfig(candidates=[MixtureCandidate(name="p", alpha=1.0), MixtureCandidate(name="q", alpha=0.3)])
    assert named.natural_name() == "p"


def test_resolve_candidates_checks_source_names():
    resolved = {r.name: r for r in resolve_candidates(_cfg(), SIZES)}
    assert resolved["natural"].weights == pytest.approx(temperature_weights(SIZES, 1.0))
    assert resolved["code_heavy"].weights == {"web": 0.5, "wiki": 0.1, "code": 0.4}
    assert resolved["code_heavy"].alpha is None
    unknown = MixtureConfig(candidates=[MixtureCandidate(name="natural", alpha=1.0),
                                        MixtureCandidate(name="x", weights={"web": 0.5, "books": 0.5})])
    with pytest.raises(ConfigError, match="unknown source.*'books'"):
        resolve_candidates(unknown, {"web": 1, "wiki": 1})
    with pytest.raises(ConfigError, match="leaves out.*'wiki'"):
        resolve_candidates(unknown, {"web": 1, "books": 1, "wiki": 1})


# --- selection ------------------------------------------------------------------------------------------------------


def _trials(bpb: dict[str, dict[str, float]], tokens: dict[str, int]) -> pd.DataFrame:
    rows = [
        {"candidate": c, "source": s, "loss_nats": v * 3.0, "bits_per_byte": v, "heldout_tokens": tokens[s]}
        for c, per_source in bpb.items() for s, v in per_source.items()
    ]
    return pd.DataFrame(rows)


def test_selection_excludes_candidate_that_regresses_a_source():
    # code_heavy has the best weighted mean but loses 0.10 bpb on wiki (> δ = 0.05): ineligible; t03 wins.
    trials = _trials(
        {
            "natural": {"web": 1.00, "wiki": 1.00, "code": 1.00},
            "t03": {"web": 0.99, "wiki": 0.96, "code": 0.97},
            "code_heavy": {"web": 0.95, "wiki": 1.10, "code": 0.80},
        },
        {"web": 800, "wiki": 100, "code": 100},
    )
    choice = select_mixture(trials, _cfg(), natural="natural")
    scores = choice.scores.set_index("candidate")
    assert choice.name == "t03"
    assert choice.score == pytest.approx((0.99 * 800 + 0.96 * 100 + 0.97 * 100) / 1000)
    assert choice.runner_up == "natural" and choice.margin == pytest.approx(1.0 - choice.score)
    assert not scores.loc["code_heavy", "eligible"]
    assert scores.loc["code_heavy", "worst_regression_bpb"] == pytest.approx(0.10)
    assert "'wiki'" in scores.loc["code_heavy", "reason"]
    assert "0.05" in choice.rule_text and "natural" in choice.rule_text


def test_rule_changes_the_winner():
    # Weighted by tokens, web dominates (a wins); the plain mean favours b's big code gain.
    cfg_kwargs = {"max_regression_bpb": 1.0}
    trials = _trials(
        {
            "natural": {"web": 1.00, "wiki": 1.00, "code": 1.00},
            "t03": {"web": 0.90, "wiki": 1.00, "code": 1.00},
            "code_heavy": {"web": 0.98, "wiki": 1.00, "code": 0.60},
        },
        {"web": 900, "wiki": 50, "code": 50},
    )
    weighted = select_mixture(trials, _cfg(**cfg_kwargs), natural="natural")
    plain = select_mixture(trials, _cfg(rule="min_mean_bpb", **cfg_kwargs), natural="natural")
    assert weighted.name == "t03"
    assert plain.name == "code_heavy" and plain.score == pytest.approx((0.98 + 1.0 + 0.6) / 3)


def test_natural_always_eligible_and_missing_candidate_reported():
    trials = _trials(
        {"natural": {"web": 1.0, "code": 1.0}, "t03": {"web": 1.2, "code": 1.2}}, {"web": 1, "code": 1}
    )
    choice = select_mixture(trials, _cfg(), natural="natural")
    scores = choice.scores.set_index("candidate")
    assert choice.name == "natural" and choice.runner_up is None and choice.margin is None
    assert scores.loc["code_heavy", "reason"] == "no results" and math.isnan(scores.loc["code_heavy", "score"])


def test_selection_rejects_inconsistent_trials():
    trials = _trials({"natural": {"web": 1.0, "code": 1.0}, "t03": {"web": 1.0}}, {"web": 1, "code": 1})
    with pytest.raises(DataError, match="same sources"):
        select_mixture(trials, _cfg(), natural="natural")
    with pytest.raises(DataError, match="lack column"):
        select_mixture(trials.drop(columns="heldout_tokens"), _cfg(), natural="natural")


def test_summary_says_the_proxy_counts_are_the_artifacts_build_not_this_run(tmp_path):
    import json

    from infra.runs import RunsLayout
    from infra.stage import SummaryContext
    from tasks.mixture.views import summary

    (tmp_path / "choice.json").write_text(json.dumps({"name": "natural", "weights": {"a": 1.0}, "rule": "lowest"}))
    (tmp_path / "meta.json").write_text(json.dumps({"summary": {"proxies_trained": 3, "proxies_reused": 0}}))
    lines = summary(SummaryContext(path=tmp_path, paths={}, layout=RunsLayout(tmp_path)))
    assert lines[-1] == "  when this artifact was built: proxies trained 3, reused from cache 0"
