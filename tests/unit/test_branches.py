"""Decay branches of a WSD main run (docs/methods.md §6): a main-mixture branch equals the shorter WSD main run that
decays from its step, an anneal branch reports its deltas per source, and adding a branch or growing the main budget
retrains nothing already done."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from infra.errors import ConfigError, DataError
from infra.runs import RunsLayout
from infra.stage import StageContext
from tasks.branches.definition import check_branches, key_branches
from tasks.branches.stage import COLUMNS, continue_loader, run as run_branches
from tasks.main.stage import run as run_main
from tasks.train.data import MixtureSampler
from tasks.train.packing import PackingConfig
from tasks.train.sections import BranchConfig, MainConfig, ModelShape, RunBudget

from tests.unit.toy_inputs import write_toy_inputs  # noqa: E402
MAIN = MainConfig(model=ModelShape(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, seq_len=8),
                  budget=RunBudget(steps=10, batch_size=2, warmup_steps=1, eval_tokens=64, schedule="wsd",
                                   decay_fraction=0.3),  # stable to step 7
                  peak_lr=1e-3, min_lr_ratio=0.0, log_every=1, checkpoint_every=2,
                  branches=BranchConfig(at_steps=[4], decay_steps=2, weights={"a": 0.2, "b": 0.8}))


@pytest.fixture
def inputs(tmp_path) -> dict[str, Path]:
    return write_toy_inputs(tmp_path, {"a": 400, "b": 120})


def _context(root: Path, inputs, stage: str, attempt: str) -> StageContext:
    out = root / "runs" / "artifacts" / stage / f".tmp-{attempt}"
    out.mkdir(parents=True)
    return StageContext(out=out, inputs=inputs, layout=RunsLayout(root / "runs"), key=f"k-{attempt}",
                        experiment="t", torch_threads=1)


def _experiment(main: MainConfig) -> SimpleNamespace:
    """The parts of the experiment config the branch stage reads: its sections and the sources by role."""
    return SimpleNamespace(main=main, packing=PackingConfig(), general_sources=["a", "b"], domain_sources=[],
                           sources={"a": None, "b": None}, seed=0)


def _main(root: Path, inputs, attempt: str, cfg: MainConfig) -> Path:
    ctx = _context(root, inputs, "main", attempt)
    run_main(ctx, cfg, sources=["a", "b"])
    return ctx.out


def _branches(root: Path, inputs, main_out: Path, attempt: str, cfg: MainConfig) -> tuple[dict, pd.DataFrame, Path]:
    ctx = _context(root, {**inputs, "main": main_out}, "branches", attempt)
    summary = run_branches(ctx, _experiment(cfg))
    check_branches(ctx.out, _experiment(cfg))
    return summary, pd.read_parquet(ctx.out / "branches.parquet"), ctx.out


def test_branches_match_the_shorter_wsd_run_report_deltas_and_are_cached(tmp_path, inputs):
    root = tmp_path / "shared"
    main_out = _main(root, inputs, "main10", MAIN)
    kept = json.loads((main_out / "run.json").read_text())
    assert kept["stable_checkpoints"] == [4, 7]

    summary, table, out = _branches(root, inputs, main_out, "first", MAIN)
    assert list(table.columns) == COLUMNS
    assert summary["stable_steps_trained"] == []  # the main run kept step 4
    assert summary["computed"] == 3 and summary["reused"] == 0  # the branch point and two branches
    assert sorted(table["branch"].unique()) == ["anneal-at4-k2", "main-at4-k2"]

    # The main-mixture branch at 4 over 2 steps is the 6-step WSD main run whose decay follows step 4
    # (decay_fraction 1/3: K = 2), trained from scratch in another runs folder.
    reference = _main(tmp_path / "reference", inputs, "main6", MAIN.model_copy(update={
        "budget": MAIN.budget.model_copy(update={"steps": 6, "decay_fraction": 1 / 3}), "branches": None}))
    heldout = pd.read_parquet(reference / "heldout.parquet").set_index("source")
    branch = table[table["mixture"] == "main"].set_index("source")
    assert branch["loss_nats"].to_dict() == heldout["loss_nats"].to_dict()
    assert (branch["tokens_seen"] == json.loads((reference / "run.json").read_text())["tokens_seen"]).all()

    anneal = table[table["mixture"] == "anneal"].set_index("source")
    for source in ("a", "b"):
        assert anneal.loc[source, "delta_bpb_vs_main_mixture"] == pytest.approx(
            anneal.loc[source, "bits_per_byte"] - branch.loc[source, "bits_per_byte"], abs=1e-12)
        assert anneal.loc[source, "delta_bpb_vs_branch_point"] == pytest.approx(
            anneal.loc[source, "bits_per_byte"] - anneal.loc[source, "branch_point_bits_per_byte"], abs=1e-12)
    assert branch["delta_bpb_vs_main_mixture"].isna().all()
    assert anneal["bits_per_byte"].to_dict() != branch["bits_per_byte"].to_dict()  # the mixture acts
    record = json.loads((out / "branches.json").read_text())
    assert record["trunk_key"] == kept["trunk_key"] and set(record["main_run"]) == {"a", "b"}
    _check_publish_and_views(out, table, tmp_path)

    # Adding a branch at step 2 (kept by no run): its stable phase and its branches only.
    more = MAIN.model_copy(update={"branches": MAIN.branches.model_copy(update={"at_steps": [4, 2]})})
    summary, table, _ = _branches(root, inputs, main_out, "second", more)
    assert summary["stable_steps_trained"] == [2]
    assert summary["computed"] == 3 and summary["reused"] == 3
    assert sorted(table["branch"].unique()) == ["anneal-at2-k2", "anneal-at4-k2", "main-at2-k2", "main-at4-k2"]

    # Growing the main run to 20 steps: it resumes from its stable step 7; every branch is read back.
    grown = MAIN.model_copy(update={"budget": MAIN.budget.model_copy(update={"steps": 20})})
    grown_out = _main(root, inputs, "main20", grown)
    assert json.loads((grown_out / "run.json").read_text())["resumed_from"] == "stable"
    summary, again, _ = _branches(root, inputs, grown_out, "third", grown)
    assert summary["computed"] == 0 and summary["reused"] == 3
    pd.testing.assert_frame_equal(again, table[table["at_step"] == 4].reset_index(drop=True))


def test_a_branch_mixture_continues_each_source_where_the_trunk_stopped():
    rng = np.random.default_rng(0)
    data = {"a": rng.integers(0, 64, 900), "b": rng.integers(0, 64, 900), "c": rng.integers(0, 64, 900)}
    trunk = MixtureSampler({"a": data["a"], "b": data["b"]}, {"a": 0.5, "b": 0.5}, seq_len=8, batch_size=4, seed=1)
    for _ in range(5):
        trunk.next_batch()
    branch = MixtureSampler({"b": data["b"], "c": data["c"]}, {"b": 0.5, "c": 0.5}, seq_len=8, batch_size=4, seed=1)
    continue_loader(trunk.state_dict(), branch)
    state = branch.state_dict()
    assert state["position"]["b"] == trunk.state_dict()["position"]["b"]  # b goes on after its 10 rows
    assert state["position"]["c"]["offset"] == 0 and state["batches_drawn"] == 5
    fresh = MixtureSampler({"b": data["b"]}, {"b": 1.0}, seq_len=8, batch_size=2, seed=1)
    fresh_rows = {tuple(r) for _ in range(5) for r in fresh.next_batch().x.tolist()}
    batch = branch.next_batch()
    next_b = [tuple(row) for row, source in zip(batch.x.tolist(), batch.sources) if source == "b"]
    assert next_b and not set(next_b) & fresh_rows  # none of the rows the trunk already read


def test_not_requested_is_an_empty_artifact_and_unknown_anneal_sources_are_refused(tmp_path, inputs):
    cosine = MAIN.model_copy(update={"branches": None})
    assert key_branches(_experiment(cosine)) == {"branches": False}
    ctx = _context(tmp_path, inputs, "branches", "none")
    assert run_branches(ctx, _experiment(cosine)) == {"requested": False}
    check_branches(ctx.out, _experiment(cosine))
    odd = MAIN.model_copy(update={"branches": BranchConfig(at_steps=[4], weights={"a": 0.5, "zz": 0.5})})
    with pytest.raises(ConfigError, match=r"main.branches.weights: \['zz'\]"):
        key_branches(_experiment(odd))
    assert key_branches(_experiment(MAIN))["branches"]["at_steps"] == [4]


def test_a_cosine_main_artifact_has_no_trunk_to_branch_from(tmp_path, inputs):
    cosine = MAIN.model_copy(update={"budget": RunBudget(steps=6, batch_size=2, warmup_steps=1, eval_tokens=64),
                                     "branches": None})
    main_out = _main(tmp_path, inputs, "cosine", cosine)
    assert "trunk_key" not in json.loads((main_out / "run.json").read_text())
    with pytest.raises(DataError, match="no stable-phase trunk"):
        run_branches(_context(tmp_path, {**inputs, "main": main_out}, "branches", "b"), _experiment(MAIN))


def _check_publish_and_views(out: Path, table: pd.DataFrame, tmp_path: Path) -> None:
    """The DuckDB table and MLflow metrics of the artifact, and its console and report sections."""
    from infra.artifacts import Artifact
    from infra.report_blocks import TableBlock
    from infra.stage import PublishContext, ReportContext, SummaryContext
    from tasks.branches.publish import publish
    from tasks.branches.views import report, summary

    published = publish(PublishContext(artifact=Artifact("branches", "k", out, {"mlflow_run_id": "r1"}), inputs={},
                                       cfg=None, cached=False))
    assert len(published.tables["decay_branches"]) == len(table) and set(published.tables["decay_branches"]["run_id"]) == {"r1"}
    anneal_a = table[(table["branch"] == "anneal-at4-k2") & (table["source"] == "a")].iloc[0]
    assert published.metrics["anneal-at4-k2.a.delta_bpb_vs_main_mixture"] == anneal_a["delta_bpb_vs_main_mixture"]
    assert "main-at4-k2.a.delta_bpb_vs_main_mixture" not in published.metrics  # none on the reference branch
    lines = summary(SummaryContext(path=out, paths={}, layout=RunsLayout(tmp_path)))
    assert lines[0].row_count == len(table) and "its decay follows step 7 of 10" in lines[1]
    blocks = report(ReportContext(path=out, paths={}, layout=RunsLayout(tmp_path), warehouse=None, plots_dir=tmp_path))
    assert [b.title for b in blocks if isinstance(b, TableBlock)] == ["Held-out loss per branch and source",
                                                                      "Main run after its full decay (10 steps)"]
