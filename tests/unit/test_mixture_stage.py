"""The mixture stage on a tiny synthetic token corpus: per-candidate and per-seed proxy cache, transfer τ, verified
proposal."""

import json

import pandas as pd
import pytest

from infra.runs import RunsLayout
from infra.stage import StageContext
from tasks.mixture.config import MixtureConfig
from tasks.mixture.stage import run
from tasks.train.sections import ModelShape, ProxyConfig, RunBudget
from tests.unit.test_train_stage import inputs  # noqa: F401  (fixture: a synthetic tokenizer artifact)

PROXY = ProxyConfig(model=ModelShape(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, seq_len=8),
                    budget=RunBudget(steps=4, batch_size=2, warmup_steps=1, eval_tokens=64), peak_lr=1e-2)
CANDIDATES = [{"name": "natural", "alpha": 1.0}, {"name": "a_heavy", "weights": {"a": 0.9, "b": 0.1}}]
CFG = MixtureConfig(candidates=CANDIDATES, generate={"kind": "grid", "count": 3, "step": 0.5},
                    transfer_model=ModelShape(n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, seq_len=8),
                    propose=True, seeds=2)


def _decision_content(out):
    """choice.json without the times its decision was declared and settled (the rest must not depend on them)."""
    choice = json.loads((out / "choice.json").read_text())
    for field in ("declared_at", "decided_at"):
        assert choice["decision"].pop(field)
    return choice


def _results(cache):
    """The per-source result files of the proxy cache (each has its ``.windows.parquet`` beside it)."""
    return sorted(p for p in cache.glob("*.parquet") if not p.name.endswith(".windows.parquet"))


def _run(tmp_path, inputs, name, cfg, metrics=None, *, refresh=False, log=None):
    out = tmp_path / "runs" / "artifacts" / "mixture" / name
    out.mkdir(parents=True, exist_ok=True)
    if log is None:
        log = (lambda m, step: metrics.update(m)) if metrics is not None else (lambda m, step: None)
    ctx = StageContext(out=out, inputs={"tokenizer": inputs["tokenizer"]}, layout=RunsLayout(tmp_path / "runs"),
                       key=name, experiment="t", torch_threads=1, log_metrics=log, refresh=refresh)
    return run(ctx, cfg, PROXY, general=["a", "b"]), out


def test_candidates_transfer_proposal_and_per_candidate_reuse(tmp_path, inputs):  # noqa: F811
    metrics = {}
    summary, out = _run(tmp_path, inputs, "first", CFG, metrics)
    # 2 listed + 3 generated candidates at two sizes, plus the verified proposal at the proxy size (read back
    # from the cache when the proposal coincides with a candidate already trained), plus one more seed for each
    # of the 2 leading candidates.
    assert summary["proxies_trained"] + summary["proxies_reused"] == 13 and summary["proxies_trained"] >= 10
    choice = json.loads((out / "choice.json").read_text())
    trials = pd.read_parquet(out / "trials.parquet")
    extra = choice["seeds"]["derived"]
    assert len(extra) == 1 and trials.groupby(["candidate", "proxy", "seed", "source"]).size().eq(1).all()
    twice = sorted(c for c, seeds in choice["seeds"]["by_candidate"].items() if len(seeds) == 2)
    assert len(twice) == 2 and sorted(trials[trials["seed"] == extra[0]]["candidate"].unique()) == twice
    assert set(trials[trials["proxy"] == "transfer"]["seed"]) == {0}  # the transfer size stays single-seed
    assert f"{twice[0]}.seed{extra[0]}.a.bits_per_byte" in metrics
    assert set(trials["candidate"]) == {"natural", "a_heavy", "grid-1", "grid-2", "grid-3", "proposed"}
    assert sorted(set(trials["d_model"])) == [16, 32]
    assert abs(sum(choice["proposal"]["weights"].values()) - 1.0) < 1e-9
    assert {r["candidate"] for r in choice["scores"]} >= {"proposed", "grid-2"}  # the proposal competed
    transfer = choice["transfer"]
    assert -1.0 <= transfer["tau"] <= 1.0 and transfer["d_model"] == {"proxy": 16, "transfer": 32}
    assert transfer["winner_flips"] == (transfer["best"]["proxy"] != transfer["best"]["transfer"])
    assert choice["margin"] is not None and choice["margin"] >= 0
    assert "transfer.natural.a.bits_per_byte" in metrics and "proposed.b.bits_per_byte" in metrics

    # One more candidate: only it is trained (at both sizes), plus the proposal if the new trial moved it.
    more = CFG.model_copy(update={"candidates": [*CFG.candidates, *MixtureConfig(
        candidates=[{"name": "natural", "alpha": 1.0}, {"name": "b_heavy", "weights": {"a": 0.2, "b": 0.8}}]
    ).candidates[1:]]})
    summary, out = _run(tmp_path, inputs, "second", more)
    # b_heavy at two sizes (+ a moved proposal, + the extra seed of new leaders)
    assert summary["proxies_trained"] <= 3 + 2
    assert summary["proxies_reused"] == 15 - summary["proxies_trained"]
    assert "b_heavy" in set(pd.read_parquet(out / "trials.parquet")["candidate"])


