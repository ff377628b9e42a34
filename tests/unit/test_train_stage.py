"""The main-run stage on a tiny synthetic token corpus: resume after an interruption, epochs per source (docs/methods.md §8)."""

import json
from pathlib import Path

import pytest
import torch

from infra.errors import TrainingError
from infra.runs import RunsLayout
from infra.stage import StageContext
from tasks.train.checkpoint import load_model
from tasks.train.sections import DistributedConfig, MainConfig, ModelShape, RunBudget
from tasks.main.stage import run

from tests.unit.toy_inputs import write_toy_inputs  # noqa: E402
TRAIN_TOKENS = {"a": 400, "b": 40}  # unique training tokens U_s
CFG = MainConfig(model=ModelShape(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, seq_len=8),
                 budget=RunBudget(steps=6, batch_size=2, warmup_steps=1, eval_tokens=64), peak_lr=1e-3,
                 log_every=1, checkpoint_every=2)


@pytest.fixture
def inputs(tmp_path) -> dict[str, Path]:
    return write_toy_inputs(tmp_path, TRAIN_TOKENS)


def _context(tmp_path: Path, inputs: dict[str, Path], attempt: str, log_metrics=lambda metrics, step: None):
    out = tmp_path / "runs" / "artifacts" / "main" / f".tmp-{attempt}"
    out.mkdir(parents=True)
    return StageContext(out=out, inputs=inputs, layout=RunsLayout(tmp_path / "runs"), key="k1", experiment="t",
                        torch_threads=1, log_metrics=log_metrics)


def test_resumed_run_reports_the_step_it_resumed_from(tmp_path, inputs, capsys):
    def interrupt_at_step_5(metrics, step):
        if step == 5:
            raise KeyboardInterrupt  # Ctrl-C after the step-4 checkpoint was written

    with pytest.raises(KeyboardInterrupt):
        run(_context(tmp_path, inputs, "first", interrupt_at_step_5), CFG, sources=["a", "b"])
    summary = run(_context(tmp_path, inputs, "second"), CFG, sources=["a", "b"])
    assert summary["steps"] == 6
    assert summary["resumed_from_step"] == 4
    assert json.loads((tmp_path / "runs/artifacts/main/.tmp-second/run.json").read_text())["resumed_from_step"] == 4
    assert "main: resuming from step 4" in capsys.readouterr().out


def test_fresh_run_reports_epochs_per_source_and_warns_above_the_limit(tmp_path, inputs, capsys):
    """D = 6 steps · 2 rows · 8 tokens = 96; e_s = 0.5 · 96 / U_s gives a 0.12, b 1.2 (docs/methods.md §8)."""
    summary = run(_context(tmp_path, inputs, "only"), CFG, sources=["a", "b"], max_epochs=1.0)
    assert summary["resumed_from_step"] == 0
    assert summary["epochs"] == pytest.approx({"a": 0.12, "b": 1.2})
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "'b' is repeated 1.20 epochs (> 1)" in warnings[0]


LONGER = CFG.model_copy(update={"budget": RunBudget(steps=30, batch_size=2, warmup_steps=1, eval_tokens=64)})
LAUNCHED = LONGER.model_copy(update={"distributed": DistributedConfig(launch="accelerate", processes=2,
                                                                      strategy="fsdp")})


def test_launched_run_matches_in_process_and_resumes_after_sigkill(tmp_path, inputs, capsys):
    """Two worker processes (FSDP2 on gloo) give the in-process losses; SIGKILL of every worker after the step-4
    checkpoint, then the same call again: it resumes from the newest complete checkpoint without a flag and ends
    where an uninterrupted run ends."""
    import psutil

    in_process = {}
    run(_context(tmp_path / "a", inputs, "one", lambda m, step: in_process.update({step: m.get("loss_nats")})),
        LONGER, sources=["a", "b"])
    launched = {}
    summary = run(_context(tmp_path / "b", inputs, "two", lambda m, step: launched.update({step: m.get("loss_nats")})),
                  LAUNCHED, sources=["a", "b"])
    assert summary["world_size"] == 2 and summary["strategy"] == "fsdp"
    losses = {k: v for k, v in launched.items() if v is not None}
    assert losses == pytest.approx({k: v for k, v in in_process.items() if v is not None}, abs=2e-5)

    def kill_workers_after_step_5(metrics, step):
        if step >= 5:
            for child in psutil.Process().children(recursive=True):
                child.kill()  # SIGKILL: no handler runs, nothing is flushed

    with pytest.raises(TrainingError, match="exit"):
        run(_context(tmp_path / "c", inputs, "killed", kill_workers_after_step_5), LAUNCHED, sources=["a", "b"])
    resumed = run(_context(tmp_path / "c", inputs, "rerun"), LAUNCHED, sources=["a", "b"])
    assert resumed["resumed_from_step"] >= 4 and resumed["resumed_from_step"] % 2 == 0
    assert "resuming from step" in capsys.readouterr().out
    final = load_model(tmp_path / "c/runs/artifacts/main/.tmp-rerun/checkpoint")
    reference = load_model(tmp_path / "b/runs/artifacts/main/.tmp-two/checkpoint")
    for (name, p), q in zip(final.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-6), name


