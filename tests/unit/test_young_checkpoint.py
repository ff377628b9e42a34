"""``[main] checkpoint_every = "young"``: the interval from the measured save time δ, the step time and the declared
MTBF by Young's formula τ = √(2·δ·M) (Young 1974), in steps max(1, ⌊τ / step_s + ½⌋); config checks; real runs
that save at the derived interval, record it, and train exactly as a run with a fixed interval."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from flows.config import load_config
from flows.keys import chain_keys
from infra.errors import ConfigError
from infra.runs import RunsLayout
from infra.stage import StageContext
from models.config import ModelConfig
from models.decoder import Decoder
from tasks.main.stage import run
from tasks.train.checkpoint import Checkpointer
from tasks.train.data import MixtureSampler
from tasks.train.intervals import YoungInterval, checkpoint_schedule, young_steps
from tasks.train.runner import run_training
from tasks.train.sections import MainConfig, ModelShape, RunBudget

from tests.unit.toy_inputs import write_toy_inputs

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "smoke.toml"
TINY = ModelConfig(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, vocab_size=64, seq_len=8)


@pytest.mark.parametrize("save_s, step_s, mtbf_hours", [(2.0, 0.5, 24.0), (30.0, 1.7, 6.0), (0.01, 4.0, 1000.0)])
def test_steps_equal_the_closed_form(save_s, step_s, mtbf_hours):
    tau = math.sqrt(2 * save_s * mtbf_hours * 3600)
    got_tau, steps = young_steps(save_s, step_s, mtbf_hours)
    assert got_tau == pytest.approx(tau, rel=1e-12)
    assert steps == max(1, round(tau / step_s))
    # e.g. δ = 2 s, 0.5 s/step, M = 24 h: τ = √(2·2·86 400) = 587.9 s = 1 176 steps


def test_steps_are_at_least_one_and_round_half_up():
    assert young_steps(0.0, 1.0, 1.0) == (0.0, 1)  # a free save: every step
    # τ = √(2·δ·M) = 3 s exactly at δ = 1.125 s, M = 4 s: 3 s / 2 s per step = 1.5 steps → 2
    assert young_steps(1.125, 2.0, 4.0 / 3600)[1] == 2
    with pytest.raises(ValueError, match="step_s > 0"):
        young_steps(1.0, 0.0, 1.0)


@pytest.mark.parametrize("overrides, words", [
    ({"main.checkpoint_every": "young"}, 'checkpoint_every = "young" needs mtbf_hours'),
    ({"main.mtbf_hours": 24.0}, 'mtbf_hours = 24.0 applies to checkpoint_every = "young" only'),
    ({"main.checkpoint_every": "young", "main.mtbf_hours": 0.0}, "main.mtbf_hours: Input should be greater than 0"),
    ({"main.checkpoint_every": "young", "main.mtbf_hours": -1.0}, "main.mtbf_hours: Input should be greater than 0"),
    ({"main.checkpoint_every": "Young", "main.mtbf_hours": 24.0}, "main.checkpoint_every: checkpoint_every = 'Young'"),
    ({"main.checkpoint_every": -2}, "main.checkpoint_every: checkpoint_every = -2: give a number of steps ≥ 0"),
    ({"main.checkpoint_every": "8"}, "main.checkpoint_every: checkpoint_every = '8'"),
])
def test_config_errors_name_the_field(overrides, words):
    with pytest.raises(ConfigError, match=words):
        load_config(SMOKE, overrides)


def test_young_is_not_in_any_key_and_default_dumps_are_unchanged():
    plain = load_config(SMOKE)
    young = load_config(SMOKE, {"main.checkpoint_every": "young", "main.mtbf_hours": 12.0})
    assert young.main.checkpoint_every == "young" and young.main.mtbf_hours == 12.0
    assert {n: k.key for n, k in chain_keys(young).items()} == {n: k.key for n, k in chain_keys(plain).items()}
    assert "mtbf_hours" not in plain.main.model_dump()
    assert MainConfig(**young.main.model_dump()) == young.main  # the job file of a launched run round-trips
    assert checkpoint_schedule(8, None) == 8
    with pytest.raises(ValueError, match="needs mtbf_hours"):
        checkpoint_schedule("young", None)


class FakeClock:
    """Seconds that move only when the run's callbacks say: ``step_s`` per optimiser step, ``save_s`` per save
    (``first_save_s`` for the first one, when given)."""

    def __init__(self, step_s: float, save_s: float, first_save_s: float | None = None):
        self.now, self.step_s, self.save_s = 100.0, step_s, save_s
        self.first_save_s = first_save_s

    def __call__(self) -> float:
        return self.now

    def on_step_end(self, state, metrics) -> None:
        self.now += self.step_s

    def on_checkpoint(self, state, model, optimizer, sampler) -> None:
        first, self.first_save_s = self.first_save_s, None
        self.now += self.save_s if first is None else first


def _sampler() -> MixtureSampler:
    tokens = np.random.default_rng(0).integers(0, TINY.vocab_size, 4_000).astype(np.uint16)
    return MixtureSampler({"a": tokens}, {"a": 1.0}, seq_len=TINY.seq_len, batch_size=2, seed=0)


def test_a_training_run_saves_at_the_derived_interval_and_records_it(tmp_path):
    """δ = 2 s, 0.5 s/step, M = 0.64 s: τ = √(2·2·0.64) = 1.6 s = 3.2 steps → 3. Probe save at step 4, then every 3
    steps, and at the end (16)."""
    clock, reported = FakeClock(step_s=0.5, save_s=2.0), []
    schedule = YoungInterval(0.64 / 3600, probe_steps=4, clock=clock,
                             report=lambda record, step: reported.append((step, record)))
    checkpointer = Checkpointer(tmp_path / "scratch", keep_last=None)
    budget = RunBudget(steps=16, batch_size=2, warmup_steps=1, eval_every=5, eval_tokens=8)
    run_training(Decoder(TINY), _sampler(), peak_lr=1e-3, budget=budget, seed=0,
                 callbacks=[clock, checkpointer], checkpoint_every=schedule)
    expected = [4, 7, 10, 13, 16]
    assert schedule.saved_at == expected
    assert sorted(int(p.name.split("_")[1]) for p in (tmp_path / "scratch").glob("step_*")) == expected
    tau = math.sqrt(2 * 2.0 * 0.64)
    record = {"checkpoint_save_s": 2.0, "step_s": 0.5, "mtbf_hours": 0.64 / 3600, "young_interval_s": tau,
              "probe_step": 4, "checkpoint_interval_steps": 3}
    assert [step for step, _ in reported] == expected
    assert reported == [(s, pytest.approx({**record, "next_checkpoint_step": s + 3})) for s in expected]
    assert schedule.record == pytest.approx({**record, "next_checkpoint_step": 19})


def test_the_interval_follows_the_latest_save_time():
    """An asynchronous first save that allocates its buffers (δ = 8 s), later ones δ = 0.5 s; 0.5 s/step, M = 1 s:
    τ = √(2·8·1) = 4 s = 8 steps after the probe save at 2, then τ = 1 s = 2 steps: saves at 2, 10, 12, 14, 16."""
    clock = FakeClock(step_s=0.5, save_s=0.5, first_save_s=8.0)
    schedule = YoungInterval(1.0 / 3600, probe_steps=2, clock=clock)
    run_training(Decoder(TINY), _sampler(), peak_lr=1e-3, seed=0, callbacks=[clock], checkpoint_every=schedule,
                 budget=RunBudget(steps=16, batch_size=2, warmup_steps=1, eval_tokens=8))
    assert schedule.saved_at == [2, 10, 12, 14, 16]
    assert schedule.record == pytest.approx({"checkpoint_save_s": 0.5, "step_s": 0.5, "mtbf_hours": 1 / 3600,
                                             "young_interval_s": 1.0, "checkpoint_interval_steps": 2,
                                             "next_checkpoint_step": 18, "probe_step": 2})


def test_a_resumed_run_probes_again_from_its_start(tmp_path):
    """From step 5 of 16: probe save at 5 + 2 = 7, then every k = 1 (δ = 0.5 s, 1 s/step, M = 1 s: τ = 1 s)."""
    clock = FakeClock(step_s=1.0, save_s=0.5)
    schedule = YoungInterval(1.0 / 3600, probe_steps=2, clock=clock)
    first = run_training(Decoder(TINY), _sampler(), peak_lr=1e-3,
                         budget=RunBudget(steps=5, batch_size=2, warmup_steps=1, eval_tokens=8), seed=0)
    budget = RunBudget(steps=10, batch_size=2, warmup_steps=1, eval_tokens=8)
    run_training(Decoder(TINY), _sampler(), peak_lr=1e-3, budget=budget, seed=0, state=first.state,
                 callbacks=[clock], checkpoint_every=schedule)
    assert schedule.saved_at == [7, 8, 9, 10]
    assert schedule.record["checkpoint_interval_steps"] == 1 and schedule.record["step_s"] == 1.0


TRAIN_TOKENS = {"a": 400, "b": 40}
FIXED = MainConfig(model=ModelShape(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, seq_len=8),
                   budget=RunBudget(steps=24, batch_size=2, warmup_steps=1, eval_tokens=64), peak_lr=1e-3,
                   log_every=1, checkpoint_every=0)


def _context(tmp_path: Path, inputs: dict[str, Path], log_metrics) -> StageContext:
    out = tmp_path / "runs" / "artifacts" / "main" / ".tmp-a"
    out.mkdir(parents=True)
    return StageContext(out=out, inputs=inputs, layout=RunsLayout(tmp_path / "runs"), key="k1", experiment="t",
                        torch_threads=1, log_metrics=log_metrics)


def test_the_main_stage_records_the_interval_and_trains_as_a_fixed_interval_run(tmp_path):
    """The measured figures are the machine's; the interval and the number of saves must follow from them."""
    inputs = write_toy_inputs(tmp_path, TRAIN_TOKENS)
    fixed, young, logged = {}, {}, {}

    def log_young(metrics, step):
        young.update({step: metrics["loss_nats"]} if "loss_nats" in metrics else {})
        if "checkpoint_interval_steps" in metrics:
            logged[step] = metrics

    run(_context(tmp_path / "fixed", inputs, lambda m, step: fixed.update(
        {step: m["loss_nats"]} if "loss_nats" in m else {})), FIXED, sources=["a", "b"])
    cfg = FIXED.model_copy(update={"checkpoint_every": "young", "mtbf_hours": 1e-4})
    summary = run(_context(tmp_path / "young", inputs, log_young), cfg, sources=["a", "b"])
    assert young == fixed  # when checkpoints are written changes nothing trained
    record = summary["checkpoint_schedule"]
    assert record["kind"] == "young" and record["probe_step"] == 10 and record["mtbf_hours"] == 1e-4
    _check_chain(logged, probe=10, end=24)
    assert record["checkpoints_saved"] == len(logged)
    assert {k: v for k, v in record.items() if k not in ("kind", "checkpoints_saved")} == logged[24]
    written = json.loads((tmp_path / "young/runs/artifacts/main/.tmp-a/run.json").read_text())
    assert written["checkpoint_schedule"] == record


