"""A gate or forecast is on record, hashed and timestamped, when first declared; one declared after the evidence it
judges existed is marked so in DuckDB, MLflow, the decision record and the summary (docs/methods.md §11)."""

from __future__ import annotations

import datetime as dt
import io
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from evals.gate import CandidateEval, GateConfig, HeldoutArrays, gate_hash
from flows.config import load_config
from flows.forecasts import after_stage, check_forecast, record_forecast
from flows.gates import Reader, cpt_evidence, declarations, declare_gate, first_declaration, record_gate
from flows.publish import PublishTarget
from infra.artifacts import Artifact, ArtifactStore
from infra.errors import GateError
from infra.runs import RunsLayout
from infra.stage import StageContext
from infra.tracking import Tracker
from infra.warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = [f"replay{f}_lr{lr}" for f in (0.0, 0.1, 0.3) for lr in ("1e-3", "3e-3", "1e-2", "3e-2")]  # 12


@pytest.fixture
def runs(tmp_path):
    """A runs folder, its warehouse and an MLflow store for experiment ``smoke``."""
    layout = RunsLayout(tmp_path / "runs")
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "mlartifacts", "smoke")
    return layout, Warehouse(layout.duckdb), tracker


def app():
    """The CLI, imported when a test calls it."""
    from flows.cli import app as cli

    return cli


def _smoke():
    return load_config(ROOT / "configs/smoke.toml")


def _edited(cfg, by: float = 0.5):
    criteria = [c.model_copy(update={"threshold": c.threshold + by}) for c in cfg.gate.criteria]
    return cfg.model_copy(update={"gate": cfg.gate.model_copy(update={"criteria": criteria})})


def _cpt_published(warehouse: Warehouse, experiment: str, key: str, candidates=CANDIDATES) -> None:
    """What publishing a CPT artifact leaves in DuckDB: its held-out rows and a ``stage_runs`` row."""
    rows = [{"checkpoint": name, "step": 10, "source": s, "split": "heldout", "tokens": 100, "loss_nats": 3.0,
             "bits_per_byte": 1.0, "run_id": "r", "stage": "cpt"} for name in ["base", *candidates]
            for s in ("general", "domain")]
    warehouse.replace("heldout_loss", pd.DataFrame(rows), key)
    warehouse.append("stage_runs", pd.DataFrame([{
        "experiment": experiment, "stage": "cpt", "artifact_key": key, "cached": False, "mlflow_run_id": "m",
        "recorded_at": pd.Timestamp.now(tz="UTC").tz_localize(None)}]))


# --------------------------------------------------------------------------------------- the gate stage's record

def _heldout(values):
    return HeldoutArrays(np.asarray(values, float), np.full(len(values), 64), np.repeat(np.arange(8), 4))


def _gate_stage(layout: RunsLayout, cfg: GateConfig, experiment: str, tmp_path: Path) -> Path:
    """Run the gate stage on a two-model CPT artifact inside ``layout``; returns its output folder."""
    from tasks.gate.stage import run

    rng = np.random.default_rng(0)
    evals = {"base": CandidateEval("base", _heldout(rng.normal(3.0, 0.01, 32)), _heldout(np.full(32, 5.0))),
             "cand": CandidateEval("cand", _heldout(rng.normal(3.0, 0.01, 32)),
                                   _heldout(5.0 - 0.5 - rng.normal(0, 0.05, 32)))}
    cpt = tmp_path / "cpt"
    (cpt / "evals").mkdir(parents=True, exist_ok=True)
    (cpt / "candidates.json").write_text(json.dumps({"base": {"checkpoint": str(cpt / "base")},
                                                     "cand": {"replay_fraction": 0.1, "peak_lr": 1e-3}}))
    for name, e in evals.items():
        np.savez(cpt / "evals" / f"{name}.npz", general_window_nats=e.general.window_nats,
                 general_window_tokens=e.general.window_tokens, general_window_docs=e.general.window_docs,
                 domain_window_nats=e.domain.window_nats, domain_window_tokens=e.domain.window_tokens,
                 domain_window_docs=e.domain.window_docs, cloze_correct=np.ones(4, bool))
    out = tmp_path / f"gate-{gate_hash(cfg)[:8]}"
    out.mkdir()
    run(StageContext(out=out, inputs={"cpt": cpt, "main": tmp_path}, layout=layout, key="gate-key",
                     experiment=experiment), cfg)
    return out


