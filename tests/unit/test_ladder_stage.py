"""The ladder stage on a tiny synthetic token corpus, and its forecast's record in a real DuckDB file: rungs at the
main run's LR rule, cached per rung, a reduced fit with an undetermined verdict, an append-only ``forecasts`` table,
and the check against the main run's held-out loss (docs/methods.md §5)."""

import json
import re
import time

import pandas as pd
import pytest

from flows.forecasts import check_forecast, record_forecast
from infra.artifacts import Artifact
from infra.runs import RunsLayout
from infra.stage import PublishContext, StageContext, SummaryContext
from infra.warehouse import Warehouse
from tasks.ladder.config import LadderConfig
from tasks.ladder.definition import check_ladder, key_ladder
from tasks.ladder.publish import publish
from tasks.ladder.rungs import rung_budget, rung_peak_lr, rung_shape
from tasks.ladder.stage import run
from tasks.ladder.views import summary
from tasks.main.stage import main_peak_lr
from tasks.train.sections import MainConfig, ModelShape, ProxyConfig, RunBudget
from tests.unit.test_train_stage import inputs  # noqa: F401  (fixture: tokenizer artifact + mixture choice)

MAIN = MainConfig(model=ModelShape(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, seq_len=8),
                  budget=RunBudget(steps=6, batch_size=2, warmup_steps=1, eval_tokens=64))
PROXY = ProxyConfig(model=MAIN.model, budget=RunBudget(steps=4, batch_size=4, warmup_steps=1, eval_tokens=64))
LADDER = LadderConfig(enabled=True, widths=[8, 12], steps=[3, 6], bootstrap=20)
BEST = {"best_lr": 1e-2, "study_name": "s16", "widths": [{"d_model": 16, "best_lr": 1e-2, "study_name": "s16"},
                                                          {"d_model": 8, "best_lr": 3e-3, "study_name": "s8"}]}


@pytest.fixture
def ladder_inputs(inputs, tmp_path):  # noqa: F811
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "best.json").write_text(json.dumps(BEST))
    return {**inputs, "sweep": sweep}


def _run(tmp_path, inputs, name, cfg=LADDER, children=None):
    out = tmp_path / "runs" / "artifacts" / "ladder" / name
    out.mkdir(parents=True)
    ctx = StageContext(out=out, inputs=inputs, layout=RunsLayout(tmp_path / "runs"), key=name, experiment="t",
                       torch_threads=1,
                       log_child=(lambda n, params, rows: children.append((n, params, rows))) if children is not None
                       else (lambda *a: None))
    return run(ctx, cfg, MAIN, PROXY, general=["a", "b"]), out