def _check_chain(logged: dict[int, dict], *, probe: int, end: int) -> None:
    """The saves, as the run logged them, lie where each one's Young interval put the next (and at the end)."""
    steps, expected = sorted(logged), [probe]
    for step in steps:
        metrics = logged[step]
        tau, interval = young_steps(metrics["checkpoint_save_s"], metrics["step_s"], metrics["mtbf_hours"])
        assert metrics["young_interval_s"] == pytest.approx(tau) and metrics["checkpoint_interval_steps"] == interval
        assert metrics["next_checkpoint_step"] == step + interval
        if step != end:
            expected.append(min(step + interval, end))
    assert steps == expected


def test_a_launched_run_agrees_on_one_interval_across_ranks(tmp_path):
    """Two FSDP workers measure their own δ and step time; both save at the interval of the ranks' means (a save is
    collective: a disagreement would hang the run), and the run trains as the in-process one."""
    from tasks.train.sections import DistributedConfig

    inputs = write_toy_inputs(tmp_path, TRAIN_TOKENS)
    in_process, launched, logged = {}, {}, {}
    run(_context(tmp_path / "one", inputs, lambda m, step: in_process.update(
        {step: m["loss_nats"]} if "loss_nats" in m else {})), FIXED, sources=["a", "b"])
    cfg = FIXED.model_copy(update={"checkpoint_every": "young", "mtbf_hours": 1e-4, "distributed": DistributedConfig(
        launch="accelerate", processes=2, strategy="fsdp")})

    def log(metrics, step):
        launched.update({step: metrics["loss_nats"]} if "loss_nats" in metrics else {})
        if "checkpoint_interval_steps" in metrics:
            logged[step] = metrics

    summary = run(_context(tmp_path / "two", inputs, log), cfg, sources=["a", "b"])
    assert launched == pytest.approx(in_process, abs=2e-5)
    _check_chain(logged, probe=10, end=24)
    assert summary["checkpoint_schedule"]["checkpoints_saved"] == len(logged)
