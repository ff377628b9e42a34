"""The sweep stage on a tiny synthetic token corpus: widths, the peak-LR decision, spread, forecast, what publish
and the views show, and a study that grows."""

import json
import math

import numpy as np
import optuna
import pandas as pd
import pytest

from rich.console import Console

from infra.artifacts import Artifact
from infra.errors import DataError
from infra.report_blocks import Figure, TableBlock
from infra.runs import RunsLayout
from infra.stage import PublishContext, ReportContext, StageContext, SummaryContext
from infra.warehouse import Warehouse
from tasks.sweep.config import SweepConfig
from tasks.sweep.publish import publish
from evals.decision import DecisionRecord
from tasks.sweep.lr_fit import fit_lr
from tasks.sweep.stage import at_width, json_safe, lr_rule, lr_spread, run, width_entry
from tasks.sweep.study import SweepResult
from tasks.sweep.views import report, summary as summary_lines
from tasks.train.sections import ModelShape, ProxyConfig, RunBudget
from tests.unit.recording_progress import RecordingProgress
from tests.unit.test_train_stage import inputs  # noqa: F401  (fixture: tokenizer artifact + mixture choice)

optuna.logging.set_verbosity(optuna.logging.ERROR)
PROXY = ProxyConfig(model=ModelShape(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, seq_len=8),
                    budget=RunBudget(steps=6, batch_size=2, warmup_steps=1, eval_tokens=64))
CFG = SweepConfig(n_trials=3, lr_min=1e-3, lr_max=1e-1, report_every=1, widths=[32], pruner_startup_trials=10,
                  forecast_windows=[0.5, 0.9], spread_tolerance=0.05)


def _no_constant(name):
    raise AssertionError(f"best.json holds {name}")


def _run(tmp_path, inputs, name, cfg, children=None, **context):
    out = tmp_path / "runs" / "artifacts" / "sweep" / name
    out.mkdir(parents=True)
    ctx = StageContext(out=out, inputs=inputs, layout=RunsLayout(tmp_path / "runs"), key=name, experiment="t",
                       torch_threads=1, **context,
                       log_child=(lambda n, params, rows: children.append((n, params))) if children is not None
                       else (lambda *a: None))
    return run(ctx, cfg, PROXY, general=["a", "b"]), out


def test_widths_spread_forecast_and_a_growing_study(tmp_path, inputs):  # noqa: F811
    children = []
    summary, out = _run(tmp_path, inputs, "first", CFG, children)
    best = json.loads((out / "best.json").read_text(), parse_constant=_no_constant)  # no NaN or Infinity
    assert [w["d_model"] for w in best["widths"]] == [16, 32]
    assert best["best_lr"] == best["widths"][0]["best_lr"] == summary["best_lr"]  # the proxy width feeds main
    assert best["spread"]["lr_low"] <= best["best_trial_lr"] <= best["spread"]["lr_high"]
    assert 1 <= best["spread"]["n_within"] <= best["spread"]["n_complete"] <= 3
    # Three trials are fewer than the 10 the LR fit needs: undetermined, and the main run gets the best trial's LR.
    for entry in best["widths"]:
        assert entry["verdict"] == "undetermined" and entry["best_lr"] == entry["best_trial_lr"]
        assert entry["fit"]["n_trials"] + entry["fit"]["n_pruned"] <= 3
        assert entry["resolve"].startswith(f"needs >= 10 trials, has {entry['fit']['n_trials']}: raise sweep.n_trials")
        assert entry["fallback"] and entry["fit"]["optimum"] is None and entry["fit"]["reason"]
    decision = best["decision"]
    assert decision["kind"] == "peak_lr" and decision["verdict"] == "undetermined"
    assert (decision["units"], decision["min_units"]) == ("trials", 10)
    assert decision["n_units"] == best["widths"][0]["fit"]["n_trials"]
    assert decision["declared_at"] <= decision["decided_at"]
    assert decision["choice"] == f"{best['best_lr']:.4g}" and decision["evidence"]["table"] == "sweep_trials"
    drift = best["lr_drift"]
    assert drift["widths"] == [16, 32] and drift["ratio"] == pytest.approx(
        best["widths"][1]["best_lr"] / best["widths"][0]["best_lr"])
    assert drift["exponent"] is None and drift["reason"].startswith("needs ≥ 3 widths with a resolved optimum; got ")
    assert "lr_width_exponent" not in summary
    assert [d["kind"] for d in best["decisions"]] == ["lr_width_exponent"]
    assert best["decisions"][0]["verdict"] == "undetermined"
    _published_and_shown(tmp_path, out, best)
    assert [f["window"] for f in best["forecast"]] == [0.5, 0.9]
    assert all(f["points"] >= 3 and f["target_tokens"] == 6 * 2 * 8 for f in best["forecast"])
    assert best["forecast"][1]["actual"] == pytest.approx(best["best_value"])  # judged on the final loss
    assert len(children) == 6 and {p["d_model"] for _, p in children} == {16, 32}
    first = pd.read_parquet(out / "trials.parquet")

    # Raising n_trials continues both studies: the first three trials are kept, one more is run per width.
    summary, out = _run(tmp_path, inputs, "second", CFG.model_copy(update={"n_trials": 4}))
    second = pd.read_parquet(out / "trials.parquet")
    assert len(second) == 8 and set(second["study_name"]) == set(first["study_name"])
    kept = second.merge(first, on=["study_name", "number"], suffixes=("", "_before"))
    assert len(kept) == 6 and (kept["peak_lr"] == kept["peak_lr_before"]).all()


