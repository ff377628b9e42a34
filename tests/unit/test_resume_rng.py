"""A resumed main run continues the generator streams of an uninterrupted one: its final checkpoint records the same
RNG states (python, numpy, torch), whatever the process did before it. The CPU utilisation reference
(``tasks.train.instruments``) is measured once per process, at the start of the first training loop with
``instrument_every``; it used to draw its operands from torch's global generator, so a run that resumed in a fresh
process (the stages before main cached) moved its torch stream where the uninterrupted run, whose process had
measured in an earlier stage, did not."""

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch

from infra.runs import RunsLayout
from infra.stage import StageContext, scratch_folder
from tasks.train import instruments
from tasks.train.sections import MainConfig, ModelShape, RunBudget
from tests.unit.toy_inputs import run_main, write_toy_inputs

# WSD: stable to step 7 (kept in <runs>/cache/stable), decay over 8..10; scratch checkpoints every 2 steps, written
# in the training thread (a background write of the stopped attempt would race the resumed one in this process).
MAIN = MainConfig(model=ModelShape(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, seq_len=8),
                  budget=RunBudget(steps=10, batch_size=2, warmup_steps=1, eval_tokens=64, schedule="wsd",
                                   decay_fraction=0.3),
                  peak_lr=1e-3, min_lr_ratio=0.0, log_every=1, checkpoint_every=2)
assert MAIN.stability.instrument_every > 0  # the loop measures the utilisation reference


@pytest.fixture
def small_reference(monkeypatch):
    """The real measurement on small operands (the code under test is how it draws them), its per-process cache
    emptied before and after."""
    monkeypatch.setattr(instruments, "matmul_peak_flops",
                        functools.partial(instruments.matmul_peak_flops, n=32, repeats=1))
    instruments._cpu_reference.cache_clear()
    yield
    instruments._cpu_reference.cache_clear()


def test_measuring_the_cpu_reference_leaves_the_global_generators_alone(small_reference):
    torch.manual_seed(3)
    before = torch.get_rng_state()
    instruments.matmul_peak_flops()
    instruments.device_peak_flops(torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), before)


def _main(root: Path, inputs, attempt: str, log_metrics=lambda metrics, step: None) -> Path:
    out = root / "runs" / "artifacts" / "main" / f".tmp-{attempt}"
    out.mkdir(parents=True)
    ctx = StageContext(out=out, inputs=inputs, layout=RunsLayout(root / "runs"), key="k1", experiment="t",
                       torch_threads=1, log_metrics=log_metrics)
    run_main(ctx, MAIN, sources=["a", "b"])
    return out / "checkpoint" / "state.json"


@pytest.mark.parametrize("stop_at, resume_from", [(5, "scratch"), (9, "stable")])
def test_a_resumed_main_run_ends_with_the_rng_states_of_an_uninterrupted_one(tmp_path, small_reference, stop_at,
                                                                             resume_from):
    """The uninterrupted run's process has measured already (as the pipeline's, after the proxy stages); the
    stopped run is resumed in a "fresh process" (the cache emptied), from its newest scratch checkpoint (step 4) or,
    its scratch removed, from the stable-phase checkpoint (step 7). The final state.json must be the same, RNG
    states included: a run continued from either checkpoint then draws the same numbers."""
    inputs = write_toy_inputs(tmp_path, {"a": 400, "b": 120})
    instruments._cpu_reference(1)  # the process measured in an earlier stage (main runs on 1 thread here)
    reference = json.loads(_main(tmp_path / "uninterrupted", inputs, "only").read_text())

    def stop(metrics, step):
        if step == stop_at:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _main(tmp_path / "stopped", inputs, "first", log_metrics=stop)
    if resume_from == "stable":
        shutil.rmtree(scratch_folder(tmp_path / "stopped" / "runs", "main", "k1"))
    instruments._cpu_reference.cache_clear()  # the rerun is a new process
    resumed_path = _main(tmp_path / "stopped", inputs, "second")
    resumed = json.loads(resumed_path.read_text())
    summary = json.loads((resumed_path.parent.parent / "run.json").read_text())
    assert summary["resumed_from"] == resume_from and summary["resumed_from_step"] == {"scratch": 4, "stable": 7}[
        resume_from]
    assert resumed["rng"] == reference["rng"]
    assert resumed == reference
