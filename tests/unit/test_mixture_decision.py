"""The mixture decision under seed noise (docs/methods.md §14): synthetic per-window losses whose truth is known, the
identity between the window-weighted margin and the rule's score difference, and the stage's records."""

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evals.decision import DecisionRecord
from evals.stats import seed_cluster_bootstrap_ci
from infra.artifacts import Artifact
from infra.errors import ConfigError
from infra.runs import RunsLayout
from infra.stage import PublishContext, ReportContext, StageContext, SummaryContext
from tasks.mixture.config import MixtureConfig
from tasks.mixture.decide import (Margin, decide, derived_seeds, margin_interval, mean_trials, rule_config,
                                  rule_text, rule_weights, seed_interval, seed_scores, seeds_needed, window_bpb)
from tasks.mixture.select import select_mixture
from tests.unit.test_mixture_stage import CANDIDATES, PROXY
from tests.unit.test_train_stage import inputs  # noqa: F401  (fixture: a synthetic tokenizer artifact)

TOKENS_PER_BYTE = {"web": 0.25, "wiki": 0.31}
DOCS = {"web": 14, "wiki": 5}  # held-out documents per source, 3 windows each
UNIQUE = {"web": 9000, "wiki": 1000}  # training tokens U_s
SEEDS = derived_seeds(7, 3)
NATURAL_W = {"web": 0.9, "wiki": 0.1}  # ∝ U_s: the least repeated mixture there is


def _synthetic(offsets: dict[str, float], seed_noise: dict[str, list[float]], *, shift=None, rng_seed=0):
    """Windows and trials of candidates whose true score differs from the natural one's by ``offsets`` (bits/byte,
    every window), plus one shift per trained seed (``seed_noise``: the training noise, as given) and a little
    window noise. Windows have uneven token counts, so token-weighted and plain means differ."""
    rng = np.random.default_rng(rng_seed)
    base = {s: (np.repeat(np.arange(n), 3), 1.0 + rng.normal(0, 0.05, 3 * n), rng.integers(8, 40, 3 * n))
            for s, n in DOCS.items()}  # doc of each window, its difficulty (shared by all candidates), its tokens
    windows = []
    for cand, noises in seed_noise.items():
        for seed, eps in zip(SEEDS, noises):
            for source, (docs, difficulty, tokens) in base.items():
                bpb = (difficulty + offsets[cand] + eps + (shift or {}).get((cand, source), 0.0)
                       + rng.normal(0, 0.002, len(docs)))
                windows.append(pd.DataFrame({"candidate": cand, "seed": seed, "source": source,
                                             "window": np.arange(len(docs)), "doc": docs, "tokens": tokens,
                                             "nats": bpb * math.log(2) * tokens / TOKENS_PER_BYTE[source]}))
    windows = pd.concat(windows, ignore_index=True)
    trials = (windows.groupby(["candidate", "seed", "source"], sort=False)
              .agg(nats=("nats", "sum"), heldout_tokens=("tokens", "sum")).reset_index())
    trials["loss_nats"] = trials.nats / trials.heldout_tokens
    trials["bits_per_byte"] = trials.loss_nats * trials.source.map(TOKENS_PER_BYTE) / math.log(2)
    return windows, trials.drop(columns="nats")


def _cfg(**kwargs) -> MixtureConfig:
    return MixtureConfig(candidates=[{"name": "natural", "alpha": 1.0}, {"name": "t03", "alpha": 0.3},
                                     {"name": "wiki_heavy", "weights": {"web": 0.5, "wiki": 0.5}}], **kwargs)


WEIGHTS = {"natural": NATURAL_W, "t03": {"web": 0.75, "wiki": 0.25}, "wiki_heavy": {"web": 0.5, "wiki": 0.5}}


def _decide(windows, trials, cfg, names=("natural", "t03")):
    return decide(trials, windows, cfg, natural="natural", names=list(names), weights=WEIGHTS, unique=UNIQUE,
                  tokens_per_byte=TOKENS_PER_BYTE, seed=0)


# --- the identity: window-weighted mean difference = the rule's score difference ----------------------------------


