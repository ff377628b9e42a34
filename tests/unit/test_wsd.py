"""Warmup-stable-decay (docs/methods.md §6): schedule values by hand, cosine unchanged (values and keys), config
validation, decay branches equal to shorter WSD runs, and bit-exact resumes of a WSD main run (killed in the stable
phase, killed in the decay, and grown from a shorter run's stable checkpoint)."""

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from infra.artifacts import canonical_json
from infra.errors import ConfigError
from infra.runs import RunsLayout
from infra.section import key_dump
from infra.stage import StageContext
from models.config import ModelConfig
from models.decoder import Decoder
from tasks.train.checkpoint import Checkpointer, load_model
from tasks.train.config import OptimConfig
from tasks.train.data import MixtureSampler
from tasks.train.loop import train
from tasks.train.optim import build_optimizer
from tasks.train.schedule import (branch_lr, decay_start, decay_steps_of, lr_at, lr_schedule, wsd_lr)
from tasks.train.sections import BranchConfig, MainConfig, ModelShape, ProxyConfig, RunBudget

PEAK = 1e-3


# --------------------------------------------------------------------------- the schedule, by hand

def wsd(step, shape="linear", floor=0.0):
    """peak 1e-3, warmup 10, total 100, decay_fraction 0.2: K = 20, decay after step D = 80."""
    return lr_schedule(step, schedule="wsd", peak_lr=PEAK, warmup_steps=10, total_steps=100, min_lr_ratio=floor,
                       decay_fraction=0.2, decay_shape=shape)


@pytest.mark.parametrize("step, expected", [(0, 0.0), (5, 5e-4), (10, 1e-3), (50, 1e-3), (80, 1e-3), (90, 5e-4),
                                            (95, 2.5e-4), (100, 0.0), (120, 0.0)])
def test_wsd_linear_reference_values(step, expected):
    assert wsd(step) == pytest.approx(expected, abs=1e-15)


def test_wsd_shapes_and_floor_by_hand():
    # p = (step − 80) / 20; linear 1 − p, cosine ½(1 + cos πp), 1-sqrt 1 − √p (Hägele et al. 2024).
    assert wsd(85, "1-sqrt") == pytest.approx(PEAK * (1 - math.sqrt(0.25)))  # 5e-4
    assert wsd(90, "1-sqrt") == pytest.approx(PEAK * (1 - math.sqrt(0.5)))  # 2.929e-4
    assert wsd(90, "cosine") == pytest.approx(5e-4)
    assert wsd(95, "cosine") == pytest.approx(PEAK * 0.5 * (1 + math.cos(0.75 * math.pi)))  # 1.464e-4
    assert wsd(90, "linear", floor=0.1) == pytest.approx(1e-4 + 9e-4 * 0.5)  # 5.5e-4
    assert wsd(100, "cosine", floor=0.1) == pytest.approx(1e-4)
    assert wsd(81, "1-sqrt") < wsd(81, "cosine") < PEAK  # 1-sqrt drops fastest at the start of the decay
    for shape in ("linear", "cosine", "1-sqrt"):
        values = [wsd(s, shape) for s in range(80, 101)]
        assert values[0] == PEAK and values[-1] == 0.0 and values == sorted(values, reverse=True)


def test_decay_length_rounds_half_up_and_is_at_least_one_step():
    assert decay_steps_of(100, 0.2) == 20 and decay_start(100, 0.2) == 80
    assert decay_steps_of(10, 0.25) == 3  # ⌊2.5 + ½⌋
    assert decay_steps_of(3, 0.1) == 1  # ⌊0.8⌋ = 0 → at least one decay step
    assert decay_steps_of(10, 1.0) == 10 and decay_start(10, 1.0) == 0


@pytest.mark.parametrize("step, expected", [
    (1_000, 1.50e-4), (2_000, 3.00e-4), (127_000, 2.61e-4), (254_313, 1.66e-4), (381_000, 7.01e-5), (508_626, 3.00e-5),
])
def test_cosine_through_the_generic_function_keeps_the_methods_check_values(step, expected):
    kwargs = dict(peak_lr=3e-4, warmup_steps=2_000, total_steps=508_626, min_lr_ratio=0.1)
    lr = lr_schedule(step, schedule="cosine", decay_fraction=0.5, decay_shape="linear", **kwargs)
    assert lr == lr_at(step, **kwargs)  # the decay_* arguments do not act under cosine
    assert lr == pytest.approx(expected, rel=5e-3)


