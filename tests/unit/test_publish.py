"""Publishing the gate and the export: the registered model's alias ``kept`` follows the decision of the gate just
published, through the export of its kept model."""

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from flows.config import load_config
from flows.publish import PublishTarget, publish
from flows.registry import get_stage
from infra.artifacts import ArtifactStore
from infra.tracking import Tracker
from infra.warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "mlartifacts", "smoke")
    return SimpleNamespace(cfg=load_config(ROOT / "configs/smoke.toml"), tracker=tracker,
                           warehouse=Warehouse(tmp_path / "results.duckdb"), store=ArtifactStore(tmp_path / "artifacts"),
                           parent_run_id=tracker.start_run("pipeline"), flow_run_id="flow-1", root=tmp_path)


def _gate_artifact(env, key: str, kept: str):
    """A completed gate artifact whose decision keeps ``kept`` (a candidate folder that exists)."""
    checkpoint = env.root / "artifacts" / "cpt" / f"cpt-{key}" / "candidates" / kept
    checkpoint.mkdir(parents=True)
    tmp = env.store.begin("gate", key)
    (tmp / "decision.json").write_text(json.dumps(
        {"gate_hash": "g1", "kept": kept, "kept_checkpoint": str(checkpoint), "summary": f"keep {kept}"}))
    pd.DataFrame([{"candidate": kept, "decision": "pass"}]).to_parquet(tmp / "decisions.parquet", index=False)
    return env.store.commit("gate", key, tmp, {"mlflow_run_id": "", "summary": {"kept": kept}})


def _export_artifact(env, key: str, kept: str):
    """A gate artifact keeping ``kept`` and the completed export artifact of its kept model."""
    gate = _gate_artifact(env, f"gate-{key}", kept)
    tmp = env.store.begin("export", key)
    (tmp / "model").mkdir()
    (tmp / "model" / "export.json").write_text(json.dumps(
        {"architecture": "LlamaForCausalLM", "checkpoint": json.loads((gate.path / "decision.json").read_text())[
            "kept_checkpoint"], "max_abs_logit_diff": 1e-6, "greedy_equal": True, "transformers_version": "5"}))
    return env.store.commit("export", key, tmp, {"mlflow_run_id": "", "input_keys": {"gate": gate.key}})


def _publish(env, artifact, cached: bool) -> str:
    run_id = env.tracker.start_run(artifact.stage, parent_id=env.parent_run_id)
    target = PublishTarget(env.tracker, env.warehouse, env.cfg.name, env.parent_run_id, env.flow_run_id)
    inputs = {name: env.store.get(name, key) for name, key in artifact.meta.get("input_keys", {}).items()}
    publish(get_stage(artifact.stage), artifact, inputs, env.cfg, target, run_id, cached=cached)
    return run_id


def test_cached_export_moves_kept_back_to_its_own_decision(env):
    """Gate A keeps c1, a later gate B keeps c2; rerunning the config of A (gate and export cached) must point kept
    at the export of c1."""
    client = env.tracker.client
    first = _export_artifact(env, "a", "c1")
    second = _export_artifact(env, "b", "c2")
    _publish(env, first, cached=False)
    _publish(env, second, cached=False)
    assert client.get_model_version_by_alias("smoke-base", "kept").tags["candidate"] == "c2"

    run_id = _publish(env, first, cached=True)
    kept = client.get_model_version_by_alias("smoke-base", "kept")
    assert kept.tags["candidate"] == "c1"
    assert kept.source == str(first.path / "model")  # the Hugging Face folder, not the checkpoint
    assert kept.tags["checkpoint"].endswith("/candidates/c1") and kept.tags["gate_artifact_key"] == "gate-a"
    assert len(client.search_model_versions("name = 'smoke-base'")) == 2  # moved, not registered again
    assert client.get_run(run_id).data.tags["registered_version"] == str(kept.version)


def test_the_gate_registers_the_candidates_not_kept_and_no_base(env):
    checkpoint = env.root / "artifacts" / "cpt" / "cpt-x" / "candidates"
    tmp = env.store.begin("gate", "gate-x")
    (tmp / "decision.json").write_text(json.dumps(
        {"gate_hash": "g1", "kept": "c1", "kept_checkpoint": str(checkpoint / "c1"), "candidates_dir": str(checkpoint),
         "summary": "keep c1"}))
    pd.DataFrame([{"candidate": "c1", "decision": "pass"}, {"candidate": "c2", "decision": "fail"}]).to_parquet(
        tmp / "decisions.parquet", index=False)
    _publish(env, env.store.commit("gate", "gate-x", tmp, {"mlflow_run_id": ""}), cached=False)
    client = env.tracker.client
    assert not client.search_registered_models(filter_string="name = 'smoke-base'")
    (candidate,) = client.search_model_versions("name = 'smoke-cpt-candidates'")
    assert candidate.tags["candidate"] == "c2" and candidate.tags["verdict"] == "rejected"


def test_republishing_the_same_export_adds_no_version(env):
    artifact = _export_artifact(env, "a", "base")
    for cached in (False, True, True):
        _publish(env, artifact, cached=cached)
    versions = env.tracker.client.search_model_versions("name = 'smoke-base'")
    assert [int(v.version) for v in versions] == [1]
    assert int(env.tracker.client.get_model_version_by_alias("smoke-base", "kept").version) == 1


def test_parent_run_gets_the_kept_models_heldout_figures_from_the_cpt_input(env):
    """The headline is read from the gate's input CPT artifact, not from a recorded path."""
    cpt_tmp = env.store.begin("cpt", "cpt-key")
    pd.DataFrame([
        {"checkpoint": "base", "source": "handbook_en", "loss_nats": 6.0, "bits_per_byte": 3.0},
        {"checkpoint": "c1", "source": "handbook_en", "loss_nats": 5.5, "bits_per_byte": 2.75},
        {"checkpoint": "c1", "source": "python_doc", "loss_nats": 4.0, "bits_per_byte": 2.0},
    ]).to_parquet(cpt_tmp / "heldout.parquet", index=False)
    env.store.commit("cpt", "cpt-key", cpt_tmp, {})
    checkpoint = env.root / "elsewhere" / "c1"
    checkpoint.mkdir(parents=True)
    tmp = env.store.begin("gate", "gate-h")
    (tmp / "decision.json").write_text(json.dumps(
        {"gate_hash": "g1", "kept": "c1", "kept_checkpoint": str(checkpoint), "summary": "keep c1"}))
    pd.DataFrame([{"candidate": "c1", "decision": "pass"}, {"candidate": "c2", "decision": "fail"}]).to_parquet(
        tmp / "decisions.parquet", index=False)
    artifact = env.store.commit("gate", "gate-h", tmp, {"mlflow_run_id": "", "input_keys": {"cpt": "cpt-key"}})
    _publish(env, artifact, cached=False)
    parent = env.tracker.client.get_run(env.parent_run_id).data
    assert parent.metrics["kept.heldout_bits_per_byte.handbook_en"] == 2.75
    assert parent.metrics["kept.heldout_loss_nats.python_doc"] == 4.0
    assert parent.metrics["gate.candidates_passed"] == 1.0 and parent.metrics["gate.kept_is_base"] == 0.0
    assert parent.tags["gate_verdict"] == "kept c1"