@pytest.mark.parametrize("rule", ["min_token_weighted_bpb", "min_mean_bpb"])
def test_window_weights_turn_the_mean_difference_into_the_rules_score_difference(rule):
    windows, trials = _synthetic({"natural": 0.0, "t03": -0.01}, {"natural": [0.0, 0.01, -0.02],
                                                                   "t03": [0.005, -0.01, 0.0]})
    cfg = _cfg(rule=rule)
    scores = select_mixture(mean_trials(trials), cfg, natural="natural", names=["natural", "t03"]).scores
    score = scores.set_index("candidate")["score"]
    bpb, keys = window_bpb(windows, ["t03", "natural"], SEEDS, TOKENS_PER_BYTE)
    clusters = (keys.source + "/" + keys.doc.astype(str)).to_numpy()
    ci = seed_cluster_bootstrap_ci(bpb["t03"], bpb["natural"], clusters, weights=rule_weights(keys, rule))
    assert ci.delta == pytest.approx(score["natural"] - score["t03"], abs=1e-12)
    # Per seed too: each seed's weighted mean difference is that seed's score difference under the rule.
    per_seed = seed_scores(trials, rule).pivot(index="seed", columns="candidate", values="score").loc[SEEDS]
    margin = margin_interval(windows, "t03", "natural", SEEDS, TOKENS_PER_BYTE, rule, confidence=0.95)
    assert margin.per_seed == pytest.approx(list(per_seed["natural"] - per_seed["t03"]), abs=1e-12)
    assert margin.delta == pytest.approx(ci.delta, abs=1e-12) and margin.n_clusters == sum(DOCS.values())
    # The two rules weigh the sources differently: the plain mean counts wiki's 5 documents as much as web's 14.
    other = "min_mean_bpb" if rule == "min_token_weighted_bpb" else "min_token_weighted_bpb"
    assert not np.allclose(rule_weights(keys, rule), rule_weights(keys, other))


# --- verdicts on known truth ---------------------------------------------------------------------------------------


def test_candidates_closer_than_the_seed_noise_are_undetermined_and_keep_natural():
    # t03 is truly 0.004 bits/byte better; its seeds scatter by ±0.03 around that.
    windows, trials = _synthetic({"natural": 0.0, "t03": -0.004},
                                 {"natural": [0.0, 0.0, 0.0], "t03": [0.03, -0.03, -0.015]})
    decision = _decide(windows, trials, _cfg())
    assert decision.leader == "t03" and decision.runner_up == "natural"
    assert decision.verdict == "undetermined" and decision.choice == "natural"
    assert decision.margin.low <= 0 < decision.margin.delta
    assert decision.fallback == "keep the natural mixture 'natural'"
    assert "seeds per leading candidate" in decision.resolve
    needed = int(decision.resolve.split("≈")[1].split()[0])
    assert needed > 3 and needed == seeds_needed(decision.margin, 0.95)


def test_least_repeated_takes_the_inseparable_candidate_with_the_fewest_epochs():
    # natural is clearly worse; t03 and wiki_heavy are equal within their seed noise, and t03 leads. wiki_heavy
    # repeats wiki 5 times as often per token as natural (0.5/1000 vs 0.1/1000), t03 2.5 times: t03 is taken.
    # With wiki_heavy in the lead instead, the fallback moves to t03, the less repeated of the two.
    noise = {"natural": [0.0, 0.003, -0.003], "t03": [0.02, -0.02, 0.0], "wiki_heavy": [-0.015, 0.025, 0.0]}
    names = ("natural", "t03", "wiki_heavy")
    cfg = _cfg(on_undetermined="least_repeated", max_regression_bpb=1.0)
    for offsets, leader in (({"natural": 0.1, "t03": -0.003, "wiki_heavy": 0.0}, "t03"),
                            ({"natural": 0.1, "t03": 0.01, "wiki_heavy": 0.0}, "wiki_heavy")):
        windows, trials = _synthetic(offsets, noise)
        decision = _decide(windows, trials, cfg, names)
        assert decision.leader == leader and decision.verdict == "undetermined"
        assert sorted(decision.pool) == ["t03", "wiki_heavy"]  # natural is separable: out of the pool
        assert decision.choice == "t03" and "'t03'" in decision.fallback
        separable = decision.candidates.set_index("candidate")["separable"]
        assert separable["natural"] and not separable[{"t03": "wiki_heavy", "wiki_heavy": "t03"}[leader]]
        assert _decide(windows, trials, _cfg(max_regression_bpb=1.0), names).choice == "natural"