def _iso(stamp) -> str:
    return pd.Timestamp(stamp).tz_localize("UTC").replace(microsecond=0).isoformat()


def test_a_gate_edited_after_cpt_evidence_is_a_new_declaration_marked_after_evidence(runs, tmp_path):
    """(a) declared, CPT scored 12 candidates (the gate stage then failed: no gate_decisions), gate edited: the
    run records the new gate as declared after evidence, names that evidence, and the decision says so."""
    layout, warehouse, tracker = runs
    cfg = _smoke()
    first = record_gate(cfg, warehouse, tracker, tracker.start_run("pipeline"))
    assert first["declared_after_evidence"] is False and first["evidence_before"] == ""
    _cpt_published(warehouse, "smoke", "cptkey0123456789")

    edited = _edited(cfg)
    parent = tracker.start_run("pipeline")
    record = record_gate(edited, warehouse, tracker, parent)  # no decisions yet under the old gate: no refusal
    rows = warehouse.query("SELECT * FROM gates ORDER BY declared_at")
    assert list(rows["gate_hash"]) == [gate_hash(cfg.gate), gate_hash(edited.gate)]
    assert list(rows["declared_after_evidence"]) == [False, True]
    text = rows["evidence_before"].iloc[1]
    assert text.startswith("12 CPT candidates scored in cpt artifact cptkey012345 (published ")
    assert f"gate {gate_hash(cfg.gate)[:12]} in force" in text
    assert record["declared_after_evidence"] is True and record["evidence_before"] == text
    tags = tracker.client.get_run(parent).data.tags
    assert tags["gate_declared_after_evidence"] == "true" and tags["gate_evidence_before"] == text
    assert tags["gate_declared_at"] == str(rows["declared_at"].iloc[1])

    # The gate stage cites that declaration: its first time, and the mark with what existed.
    out = _gate_stage(layout, edited.gate, "smoke", tmp_path)
    decision = json.loads((out / "decision.json").read_text())["decision"]
    assert decision["declared_after_evidence"] is True
    assert decision["declared_at"] == _iso(rows["declared_at"].iloc[1])
    assert decision["evidence"]["evidence_before_declaration"] == text
    from evals.decision import DecisionRecord

    assert "(declared after evidence)" in DecisionRecord.from_dict(decision).line()

    # The console summary (its gate section and the decisions list) and the published rows carry the mark.
    from flows.summary import print_summary

    console = Console(file=io.StringIO(), width=400)
    print_summary({"experiment": "smoke", "paths": {"gate": str(out)}, "cached": {"gate": False}}, layout, console)
    shown = console.file.getvalue()
    assert shown.count("(declared after evidence)") == 2  # the gate section's record line and the decisions list
    assert "the gate was declared after evidence existed: 12 CPT candidates scored" in shown
    published = _publish_gate(out, warehouse, tracker, tmp_path)
    assert list(warehouse.query("SELECT declared_after_evidence FROM decisions")["declared_after_evidence"]) == [True]
    marks = warehouse.query("SELECT declared_after_evidence FROM gate_decisions")["declared_after_evidence"]
    assert len(marks) and set(marks) == {True}
    assert tracker.client.get_run(published).data.tags["decision.gate.declared_after_evidence"] == "true"


def _publish_gate(out: Path, warehouse: Warehouse, tracker: Tracker, tmp_path: Path) -> str:
    from flows.publish import publish
    from flows.registry import get_stage

    store = ArtifactStore(tmp_path / "artifacts")
    tmp = store.begin("gate", "gate-key")
    for name in ("decision.json", "decisions.parquet", "gate_scatter.png"):
        (tmp / name).write_bytes((out / name).read_bytes())
    artifact = store.commit("gate", "gate-key", tmp, {"mlflow_run_id": ""})
    parent = tracker.start_run("pipeline")
    run_id = tracker.start_run("gate", parent_id=parent)
    publish(get_stage("gate"), artifact, {}, _smoke(), PublishTarget(tracker, warehouse, "smoke", parent, "f"), run_id,
            cached=False)
    return run_id


