"""Milestone and averaged weights of the main stage (tasks/train/milestones.py) on a tiny synthetic corpus: kept in
the artifact, equal after a crash and resume to an uninterrupted run's, the average equal to the mean of the kept
tensors, scored beside the final weights, and nameable (``<artifact>@<name>``, ``main@<name>``, [cpt]
base_checkpoint) with errors that list the names there are."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from infra.errors import CheckpointError
from infra.runs import RunsLayout
from infra.stage import StageContext
from tasks.train.milestones import available_checkpoints, named_checkpoint, resolve_named
from tasks.train.checkpoint import load_model, verify_checkpoint
from tasks.train.sections import MainConfig, ModelShape, RunBudget

from tests.unit.toy_inputs import run_main as run, write_toy_inputs

ROOT = Path(__file__).resolve().parents[2]
CFG = MainConfig(model=ModelShape(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, seq_len=8),
                 budget=RunBudget(steps=6, batch_size=2, warmup_steps=1, eval_tokens=64), peak_lr=1e-3,
                 log_every=1, checkpoint_every=2, milestone_every=2, milestones=[3], ema_decay=0.9, average_last=3)


def _context(root: Path, inputs: dict[str, Path], attempt: str, log_metrics=lambda metrics, step: None):
    out = root / "runs" / "artifacts" / "main" / attempt
    out.mkdir(parents=True)
    return StageContext(out=out, inputs=inputs, layout=RunsLayout(root / "runs"), key="k1", experiment="t",
                        torch_threads=1, log_metrics=log_metrics)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted run and one killed after step 5 (scratch checkpoints at 0, 2, 4) then resumed."""
    root = tmp_path_factory.mktemp("milestones")
    inputs = write_toy_inputs(root, {"a": 400, "b": 40})

    def crash_at_step_5(metrics, step):
        if step == 5:
            raise KeyboardInterrupt

    full = run(_context(root / "full", inputs, "k1"), CFG, sources=["a", "b"])
    with pytest.raises(KeyboardInterrupt):
        run(_context(root / "cut", inputs, "first", crash_at_step_5), CFG, sources=["a", "b"])
    scratch = root / "cut" / "runs" / "scratch" / "main" / "k1" / "milestones"
    assert sorted(p.name for p in scratch.iterdir()) == ["step_00000002", "step_00000003", "step_00000004"]
    resumed = run(_context(root / "cut", inputs, "k1"), CFG, sources=["a", "b"])
    return {"root": root, "inputs": inputs, "full": (full, root / "full/runs/artifacts/main/k1"),
            "resumed": (resumed, root / "cut/runs/artifacts/main/k1")}


def _params(directory: Path) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in load_model(directory).named_parameters()}


def test_the_artifact_keeps_the_declared_milestones_and_lists_them(runs):
    summary, artifact = runs["full"]
    assert summary["milestones"] == [2, 3, 4, 6] and summary["averaged_steps"] == [3, 4, 6]
    assert summary["kept_weights"] == ["final", "step_00000002", "step_00000003", "step_00000004", "step_00000006",
                                       "ema", "average"]
    for step in (2, 3, 4, 6):
        record = verify_checkpoint(artifact / "milestones" / f"step_{step:08d}")
        assert record["step"] == step and record["format"] == "weights"
    assert json.loads((artifact / "run.json").read_text())["kept_weights"] == summary["kept_weights"]
    final = _params(artifact / "checkpoint")
    for name, value in _params(artifact / "milestones/step_00000006").items():  # the last milestone is the end
        assert torch.equal(value, final[name]), name
    early = _params(artifact / "milestones/step_00000002")
    assert any(not torch.equal(early[k], final[k]) for k in final)  # a milestone is not the final weights


def test_a_resumed_run_keeps_the_milestones_and_ema_of_an_uninterrupted_one(runs):
    (summary, artifact), (resumed_summary, resumed) = runs["full"], runs["resumed"]
    assert resumed_summary["resumed_from_step"] == 4
    assert resumed_summary["kept_weights"] == summary["kept_weights"]
    for name in ("step_00000002", "step_00000003", "step_00000004", "step_00000006", "ema", "average", "final"):
        a, b = _params(named_checkpoint(artifact, name)), _params(named_checkpoint(resumed, name))
        for key in a:
            assert torch.equal(a[key], b[key]), (name, key)
    from safetensors.torch import load_file

    ema_state = load_file(str(artifact / "checkpoint/ema.safetensors"))  # the EMA state the final checkpoint holds
    ema_weights = _params(artifact / "ema")
    for key, value in ema_state.items():
        assert torch.equal(value, ema_weights[key]), key
    resumed_state = load_file(str(resumed / "checkpoint/ema.safetensors"))
    for key, value in ema_state.items():
        assert torch.equal(value, resumed_state[key]), key


