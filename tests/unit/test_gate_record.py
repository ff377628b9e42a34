"""The gate is recorded before CPT, reused while unchanged, and a change after decisions stops the run."""

import json
from pathlib import Path

import pandas as pd
import pytest

from evals.gate import gate_hash
from flows.config import load_config
from flows.gates import declare_gate, record_gate
from infra.errors import GateError
from infra.tracking import Tracker
from infra.warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def stores(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "mlartifacts", "smoke")
    return Warehouse(tmp_path / "results.duckdb"), tracker


def _changed_gate(cfg):
    criteria = [c.model_copy(update={"threshold": c.threshold + 0.5}) for c in cfg.gate.criteria]
    return cfg.model_copy(update={"gate": cfg.gate.model_copy(update={"criteria": criteria})})


def test_gate_recorded_once_and_tagged(stores):
    warehouse, tracker = stores
    cfg = load_config(ROOT / "configs/smoke.toml")
    for _ in range(2):
        run_id = tracker.start_run("pipeline")
        record_gate(cfg, warehouse, tracker, run_id)
    gates = warehouse.query("SELECT * FROM gates")
    assert list(gates["gate_hash"]) == [gate_hash(cfg.gate)]
    assert tracker.client.get_run(run_id).data.tags["gate_hash"] == gate_hash(cfg.gate)


def test_changed_gate_after_decisions_stops_until_declared(stores):
    warehouse, tracker = stores
    cfg = load_config(ROOT / "configs/smoke.toml")
    record_gate(cfg, warehouse, tracker, tracker.start_run("pipeline"))
    warehouse.replace("gate_decisions", pd.DataFrame(
        [{"experiment": "smoke", "gate_hash": gate_hash(cfg.gate), "candidate": "c1", "decision": "pass"}]), "k1")
    changed = _changed_gate(cfg)
    with pytest.raises(GateError, match="pretrain gate declare"):
        record_gate(changed, warehouse, tracker, tracker.start_run("pipeline"))
    declare_gate(changed, warehouse)
    record = record_gate(changed, warehouse, tracker, tracker.start_run("pipeline"))
    assert record["gate_hash"] == gate_hash(changed.gate)
    assert len(warehouse.query("SELECT * FROM gates")) == 2  # the old declaration is kept


def test_changed_gate_before_any_decision_is_a_new_declaration(stores):
    warehouse, tracker = stores
    cfg = load_config(ROOT / "configs/smoke.toml")
    record_gate(cfg, warehouse, tracker, tracker.start_run("pipeline"))
    record_gate(_changed_gate(cfg), warehouse, tracker, tracker.start_run("pipeline"))
    assert len(warehouse.query("SELECT * FROM gates")) == 2


def test_warehouse_replace_is_idempotent_per_artifact_key(tmp_path):
    warehouse = Warehouse(tmp_path / "w.duckdb")
    rows = pd.DataFrame({"source": ["a", "b"], "loss_nats": [1.0, 2.0]})
    warehouse.replace("heldout_loss", rows, "k1")
    warehouse.replace("heldout_loss", rows, "k1")
    warehouse.replace("heldout_loss", rows.head(1), "k2")
    counts = warehouse.query("SELECT artifact_key, count(*) AS n FROM heldout_loss GROUP BY 1 ORDER BY 1")
    assert counts.to_dict("records") == [{"artifact_key": "k1", "n": 2}, {"artifact_key": "k2", "n": 1}]


def test_cli_gate_declare_names_the_runs_folder_and_declares_once(tmp_path, monkeypatch):
    """Without --runs-dir the declaration lands in ./runs; the command says so, and repeating it adds nothing."""
    from typer.testing import CliRunner

    from flows.cli import app
    from infra.runs import RUNS_ENV

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(RUNS_ENV, raising=False)
    runner = CliRunner()
    first = runner.invoke(app, ["gate", "declare", str(ROOT / "configs/smoke.toml")], terminal_width=200)
    again = runner.invoke(app, ["gate", "declare", str(ROOT / "configs/smoke.toml")], terminal_width=200)
    assert first.exit_code == 0 and again.exit_code == 0, first.output + again.output
    runs = (tmp_path / "runs").resolve()
    assert f"runs folder: {runs}" in first.output and f"runs folder: {runs}" in again.output
    assert "already declared" not in first.output and "already declared" in again.output
    gates = Warehouse(runs / "results.duckdb").query("SELECT * FROM gates")
    assert len(gates) == 1


def test_redeclaring_an_earlier_gate_after_another_appends_it(stores):
    warehouse, _ = stores
    cfg = load_config(ROOT / "configs/smoke.toml")
    assert declare_gate(cfg, warehouse)[1] and declare_gate(_changed_gate(cfg), warehouse)[1]
    row, added = declare_gate(cfg, warehouse)
    assert added and row["gate_hash"] == gate_hash(cfg.gate)
    assert len(warehouse.query("SELECT * FROM gates")) == 3


def test_cli_gate_declare_prints_lines_and_keeps_json_for_json(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    config, runs = str(ROOT / "configs/smoke.toml"), str(tmp_path / "runs")
    runner = CliRunner()
    assert runner.invoke(app, ["gate", "declare", config, "--runs-dir", runs]).exit_code == 0
    again = runner.invoke(app, ["gate", "declare", config, "--runs-dir", runs], terminal_width=200)
    assert again.exit_code == 0, again.output
    assert "{" not in again.output and "gate_json" not in again.output
    cfg = load_config(ROOT / "configs/smoke.toml")
    assert "unchanged" in again.output and gate_hash(cfg.gate)[:12] in again.output
    for criterion in cfg.gate.criteria:
        assert any(line.strip().startswith(f"{criterion.name}: {criterion.metric}") for line in again.output.splitlines())
    shown = json.loads(runner.invoke(app, ["gate", "declare", config, "--runs-dir", runs, "--json"]).output)
    assert shown["declared_after_evidence"] is False and shown["added"] is False
    assert shown["gate"]["criteria"][0]["name"] == cfg.gate.criteria[0].name
