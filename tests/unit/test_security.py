"""Hostile values stay data: SQL parameters, allowlisted table names, argument lists, loopback servers."""

import ast
import os
from pathlib import Path

import pandas as pd
import pytest

from infra.runs import RunsLayout
from infra.warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "x'; DROP TABLE gates; --"


def test_a_hostile_experiment_name_round_trips_as_data(tmp_path):
    warehouse = Warehouse(tmp_path / "results.duckdb")
    warehouse.append("gates", pd.DataFrame([{"experiment": HOSTILE, "gate_hash": 'h"1', "declared_at": "t0"},
                                            {"experiment": "other", "gate_hash": "h2", "declared_at": "t1"}]))
    warehouse.replace("funnel", pd.DataFrame([{"source": HOSTILE, "docs": 3}]), artifact_key=HOSTILE)
    warehouse.replace("funnel", pd.DataFrame([{"source": HOSTILE, "docs": 4}]), artifact_key=HOSTILE)  # rerun
    rows = warehouse.query("SELECT * FROM gates WHERE experiment = ?", [HOSTILE])
    assert rows.to_dict("records") == [{"experiment": HOSTILE, "gate_hash": 'h"1', "declared_at": "t0"}]
    assert len(warehouse.query("SELECT * FROM gates")) == 2
    funnel = warehouse.query("SELECT source, docs, artifact_key FROM funnel")
    assert funnel.to_dict("records") == [{"source": HOSTILE, "docs": 4, "artifact_key": HOSTILE}]


def test_a_column_name_with_a_quote_is_an_identifier_not_sql(tmp_path):
    warehouse = Warehouse(tmp_path / "results.duckdb")
    warehouse.append("stage_runs", pd.DataFrame([{"stage": "corpus"}]))
    column = 'n" INTEGER); DROP TABLE stage_runs; --'
    warehouse.append("stage_runs", pd.DataFrame([{"stage": "tokenizer", column: 1}]))
    rows = warehouse.query("SELECT * FROM stage_runs ORDER BY stage")
    assert list(rows.columns) == ["stage", column]
    assert rows["stage"].tolist() == ["corpus", "tokenizer"]


@pytest.mark.parametrize("table", ["gates; DROP TABLE manifest", "Gates", "a-b", "", "x" * 64])
def test_table_names_that_are_not_plain_identifiers_are_refused_before_any_sql(tmp_path, table):
    warehouse = Warehouse(tmp_path / "results.duckdb")
    with pytest.raises(ValueError, match="not a plain lower-case identifier"):
        warehouse.append(table, pd.DataFrame([{"a": 1}]))
    with pytest.raises(ValueError, match="not a plain lower-case identifier"):
        warehouse.replace(table, pd.DataFrame([{"a": 1}]), artifact_key="k")
    with pytest.raises(ValueError, match="not a plain lower-case identifier"):
        warehouse.update(table, {"a": 2}, {"a": 1})
    assert not warehouse.path.exists()


def test_update_binds_values_and_refuses_column_names_that_carry_sql(tmp_path):
    warehouse = Warehouse(tmp_path / "results.duckdb")
    warehouse.replace("manifest", pd.DataFrame([{"source": "a", "tokens": 0}, {"source": "b'; --", "tokens": 0}]), "k")
    warehouse.update("manifest", {"tokens": 7}, {"artifact_key": "k", "source": "b'; --"})
    rows = warehouse.query("SELECT source, tokens FROM manifest ORDER BY source")
    assert rows.to_dict("records") == [{"source": "a", "tokens": 0}, {"source": "b'; --", "tokens": 7}]
    with pytest.raises(ValueError, match="not a plain identifier"):
        warehouse.update("manifest", {'tokens" = 1; --': 1}, {"source": "a"})


def test_prefect_api_binds_to_loopback_unless_the_user_chooses_otherwise(tmp_path, monkeypatch):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_SERVER_API_HOST"}
    monkeypatch.setattr(os, "environ", env)
    RunsLayout.resolve(tmp_path / "runs").prepare_environment()
    assert env["PREFECT_SERVER_API_HOST"] == "127.0.0.1"
    env["PREFECT_SERVER_API_HOST"] = "10.0.0.5"
    RunsLayout.resolve(tmp_path / "runs").prepare_environment()
    assert env["PREFECT_SERVER_API_HOST"] == "10.0.0.5"


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, ast.unparse(node.func)


def test_external_commands_get_argument_lists_and_no_shell():
    """Every subprocess call in the platform passes a list (no shell parses config values into options)."""
    checked = 0
    for path in sorted(ROOT.glob("*/**/*.py")):
        top = path.parts[len(ROOT.parts)]
        if top == "tests" or (ROOT / top / "pyvenv.cfg").is_file():  # a venv: .venv, .venv-duckdb-cli (Makefile)
            continue
        for call, name in _calls(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(ROOT)}:{call.lineno}"
            assert name not in ("os.system", "os.popen"), where
            if name in ("subprocess.run", "subprocess.Popen", "subprocess.call", "subprocess.check_output",
                        "subprocess.check_call"):
                checked += 1
                assert not any(k.arg == "shell" for k in call.keywords), where
                first = call.args[0] if call.args else None
                assert isinstance(first, (ast.List, ast.Name)), f"{where}: pass the command as a list"
    assert checked >= 5  # deb.py, launch.py, pipeline.py's git and the benchmarks were seen