def test_the_average_is_the_mean_of_the_last_k_kept_tensors_and_is_scored(runs):
    summary, artifact = runs["full"]
    kept = [_params(artifact / "milestones" / f"step_{s:08d}") for s in (3, 4, 6)]
    average = _params(artifact / "average")
    for key, value in average.items():
        reference = torch.stack([k[key].double() for k in kept]).mean(dim=0).float()
        assert torch.allclose(value, reference, rtol=0, atol=1e-7), key
    assert verify_checkpoint(artifact / "average")["extra"]["averaged_steps"] == [3, 4, 6]
    rows = pd.read_parquet(artifact / "averaged_heldout.parquet")
    assert sorted(set(rows["checkpoint"])) == ["average_last3", "ema"]
    assert set(rows["source"]) == {"a", "b"} and (rows["step"] == 6).all()
    assert set(pd.read_parquet(artifact / "heldout.parquet")["checkpoint"]) == {"main"}  # final weights alone
    # scored like the final weights: the same evaluation on the loaded EMA model gives the same figures
    from tasks.train.corpus import TokenizedCorpus
    from tasks.train.runner import evaluate_sources

    again = evaluate_sources(load_model(artifact / "ema"), TokenizedCorpus(runs["inputs"]["tokenizer"]), ["a", "b"],
                             seq_len=8, eval_tokens=64)
    ema_rows = rows[rows["checkpoint"] == "ema"].set_index("source")
    for e in again:
        assert ema_rows.loc[e.source, "loss_nats"] == pytest.approx(e.loss.loss_nats, abs=1e-7)


def test_names_resolve_and_unknown_ones_list_the_available(runs):
    _, artifact = runs["full"]
    assert resolve_named(f"{artifact}@step_4") == artifact / "milestones/step_00000004"
    assert resolve_named(f"{artifact}@step_00000004") == artifact / "milestones/step_00000004"
    assert resolve_named(f"{artifact}@ema") == artifact / "ema"
    assert resolve_named(f"{artifact}@average_last3") == artifact / "average"
    assert resolve_named(f"{artifact}@final") == artifact / "checkpoint"
    assert resolve_named("main@average", main_artifact=artifact) == artifact / "average"
    assert resolve_named(str(artifact / "checkpoint")) == artifact / "checkpoint"  # a plain path stays a path
    with pytest.raises(CheckpointError, match=r"no checkpoint named 'step_5'; available: final, step_00000002, "
                                              r"step_00000003, step_00000004, step_00000006, ema, average"):
        resolve_named(f"{artifact}@step_5")
    with pytest.raises(CheckpointError, match="is not a main-run artifact"):
        named_checkpoint(artifact / "milestones", "ema")
    # main@ without an experiment: the runs folder's only main artifact, else the ones it holds are named
    assert resolve_named("main@ema", runs_root=runs["root"] / "full/runs") == artifact / "ema"
    (runs["root"] / "full/runs/artifacts/main/other/checkpoint").mkdir(parents=True)
    try:
        with pytest.raises(CheckpointError, match=r"needs one main artifact.*\['k1', 'other'\]"):
            resolve_named("main@ema", runs_root=runs["root"] / "full/runs")
    finally:
        (runs["root"] / "full/runs/artifacts/main/other/checkpoint").rmdir()
        (runs["root"] / "full/runs/artifacts/main/other").rmdir()


def test_export_and_cpt_take_named_checkpoints(runs):
    from flows.export import checkpoint_folder
    from tasks.cpt.stage import base_checkpoint
    from tasks.train.corpus import TokenizedCorpus
    from tasks.train.sections import CptConfig

    _, artifact = runs["full"]
    assert checkpoint_folder(Path(f"{artifact}@step_3")) == artifact / "milestones/step_00000003"
    corpus = TokenizedCorpus(runs["inputs"]["tokenizer"])
    cpt = CptConfig(domain_sources=["b"], replay_fractions=[0.1], peak_lrs=[1e-3],
                    budget=RunBudget(steps=2, batch_size=2, warmup_steps=1), base_checkpoint="main@step_00000004")
    ctx = StageContext(out=runs["root"] / "cpt_out", inputs={**runs["inputs"], "main": artifact},
                       layout=RunsLayout(runs["root"] / "full/runs"), key="c1", experiment="t", torch_threads=1)
    assert base_checkpoint(ctx, cpt, corpus) == artifact / "milestones/step_00000004"
    assert base_checkpoint(ctx, cpt.model_copy(update={"base_checkpoint": "main@ema"}), corpus) == artifact / "ema"
    with pytest.raises(CheckpointError, match="no checkpoint named 'step_7'.*available: final"):
        base_checkpoint(ctx, cpt.model_copy(update={"base_checkpoint": "main@step_7"}), corpus)