def test_cpt_refuses_a_base_trained_with_another_tokenizer(tmp_path, inputs):
    from infra.errors import CheckpointError
    from tasks.cpt.stage import base_checkpoint
    from tasks.train.corpus import TokenizedCorpus
    from tasks.train.sections import CptConfig

    summary = run(_context(tmp_path, inputs, "main"), CFG, sources=["a", "b"])
    assert summary["steps"] == 6
    main = tmp_path / "runs/artifacts/main/.tmp-main"
    corpus = TokenizedCorpus(inputs["tokenizer"])
    cpt = CptConfig(domain_sources=["b"], replay_fractions=[0.1], peak_lrs=[1e-3],
                    budget=RunBudget(steps=2, batch_size=2, warmup_steps=1))
    ctx = _context(tmp_path, {**inputs, "main": main}, "cpt")
    assert base_checkpoint(ctx, cpt, corpus) == main / "checkpoint"
    meta = json.loads((inputs["tokenizer"] / "tokenizer.meta.json").read_text())
    (inputs["tokenizer"] / "tokenizer.meta.json").write_text(json.dumps({**meta, "tokenizer_hash": "retrained"}))
    with pytest.raises(CheckpointError, match="trained with tokenizer 'synthetic'.*'retrained'"):
        base_checkpoint(ctx, cpt, TokenizedCorpus(inputs["tokenizer"]))
    external = cpt.model_copy(update={"base_checkpoint": str(tmp_path / "nowhere")})
    with pytest.raises(CheckpointError, match="missing or unfinished"):
        base_checkpoint(ctx, external, corpus)


def test_main_lr_comes_from_the_swept_width_nearest_the_main_model():
    from infra.errors import ConfigError
    from tasks.main.stage import main_peak_lr

    best = {"best_lr": 3e-2, "study_name": "s64",
            "widths": [{"d_model": 64, "best_lr": 3e-2, "study_name": "s64"},
                       {"d_model": 128, "best_lr": 4e-3, "study_name": "s128"}]}
    auto = CFG.model_copy(update={"peak_lr": None})
    wide = auto.model_copy(update={"model": auto.model.model_copy(update={"d_model": 256, "n_heads": 2})})
    assert main_peak_lr(wide, best) == (4e-3, {"from": "sweep", "d_model": 128, "study": "s128", "main_d_model": 256})
    narrow = auto.model_copy(update={"model": auto.model.model_copy(update={"d_model": 48})})
    assert main_peak_lr(narrow, best)[0] == 3e-2
    assert main_peak_lr(auto, {"best_lr": 1e-3, "study_name": "old"})[0] == 1e-3  # a sweep without widths
    assert main_peak_lr(CFG, best) == (1e-3, {"from": "config"})
    with pytest.raises(ConfigError, match="no peak LR"):
        main_peak_lr(auto, None)


def test_corrupt_newest_checkpoint_is_skipped_with_a_logged_warning(tmp_path, inputs, caplog):
    """A flipped byte in the newest scratch checkpoint: its checksum fails, a warning is logged (prints are hidden
    inside the pipeline) and the run resumes from the checkpoint before it, finishing like an uninterrupted run."""
    def interrupt_at_step_5(metrics, step):
        if step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(_context(tmp_path, inputs, "first", interrupt_at_step_5), CFG, sources=["a", "b"])
    scratch = tmp_path / "runs" / "scratch" / "main" / "k1"
    assert sorted(p.name for p in scratch.glob("step_*")) == ["step_00000000", "step_00000002", "step_00000004"]
    weights = scratch / "step_00000004" / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-8] ^= 0xFF
    weights.write_bytes(bytes(raw))

    with caplog.at_level("WARNING", logger="tasks.main.stage"):
        summary = run(_context(tmp_path, inputs, "second"), CFG, sources=["a", "b"])
    assert summary["resumed_from_step"] == 2
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("skipping unusable checkpoint step_00000004" in m and "sha256" in m for m in warned), warned
    reference = run(_context(tmp_path / "fresh", inputs, "only"), CFG, sources=["a", "b"])
    assert reference["resumed_from_step"] == 0
    resumed = load_model(tmp_path / "runs/artifacts/main/.tmp-second/checkpoint")
    fresh = load_model(tmp_path / "fresh/runs/artifacts/main/.tmp-only/checkpoint")
    for (name, a), (_, b) in zip(resumed.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name
