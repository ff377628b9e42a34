"""``pretrain plan`` of a context extension (docs/methods.md §15): the extension grid is planned at the target
window T', with its tokens, FLOPs per token (+6·L·d·(T' − T)), attention share and activations at T'; a domain
adaptation config plans exactly as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.config import load_config
from flows.plan import build_plan, experiment_plan, load_plan
from infra.errors import ConfigError
from models.arithmetic import flops_per_token, training_flops
from models.context import extended_config
from models.planning import activation_bytes, memory_fit

SMOKE = Path("configs/smoke.toml")
TARGET = 256
RECIPES = [{"name": "pi", "position": "interpolation"},
           {"name": "abf", "position": "rope_base", "rope_theta": 5e5},
           {"name": "none", "position": "none"}]
EXTENSION = {"cpt.kind": "context_extension", "cpt.seeds": [0, 1],
             "cpt.context": {"target_seq_len": TARGET, "long_sources": ["handbook_en", "python_doc"],
                             "recipes": RECIPES}}
RUN = "cpt context extension"


def _number(text: str) -> int:
    return int(text.split()[0].replace(",", ""))


@pytest.fixture(scope="module")
def extension():
    cfg = load_config(SMOKE, EXTENSION)
    plan = experiment_plan(cfg)
    return cfg, plan, build_plan(plan)


def _table(tables, title_start: str):
    (table,) = [t for t in tables if t.title.startswith(title_start)]
    return {label: (value, note) for label, value, note in table.rows}


def test_extension_run_tokens_and_shape(extension):
    cfg, plan, tables = extension
    base = plan.model
    assert base.seq_len == cfg.main.model.seq_len == 64 and base.vocab_size == 1024
    run = plan.runs[1]
    candidates = 3 * len(cfg.cpt.replay_fractions) * len(cfg.cpt.peak_lrs) * 2
    assert candidates == 24
    assert run.tokens == candidates * cfg.cpt.budget.steps * cfg.cpt.budget.batch_size * TARGET
    shapes = [extended_config(base, TARGET, recipe) for recipe in cfg.cpt.context.recipes]
    assert run.model in shapes and run.model.seq_len == TARGET
    assert len({flops_per_token(s) for s in shapes}) == 1  # the recipe does not change the arithmetic
    compute = _table(tables, f"{RUN}: compute and time ({run.tokens:.3g} tokens")
    assert compute["training FLOPs"][0] == f"{training_flops(run.model, run.tokens):.4g}"
    assert compute["candidates"][0].startswith("24 = 3 recipes × 2 replay fractions × 2 peak LRs × 2 seeds")
    for recipe in cfg.cpt.context.recipes:
        assert compute[f"recipe {recipe.name}"][0] == recipe.describe(base, TARGET)


def test_window_table_at_the_longer_window(extension):
    _, plan, tables = extension
    base, ext = plan.model, plan.runs[1].model
    window = _table(tables, f"{RUN}: context window 64 → {TARGET} tokens")
    short = _number(window["FLOPs per token at T = 64"][0])
    long = _number(window[f"FLOPs per token at T' = {TARGET}"][0])
    assert short == flops_per_token(base) and long == flops_per_token(ext)
    assert long - short == 6 * base.n_layers * base.d_model * (TARGET - 64)
    for label, shape, per_token in (("T = 64", base, short), (f"T' = {TARGET}", ext, long)):
        share = 6 * shape.n_layers * shape.d_model * shape.seq_len / per_token
        assert window[f"attention FLOPs share at {label}"][0] == f"{share:.2%}"
    assert float(window[f"attention FLOPs share at T' = {TARGET}"][0].rstrip("%")) > \
        float(window["attention FLOPs share at T = 64"][0].rstrip("%"))
    act_short = _number(window["activations at T = 64"][0])
    act_long = _number(window[f"activations at T' = {TARGET}"][0])
    assert act_long == activation_bytes(ext, 8) and act_short == activation_bytes(base, 8)
    assert act_long == act_short * TARGET // 64


def test_extension_memory_is_at_the_longer_window(extension):
    _, plan, tables = extension
    ext = plan.runs[1].model
    memory = _table(tables, f"{RUN}: memory per device")
    fit = memory_fit(ext, micro_batch=8, device_gb=80.0, zero_stage=0, ranks=1)
    assert memory["model states, ZeRO-0"][1] == "← chosen: " + fit.describe()
    assert fit.activations == activation_bytes(ext, 8)
    parallel = _table(tables, f"{RUN}: parallelism and recovery")
    assert parallel["if tensor-parallel"][0].startswith(f"{2 * TARGET * 8 * ext.d_model:,} B per all-reduce")


def test_main_run_is_planned_as_without_the_extension(extension):
    _, _, tables = extension
    plain = build_plan(load_plan(SMOKE))
    assert [(t.title, t.rows) for t in tables if not t.title.startswith(RUN)] == [(t.title, t.rows) for t in plain]


def test_domain_adaptation_plan_is_unchanged():
    tables = build_plan(load_plan(SMOKE))
    assert load_config(SMOKE).cpt.kind == "domain_adaptation"
    # the committed tables of configs/smoke.toml
    expected = [
        ("Model", ["parameters", "blocks", "embedding"]),
        ("main: compute and time (8.19e+03 tokens, 1 × H100-SXM)",
         ["training FLOPs", "6ND shortcut", "GPU-hours", "elapsed", "elapsed at MFU 30%", "elapsed at MFU 40%",
          "elapsed at MFU 50%"]),
        ("main: memory per device (ZeRO-0, micro-batch 8)",
         ["model states, ZeRO-0", "model states, ZeRO-1", "model states, ZeRO-2", "model states, ZeRO-3",
          "total with full checkpointing", "on this machine"]),
        ("main: parallelism and recovery", ["global batch", "if tensor-parallel", "checkpoint interval",
                                            "checkpoint size"]),
        ("Chinchilla allocation (L = 1.69 + 406.4/N^0.34 + 410.7/D^0.28, C6 = 6ND)",
         ["law", "this run", "same-compute optimum", "20 tokens/param", "equal-loss optimum"]),
    ]
    assert [t.title for t in tables] == [title for title, _ in expected]
    for table, (_, labels) in zip(tables, expected):
        got = [label for label, _, _ in table.rows]
        assert len(got) == len(labels) and all(g.startswith(w) for g, w in zip(got, labels)), table.title
    rows = {label: value for t in tables for label, value, _ in t.rows}
    assert (rows["parameters"], rows["training FLOPs"]) == ("57,504", "3.028e+09")


def test_a_recipe_that_cannot_extend_the_main_model_is_refused():
    smaller = {**EXTENSION, "cpt.context": {**EXTENSION["cpt.context"], "recipes": [
        {"name": "abf", "position": "rope_base", "rope_theta": 5000.0}]}}
    # Refused when the config loads, before any plan (or run) is made.
    with pytest.raises(ConfigError, match="recipe abf: rope_theta = 5000 is not larger than the base's 10000"):
        experiment_plan(load_config(SMOKE, smaller))


def test_cli_plan_shows_the_extension(tmp_path):
    text = SMOKE.read_text(encoding="utf-8")
    anchor = 'domain_sources = ["python_doc"]\n'
    assert text.count(anchor) == 1 and text.count("[gate]") == 1
    context = (f"[cpt.context]\ntarget_seq_len = {TARGET}\nlong_sources = [\"handbook_en\"]\n"
               "recipes = [{ name = \"pi\", position = \"interpolation\", factor = 4.0 }]\n\n[gate]")
    config = tmp_path / "context.toml"
    config.write_text(text.replace(anchor, 'kind = "context_extension"\n').replace("[gate]", context),
                      encoding="utf-8")
    result = CliRunner().invoke(app, ["plan", str(config), "--json", "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    rows = {(r["section"].split(":")[0], r["label"]): r["value"] for r in json.loads(result.output)}
    assert rows[(RUN, "recipe pi")] == "position interpolation ×4 (positions / 4), θ 10000"
    assert rows[(RUN, f"FLOPs per token at T' = {TARGET}")] == "443,328"
    assert rows[(RUN, "candidates")].startswith("4 = 1 recipe × 2 replay fractions × 2 peak LRs × 1 seed")
