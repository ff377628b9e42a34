"""The CLI's quick answers (`--help` of every command, a config error) import none of the heavy stack: they cost a
fraction of a second of CPU, not the ~4 s of importing torch, MLflow and Prefect (benchmarks/cli_latency.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from flows.cli import app

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "mlflow", "prefect", "pandas", "scipy.stats", "numba", "transformers", "duckdb", "pyarrow",
         "great_expectations", "optuna", "ray", "accelerate", "sklearn", "tokenizers.trainers")

# Runs the CLI in a fresh interpreter and prints, at exit, which heavy modules were imported and the exit status.
PROBE = """
import json, sys
from flows.cli import app
heavy = {heavy!r}
try:
    code = app({argv!r}, standalone_mode=False) or 0  # click returns an Exit's code when not standalone
except SystemExit as exc:
    code = exc.code
except BaseException as exc:
    code = type(exc).__name__
print("PROBE " + json.dumps({{"code": code, "heavy": sorted(m for m in heavy if m in sys.modules)}}))
"""


def _probe(argv: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY, argv=argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert line is not None, f"no probe line:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return json.loads(line.removeprefix("PROBE "))


def _command_paths() -> list[list[str]]:
    """Every command and sub-command of the ``pretrain`` app, as argv prefixes."""
    group = typer.main.get_command(app)
    paths = []
    for name, command in group.commands.items():
        sub = getattr(command, "commands", None)
        paths += [[name, child] for child in sub] if sub else [[name]]
    return paths


def test_the_app_has_the_commands_users_know() -> None:
    names = {" ".join(p) for p in _command_paths()}
    assert {"run", "serve", "status", "gate declare", "gate show", "export", "eval", "plan", "fetch"} <= names


def test_top_level_help_imports_nothing_heavy() -> None:
    found = _probe(["--help"])
    assert found["heavy"] == [], found
    assert found["code"] in (0, None)


@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(p))
def test_each_command_help_imports_nothing_heavy(path: list[str]) -> None:
    found = _probe([*path, "--help"])
    assert found["heavy"] == [], f"`pretrain {' '.join(path)} --help` imported {found['heavy']}"


def test_a_config_error_imports_nothing_heavy_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nsources = {}\n[corpus]\nnear_dedupe = {}\n')
    found = _probe(["run", str(bad), "--runs-dir", str(tmp_path / "runs")])
    assert found == {"code": 2, "heavy": []}, found


def test_loading_the_shipped_configs_imports_nothing_heavy() -> None:
    code = ("import sys, json\nfrom flows.config import load_config\n"
            "for name in ('demo', 'smoke'):\n    load_config(f'configs/{name}.toml')\n"
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_run_help_names_every_stage_in_order() -> None:
    from flows.registry import stage_names

    doc = " ".join(typer.main.get_command(app).commands["run"].help.split())
    assert " → ".join(stage_names()) in doc
