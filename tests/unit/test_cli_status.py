"""`pretrain status --explain` says when nothing changed, and its explanations sit under the key column
(flows/cli.py ``status``)."""

from pathlib import Path

from typer.testing import CliRunner

import flows.status
from flows.cli import app
from flows.status import StageStatus

ROOT = Path(__file__).resolve().parents[2]


def _explain(monkeypatch, tmp_path, statuses) -> list[str]:
    monkeypatch.setattr(flows.status, "stage_statuses", lambda cfg, layout: statuses)
    result = CliRunner().invoke(app, ["status", str(ROOT / "configs/smoke.toml"), "--runs-dir", str(tmp_path),
                                      "--explain"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def test_nothing_changed_is_said(monkeypatch, tmp_path):
    lines = _explain(monkeypatch, tmp_path, [StageStatus("sources", "a" * 16, True, "p"),
                                             StageStatus("quality_model", "b" * 16, True, "p")])
    assert any("nothing changed since the cached artifacts" in line for line in lines)


def test_explanations_align_under_the_key_column(monkeypatch, tmp_path):
    lines = _explain(monkeypatch, tmp_path, [
        StageStatus("sources", "a" * 16, True, "p"),
        StageStatus("quality_ablation", "b" * 16, False, "p", nearest="c" * 16, reasons=["seed: 0 → 1"])])
    column = next(line for line in lines if line.startswith("quality_ablation")).index("b" * 16)
    nearest = next(line for line in lines if "nearest stored artifact" in line)
    reason = next(line for line in lines if "seed: 0 → 1" in line)
    assert nearest.index("nearest") == column and reason.index("seed") >= column
    assert not any("nothing changed" in line for line in lines)
