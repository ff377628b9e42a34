"""Warmup-cosine schedule against the check values of docs/methods.md §6, and OptimConfig validation."""

import pytest

from infra.errors import ConfigError
from tasks.train.config import OptimConfig
from tasks.train.schedule import lr_at


@pytest.mark.parametrize("step, expected", [
    (1_000, 1.50e-4), (2_000, 3.00e-4), (127_000, 2.61e-4), (254_313, 1.66e-4), (381_000, 7.01e-5), (508_626, 3.00e-5),
])
def test_spec_check_values(step, expected):
    lr = lr_at(step, peak_lr=3e-4, warmup_steps=2_000, total_steps=508_626, min_lr_ratio=0.1)
    assert lr == pytest.approx(expected, rel=5e-3)


def test_floor_holds_after_total():
    assert lr_at(600_000, peak_lr=3e-4, warmup_steps=2_000, total_steps=508_626) == pytest.approx(3e-5)


def test_no_warmup_starts_at_peak():
    assert lr_at(0, peak_lr=1e-3, warmup_steps=0, total_steps=10) == pytest.approx(1e-3)


def test_warmup_longer_than_run_rejected():
    with pytest.raises(ConfigError, match="warmup"):
        lr_at(1, peak_lr=1e-3, warmup_steps=20, total_steps=10)


def test_optim_defaults_are_spec():
    cfg = OptimConfig(peak_lr=3e-4, warmup_steps=2_000)
    assert (cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, cfg.min_lr_ratio, cfg.grad_clip) == (
        0.9, 0.95, 1e-8, 0.1, 0.1, 1.0)


@pytest.mark.parametrize("field, value", [("peak_lr", 0.0), ("beta2", 1.0), ("grad_clip", 0.0), ("warmup_steps", -1),
                                          ("min_lr_ratio", 1.5)])
def test_optim_rejects_with_field_name(field, value):
    kwargs = {"peak_lr": 3e-4, "warmup_steps": 10, field: value}
    with pytest.raises(ConfigError, match=field):
        OptimConfig(**kwargs)