def test_a_gap_beyond_the_seed_noise_is_decided():
    windows, trials = _synthetic({"natural": 0.0, "t03": -0.08},
                                 {"natural": [0.0, 0.004, -0.004], "t03": [0.003, -0.005, 0.0]})
    cfg = _cfg(on_undetermined="least_repeated")
    decision = _decide(windows, trials, cfg)
    assert decision.verdict == "decided" and decision.choice == "t03" and decision.runner_up == "natural"
    assert 0 < decision.margin.low <= decision.margin.delta <= decision.margin.high
    assert decision.margin.delta == pytest.approx(0.08, abs=0.005)
    record = decision.settle(DecisionRecord.declare("mixture", rule=rule_text(cfg, "natural"),
                                                    rule_config=rule_config(cfg)), 0.95, {"table": "mixture_trials"})
    assert (record.verdict, record.choice, record.fallback, record.resolve) == ("decided", "t03", "", "")
    assert record.low == decision.margin.low and record.unit == "bits/byte"
    assert decision.margin.low < 0.08 < decision.margin.high  # the interval holds the true gap


def test_two_seeds_are_undetermined_even_for_a_large_gap():
    seeds2 = {"natural": [0.0, 0.004], "t03": [0.003, -0.005]}
    windows, trials = _synthetic({"natural": 0.0, "t03": -0.08}, seeds2)
    decision = _decide(windows, trials, _cfg())
    assert decision.verdict == "undetermined" and decision.choice == "natural"
    assert "needs >= 3 seeds, has 2" in decision.reason and "mixture.seeds" in decision.resolve
    assert decision.margin.low > 0  # the interval alone would have said decided: the minimum is what refuses


def test_equal_candidates_are_undetermined_in_nearly_every_seeded_repeat():
    # A null batch: both candidates have the same true score; 3 seeds of training noise (sd 0.01 bits/byte) and
    # window noise. At 95% the margin's low bound may exceed 0 in ~2.5% of repeats; 40 fixed repeats, ≤ 2 allowed.
    decided = 0
    for repeat in range(40):
        rng = np.random.default_rng(1000 + repeat)
        noise = {c: list(rng.normal(0, 0.01, 3)) for c in ("natural", "t03")}
        windows, trials = _synthetic({"natural": 0.0, "t03": 0.0}, noise, rng_seed=repeat)
        decided += _decide(windows, trials, _cfg()).verdict == "decided"
    assert decided <= 2


def test_one_seed_is_undetermined_even_for_a_large_gap():
    windows, trials = _synthetic({"natural": 0.0, "t03": -0.08}, {"natural": [0.0], "t03": [0.0]})
    decision = _decide(windows, trials, _cfg(seeds=1))
    assert decision.verdict == "undetermined" and decision.choice == "natural"
    assert "seed noise is unmeasured" in decision.reason and "≥ 2 seeds" in decision.resolve
    # The held-out documents alone separate them; the verdict still waits for seed noise.
    assert decision.margin.low > 0 and decision.margin.seeds == (SEEDS[0],)
    scores = decision.candidates.set_index("candidate")
    assert math.isnan(scores.loc["t03", "score_low"]) and scores.loc["t03", "seeds"] == 1


def test_a_runner_up_outside_round_two_is_undetermined_and_says_so():
    windows, trials = _synthetic({"natural": 0.0, "t03": -0.08}, {"natural": [0.0], "t03": [0.0, 0.0, 0.0]})
    decision = _decide(windows, trials, _cfg())
    assert decision.verdict == "undetermined" and "'natural' trained at 1 seed" in decision.reason
    assert "mixture.top_k" in decision.resolve


