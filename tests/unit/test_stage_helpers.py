"""Replay weights: the domain stream gets 1 − f, the base mixture gets f in its own proportions (docs/methods.md §11)."""

import pytest

from tasks.cpt.stage import replay_weights


def test_replay_weights_follow_the_base_mixture():
    weights = replay_weights(["doc"], {"en": 0.75, "zh": 0.25}, 0.2)
    assert weights == pytest.approx({"doc": 0.8, "en": 0.15, "zh": 0.05})
    assert sum(weights.values()) == pytest.approx(1.0)


def test_zero_replay_is_pure_domain_and_two_domains_split_evenly():
    assert replay_weights(["a", "b"], {"en": 1.0}, 0.0) == pytest.approx({"a": 0.5, "b": 0.5, "en": 0.0})


def test_sweep_edge_warning_names_the_edge():
    from tasks.sweep.config import SweepConfig
    from tasks.sweep.stage import edge_warning

    cfg = SweepConfig(lr_min=1e-3, lr_max=2e-2, report_every=10)
    assert "upper edge" in edge_warning(2e-2, cfg)
    assert "lower edge" in edge_warning(1e-3, cfg)
    assert edge_warning(5e-3, cfg) == ""
