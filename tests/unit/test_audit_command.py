"""`pretrain audit` runs what it needs first: the chain up to the quality classifier when the runs folder does not
hold it yet, through the same `pretrain run` (stubbed here: the real chain runs in tests/e2e)."""

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.runs import RunsLayout

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def audit_cli(tmp_path, monkeypatch):
    """(app, runs folder, calls of `pretrain run`) with the audit flow stubbed; the environment is restored after."""
    saved = dict(os.environ)
    layout = RunsLayout.resolve(str(tmp_path / "runs"))
    layout.prepare_environment()  # before Prefect is imported, as the command does
    import flows.audit
    import flows.cli

    calls = []
    monkeypatch.setattr(flows.cli, "run", lambda config, **options: calls.append((config, options)))
    monkeypatch.setattr(flows.audit, "audit", lambda *args, **kwargs: {"experiment": "smoke", "sources": {}})
    monkeypatch.chdir(ROOT)
    yield flows.cli.app, layout.root, calls
    os.environ.clear()
    os.environ.update(saved)


def test_audit_runs_the_chain_up_to_the_classifier_first_and_says_so(audit_cli):
    app, runs, calls = audit_cli
    result = CliRunner().invoke(app, ["audit", "configs/smoke.toml", "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    assert calls == [(Path("configs/smoke.toml"), {"runs_dir": str(runs), "refresh": [], "until": "quality_model",
                                                   "dry_run": False, "tracking_uri": None, "verbose": False})]
    assert "running `pretrain run configs/smoke.toml --until quality_model` first" in " ".join(result.output.split())


def test_audit_without_a_trained_classifier_runs_nothing_first(audit_cli, tmp_path):
    app, runs, calls = audit_cli
    text = (ROOT / "configs" / "smoke.toml").read_text()
    assert "[corpus.quality_model]\nenabled = true\n" in text
    config = tmp_path / "no-classifier.toml"
    config.write_text(text.replace("[corpus.quality_model]\nenabled = true\n", "[corpus.quality_model]\nenabled = "
                                   "false\n", 1).replace("\nablate = true\n", "\nablate = false\n", 1))
    result = CliRunner().invoke(app, ["audit", str(config), "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    assert calls == [] and "pretrain run" not in result.output
