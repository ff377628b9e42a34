"""End to end: a context extension of the smoke run's main model, 64 → 256 tokens (docs/methods.md §15).

``configs/smoke_context.toml`` is the smoke config with another [cpt] and [gate], so in a copy of the smoke runs
folder the chain up to main is reused and only the extension grid (three position recipes), its gate and the export
run. Then: each candidate is cached on its own (a recipe added to the grid trains alone), a config whose long sources
cannot supply long documents is refused with the figures, and the declared concatenation is labelled in every
table.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from conftest import ROOT, pretrain, stage_status
from gate_checks import implied_verdict

pytestmark = pytest.mark.e2e

UPSTREAM = ("sources", "quality_model", "corpus", "tokenizer", "mixture", "quality_ablation", "sweep", "ladder", "main",
            "branches")


def _latest(runs: Path, stage: str) -> Path:
    """The newest complete artifact of ``stage``."""
    done = [p for p in (runs / "artifacts" / stage).iterdir() if (p / "_COMPLETE").exists()]
    return max(done, key=lambda p: p.stat().st_mtime)


def _edited(tmp_path: Path, name: str, edits: dict[str, str]) -> Path:
    text = (ROOT / "configs" / "smoke_context.toml").read_text()
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def context_runs(smoke_runs, tmp_path_factory) -> dict:
    runs = tmp_path_factory.mktemp("context") / "runs"
    shutil.copytree(smoke_runs["runs"], runs)
    first = pretrain("run", "configs/smoke_context.toml", runs=runs)
    return {"runs": runs, "first": first}


def test_the_extension_reuses_the_chain_up_to_main_and_reports_each_recipe(context_runs):
    out = context_runs["first"].stdout
    status = stage_status(out)
    assert all(status[s] == "cached" for s in UPSTREAM), status
    assert status["cpt"] == status["gate"] == status["export"] == "ran"
    assert "3 candidate(s) trained, 0 reused" in out
    for title in ("Context extension candidates", "Held-out loss by token position", "Passkey retrieval by prompt"):
        assert title in out
    for recipe in ("pi_replay0.25", "abf_replay0.25", "none_replay0.25"):
        assert recipe in out
    assert "long stream (natural)" in out


def test_candidates_carry_their_rope_and_window_in_checkpoints_and_tables(context_runs):
    runs = context_runs["runs"]
    cpt = _latest(runs, "cpt")
    saved = {p.name: json.loads((p / "state.json").read_text())["model_config"] for p in (cpt / "candidates").iterdir()}
    assert {n.split("_")[0] for n in saved} == {"pi", "abf", "none"}
    for name, model in saved.items():
        assert model["seq_len"] == 256
        recipe = name.split("_")[0]
        assert model.get("rope_scaling_factor", 1.0) == (4.0 if recipe == "pi" else 1.0)
        assert model["rope_theta"] == (500000.0 if recipe == "abf" else 10000.0)
    with duckdb.connect(str(runs / "results.duckdb"), read_only=True) as db:
        key = cpt.name
        position = db.execute("SELECT * FROM context_position_loss WHERE artifact_key = ?", [key]).df()
        retrieval = db.execute("SELECT * FROM context_retrieval WHERE artifact_key = ?", [key]).df()
        supply = db.execute("SELECT * FROM context_supply WHERE artifact_key = ?", [key]).df()
    assert set(position["checkpoint"]) == {"base", *saved}
    assert sorted(set(zip(position["bucket_start"], position["bucket_end"]))) == [
        (0, 16), (16, 32), (32, 64), (64, 128), (128, 256)]
    assert (position["ci_low"] <= position["loss_nats"]).all() and (position["loss_nats"] <= position["ci_high"]).all()
    assert set(position["construction"]) == set(retrieval["construction"]) == set(supply["construction"]) == {"natural"}
    overall = retrieval[retrieval["depth"] == "all"]
    assert sorted(set(overall["length"])) == [128, 256]  # 64 tokens cannot hold a prompt and 16 filler tokens
    assert (overall["n"] == 12).all()  # 6 prompts × 2 depths per length
    assert ((overall["ci_low"] <= overall["accuracy"]) & (overall["accuracy"] <= overall["ci_high"])).all()
    assert set(supply["source"]) == {"handbook_en", "python_doc"}
    assert (supply["long_token_share"] >= 0.5).all() and (supply["beyond_window_tokens"] > 0).all()


def test_the_gate_judges_long_loss_retrieval_and_forgetting_and_the_export_keeps_the_rope(context_runs):
    runs = context_runs["runs"]
    gate = _latest(runs, "gate")
    table = pd.read_parquet(gate / "decisions.parquet")
    for column in ("long_loss_reduction_nats", "long_loss_reduction_nats_docs", "retrieval_accuracy_delta@256",
                   "retrieval_accuracy@256_ci_low", "status_retrieval", "status_long_context",
                   "status_short_forgetting", "param_recipe"):
        assert column in table.columns, column
    assert set(table["param_recipe"]) == {"pi", "abf", "none"}
    decision = json.loads((gate / "decision.json").read_text())
    verdict = implied_verdict(table, decision, ROOT / "configs" / "smoke_context.toml")
    if verdict == "undetermined":  # what would resolve it is named
        assert decision["decision"]["fallback"] == "keep the base" and decision["decision"]["resolve"]
    assert "gate:" in context_runs["first"].stdout
    kept = decision["kept"]
    export = json.loads((_latest(runs, "export") / "model" / "config.json").read_text())
    rope = export.get("rope_parameters") or {}
    if kept.startswith("pi_"):
        assert rope == {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    else:
        assert rope.get("rope_type") == "default"
        assert rope.get("rope_theta") == (500000.0 if kept.startswith("abf_") else 10000.0)
    assert export["max_position_embeddings"] == (64 if kept == "base" else 256)


def test_the_documented_context_queries_run_and_return_rows(context_runs):
    import re

    queries = re.findall(r"```sql context\n(.*?)```", (ROOT / "docs" / "duckdb.md").read_text(), re.S)
    assert queries
    with duckdb.connect(str(context_runs["runs"] / "results.duckdb"), read_only=True) as db:
        for query in queries:
            rows = db.execute(query).fetchall()
            assert rows and {r[0] for r in rows} >= {"base"}, query


def test_each_candidate_is_cached_on_its_own(context_runs, tmp_path):
    runs = context_runs["runs"]
    before = pd.read_parquet(_latest(runs, "gate") / "decisions.parquet")
    # A recipe added to the grid trains alone; the others are reused and keep their scores and their gate rows.
    grown = _edited(tmp_path, "grown", {'  { name = "none", position = "none" },\n':
                                        '  { name = "none", position = "none" },\n'
                                        '  { name = "pi2", position = "interpolation", factor = 2.0 },\n'})
    more = pretrain("run", str(grown), runs=runs)
    assert "1 candidate(s) trained, 3 reused" in more.stdout
    after = pd.read_parquet(_latest(runs, "gate") / "decisions.parquet")
    assert set(after["candidate"]) == set(before["candidate"]) | {"pi2_replay0.25_lr0.003"}
    shared = after[after["candidate"].isin(before["candidate"])].drop(columns="kept").reset_index(drop=True)
    pd.testing.assert_frame_equal(before.drop(columns="kept"), shared)
    # Changing only the evaluation re-scores every candidate without training any.
    rescored = _edited(tmp_path, "rescored", {"retrieval_items = 6": "retrieval_items = 5"})
    assert "0 candidate(s) trained, 3 reused from the candidate cache (runs/cache/cpt), 3 scored anew" in pretrain(
        "run", str(rescored), runs=runs).stdout


def test_sources_without_long_documents_are_refused_with_the_figures(context_runs, tmp_path):
    # The fixture's fortune files hold about 85% of their tokens in documents longer than 64 tokens: not 95%.
    config = _edited(tmp_path, "short", {'long_sources = ["handbook_en", "python_doc"]':
                                         'long_sources = ["fortunes_en"]\nmin_long_token_share = 0.95'})
    env = {**os.environ, "PRETRAIN_RUNS_DIR": str(context_runs["runs"]), "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(config)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode != 0
    message = proc.stdout + proc.stderr
    assert "fortunes_en" in message and "concatenate" in message
    assert re.search(r"fortunes_en \(natural\): [\d,]+ documents, [\d,]+ longer than", message)  # counted


def test_a_declared_concatenation_is_labelled_in_every_table(context_runs, tmp_path):
    config = _edited(tmp_path, "joined", {
        'target_seq_len = 256\n': 'target_seq_len = 256\nconstruction = "concatenate"\n',
        # fortunes are mostly shorter than a 257-token row: they are joined
        'long_sources = ["handbook_en", "python_doc"]': 'long_sources = ["handbook_en", "fortunes_en"]',
        '  { name = "abf", position = "rope_base", rope_theta = 500000.0 },\n  { name = "none", position = "none" },\n':
            ""})
    runs = context_runs["runs"]
    proc = pretrain("run", str(config), "--until", "cpt", runs=runs)
    assert "long stream (concatenated)" in proc.stdout
    cpt = _latest(runs, "cpt")
    for name in ("position_loss", "retrieval", "context_supply", "long_documents"):
        assert set(pd.read_parquet(cpt / f"{name}.parquet")["construction"]) == {"concatenated"}, name
    members = pd.read_parquet(cpt / "long_documents.parquet")
    assert (members.loc[members["source"] == "fortunes_en", "n_docs"] > 1).any()
    assert set(members["split"]) == {"train", "heldout"}
    joined = members[members["split"] == "train"]
    for source, rows in joined.groupby("source"):  # every document of the source in exactly one joined document
        first = rows["first_doc"].to_numpy()
        assert first[0] == 0 and (first[1:] == (first + rows["n_docs"].to_numpy())[:-1]).all(), source