def test_only_one_eligible_candidate_is_decided_trivially():
    # t03 is better overall but 0.2 bits/byte worse on wiki (> δ = 0.05): ineligible.
    windows, trials = _synthetic({"natural": 0.0, "t03": -0.1}, {"natural": [0.0, 0.01], "t03": [0.0, 0.01]},
                                 shift={("t03", "wiki"): 0.3})
    decision = _decide(windows, trials, _cfg())
    assert decision.verdict == "decided" and decision.choice == "natural" and decision.runner_up is None
    assert "only eligible" in decision.reason and decision.margin is None


# --- pieces -----------------------------------------------------------------------------------------------------------


def test_seed_interval_is_the_student_t_interval():
    mean, low, high = seed_interval([1.0, 1.2, 1.1], 0.95)
    half = 4.302653 * 0.1 / math.sqrt(3)  # t_{0.975, 2} · sd / √n
    assert (mean, low, high) == pytest.approx((1.1, 1.1 - half, 1.1 + half), abs=1e-6)
    one = seed_interval([1.3], 0.95)
    assert one[0] == 1.3 and math.isnan(one[1]) and math.isnan(one[2])


def test_seeds_needed_by_hand():
    # Δ = 0.01, per-seed sd 0.01 at 3 seeds and no held-out noise: t_{0.975, N−1}·0.01/√N < 0.01 first at N = 7
    # (2.447 < 2.646; at N = 6, 2.571 > 2.449).
    margin = Margin(0.01, -0.02, 0.04, 0.01 / math.sqrt(3), 0.0, 2.0, (0.0, 0.02, 0.01), (1, 2, 3), 10, 30)
    assert seeds_needed(margin, 0.95) == 7
    assert seeds_needed(dataclasses.replace(margin, delta=-0.001), 0.95) is None  # no gap: no number of seeds
    # Held-out noise does not shrink with seeds: with a document part as large as Δ/2 no seed count suffices.
    assert seeds_needed(dataclasses.replace(margin, doc_se=0.006), 0.95, limit=200) is None


def test_derived_seeds_start_at_the_experiment_seed_and_differ():
    seeds = derived_seeds(7, 4)
    assert seeds[0] == 7 and len(set(seeds)) == 4 and derived_seeds(7, 4) == seeds
    assert derived_seeds(7, 2) == seeds[:2] and derived_seeds(8, 2)[1] != seeds[1]
    assert all(0 <= s < 2**32 for s in seeds)


def test_config_fields_default_and_errors_name_the_field():
    cfg = _cfg()
    assert (cfg.seeds, cfg.top_k, cfg.confidence, cfg.on_undetermined) == (3, 2, 0.95, "natural")
    for field, value in (("seeds", 0), ("top_k", 1), ("confidence", 1.0), ("confidence", 0.0)):
        with pytest.raises(ConfigError, match=f"mixture.{field}"):
            _cfg(**{field: value})
    raw = {"candidates": [{"name": "natural", "alpha": 1.0}, {"name": "t", "alpha": 0.3}], "on_undetermined": "best"}
    with pytest.raises(ConfigError, match="on_undetermined"):
        MixtureConfig.validate_strict(raw, "x.toml")
    assert rule_config(_cfg(top_k=3))["top_k"] == 3


# --- the stage -------------------------------------------------------------------------------------------------------