def test_the_trials_bar_counts_what_is_left_and_a_refreshed_sweep_starts_over(tmp_path, inputs):  # noqa: F811
    """A resumed study's finished trials are not on the bar (no bar when none is left); --refresh sweep runs every
    trial again."""
    cfg = CFG.model_copy(update={"widths": []})

    def bars(name, cfg, **context):
        progress, children = RecordingProgress(), []
        _run(tmp_path, inputs, name, cfg, children, progress=progress, **context)
        return [(b.description, b.total, b.done) for b in progress.bars], len(children)

    assert bars("first", cfg) == ([("sweep: Optuna trials", 3, 3)], 3)
    assert bars("again", cfg) == ([], 0)  # all 3 already complete: nothing to count
    assert bars("more", cfg.model_copy(update={"n_trials": 4})) == ([("sweep: Optuna trials", 1, 1)], 1)
    assert bars("refreshed", cfg, refresh=True) == ([("sweep: Optuna trials", 3, 3)], 3)


def _published_and_shown(tmp_path, out, best):
    """The artifact's decisions reach a real DuckDB warehouse and MLflow tags; the summary and report show them."""
    (out / "meta.json").write_text("{}")
    published = publish(PublishContext(Artifact("sweep", "k1", out, {}), {}, None, False))
    warehouse = Warehouse(tmp_path / "results.duckdb")
    for table, frame in published.tables.items():
        warehouse.replace(table, frame, "k1")
    rows = warehouse.query("SELECT kind, verdict, choice, evidence FROM decisions ORDER BY kind, evidence")
    assert rows["kind"].tolist() == ["lr_width_exponent", "peak_lr", "peak_lr"]
    assert sorted(json.loads(e)["d_model"] for e in rows["evidence"][1:]) == [16, 32]
    assert published.tags["decision.peak_lr.verdict"] == "undetermined"
    assert published.tags["decision.peak_lr.d32.verdict"] == "undetermined"
    assert published.tags["decision.lr_width_exponent.verdict"] == "undetermined"

    console = Console(record=True, width=400)
    for item in summary_lines(SummaryContext(path=out, paths={"sweep": out}, layout=RunsLayout(tmp_path / "runs"))):
        console.print(item)
    shown = console.export_text()
    assert f"Peak LR: {best['best_lr']:.3e} — the main run trains at it, from the d16 sweep: its best trial" in shown
    # the fallback and what would settle it are the closing decisions block's, said once
    assert "— undetermined" in shown and "to resolve" not in shown
    assert "no width exponent: needs ≥ 3 widths" in shown and "d_model^" not in shown
    blocks = report(ReportContext(path=out, paths={"sweep": out}, layout=RunsLayout(tmp_path / "runs"),
                                  warehouse=warehouse, plots_dir=tmp_path))
    (figure,) = [b for b in blocks if isinstance(b, Figure)]
    assert figure.path.name == "sweep_lr_fit.png" and figure.path.stat().st_size > 0
    table = next(b for b in blocks if isinstance(b, TableBlock) and b.title.startswith("Peak LR per width"))
    assert table.frame["verdict"].tolist() == ["undetermined", "undetermined"]


