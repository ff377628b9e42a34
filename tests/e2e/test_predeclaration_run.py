"""End to end: the smoke run's gate and forecast are on record before their evidence, and a gate edited after the
smoke run's CPT results is refused, then declared explicitly and marked as declared after evidence in DuckDB, MLflow
and the summary (docs/methods.md §11)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from mlflow import MlflowClient

from conftest import ROOT, pretrain, stage_status

pytestmark = pytest.mark.e2e


def _rows(runs: Path, sql: str) -> pd.DataFrame:
    con = duckdb.connect(str(runs / "results.duckdb"), read_only=True)
    try:
        return con.execute(sql).df()
    finally:
        con.close()


def _iso(stamp) -> str:
    return pd.Timestamp(stamp).tz_localize("UTC").replace(microsecond=0).isoformat()


def test_the_smoke_runs_gate_and_forecast_were_declared_before_their_evidence(smoke_runs):
    runs = smoke_runs["runs"]
    gates = _rows(runs, "SELECT * FROM gates")
    assert len(gates) == 1 and not gates["declared_after_evidence"].iloc[0] and gates["evidence_before"].iloc[0] == ""
    forecasts = _rows(runs, "SELECT * FROM forecasts")
    assert len(forecasts) == 1 and not forecasts["declared_after_evidence"].iloc[0]
    first_cpt = _rows(runs, "SELECT min(recorded_at) AS t FROM stage_runs WHERE stage = 'cpt'")["t"].iloc[0]
    first_main = _rows(runs, "SELECT min(recorded_at) AS t FROM stage_runs WHERE stage = 'main'")["t"].iloc[0]
    assert gates["declared_at"].iloc[0] < first_cpt and forecasts["declared_at"].iloc[0] < first_main
    # Both runs' gate decision cites the declaration's time, not the gate stage's start.
    decision = _rows(runs, "SELECT declared_at, declared_after_evidence FROM decisions WHERE kind = 'gate'")
    assert list(decision["declared_at"]) == [_iso(gates["declared_at"].iloc[0])]
    assert not decision["declared_after_evidence"].iloc[0]


def test_a_gate_edited_after_the_smoke_runs_results_is_declared_after_evidence(smoke_runs, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(smoke_runs["runs"], runs)
    old = _rows(runs, "SELECT gate_hash FROM gates")["gate_hash"].iloc[0]
    edited = tmp_path / "smoke-edited.toml"
    text = (ROOT / "configs/smoke.toml").read_text()
    assert "threshold = 0.05" in text
    edited.write_text(text.replace("threshold = 0.05", "threshold = 0.5"))

    env = {**os.environ, "PRETRAIN_RUNS_DIR": str(runs), "COLUMNS": "200"}
    refused = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(edited)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=900)
    assert refused.returncode != 0 and "pretrain gate declare" in refused.stdout + refused.stderr
    assert len(_rows(runs, "SELECT * FROM gates")) == 1

    declared = pretrain("gate", "declare", str(edited), runs=runs).stdout
    assert "declared after evidence:" in declared
    assert f"under gate {old[:12]}" in declared and "CPT candidates scored in cpt artifact" in declared
    gates = _rows(runs, "SELECT * FROM gates ORDER BY declared_at")
    assert list(gates["declared_after_evidence"]) == [False, True]
    new = gates["gate_hash"].iloc[1]

    proc = pretrain("run", str(edited), runs=runs)
    status = stage_status(proc.stdout)
    assert status["cpt"] == "cached" and status["gate"] == "ran"
    assert "(declared after evidence)" in proc.stdout
    decision = _rows(runs, "SELECT d.declared_at, d.declared_after_evidence, d.evidence FROM decisions d JOIN "
                           f"gate_decisions g USING (artifact_key) WHERE d.kind = 'gate' AND g.gate_hash = '{new}' "
                           "LIMIT 1")
    assert decision["declared_after_evidence"].iloc[0]
    assert decision["declared_at"].iloc[0] == _iso(gates["declared_at"].iloc[1])
    assert json.loads(decision["evidence"].iloc[0])["evidence_before_declaration"] == gates["evidence_before"].iloc[1]
    marks = _rows(runs, f"SELECT DISTINCT declared_after_evidence FROM gate_decisions WHERE gate_hash = '{new}'")
    assert list(marks["declared_after_evidence"]) == [True]

    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("smoke")
    parents = [r for r in client.search_runs([experiment.experiment_id], max_results=500)
               if r.data.tags.get("mlflow.runName") == "pipeline"]
    latest = max(parents, key=lambda r: r.info.start_time)
    assert latest.data.tags["gate_declared_after_evidence"] == "true" and latest.data.tags["gate_hash"] == new
    earlier = [r for r in parents
               if r.info.run_id != latest.info.run_id and "gate_declared_after_evidence" in r.data.tags]
    assert earlier and all(r.data.tags["gate_declared_after_evidence"] == "false" for r in earlier)

    shown = json.loads(pretrain("gate", "show", str(edited), "--json", runs=runs).stdout)
    assert [(g["gate_hash"], g["declared_after_evidence"]) for g in shown["gates"]] == [(new, True), (old, False)]
