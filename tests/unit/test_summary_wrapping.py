"""The run summary's closing lines word-wrap in a terminal and stay one line a record in a log file
(flows/summary.py, flows/cli.py ``make_console``)."""

import io
import json

from rich.console import Console

from evals.decision import DecisionRecord
from flows.cli import make_console
from flows.registry import stage_names
from flows.summary import print_summary
from infra.runs import RunsLayout


def _printed(console: Console, tmp_path) -> str:
    folder = tmp_path / "sources"  # a stage without a section of its own: only the decisions block reads it
    folder.mkdir()
    record = DecisionRecord.declare("peak_lr", rule="r", rule_config={}).settle(
        choice="1e-3", verdict="undetermined", fallback="the best trial's LR", resolve="raise sweep.n_trials so "
        "that at least eight more trials complete between 1e-3 and 3e-2", evidence={"d_model": 128})
    (folder / "best.json").write_text(json.dumps({"decision": json.loads(record.to_json())}))
    result = {"experiment": "demo", "experiment_id": "1", "paths": {"sources": str(folder)},
              "cached": {name: True for name in stage_names()}}
    print_summary(result, RunsLayout(tmp_path / "runs"), console)
    return console.file.getvalue()


def test_a_terminal_wraps_the_closing_lines_between_words(tmp_path):
    text = _printed(Console(file=io.StringIO(), width=100), tmp_path)
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines)
    words = " ".join(lines).split()
    for whole in ("stages:", *(f"{name}=cached" for name in stage_names()), "127.0.0.1", "resolve", "sweep.n_trials"):
        assert whole in words or any(w.startswith(whole) or w.endswith(whole) for w in words), whole


def test_a_log_file_keeps_each_closing_record_on_one_line(tmp_path):
    text = _printed(make_console(False, file=io.StringIO()), tmp_path)
    lines = text.splitlines()
    [stages] = [line for line in lines if line.startswith("stages:")]
    assert all(f"{name}=cached" in stages for name in stage_names())
    assert any("127.0.0.1" in line and "mlflow" in line and "ui" in line for line in lines)
    [decision] = [line for line in lines if "sweep.n_trials" in line]
    assert "undetermined" in decision