def test_width_scaling_and_spread_rules():
    wide = at_width(PROXY.model, 64)
    assert (wide.d_model, wide.d_ff, wide.n_heads) == (64, 128, 2)
    with pytest.raises(DataError, match="multiple of n_heads"):
        at_width(PROXY.model, 33)
    trials = pd.DataFrame({"state": ["COMPLETE", "COMPLETE", "COMPLETE", "PRUNED"], "value": [2.0, 2.03, 2.5, None],
                           "peak_lr": [1e-3, 3e-3, 1e-2, 1e-4]})
    assert lr_spread(trials, 0.02) == {"tolerance": 0.02, "best_value": 2.0, "lr_low": 1e-3, "lr_high": 3e-3,
                                       "n_within": 2, "n_complete": 3}


def _entry(lrs, losses):
    """One width's ``best.json`` entry from synthetic COMPLETE trials, through the rule and the decision record."""
    cfg = SweepConfig(lr_min=1e-4, lr_max=1e-1, report_every=1)
    trials = pd.DataFrame({"state": "COMPLETE", "peak_lr": lrs, "value": losses})
    best = int(np.argmin(losses))
    result = SweepResult(float(lrs[best]), float(losses[best]), "s", trials)
    rule = lr_rule(cfg)
    declared = DecisionRecord.declare("peak_lr", rule=rule.text(cfg.lr_min, cfg.lr_max),
                                      rule_config=rule.config(cfg.lr_min, cfg.lr_max))
    fit = fit_lr(trials, lr_min=cfg.lr_min, lr_max=cfg.lr_max, confidence=cfg.confidence, seed=0)
    return json.loads(json.dumps(json_safe(width_entry(16, result, fit, rule, declared, cfg, "k")), allow_nan=False))


def test_a_decided_peak_lr_records_its_trials_and_an_unresolved_one_leaves_its_interval_out():
    lrs = np.geomspace(1e-4, 1e-1, 12)
    u = np.log(lrs / 3e-3)
    decided = _entry(lrs, 3.0 + 0.05 * u**2 + 0.004 * u**3 + np.random.default_rng(0).normal(0, 0.005, 12))
    record = decided["decision"]
    assert decided["verdict"] == record["verdict"] == "decided" and decided["lr_source"] == "fit"
    assert (record["n_units"], record["units"], record["min_units"]) == (12, "trials", 10)
    assert record["low"] <= record["estimate"] == decided["best_lr"] <= record["high"]
    assert "Fieller" in record["rule"] and "≥ 10 COMPLETE trials" in record["rule"]

    flat = _entry(lrs, 3.0 + np.random.default_rng(1).normal(0, 0.01, 12))
    record = flat["decision"]
    assert flat["verdict"] == "undetermined" and "the minimum is not resolved" in flat["resolve"]
    assert "low" not in record and "high" not in record and record["evidence"]["no_interval"]
    assert flat["fit"]["interval"] == [None, None] and flat["fit"]["bounded"] is False
    read = DecisionRecord.from_dict(record)
    assert math.isnan(read.low) and "peak_lr: " in read.line()
