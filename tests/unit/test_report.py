"""`pretrain report`: rendering of hand-built blocks, and a runs folder where no stage has completed yet."""

import base64
import re
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from flows.config import load_config
from tasks.corpus.plots import plot_s_curve
from flows.report import (Figure, Heading, Report, TableBlock, Text, build_report, print_report, resolve_formats,
                          to_markdown, write_report)
from infra.errors import ConfigError
from infra.runs import RunsLayout

ROOT = Path(__file__).resolve().parents[2]


def _report(tmp_path: Path) -> Report:
    (tmp_path / "plots").mkdir()
    figure = plot_s_curve(14, 8, 0.8, tmp_path / "plots" / "s_curve.png")
    frame = pd.DataFrame({"rule": ["a|b", "c"], "documents": [1234, 5], "share": [0.5, 0.001]})
    return Report("tiny", [], [Heading("Corpus"), Text("**Kept** 3"), TableBlock("Removals", frame),
                               Figure(figure, "S-curve")])


def test_markdown_tables_escape_pipes_and_format_numbers(tmp_path):
    md = to_markdown(_report(tmp_path), lambda p: f"plots/{p.name}")
    assert "## Corpus" in md and "**Kept** 3" in md
    assert "| rule | documents | share |" in md
    assert "|---|---:|---:|" in md
    assert "| a\\|b | 1,234 | 0.5000 |" in md
    assert "| c | 5 | 1.0e-03 |" in md
    assert "![S-curve](plots/s_curve.png)" in md


def test_written_files_link_and_embed_the_figures(tmp_path):
    report = _report(tmp_path)
    md_path, html_path = write_report(report, tmp_path)
    assert "](plots/s_curve.png)" in md_path.read_text()
    html = html_path.read_text()
    (encoded,) = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert base64.b64decode(encoded) == (tmp_path / "plots" / "s_curve.png").read_bytes()
    assert "<table>" in html and "<td>a|b</td>" in html


def test_formats_are_checked():
    assert resolve_formats(None) == ("md", "html") and resolve_formats("html") == ("html",)
    with pytest.raises(ConfigError, match="--format 'pdf' is not one of"):
        resolve_formats("pdf")


def test_a_runs_folder_without_artifacts_reports_every_stage_missing(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the config's relative paths (local sources, cloze files)
    cfg = load_config(ROOT / "configs/smoke.toml")
    layout = RunsLayout(tmp_path / "runs")
    report = build_report(cfg, layout, tmp_path / "out" / "plots")
    assert report.missing == ["sources", "quality_model", "corpus", "tokenizer", "mixture", "quality_ablation",
                              "sweep", "ladder", "main", "branches", "cpt", "gate", "export"]
    assert [b.text for b in report.blocks if isinstance(b, Heading)] == ["Lineage"]
    assert not layout.root.exists()  # reading creates no runs folder
    md_path, _ = write_report(report, tmp_path / "out")
    assert ("**Missing stages:** sources, quality_model, corpus, tokenizer, mixture, quality_ablation, sweep, ladder, "
            "main, branches, cpt, gate, export."
            in md_path.read_text())
    console = Console(record=True, width=200)
    print_report(report, console)
    assert "Missing stages: sources, quality_model, corpus" in console.export_text()
