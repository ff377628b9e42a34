"""The closing decisions block says what was used downstream and how a forecast fared (flows/summary.py)."""

import json

import pandas as pd

from evals.decision import DecisionRecord
from flows.summary import collect_decisions, downstream


def _record(kind: str, **evidence) -> DecisionRecord:
    declared = DecisionRecord.declare(kind, rule="r", rule_config={"kind": kind})
    return declared.settle(choice="x", verdict="decided", estimate=6.7, low=6.5, high=6.9, unit="nats/token",
                           evidence=evidence)


def _run(tmp_path, loss: float):
    main, ladder = tmp_path / "main", tmp_path / "ladder"
    main.mkdir()
    ladder.mkdir()
    (main / "run.json").write_text(json.dumps({"peak_lr": 4.12e-3, "peak_lr_source": {
        "from": "sweep", "d_model": 128, "study": "s", "main_d_model": 128}}))
    pd.DataFrame({"source": ["a", "b", "dom"], "loss_nats": [loss, loss, 1.0], "tokens": [100, 300, 50]}).to_parquet(
        main / "heldout.parquet")
    (ladder / "forecast.json").write_text(json.dumps({"target": {"general_sources": ["a", "b"]}}))
    return {"main": main, "ladder": ladder}


def test_the_peak_lr_of_another_width_says_it_was_not_used(tmp_path):
    paths = _run(tmp_path, 6.0995)
    other = downstream(_record("peak_lr", d_model=64), paths)
    used = downstream(_record("peak_lr", d_model=128), paths)
    assert other.used == "not this width's: the main run (d_model 128) trained at 0.00412, the sweep at d_model 128"
    assert used.used == "the main run trained at 0.00412"
    assert "used downstream: not this width's" in other.line()


def test_a_forecast_outside_its_interval_is_marked_missed(tmp_path):
    missed = downstream(_record("forecast"), _run(tmp_path, 6.0995))
    assert missed.check == "missed: measured 6.0995 nats/token, error +9.8%"
    assert "checked: missed" in missed.line()


def test_a_forecast_inside_its_interval_is_marked_covered(tmp_path):
    covered = downstream(_record("forecast"), _run(tmp_path, 6.8))
    assert covered.check.startswith("covered: measured 6.8000")


def test_decisions_are_read_from_the_artifacts_with_nan_written_as_null(tmp_path):
    paths = _run(tmp_path, 6.8)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    undetermined = DecisionRecord.declare("peak_lr", rule="r", rule_config={}).settle(
        choice="1e-3", verdict="undetermined", fallback="best trial", resolve="more trials", evidence={"d_model": 128})
    text = json.dumps({"decision": json.loads(undetermined.to_json())})
    assert "NaN" not in text and '"estimate": null' in text
    (sweep / "best.json").write_text(text)
    [record] = collect_decisions({"sweep": sweep, **paths})
    assert record.verdict == "undetermined" and record.used == "the main run trained at 0.00412"
    assert record.estimate != record.estimate  # null reads back as NaN


def test_where_to_look_next_prints_commands_that_run_from_here(tmp_path, monkeypatch):
    import io
    import sys

    from rich.console import Console

    from flows.summary import print_summary
    from infra.runs import RunsLayout

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PRETRAIN_DUCKDB_CLI", raising=False)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "mlflow").touch()
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    ablation = tmp_path / "quality_ablation"
    ablation.mkdir()
    undetermined = DecisionRecord.declare("quality_ablation", rule="r", rule_config={}).settle(
        choice="classifier kept", verdict="undetermined", fallback="as built", resolve="raise [proxy] budget.steps")
    (ablation / "ablation.json").write_text(json.dumps({"requested": False,
                                                       "decision": json.loads(undetermined.to_json())}))
    out = io.StringIO()
    print_summary({"experiment": "e", "paths": {"quality_ablation": ablation}, "cached": {}}, RunsLayout(tmp_path / "runs"),
                  Console(file=out, width=100, soft_wrap=True))
    text = out.getvalue()
    assert "raise [proxy] budget.steps" in text  # a config section in a decision is text, not rich markup
    assert "MLflow UI:   .venv/bin/mlflow ui --backend-store-uri sqlite:///" in text
    assert "DuckDB:      .venv-duckdb-cli/bin/duckdb -readonly runs/results.duckdb   (`make duckdb-cli` installs" in text