def test_rungs_follow_the_main_run_and_a_two_by_two_ladder_is_undetermined(tmp_path, ladder_inputs):
    children = []
    summary_, out = _run(tmp_path, ladder_inputs, "first", children=children)
    points = pd.read_parquet(out / "points.parquet")
    forecast = json.loads((out / "forecast.json").read_text())
    assert list(zip(points["width"], points["steps"])) == [(8, 3), (8, 6), (12, 3), (12, 6)]
    # The main run's LR rule at each rung's width: d8 → the d8 study, d12 → the nearer d16 study (by ratio).
    assert dict(zip(points["width"], points["peak_lr"])) == {8: 3e-3, 12: 1e-2}
    assert (points["tokens"] == points["steps"] * 2 * 8).all() and (points["batch_size"] == 2).all()
    assert (points["n_params"] < points["n_params_total"]).all() and not points["held_out"].any()
    assert points["loss_nats"].notna().all() and (points["excluded"] == "").all()
    assert summary_["verdict"] == "undetermined" and summary_["rungs_trained"] == 4
    assert forecast["fit"]["form"] == "shared_exponent_no_floor" and forecast["decision"]["kind"] == "forecast"
    assert forecast["decision"]["fallback"] == "the forecast is recorded but not trusted"
    assert forecast["target"]["tokens"] == 6 * 2 * 8 and forecast["target"]["general_sources"] == ["a", "b"]
    assert len(forecast["forecast_hash"]) == 64
    # Standard JSON: undefined numbers (no held-out rung's error, no backtest) are null, with the reason beside.
    text = (out / "forecast.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text, parse_constant=lambda token: pytest.fail(f"non-standard JSON token {token}"))
    assert forecast["max_abs_heldout_relative_error"] is None and forecast["backtest"] is None
    assert "needs 4 of them; there are 3" in forecast["backtest_note"]
    assert {r["rule"] for r in forecast["assessment"]["reasons"]} >= {"form", "backtest"}
    assert forecast["decision"]["n_units"] == 4 and forecast["decision"]["min_units"] == 7
    assert {"backtest", "backtest_predicted"} <= set(points.columns) and not points["backtest"].any()
    assert len(children) == 4 and {p["d_model"] for _, p, _ in children} == {8, 12}
    assert all(rows[0]["step"] == p["steps"] for _, p, rows in children)
    check_ladder(out, type("Cfg", (), {"ladder": LADDER})())

    # A second computation reads every rung back from <runs>/cache/ladder/ and forecasts the same.
    again, out2 = _run(tmp_path, ladder_inputs, "second")
    assert (again["rungs_trained"], again["rungs_reused"]) == (0, 4)
    assert json.loads((out2 / "forecast.json").read_text())["forecast_hash"] == forecast["forecast_hash"]
    assert len(list((tmp_path / "runs" / "cache" / "ladder").glob("*.parquet"))) == 4

    published = publish(PublishContext(Artifact("ladder", "first", out, {}), {}, None, cached=False))
    assert len(published.tables["ladder_points"]) == 4
    (decision,) = published.tables["decisions"].to_dict(orient="records")
    assert decision["kind"] == "forecast" and decision["verdict"] == "undetermined"
    assert published.tags["decision.forecast.verdict"] == "undetermined"
    assert published.metrics["decision.forecast.estimate"] == pytest.approx(forecast["prediction"]["predicted"])

    # The summary shows the law, the forecast, the decision, and once main exists the check against it.
    main = tmp_path / "main"
    main.mkdir()
    pd.DataFrame({"source": ["a", "b"], "tokens": [64, 64], "loss_nats": [4.0, 4.2]}).to_parquet(
        main / "heldout.parquet")
    lines = "\n".join(summary(SummaryContext(path=out, paths={"ladder": out, "main": main},
                                             layout=RunsLayout(tmp_path / "runs"))))
    assert "forecast: " in lines and "undetermined" in lines and "compute-optimal" in lines
    assert "backtest: not run" in lines and "no backtest" in lines
    assert "main run measured 4.1000 nats/token" in lines
    assert "to resolve" not in lines  # said once, in the closing decisions block


def test_rung_shape_budget_and_lr_rule():
    shape = rung_shape(MAIN.model, 8)
    assert (shape.d_model, shape.d_ff, shape.n_heads, shape.seq_len, shape.n_layers) == (8, 16, 2, 8, 1)
    deep = MAIN.model_copy(update={"model": MAIN.model.model_copy(update={"n_layers": 4})})
    assert rung_shape(deep.model, 8, scale_layers=True).n_layers == 2
    assert rung_budget(MAIN, 12, 4).warmup_steps == 2 and rung_budget(MAIN, 2, 4).warmup_steps == 1
    assert rung_peak_lr(MAIN, BEST, 16)[0] == main_peak_lr(MAIN, BEST)[0]  # the same rule at main's width
    fixed = MAIN.model_copy(update={"peak_lr": 5e-4})
    assert rung_peak_lr(fixed, BEST, 8) == (5e-4, {"from": "config"})
    from infra.errors import DataError

    with pytest.raises(DataError, match="multiple of 2 × n_heads"):
        rung_shape(MAIN.model, 10)


def test_a_disabled_ladder_writes_an_empty_artifact_and_keys_on_nothing_else(tmp_path, ladder_inputs):
    summary_, out = _run(tmp_path, ladder_inputs, "off", cfg=LadderConfig())
    assert summary_ == {"enabled": False} and sorted(p.name for p in out.iterdir()) == ["ladder.json"]
    assert publish(PublishContext(Artifact("ladder", "off", out, {}), {}, None, cached=False)).tags == {
        "ladder": "not enabled"}
    assert summary(SummaryContext(path=out, paths={}, layout=RunsLayout(tmp_path))) == []
    assert key_ladder(type("Cfg", (), {"ladder": LadderConfig()})()) == {"ladder": False}


def _ladder_artifact(tmp_path, name: str, predicted: float, low: float, high: float) -> Artifact:
    folder = tmp_path / "artifacts" / "ladder" / name
    folder.mkdir(parents=True)
    forecast = {"forecast_hash": f"hash-{predicted}", "prediction": {"predicted": predicted, "low": low, "high": high},
                "decision": {"verdict": "undetermined"}, "target": {"general_sources": ["a", "b"]}}
    (folder / "forecast.json").write_text(json.dumps(forecast))
    return Artifact("ladder", name, folder, {})


def _main_artifact(tmp_path, name: str, committed_at: float) -> Artifact:
    folder = tmp_path / "artifacts" / "main" / name
    folder.mkdir(parents=True)
    pd.DataFrame({"source": ["a", "b", "domain"], "tokens": [300, 100, 500],
                  "loss_nats": [4.0, 6.0, 1.0]}).to_parquet(folder / "heldout.parquet")
    return Artifact("main", name, folder, {"committed_at": committed_at})


def test_a_forecast_is_recorded_once_and_never_replaced(tmp_path):
    warehouse = Warehouse(tmp_path / "results.duckdb")
    first = _ladder_artifact(tmp_path, "l1", 4.6, 4.4, 4.8)
    row, added = record_forecast(warehouse, "exp", first, "main-key")
    again, added_again = record_forecast(warehouse, "exp", first, "main-key")
    assert added and not added_again and again["declared_at"] == row["declared_at"]
    assert len(warehouse.query("SELECT * FROM forecasts")) == 1

    changed = _ladder_artifact(tmp_path, "l2", 4.9, 4.7, 5.1)  # a changed forecast: a new row, the old one kept
    _, added = record_forecast(warehouse, "exp", changed, "main-key")
    rows = warehouse.query("SELECT * FROM forecasts ORDER BY declared_at")
    assert added and list(rows["forecast_hash"]) == ["hash-4.6", "hash-4.9"]
    assert list(rows["predicted"]) == [4.6, 4.9] and list(rows["ladder_artifact_key"]) == ["l1", "l2"]
    assert rows["declared_at"].iloc[0] == row["declared_at"]
    assert record_forecast(warehouse, "exp", Artifact("ladder", "x", tmp_path, {}), "m") is None  # disabled


def test_the_check_measures_error_and_coverage_once_per_main_artifact(tmp_path):
    warehouse = Warehouse(tmp_path / "results.duckdb")
    ladder = _ladder_artifact(tmp_path, "l1", 4.6, 4.4, 4.8)
    record_forecast(warehouse, "exp", ladder, "m1")
    main = _main_artifact(tmp_path, "m1", time.time() + 1)
    check = check_forecast(warehouse, "exp", ladder, main)
    # Token-weighted over the general sources a and b only: (300·4 + 100·6) / 400 = 4.5.
    assert check["actual"] == pytest.approx(4.5) and check["error"] == pytest.approx(0.1)
    assert check["relative_error"] == pytest.approx(0.1 / 4.5) and check["covered"] and check["prospective"]
    check_forecast(warehouse, "exp", ladder, main)
    assert len(warehouse.query("SELECT * FROM forecast_checks")) == 1
    narrow = _ladder_artifact(tmp_path, "l2", 4.6, 4.55, 4.8)
    early = _main_artifact(tmp_path, "m0", 0.0)  # made before any forecast was on record
    late = check_forecast(warehouse, "exp", narrow, early)
    assert not late["covered"] and not late["prospective"]
    assert len(warehouse.query("SELECT * FROM forecast_checks")) == 2


def test_plan_uses_the_fitted_law_when_the_configs_ladder_artifact_exists(tmp_path, monkeypatch):
    from pathlib import Path

    from typer.testing import CliRunner

    from flows.cli import app
    from flows.config import load_config
    from flows.keys import chain_keys
    from flows.plan import build_plan, ladder_law, load_plan
    from infra.artifacts import ArtifactStore

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)  # the smoke sources are globs relative to the repository
    layout = RunsLayout(tmp_path / "runs")
    law, note = ladder_law(root / "configs/smoke.toml", layout)
    assert law is None and "no complete ladder artifact" in note and not layout.root.exists()
    published = {label: value for t in build_plan(load_plan("configs/smoke.toml"), law, note) for label, value, _ in t.rows}
    assert published["law"] == "published (Hoffmann et al. 2022)"

    key = chain_keys(load_config("configs/smoke.toml"), until="ladder")["ladder"].key
    store = ArtifactStore(layout.artifacts)
    tmp = store.begin("ladder", key)
    forecast = {"law": {"E": 1.5, "A": 30.0, "alpha": 0.3, "B": 40.0, "beta": 0.25, "form": "full"},
                "decision": {"verdict": "decided"}}
    (tmp / "forecast.json").write_text(json.dumps(forecast))
    (tmp / "ladder.json").write_text(json.dumps({"enabled": True}))
    store.commit("ladder", key, tmp, {})
    result = CliRunner().invoke(app, ["plan", "configs/smoke.toml", "--json", "--runs-dir", str(layout.root)])
    assert result.exit_code == 0, result.output
    rows = {row["label"]: row for row in json.loads(result.output)}
    assert rows["law"]["value"] == f"fitted by ladder artifact {key}"
    assert rows["law"]["section"].startswith("Fitted scaling law of the ladder (L = 1.5 + 30/N^0.3 + 40/D^0.25")
    cfg = load_plan("configs/smoke.toml").model
    from models.arithmetic import param_count

    n, d = param_count(cfg).blocks, 16 * 8 * 64  # N non-embedding, D = steps · batch · seq_len of [main]
    expected = 1.5 + 30.0 / n ** 0.3 + 40.0 / d ** 0.25
    assert rows["this run"]["note"] == f"loss {expected:.3f}"
    assert rows["law"]["note"] == "full form, decided; used instead of the published Chinchilla constants"