def test_cached_proxy_results_equal_fresh_ones(tmp_path, inputs):  # noqa: F811
    cfg = MixtureConfig(candidates=CANDIDATES)
    _, first = _run(tmp_path, inputs, "first", cfg)
    _, second = _run(tmp_path, inputs, "second", cfg)
    fresh, cached = pd.read_parquet(first / "trials.parquet"), pd.read_parquet(second / "trials.parquet")
    pd.testing.assert_frame_equal(fresh, cached)
    # The cache is keyed by the proxy: another LR trains both candidates anew.
    other = PROXY.model_copy(update={"peak_lr": 3e-3})
    out = tmp_path / "runs" / "artifacts" / "mixture" / "third"
    out.mkdir(parents=True)
    summary = run(StageContext(out=out, inputs={"tokenizer": inputs["tokenizer"]}, layout=RunsLayout(tmp_path / "runs"),
                               key="third", experiment="t", torch_threads=1), cfg, other, general=["a", "b"])
    assert (summary["proxies_trained"], summary["proxies_reused"]) == (6, 0)  # 2 candidates × 3 seeds


def test_choice_is_the_same_after_an_interrupted_run(tmp_path, inputs):  # noqa: F811
    """A run killed after some proxies were cached, then rerun, writes the decision a cold run writes."""
    cfg = MixtureConfig(candidates=CANDIDATES, generate={"kind": "grid", "count": 1, "step": 0.5})
    _, cold = _run(tmp_path / "cold", inputs, "k", cfg)
    _, first = _run(tmp_path / "warm", inputs, "first", cfg)
    cache = _results(tmp_path / "warm" / "runs" / "cache" / "proxies")
    assert len(cache) == 3 + 2 * 2  # round 1, then 2 more seeds of the 2 leading candidates
    for path in cache[1:]:  # as if the run died after its first proxy was cached
        path.unlink()
    summary, resumed = _run(tmp_path / "warm", inputs, "k", cfg)
    assert (summary["proxies_trained"], summary["proxies_reused"]) == (6, 1)
    assert _decision_content(resumed) == _decision_content(cold)
    pd.testing.assert_frame_equal(pd.read_parquet(resumed / "trials.parquet"), pd.read_parquet(cold / "trials.parquet"))


def test_a_refreshed_stage_trains_every_proxy_again_and_resumes_after_a_kill(tmp_path, inputs):  # noqa: F811
    """--refresh mixture reads nothing back from the proxy cache; a refreshed attempt killed part-way and run again
    with --refresh keeps the proxies it had trained; a stage recomputed only downstream reuses the cache."""
    cfg = MixtureConfig(candidates=CANDIDATES)
    summary, first = _run(tmp_path, inputs, "first", cfg)
    assert (summary["proxies_trained"], summary["proxies_reused"]) == (6, 0)
    summary, _ = _run(tmp_path, inputs, "downstream", cfg)
    assert (summary["proxies_trained"], summary["proxies_reused"]) == (0, 6)
    cache = tmp_path / "runs" / "cache" / "proxies"
    before = {p.name: p.stat().st_mtime_ns for p in _results(cache)}

    summary, refreshed = _run(tmp_path, inputs, "refreshed", cfg, refresh=True)
    assert (summary["proxies_trained"], summary["proxies_reused"]) == (6, 0)
    assert all(p.stat().st_mtime_ns > before[p.name] for p in _results(cache))  # every entry written again
    pd.testing.assert_frame_equal(pd.read_parquet(refreshed / "trials.parquet"),
                                  pd.read_parquet(first / "trials.parquet"))

    logged = []

    def killed_after_two(metrics, step):  # logged once per proxy, after its result is cached
        logged.append(step)
        if len(logged) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, inputs, "again", cfg, refresh=True, log=killed_after_two)
    summary, _ = _run(tmp_path, inputs, "again", cfg, refresh=True)
    assert (summary["proxies_trained"], summary["proxies_reused"]) == (4, 2)