def test_the_refusal_stays_and_an_explicit_declaration_names_the_decisions(runs, tmp_path, monkeypatch):
    """With gate decisions under the old gate the run still stops; ``pretrain gate declare`` then records the new
    gate marked after evidence, naming those decisions, and says so."""
    layout, warehouse, tracker = runs
    cfg = _smoke()
    record_gate(cfg, warehouse, tracker, tracker.start_run("pipeline"))
    warehouse.replace("gate_decisions", pd.DataFrame(
        [{"experiment": "smoke", "gate_hash": gate_hash(cfg.gate), "candidate": c, "decision": "fail"}
         for c in ("c1", "c2")]), "gk")
    edited = _edited(cfg)
    with pytest.raises(GateError, match="marked as made after evidence"):
        record_gate(edited, warehouse, tracker, tracker.start_run("pipeline"))
    assert len(warehouse.query("SELECT * FROM gates")) == 1

    config = tmp_path / "edited.toml"
    config.write_text((ROOT / "configs/smoke.toml").read_text().replace("threshold = 0.05", "threshold = 0.55"))
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(app(), ["gate", "declare", str(config), "--runs-dir", str(layout.root)],
                                terminal_width=300)
    assert result.exit_code == 0, result.output
    expected = f"gate decisions on 2 candidate(s) under gate {gate_hash(cfg.gate)[:12]}"
    assert "declared after evidence:" in result.output and expected in result.output
    row = first_declaration(warehouse, "smoke", gate_hash(load_config(config).gate))
    assert row["declared_after_evidence"] is True and row["evidence_before"] == expected
    record = record_gate(load_config(config), warehouse, tracker, tracker.start_run("pipeline"))
    assert record["declared_at"] == row["declared_at"] and len(warehouse.query("SELECT * FROM gates")) == 2


def test_a_gate_declared_before_evidence_keeps_its_first_time_and_no_mark(runs, tmp_path, monkeypatch):
    """(b) declared hours before CPT evidence: a rerun adds no row, and the decision cites the table's time."""
    layout, warehouse, tracker = runs
    cfg = _smoke()
    hours_ago = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None, microsecond=0) - dt.timedelta(hours=5)
    monkeypatch.setattr("flows.gates._now", lambda: hours_ago)
    record_gate(cfg, warehouse, tracker, tracker.start_run("pipeline"))
    monkeypatch.undo()
    _cpt_published(warehouse, "smoke", "cptkey")
    parent = tracker.start_run("pipeline")
    record = record_gate(cfg, warehouse, tracker, parent)  # the rerun: the gate is the one declared
    assert len(warehouse.query("SELECT * FROM gates")) == 1
    assert pd.Timestamp(record["declared_at"]) == pd.Timestamp(hours_ago) and not record["declared_after_evidence"]
    tags = tracker.client.get_run(parent).data.tags
    assert tags["gate_declared_after_evidence"] == "false" and "gate_evidence_before" not in tags
    assert pd.Timestamp(tags["gate_declared_at"]) == pd.Timestamp(hours_ago)

    decision = json.loads((_gate_stage(layout, cfg.gate, "smoke", tmp_path) / "decision.json").read_text())["decision"]
    assert decision["declared_at"] == _iso(hours_ago)
    assert decision["declared_after_evidence"] is False and "evidence_before_declaration" not in decision["evidence"]
    decided = pd.Timestamp(decision["decided_at"])
    assert decided - pd.Timestamp(decision["declared_at"]) > pd.Timedelta(hours=4)
    from evals.decision import DecisionRecord

    assert "declared after evidence" not in DecisionRecord.from_dict(decision).line()


