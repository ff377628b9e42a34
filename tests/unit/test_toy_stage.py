"""A stage defined in one folder and registered with one line runs through the real flow: Prefect task, artifact
with its marker, nested MLflow run, DuckDB rows, a cached rerun, and its own sections of the console summary and
the report. Its scratch folder outlives a commit that fails and is removed by the pipeline once one succeeds."""

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]

RUN = """
import json, os, sys
if os.environ.get("TOY_FAIL_COMMIT"):  # the commit fails as a kill or a full disk would make it
    from infra.artifacts import ArtifactStore
    real = ArtifactStore.commit
    def failing(self, stage, key, tmp, meta):
        if stage == "wordcount":
            raise OSError("commit failed on purpose")
        return real(self, stage, key, tmp, meta)
    ArtifactStore.commit = failing
from flows.registry import register
from tests.unit.toy_stage.definition import STAGE
register(STAGE, after="sources")
from infra.runs import RunsLayout
RunsLayout.resolve(sys.argv[1]).prepare_environment()
from flows.pipeline import pipeline
result = pipeline("configs/smoke.toml", sys.argv[1], until="wordcount")
from rich.console import Console
from flows.summary import print_summary
console = Console(record=True, width=200)
print_summary(result, RunsLayout.resolve(sys.argv[1]), console)
from pathlib import Path
from flows.config import load_config
from flows.report import build_report, to_markdown
report = build_report(load_config("configs/smoke.toml"), RunsLayout.resolve(sys.argv[1]), Path(sys.argv[1]) / "plots")
print("RESULT", json.dumps({"cached": result["cached"], "keys": result["keys"], "summary": console.export_text(),
                            "report": to_markdown(report, lambda p: p.name)}))
"""


def _run(runs: Path, fail_commit: bool = False) -> dict:
    import json

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "TOY_"))}
    if fail_commit:
        env["TOY_FAIL_COMMIT"] = "1"
    proc = subprocess.run([sys.executable, "-c", RUN, str(runs)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    if fail_commit:
        assert proc.returncode != 0 and "commit failed on purpose" in proc.stdout + proc.stderr
        return {}
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return {**json.loads(line.removeprefix("RESULT ")), "stdout": proc.stdout}


def test_a_registered_toy_stage_runs_through_the_real_flow(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, fail_commit=True)
    (journal,) = (runs / "scratch" / "wordcount").glob("*/journal.txt")  # the failed commit left it
    assert not list((runs / "artifacts" / "wordcount").glob("*/_COMPLETE"))

    first = _run(runs)
    assert first["cached"] == {"sources": True, "wordcount": False}
    key = first["keys"]["wordcount"]
    assert journal.parent.name == key
    artifact = runs / "artifacts" / "wordcount" / key
    assert (artifact / "_COMPLETE").is_file() and (artifact / "word_counts.parquet").is_file()
    meta = json.loads((artifact / "meta.json").read_text())
    assert meta["summary"]["resumed"] is True  # the attempt after the failed commit found the journal
    assert (f"wordcount: resuming after an interrupted attempt, which left 1 file(s) (0.0 MiB) in "
            f"scratch/wordcount/{key}") in first["stdout"]
    assert not journal.parent.exists()  # removed by the pipeline after the commit

    with duckdb.connect(str(runs / "results.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT source, n_words FROM toy_word_counts WHERE artifact_key = ?", [key]).fetchall()
        stages = con.execute("SELECT stage FROM stage_runs ORDER BY recorded_at").fetchall()
    assert len(rows) == 5 and all(n > 0 for _, n in rows)
    assert [s for (s,) in stages] == ["sources", "sources", "wordcount"]  # the failed run published sources

    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    runs_of_stage = client.search_runs([client.get_experiment_by_name("smoke").experiment_id],
                                       filter_string="tags.stage = 'wordcount'", order_by=["attributes.start_time"])
    assert [r.info.status for r in runs_of_stage] == ["FAILED", "FINISHED"]
    run = runs_of_stage[1]
    assert run.data.tags["artifact_key"] == key and run.data.params["toy.sources"] == "5"
    assert {f"words.{source}" for source, _ in rows} <= set(run.data.metrics)
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["word_counts.parquet"]

    total = sum(n for _, n in rows)
    assert f"Word counts: {total:,} words in 5 sources" in first["summary"]
    # a run stopped after the toy stage lists the built-in sections it did not reach
    assert "not run this time: quality_model, corpus, tokenizer, mixture, quality_ablation, sweep, ladder, main, branches, cpt, gate" in first["summary"]
    assert "## Word counts" in first["report"] and "**Words per source**" in first["report"]
    assert "| source | n_docs | n_words |" in first["report"]

    again = _run(runs)
    assert "resuming" not in again["stdout"]
    assert again["cached"] == {"sources": True, "wordcount": True} and again["keys"] == first["keys"]