def test_stable_checkpoints_of_a_wsd_run_are_nameable(tmp_path):
    """available_checkpoints reads run.json's trunk_key and stable_checkpoints (tasks.train.trunk folders)."""
    from tasks.train.checkpoint import save_weights
    from tasks.train.loop import TrainState
    from models.config import ModelConfig
    from models.decoder import Decoder

    artifact = tmp_path / "runs/artifacts/main/k"
    tiny = Decoder(ModelConfig(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, vocab_size=64, seq_len=8))
    save_weights(artifact / "checkpoint", model=tiny, state=TrainState(step=9))
    stable = save_weights(tmp_path / "runs/cache/stable/abc/step_00000004", model=tiny, state=TrainState(step=4))
    (artifact / "run.json").write_text(json.dumps({"trunk_key": "abc", "stable_checkpoints": [4]}))
    assert available_checkpoints(artifact)["stable_step_00000004"] == stable
    assert resolve_named(f"{artifact}@stable_step_4") == stable


def test_eval_names_this_experiments_main_run_and_says_when_it_has_not_run(tmp_path):
    from flows.config import load_config
    from flows.evaluate import evaluate_checkpoint
    from flows.keys import chain_keys

    cfg = load_config(ROOT / "configs" / "demo.toml")
    key = chain_keys(cfg, until="main")["main"].key
    with pytest.raises(CheckpointError, match=f"main@ema: this experiment's main artifact .*/main/{key} does not "
                                              "exist"):
        evaluate_checkpoint(Path("main@ema"), cfg, RunsLayout(tmp_path / "runs"))


def test_a_launched_sharded_run_keeps_the_milestones_of_an_in_process_one(runs):
    """Two FSDP2 workers (gloo): each milestone is gathered to rank 0 and kept; the weights equal the in-process
    run's up to float reduction order, and the average is their mean."""
    from tasks.train.sections import DistributedConfig

    cfg = CFG.model_copy(update={"ema_decay": 0.0, "distributed": DistributedConfig(launch="accelerate", processes=2,
                                                                                   strategy="fsdp")})
    summary = run(_context(runs["root"] / "launched", runs["inputs"], "k1"), cfg, sources=["a", "b"])
    assert summary["world_size"] == 2 and summary["kept_weights"] == ["final", "step_00000002", "step_00000003",
                                                                      "step_00000004", "step_00000006", "average"]
    launched, (_, in_process) = runs["root"] / "launched/runs/artifacts/main/k1", runs["full"]
    for name in ("step_00000002", "step_00000004", "average"):
        a, b = _params(named_checkpoint(launched, name)), _params(named_checkpoint(in_process, name))
        for key in a:
            assert torch.allclose(a[key], b[key], atol=1e-5), (name, key)


def test_a_grown_wsd_run_resumes_its_ema_from_the_trunk_but_never_skips_a_milestone(tmp_path):
    """The trunk checkpoint of a WSD run holds its EMA: a run grown from 10 to 20 steps that starts there ends with
    the EMA and milestone of a 20-step run from scratch. A milestone before the trunk step forbids starting there
    (the run trains from step 0, so the milestone exists). The trunk step is nameable as stable_step_*."""
    inputs = write_toy_inputs(tmp_path, {"a": 400, "b": 120})
    wsd = CFG.model_copy(update={
        "budget": RunBudget(steps=10, batch_size=2, warmup_steps=1, eval_tokens=64, schedule="wsd",
                            decay_fraction=0.3), "min_lr_ratio": 0.0, "milestone_every": 0, "milestones": [],
        "average_last": 0})  # stable to step 7
    grown = wsd.model_copy(update={"budget": wsd.budget.model_copy(update={"steps": 20}), "milestones": [10]})
    short = run(_context(tmp_path / "shared", inputs, "short"), wsd, sources=["a", "b"])
    assert short["stable_checkpoints"] == [7]
    short_artifact = tmp_path / "shared/runs/artifacts/main/short"
    assert resolve_named(f"{short_artifact}@stable_step_7").parent.name == short["trunk_key"]
    summary = run(_context(tmp_path / "shared", inputs, "long"), grown, sources=["a", "b"])
    assert summary["resumed_from"] == "stable" and summary["resumed_from_step"] == 7
    fresh = run(_context(tmp_path / "fresh", inputs, "long"), grown, sources=["a", "b"])
    assert fresh["resumed_from_step"] == 0
    for name in ("ema", "step_00000010", "final"):
        a = _params(named_checkpoint(tmp_path / "shared/runs/artifacts/main/long", name))
        b = _params(named_checkpoint(tmp_path / "fresh/runs/artifacts/main/long", name))
        for key in a:
            assert torch.equal(a[key], b[key]), (name, key)
    early = grown.model_copy(update={"milestones": [5]})
    summary = run(_context(tmp_path / "shared", inputs, "early"), early, sources=["a", "b"])
    assert summary["resumed_from_step"] == 0 and summary["milestones"] == [5]