def test_stage_records_seeds_windows_and_a_decision(tmp_path, inputs):  # noqa: F811
    from flows.config import load_config
    from tasks.mixture.publish import publish
    from tasks.mixture.stage import run
    from tasks.mixture.views import report, summary

    out = tmp_path / "runs" / "artifacts" / "mixture" / "k"
    out.mkdir(parents=True)
    ctx = StageContext(out=out, inputs={"tokenizer": inputs["tokenizer"]}, layout=RunsLayout(tmp_path / "runs"),
                       key="k", experiment="t", torch_threads=1, seed=3)
    cfg = MixtureConfig(candidates=[*CANDIDATES, {"name": "even", "weights": {"a": 0.5, "b": 0.5}}], seeds=2,
                        max_regression_bpb=1.0)
    result = run(ctx, cfg, PROXY, general=["a", "b"])
    choice = json.loads((out / "choice.json").read_text())
    trials, windows = pd.read_parquet(out / "trials.parquet"), pd.read_parquet(out / "windows.parquet")
    seeds = derived_seeds(3, 2)

    # 3 candidates at seed 3, the 2 leading ones at one derived seed more: a row per candidate × source × seed.
    by_candidate = choice["seeds"]["by_candidate"]
    assert sorted(map(len, by_candidate.values())) == [1, 2, 2] and choice["seeds"]["derived"] == seeds[1:]
    assert len(trials) == 2 * 5 and set(trials["seed"]) == set(seeds)
    assert result["proxies_trained"] + result["proxies_reused"] == 5
    # The cached windows reproduce every proxy's per-source bits/byte.
    tpb = 1 / 4  # the fixture's shards hold 4 bytes per token
    again = windows.groupby(["candidate", "seed", "source"]).apply(
        lambda g: g.nats.sum() / g.tokens.sum() * tpb / math.log(2), include_groups=False)
    joined = trials.set_index(["candidate", "seed", "source"])["bits_per_byte"]
    assert np.allclose(again.loc[joined.index].to_numpy(), joined.to_numpy(), atol=1e-12)
    # The margin's estimate is the leader's seed-averaged margin: both were trained at the same seeds.
    leader, runner_up = choice["leader"], choice["runner_up"]
    assert by_candidate[leader] == by_candidate[runner_up] == seeds
    assert choice["margin_interval"]["estimate"] == pytest.approx(choice["margin"], abs=1e-12)
    assert choice["margin_interval"]["clusters"] == 2  # one held-out document per source in the fixture
    record = DecisionRecord.from_dict(choice["decision"])
    assert record.kind == "mixture" and record.verdict == choice["verdict"] == result["verdict"]
    assert record.choice == choice["name"] and record.estimate == choice["margin_interval"]["estimate"]
    # Two seeds and two held-out documents are below the interval's minimum (docs/methods.md §16): undetermined,
    # whatever the margin, and the natural mixture is kept.
    assert choice["verdict"] == "undetermined" and "needs >= 3 seeds, has 2" in choice["verdict_reason"]
    assert record.n_units == 2 and record.min_units == 3 and record.units.startswith("seeds")
    assert choice["name"] == "natural" and trials.loc[trials.chosen, "candidate"].unique().tolist() == ["natural"]
    rows = {r["candidate"]: r for r in choice["scores"]}
    assert rows[leader]["seeds"] == 2 and rows[leader]["score_low"] <= rows[leader]["score"] <= rows[leader]["score_high"]
    # Declared before any proxy trained: not later than the oldest cached result.
    cache = Path(tmp_path / "runs" / "cache" / "proxies")
    oldest = min(p.stat().st_mtime for p in cache.glob("*.parquet"))
    assert pd.Timestamp(record.declared_at).timestamp() <= oldest
    assert len(list(cache.glob("*.windows.parquet"))) == 5

    published = publish(PublishContext(Artifact("mixture", "k", out, {}), {}, load_config("configs/smoke.toml"),
                                       cached=False))
    table = published.tables["decisions"]
    assert len(table) == 1 and table.loc[0, "kind"] == "mixture" and table.loc[0, "verdict"] == record.verdict
    assert published.tags["decision.mixture.verdict"] == record.verdict
    assert published.metrics["decision.mixture.margin_low"] == record.low
    assert "seed" in published.tables["mixture_trials"]

    (out / "meta.json").write_text(json.dumps({"summary": result}, default=float))
    lines = summary(SummaryContext(path=out, paths={}, layout=RunsLayout(tmp_path)))
    text = "\n".join(lines)
    assert f"verdict: {record.verdict}" in text and "(2 seeds)" in text and "95% interval" in text
    if record.verdict == "undetermined":
        assert "keep the natural mixture" in text and "to resolve:" in text
    plots = tmp_path / "plots"
    plots.mkdir()
    blocks = report(ReportContext(path=out, paths={}, layout=RunsLayout(tmp_path), warehouse=None, plots_dir=plots,
                                  cfg=None))
    assert any(f"**Decision:** {record.verdict}" in getattr(b, "text", "") for b in blocks)