def test_branch_lr_is_the_wsd_run_of_s_plus_k_steps_decaying_from_s():
    s, k = 37, 9
    for shape in ("linear", "cosine", "1-sqrt"):
        for t in range(s + 1, s + k + 3):
            assert branch_lr(t, branch_step=s, decay_steps=k, peak_lr=PEAK, min_lr_ratio=0.05, decay_shape=shape) == \
                wsd_lr(t, peak_lr=PEAK, warmup_steps=5, total_steps=s + k, decay_steps=k, min_lr_ratio=0.05,
                       decay_shape=shape)
    assert branch_lr(s + k, branch_step=s, decay_steps=k, peak_lr=PEAK, min_lr_ratio=0.0) == 0.0
    with pytest.raises(ValueError, match="not after the branch point"):
        branch_lr(s, branch_step=s, decay_steps=k, peak_lr=PEAK, min_lr_ratio=0.0)


def test_no_decay_is_the_stable_trunk():
    assert [wsd_lr(t, peak_lr=PEAK, warmup_steps=4, total_steps=8, decay_steps=0, min_lr_ratio=0.0)
            for t in (2, 4, 8, 9)] == \
        [5e-4, PEAK, PEAK, PEAK]


@pytest.mark.parametrize("call, match", [
    (lambda: lr_schedule(5, schedule="step", peak_lr=PEAK, warmup_steps=0, total_steps=10), "schedule"),
    (lambda: wsd(50, "exp"), "decay_shape"),
    (lambda: wsd_lr(1, peak_lr=PEAK, warmup_steps=9, total_steps=10, decay_steps=5, min_lr_ratio=0.0),
     "inside the warmup"),
    (lambda: decay_steps_of(10, 0.0), "decay_fraction"),
])
def test_schedule_errors_name_the_setting(call, match):
    with pytest.raises(ConfigError, match=match):
        call()


# --------------------------------------------------------------------------- config and keys

@pytest.mark.parametrize("field, value", [("schedule", "linear"), ("decay_fraction", 0.0), ("decay_fraction", 1.5),
                                          ("decay_shape", "sqrt"), ("decay_steps", -1)])
def test_optim_rejects_schedule_settings_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        OptimConfig(peak_lr=PEAK, warmup_steps=1, **{field: value})


BUDGET = {"steps": 16, "batch_size": 8, "warmup_steps": 2, "eval_every": 8, "eval_tokens": 2048}


@pytest.mark.parametrize("extra, match", [
    ({"schedule": "step"}, "schedule"),
    ({"schedule": "wsd", "decay_fraction": 0.0}, "decay_fraction"),
    ({"schedule": "wsd", "decay_fraction": 1.5}, "decay_fraction"),
    ({"schedule": "wsd", "decay_shape": "exp"}, "decay_shape"),
    ({"schedule": "wsd", "decay_fraction": 0.95}, "decay_fraction = 0.95 .*inside the warmup"),
])
def test_budget_rejects_bad_schedules_naming_the_field(extra, match):
    with pytest.raises(ConfigError, match=match):
        RunBudget.validate_strict({**BUDGET, **extra}, "cfg.toml")


# The main and proxy sections of configs/smoke.toml; the hashes were computed with the RunBudget and MainConfig of
# before WSD existed, so an unchanged hash means every existing cosine artifact keeps its key.
SMOKE_MAIN = {"model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "n_kv_heads": 1, "d_ff": 96, "seq_len": 64},
              "budget": BUDGET, "log_every": 2, "checkpoint_every": 8, "async_checkpoints": True}
SMOKE_PROXY = {"peak_lr": 3e-3, "model": {"n_layers": 1, "d_model": 32, "n_heads": 2, "n_kv_heads": 1, "d_ff": 96,
                                          "seq_len": 64},
               "budget": {"steps": 12, "batch_size": 8, "warmup_steps": 2, "eval_tokens": 2048}}


def _hash(value) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:16]


def test_a_cosine_config_keeps_its_key():
    main = MainConfig.validate_strict(SMOKE_MAIN, "smoke")
    proxy = ProxyConfig.validate_strict(SMOKE_PROXY, "smoke")
    assert _hash(key_dump(main)) == "4f3574ac806556aa"
    assert _hash(key_dump(proxy)) == "7da5d8d8d7727725"
    assert _hash(proxy.budget.model_dump()) == "9a9c0f137bcb5bc0"  # the mixture's proxy cache key hashes this dump
    # Written out, the defaults give the same key; the WSD-only fields do not act under cosine.
    spelled = {**SMOKE_MAIN, "min_lr_ratio": 0.1, "budget": {**BUDGET, "schedule": "cosine", "decay_shape": "linear"}}
    assert key_dump(MainConfig.validate_strict(spelled, "smoke")) == key_dump(main)