def test_an_earlier_gate_declared_again_keeps_the_mark_of_its_first_declaration(runs):
    layout, warehouse, tracker = runs
    cfg = _smoke()
    declare_gate(cfg, warehouse)
    _cpt_published(warehouse, "smoke", "k1", candidates=["c1"])
    edited, _ = declare_gate(_edited(cfg), warehouse)
    assert edited["declared_after_evidence"] and edited["evidence_before"].startswith("1 CPT candidate scored")
    again, added = declare_gate(cfg, warehouse)  # back to the predeclared gate: a new row, still no mark
    assert added and again["declared_after_evidence"] is False
    gates = declarations(warehouse, "smoke")
    assert list(gates["declared_after_evidence"]) == [False, True, False]
    assert first_declaration(warehouse, "smoke", gate_hash(cfg.gate))["declared_at"] == gates["declared_at"].iloc[2]


def test_rows_written_before_the_mark_read_false_and_gain_the_columns(runs):
    layout, warehouse, _ = runs
    cfg = _smoke()
    warehouse.append("gates", pd.DataFrame([{"experiment": "smoke", "gate_hash": "old", "declared_at":
                                             dt.datetime(2024, 1, 1), "gate_json": "{}", "mlflow_parent_run_id": ""}]))
    row, added = declare_gate(cfg, warehouse)
    assert added and row["declared_after_evidence"] is False
    gates = declarations(warehouse, "smoke")
    assert list(gates["gate_hash"]) == [gate_hash(cfg.gate), "old"]
    assert list(gates["declared_after_evidence"]) == [False, False] and list(gates["evidence_before"]) == ["", ""]
    raw = warehouse.query("SELECT declared_after_evidence FROM gates WHERE gate_hash = 'old'")
    assert raw["declared_after_evidence"].isna().all()  # NULL on record, False when read


def test_gate_show_lists_one_experiments_gates_only(runs, tmp_path, monkeypatch):
    """(c) two experiments in one warehouse: each `gate show` lists its own declarations and marks, and one
    experiment's CPT evidence does not mark the other's gate."""
    layout, warehouse, tracker = runs
    smoke = _smoke()
    other_path = tmp_path / "other.toml"
    other_path.write_text((ROOT / "configs/smoke.toml").read_text().replace('name = "smoke"', 'name = "other"')
                          .replace("threshold = 0.05", "threshold = 0.07"))
    other = load_config(other_path)
    declare_gate(other, warehouse)
    _cpt_published(warehouse, "other", "otherkey", candidates=["c1", "c2"])
    declare_gate(_edited(other), warehouse)  # marked: other's CPT ran
    declare_gate(smoke, warehouse)  # not marked: smoke has no CPT evidence
    assert cpt_evidence(Reader.of(warehouse), "smoke") == ""

    monkeypatch.chdir(ROOT)
    runner = CliRunner()
    shown = {}
    for name, path in (("smoke", ROOT / "configs/smoke.toml"), ("other", other_path)):
        result = runner.invoke(app(), ["gate", "show", str(path), "--json", "--runs-dir", str(layout.root)])
        assert result.exit_code == 0, result.output
        shown[name] = json.loads(result.output)["gates"]
    assert [g["experiment"] for g in shown["smoke"]] == ["smoke"]
    assert [g["gate_hash"] for g in shown["smoke"]] == [gate_hash(smoke.gate)]
    assert [g["declared_after_evidence"] for g in shown["smoke"]] == [False]
    assert [g["gate_hash"] for g in shown["other"]] == [gate_hash(_edited(other).gate), gate_hash(other.gate)]
    assert [g["declared_after_evidence"] for g in shown["other"]] == [True, False]
    assert shown["other"][0]["evidence_before"].startswith("2 CPT candidates scored in cpt artifact otherkey")

    text = runner.invoke(app(), ["gate", "show", str(other_path), "--runs-dir", str(layout.root)],
                         terminal_width=300).output
    assert "experiment: other" in text and gate_hash(smoke.gate)[:12] not in text
    assert gate_hash(other.gate)[:12] in text and "yes: 2 CPT candidates scored" in text
    text = runner.invoke(app(), ["gate", "show", "configs/smoke.toml", "--runs-dir", str(layout.root)],
                         terminal_width=300).output
    assert gate_hash(other.gate)[:12] not in text and gate_hash(_edited(other).gate)[:12] not in text
    assert gate_hash(smoke.gate)[:12] in text and "yes:" not in text