def test_plan_falls_back_to_the_published_law_when_the_ladders_is_undetermined(monkeypatch):
    """A degenerate fit (α on its bound) would plan D ≈ 1e34 tokens: the published constants are planned on instead,
    the law row says why, and the numbers are rounded to what they can tell."""
    from pathlib import Path

    from flows.plan import FittedLaw, as_rows, build_plan, load_plan
    from models.planning import Chinchilla

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    law = FittedLaw(Chinchilla(E=1.5, A=1.7e17, B=40.0, alpha=4.0, beta=0.25), "k1", "full", "undetermined",
                    "α = 4 sits on its bound 4 (within ladder.bound_tolerance = 0.02)")
    tables = build_plan(load_plan("configs/smoke.toml"), law, "")
    rows = {row["label"]: row for row in as_rows(tables)}
    assert rows["law"]["value"] == "published (Hoffmann et al. 2022)"
    assert rows["law"]["section"].startswith("Chinchilla allocation (L = 1.69 + 406.4/N^0.34")
    assert rows["law"]["note"] == ("ladder artifact k1 fitted a law whose forecast is undetermined (α = 4 sits on its "
                                   "bound 4 (within ladder.bound_tolerance = 0.02)): its constants are not used")
    assert rows["this run"]["value"] == "N 57.5k, D 8.19k" and rows["same-compute optimum"]["value"] == "N 11.1k, D 42.4k"
    for label in ("this run", "same-compute optimum", "20 tokens/param"):
        assert re.fullmatch(r"loss \d+\.\d{3}", rows[label]["note"]), rows[label]
    assert re.fullmatch(r"target loss \d+\.\d{3} is outside .* \(\d+\.\d{3}–\d+\.\d{3}\); the irreducible loss is 1\.690",
                        rows["equal-loss optimum"]["note"])
    # The smoke run takes microseconds: shorter than any checkpoint interval.
    assert rows["checkpoint interval"]["value"] == "none: the run is shorter than one"
    assert rows["elapsed"]["value"].endswith("µs")