def test_wsd_settings_and_the_floor_are_in_the_key_branches_are_not():
    base = key_dump(MainConfig.validate_strict(SMOKE_MAIN, "smoke"))
    wsd_main = {**SMOKE_MAIN, "budget": {**BUDGET, "schedule": "wsd"}}
    keyed = key_dump(MainConfig.validate_strict(wsd_main, "smoke"))
    assert keyed != base and keyed["budget"]["decay_shape"] == "1-sqrt" and keyed["budget"]["decay_fraction"] == 0.2
    linear = {**wsd_main, "budget": {**wsd_main["budget"], "decay_shape": "linear"}}
    assert key_dump(MainConfig.validate_strict(linear, "smoke")) != keyed
    assert key_dump(MainConfig.validate_strict({**wsd_main, "min_lr_ratio": 0.0}, "smoke")) != keyed
    branched = {**wsd_main, "branches": {"at_steps": [4, 8], "decay_steps": 2}}
    assert key_dump(MainConfig.validate_strict(branched, "smoke")) == keyed


@pytest.mark.parametrize("main, match", [
    ({"budget": BUDGET, "branches": {"at_steps": [4]}}, 'branches need budget.schedule = "wsd"'),
    ({"budget": {**BUDGET, "schedule": "wsd"}, "branches": {"at_steps": [1, 13]}},
     r"branches.at_steps \[1, 13\] lie outside the stable phase \[2, 13\)"),
    ({"budget": {**BUDGET, "schedule": "wsd"}, "branches": {"at_steps": [4], "decay_steps": 0}}, "decay_steps"),
    ({"budget": {**BUDGET, "schedule": "wsd"}, "branches": {"at_steps": [4], "decay_steps": 1.5}}, "decay_steps"),
    ({"budget": {**BUDGET, "schedule": "wsd"}, "branches": {"at_steps": [4], "weights": {"a": 0.7}}}, "sum to 1"),
    ({"budget": {**BUDGET, "schedule": "wsd"}, "min_lr_ratio": -0.1}, "min_lr_ratio"),
])
def test_branch_settings_are_validated(main, match):
    with pytest.raises(ConfigError, match=match):
        MainConfig.validate_strict({**SMOKE_MAIN, **main}, "cfg.toml")


def test_branch_length_is_steps_or_a_fraction_of_the_branch_step():
    assert BranchConfig(at_steps=[40], decay_steps=7).length(40) == 7
    assert BranchConfig(at_steps=[40], decay_steps=0.25).length(40) == 10
    assert BranchConfig(at_steps=[3], decay_steps=0.1).length(3) == 1


# --------------------------------------------------------------------------- the loop: a branch is a shorter WSD run

CFG = ModelConfig(n_layers=1, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=128, seq_len=16)


def _sampler():
    rng = np.random.default_rng(0)
    data = {"a": rng.integers(0, 128, 3_000).astype(np.uint16), "b": rng.integers(0, 128, 2_000).astype(np.uint16)}
    return MixtureSampler(data, {"a": 0.6, "b": 0.4}, seq_len=16, batch_size=4, seed=3)


def test_a_decay_branch_equals_the_uninterrupted_wsd_run_that_decays_from_its_step(tmp_path):
    """Stable trunk to s = 7 (no decay), checkpoint, resume, decay over k = 3 steps: the same weights, bit for bit,
    as one WSD run of 10 steps with decay_fraction 0.3 (K = 3, decay after step 7)."""
    s, k = 7, 3
    torch.manual_seed(0)
    reference = Decoder(CFG)
    full = train(reference, _sampler(), OptimConfig(peak_lr=3e-3, warmup_steps=2, schedule="wsd",
                                                    decay_fraction=0.3, decay_shape="1-sqrt"), total_steps=s + k)
    torch.manual_seed(0)
    trunk = OptimConfig(peak_lr=3e-3, warmup_steps=2, schedule="wsd", decay_steps=0)
    first = train(Decoder(CFG), _sampler(), trunk, total_steps=s, callbacks=[Checkpointer(tmp_path)])
    assert [m["lr"] for m in first.metrics] == [m["lr"] for m in full.metrics[:s]]

    model = Decoder(CFG)
    optimizer = build_optimizer(model, trunk)
    loaded = Checkpointer(tmp_path).load(tmp_path / f"step_{s:08d}", model=model, optimizer=optimizer)
    data = _sampler()
    data.load_state_dict(loaded["sampler_state"])
    branch = train(model, data, trunk.model_copy(update={"decay_steps": k}), total_steps=s + k,
                   state=loaded["state"], optimizer=optimizer)
    assert [m["lr"] for m in branch.metrics] == [m["lr"] for m in full.metrics[s:]]
    assert [m["lr"] for m in branch.metrics] == [branch_lr(t, branch_step=s, decay_steps=k, peak_lr=3e-3,
                                                           min_lr_ratio=0.1) for t in range(s + 1, s + k + 1)]
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name