# ------------------------------------------------------------------------------------------------- the forecast

def _ladder(store: ArtifactStore, key: str, predicted: float) -> Artifact:
    tmp = store.begin("ladder", key)
    forecast = {"forecast_hash": f"hash-{predicted}", "prediction": {"predicted": predicted, "low": predicted - 0.2,
                                                                    "high": predicted + 0.2},
                "decision": {"verdict": "decided"}, "target": {"general_sources": ["a", "b"]}}
    (tmp / "forecast.json").write_text(json.dumps(forecast))
    return store.commit("ladder", key, tmp, {})


def _main(store: ArtifactStore, key: str) -> Artifact:
    tmp = store.begin("main", key)
    pd.DataFrame({"source": ["a", "b"], "tokens": [300, 100], "loss_nats": [4.5, 4.5]}).to_parquet(
        tmp / "heldout.parquet")
    return store.commit("main", key, tmp, {})


def test_a_forecast_recorded_after_a_main_artifact_of_its_experiment_is_marked(runs, tmp_path):
    """(d) the first record of a forecast made when a main artifact of the experiment exists is marked after
    evidence (DuckDB and the parent run's tags), and none of its checks is prospective; one recorded before main
    is not marked and its check is prospective."""
    layout, warehouse, tracker = runs
    store = ArtifactStore(layout.artifacts)
    blind = _ladder(store, "l1", 4.6)
    row, added = record_forecast(warehouse, "smoke", blind, "m1")
    assert added and row["declared_after_evidence"] is False and row["evidence_before"] == ""
    time.sleep(0.01)
    main = _main(store, "m1")
    assert check_forecast(warehouse, "smoke", blind, main)["prospective"]

    # main m1 is published for the experiment; a changed ladder forecasts main m2, which already exists too.
    warehouse.append("stage_runs", pd.DataFrame([{"experiment": "smoke", "stage": "main", "artifact_key": "m1",
                                                  "recorded_at": pd.Timestamp("2026-01-02 03:04:05")}]))
    late_main = _main(store, "m2")
    seen = _ladder(store, "l2", 4.4)
    parent = tracker.start_run("pipeline")
    target = PublishTarget(tracker, warehouse, "smoke", parent, "f")
    after_stage("ladder", {"ladder": seen}, "m2", target, store)
    rows = warehouse.query("SELECT * FROM forecasts ORDER BY declared_at")
    assert list(rows["forecast_hash"]) == ["hash-4.6", "hash-4.4"]
    assert list(rows["declared_after_evidence"]) == [False, True]
    made = dt.datetime.fromtimestamp(late_main.meta["committed_at"], dt.timezone.utc)
    assert rows["evidence_before"].iloc[1] == (f"main artifact m2 committed {made:%Y-%m-%d %H:%M:%S} UTC; "
                                               "main artifact m1 published for 'smoke' 2026-01-02 03:04:05 UTC")
    tags = tracker.client.get_run(parent).data.tags
    assert tags["forecast_declared_after_evidence"] == "true" and tags["forecast_recorded_now"] == "true"
    assert tags["forecast_evidence_before"] == rows["evidence_before"].iloc[1]
    # Recording it again changes nothing: the first record, with its mark, stays.
    again, added = record_forecast(warehouse, "smoke", seen, "m2")
    assert not added and again["declared_after_evidence"] is True
    assert again["declared_at"] == rows["declared_at"].iloc[1]
    # A main artifact made after this record does not make its check prospective: the forecast saw m1 first.
    time.sleep(0.01)
    assert not check_forecast(warehouse, "smoke", seen, _main(store, "m3"))["prospective"]


def test_main_evidence_of_another_experiment_does_not_mark_a_forecast(runs):
    layout, warehouse, _ = runs
    store = ArtifactStore(layout.artifacts)
    warehouse.append("stage_runs", pd.DataFrame([{"experiment": "other", "stage": "main", "artifact_key": "mx",
                                                  "recorded_at": pd.Timestamp("2026-01-02")}]))
    row, added = record_forecast(warehouse, "smoke", _ladder(store, "l1", 4.6), "m1")
    assert added and row["declared_after_evidence"] is False