def test_every_budget_trains_under_its_schedule_through_run_training():
    """run_training (proxies, sweep trials, main, CPT candidates) takes the schedule from the budget."""
    from tasks.train.runner import run_training

    budget = RunBudget(steps=10, batch_size=4, warmup_steps=2, schedule="wsd", decay_fraction=0.3,
                       decay_shape="linear")
    torch.manual_seed(0)
    result = run_training(Decoder(CFG), _sampler(), peak_lr=3e-3, budget=budget, seed=0, min_lr_ratio=0.0)
    assert [m["lr"] for m in result.metrics] == pytest.approx([1.5e-3] + [3e-3] * 6 + [2e-3, 1e-3, 0.0], abs=1e-15)
    cosine = run_training(Decoder(CFG), _sampler(), peak_lr=3e-3, budget=budget.model_copy(
        update={"schedule": "cosine"}), seed=0)
    assert [m["lr"] for m in cosine.metrics] == [lr_at(t, peak_lr=3e-3, warmup_steps=2, total_steps=10)
                                                 for t in range(1, 11)]


# --------------------------------------------------------------------------- the main stage under WSD

from tests.unit.toy_inputs import run_main as run, write_toy_inputs  # noqa: E402
WSD_MAIN = MainConfig(model=ModelShape(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, seq_len=8),
                      budget=RunBudget(steps=10, batch_size=2, warmup_steps=1, eval_tokens=64, schedule="wsd",
                                       decay_fraction=0.3),  # K = 3: stable to step 7, decay over 8..10
                      peak_lr=1e-3, min_lr_ratio=0.0, log_every=1, checkpoint_every=2)


def _grown(steps: int, fraction: float) -> MainConfig:
    return WSD_MAIN.model_copy(update={"budget": WSD_MAIN.budget.model_copy(
        update={"steps": steps, "decay_fraction": fraction})})


@pytest.fixture
def inputs(tmp_path) -> dict[str, Path]:
    return write_toy_inputs(tmp_path, {"a": 400, "b": 120})


def _context(root: Path, inputs, attempt: str, log_metrics=lambda metrics, step: None, stage: str = "main",
             refresh: bool = False):
    out = root / "runs" / "artifacts" / stage / f".tmp-{attempt}"
    out.mkdir(parents=True)
    return StageContext(out=out, inputs=inputs, layout=RunsLayout(root / "runs"), key="k1", experiment="t",
                        torch_threads=1, log_metrics=log_metrics, refresh=refresh)


def _main(root: Path, inputs, attempt: str, cfg: MainConfig = WSD_MAIN, **kwargs) -> dict:
    return run(_context(root, inputs, attempt, **kwargs), cfg, sources=["a", "b"])


def _weights(root: Path, attempt: str) -> dict[str, torch.Tensor]:
    return dict(load_model(root / "runs/artifacts/main" / f".tmp-{attempt}" / "checkpoint").state_dict())


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("stop_at, resumed_from", [(5, 4), (9, 8)], ids=["stable phase", "decay"])
def test_a_wsd_main_run_stopped_and_resumed_ends_bit_exact(tmp_path, inputs, stop_at, resumed_from):
    """Stopped at step 5 (stable phase) or 9 (inside the decay of steps 8..10), resumed from the newest scratch
    checkpoint: the same final weights as an uninterrupted run, bit for bit."""
    reference = _main(tmp_path / "uninterrupted", inputs, "only")
    assert reference["schedule"] == "wsd" and reference["decay_start"] == 7 and reference["decay_steps"] == 3
    assert reference["stable_checkpoints"] == [7]

    def stop(metrics, step):
        if step == stop_at:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _main(tmp_path / "stopped", inputs, "first", log_metrics=stop)
    resumed = _main(tmp_path / "stopped", inputs, "second")
    assert resumed["resumed_from_step"] == resumed_from and resumed["resumed_from"] == "scratch"
    _assert_same_weights(_weights(tmp_path / "stopped", "second"), _weights(tmp_path / "uninterrupted", "only"))
    # the stable checkpoint the first attempt wrote (step 7, before the stop at 9) is the run's too
    assert resumed["stable_checkpoints"] == [7] and resumed["final_loss_nats"] == reference["final_loss_nats"]


def test_a_run_killed_after_its_last_checkpoint_reports_what_the_uninterrupted_run_did(tmp_path, inputs):
    """Killed after its last checkpoint but before the commit, the rerun resumes at the last step and trains none:
    its run.json still gives the final loss and the stable checkpoints of the run."""
    from tasks.main.stage import run as stage_run

    reference = _main(tmp_path / "uninterrupted", inputs, "only")
    stage_run(_context(tmp_path / "killed", inputs, "first"), WSD_MAIN, sources=["a", "b"])  # its scratch stays
    resumed = _main(tmp_path / "killed", inputs, "second")
    assert resumed["resumed_from_step"] == reference["steps"] == 10
    assert isinstance(reference["final_loss_nats"], float)
    for name in ("final_loss_nats", "stable_checkpoints", "steps", "tokens_seen"):
        assert resumed[name] == reference[name], name
    _assert_same_weights(_weights(tmp_path / "killed", "second"), _weights(tmp_path / "uninterrupted", "only"))


def test_a_refreshed_main_run_trains_its_stable_phase_again(tmp_path, inputs):
    """--refresh main recomputes the run: the cached stable-phase checkpoint of the same trunk is not resumed, and
    the weights equal the first computation's."""
    _main(tmp_path / "shared", inputs, "first")
    steps = []
    again = _main(tmp_path / "shared", inputs, "refreshed", refresh=True,
                  log_metrics=lambda metrics, step: steps.append(step) if "lr" in metrics else None)
    assert again["resumed_from_step"] == 0 and "resumed_from" not in again
    assert min(steps) == 1
    _assert_same_weights(_weights(tmp_path / "shared", "refreshed"), _weights(tmp_path / "shared", "first"))


def test_a_grown_wsd_budget_resumes_from_the_stable_checkpoint_bit_exact(tmp_path, inputs, capsys):
    """A 10-step run keeps its stable state at step 7; the same run grown to 20 steps (decay after step 14) starts
    there, trains 13 steps, and ends with the weights of a 20-step run trained from scratch."""
    lrs = {}
    _main(tmp_path / "shared", inputs, "short")
    grown = _main(tmp_path / "shared", inputs, "long", _grown(20, 0.3),
                  log_metrics=lambda metrics, step: lrs.update({step: metrics.get("lr")}))
    assert grown["resumed_from"] == "stable" and grown["resumed_from_step"] == 7
    assert "main: resuming from stable checkpoint step 7" in capsys.readouterr().out
    assert min(s for s in lrs if lrs[s] is not None) == 8  # steps 1..7 were not trained again
    assert grown["trunk_key"] == json.loads(
        (tmp_path / "shared/runs/artifacts/main/.tmp-short/run.json").read_text())["trunk_key"]
    scratch = _main(tmp_path / "fresh", inputs, "long", _grown(20, 0.3))
    assert scratch["resumed_from_step"] == 0
    _assert_same_weights(_weights(tmp_path / "shared", "long"), _weights(tmp_path / "fresh", "long"))
    kept = sorted(p.name for p in (tmp_path / "shared/runs/cache/stable" / grown["trunk_key"]).glob("step_*"))
    assert kept == ["step_00000007", "step_00000014"]
    from tasks.main.views import main_run_lines

    lines = main_run_lines(grown, max_epochs=100.0)
    assert lines[0] == "  resumed from step 7 of 20 (the stable-phase checkpoint of a WSD run with another budget)"
    assert lines[1].startswith("  schedule WSD: peak to step 14, then 6 decay steps (1-sqrt) to 0 × peak; stable "
                               "checkpoints kept at steps 14")


def test_the_trunk_key_ignores_the_length_and_decay_but_not_the_warmup(tmp_path, inputs):
    from tasks.main.stage import main_trunk_key
    from tasks.train.packing import PackingConfig

    def key(cfg):
        return main_trunk_key(cfg, inputs, packing=PackingConfig(), seed=0)

    longer = _grown(40, 0.5).model_copy(update={"min_lr_ratio": 0.1})
    assert key(WSD_MAIN) == key(longer)
    assert key(WSD_MAIN) != key(WSD_MAIN.model_copy(update={"budget": WSD_MAIN.budget.model_copy(
        update={"warmup_steps": 2})}))
    assert key(WSD_MAIN) != key(WSD_MAIN.model_copy(update={"peak_lr": 2e-3}))
