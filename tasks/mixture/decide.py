"""The mixture decision with its uncertainty: seed-averaged scores, the leader's margin over the runner-up with an
interval over training seeds and held-out documents, and a verdict (docs/methods.md §14).

Seeds. Every candidate trains at the experiment seed; the ``top_k`` leading eligible candidates of that round train
at ``seeds − 1`` more, derived as ``SeedSequence([experiment_seed, SEED_STREAM, i]).generate_state(1)[0]`` for
i = 1, 2, … (a 32-bit integer per i; ``SEED_STREAM`` = 2 keeps them apart from other stages' derived seeds).
A seed sets the proxy's initialisation and its data order.

Scores. A candidate's per-source bits/byte is the mean over the seeds it has; eligibility (δ against the natural
mixture) and the rule's score are computed on those means (``tasks.mixture.select``). Its score is reported as the
mean of its per-seed scores ± a Student-t interval over them (NaN with one seed).

Margin. Δ = score(runner-up) − score(leader), bits/byte, over the seeds both have. Per held-out window w of source
s, bpb_w = nats_w · (tokens/byte)_s / (ln 2 · tokens_w), weighted by tokens_w (``min_token_weighted_bpb``) or by
tokens_w / T_s (``min_mean_bpb``, T_s the source's scored tokens), so that Σ_w u_w·bpb_w / Σ_w u_w is the rule's
score. Its interval is a t interval whose variance adds the two sources of noise: the spread of the per-seed
margins (training seeds) and the delete-one-document jackknife over the (source, document) clusters of the
seed-averaged margin (held-out sample), with Welch–Satterthwaite degrees of freedom
(``evals.stats.seed_cluster_mean_ci``; its coverage at 2–5 seeds and 3–100 documents is in docs/methods.md §16).

Verdict. ``decided`` when the interval's low bound is > 0 and it rests on at least ``MIN_UNITS["seeds"]`` common
seeds and ``MIN_UNITS["documents"]`` held-out documents; otherwise ``undetermined`` (with "needs >= 3 seeds, has
2"), and the choice follows ``on_undetermined``. One eligible candidate: decided trivially.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from evals.decision import DecisionRecord
from evals.stats import MIN_UNITS, has_width, seed_cluster_mean_ci, units_shortfall
from infra.errors import DataError
from tasks.mixture.config import MixtureConfig
from tasks.mixture.select import MixtureChoice, select_mixture

SEED_STREAM = 2
MAX_SEEDS = 1000  # beyond this a seeds estimate is no practical advice
WINDOW_COLUMNS = ["candidate", "seed", "source", "window", "doc", "nats", "tokens"]
UNIT = "bits/byte"

_RULE_NAMES = {"min_token_weighted_bpb": "held-out-token-weighted mean bits/byte",
               "min_mean_bpb": "plain mean bits/byte over sources"}


def derived_seeds(experiment_seed: int, n: int) -> list[int]:
    """The ``n`` training seeds of a leading candidate: the experiment seed, then
    ``SeedSequence([experiment_seed, SEED_STREAM, i]).generate_state(1)[0]`` for i = 1 … n − 1 (32-bit integers)."""
    return [int(experiment_seed)] + [int(np.random.SeedSequence([int(experiment_seed), SEED_STREAM, i])
                                         .generate_state(1)[0]) for i in range(1, n)]


def rule_config(cfg: MixtureConfig) -> dict[str, Any]:
    """The fields of ``[mixture]`` that make up the declared decision rule (hashed into the decision record)."""
    return {"rule": cfg.rule, "max_regression_bpb": cfg.max_regression_bpb, "seeds": cfg.seeds, "top_k": cfg.top_k,
            "confidence": cfg.confidence, "on_undetermined": cfg.on_undetermined}


def rule_text(cfg: MixtureConfig, natural: str) -> str:
    """The declared decision rule in words."""
    fallback = (f"keep the natural mixture {natural!r}" if cfg.on_undetermined == "natural" else
                "take, among the leader and the candidates not separable from it, the one whose most-repeated "
                "source has the smallest w_s/U_s")
    return (f"lowest {_RULE_NAMES[cfg.rule]} (mean over seeds) among candidates no source of which is more than "
            f"δ = {cfg.max_regression_bpb:g} bits/byte worse than under {natural!r}; every candidate at the "
            f"experiment seed, the {cfg.top_k} leading at {cfg.seeds} seeds; decided when the "
            f"{cfg.confidence:.0%} interval of runner-up − leader (seeds × held-out documents) lies above 0, "
            f"else undetermined: {fallback}")


def seed_scores(trials: pd.DataFrame, rule: str) -> pd.DataFrame:
    """Each (candidate, seed)'s score under ``rule`` (columns candidate, seed, score; bits/byte).

    ``trials``: one row per (candidate, seed, source) with bits_per_byte and heldout_tokens.
    """
    def score(group: pd.DataFrame) -> float:
        if rule == "min_token_weighted_bpb":
            return float((group.bits_per_byte * group.heldout_tokens).sum() / group.heldout_tokens.sum())
        return float(group.bits_per_byte.mean())

    rows = [{"candidate": c, "seed": int(s), "score": score(g)}
            for (c, s), g in trials.groupby(["candidate", "seed"], sort=False)]
    return pd.DataFrame(rows, columns=["candidate", "seed", "score"])


def seed_interval(scores: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """(mean, low, high) of per-seed scores: the Student-t interval mean ± t_{(1+c)/2, n−1}·sd/√n
    (``scipy.stats.t.interval``); NaN bounds with one seed (seed noise unmeasured)."""
    values = np.asarray(scores, dtype=float)
    mean = float(values.mean())
    if len(values) < 2:
        return mean, math.nan, math.nan
    sem = float(stats.sem(values))
    if sem == 0.0:
        return mean, mean, mean
    low, high = stats.t.interval(confidence, len(values) - 1, loc=mean, scale=sem)
    return mean, float(low), float(high)


def window_bpb(windows: pd.DataFrame, candidates: Sequence[str], seeds: Sequence[int],
               tokens_per_byte: dict[str, float]) -> tuple[dict[str, np.ndarray], pd.DataFrame]:
    """Per-window bits/byte of ``candidates`` at ``seeds``: name → (S, N) array (rows in ``seeds`` order), and the
    (N,) window keys (source, window, doc, tokens) its columns follow, sorted by source then window.

    Raises:
        DataError: a candidate lacks a window another has at one of the seeds (they were not scored alike).
    """
    rows = windows[windows.candidate.isin(list(candidates)) & windows.seed.isin(list(seeds))]
    wide = rows.pivot_table(index=["source", "window", "doc", "tokens"], columns=["candidate", "seed"],
                            values="nats", aggfunc="first").sort_index()
    wanted = [(c, int(s)) for c in candidates for s in seeds]
    if wide.isna().any().any() or sorted(wide.columns.tolist()) != sorted(wanted):
        raise DataError(f"candidates {list(candidates)} were not scored on the same held-out windows at seeds "
                        f"{list(seeds)}: rerun their proxies")
    keys = wide.index.to_frame(index=False)
    scale = keys.source.map(tokens_per_byte).to_numpy() / (math.log(2) * keys.tokens.to_numpy())
    return ({c: np.stack([wide[(c, int(s))].to_numpy() * scale for s in seeds]) for c in candidates}, keys)


def rule_weights(keys: pd.DataFrame, rule: str) -> np.ndarray:
    """(N,) window weights u_w under which Σ u_w·bpb_w / Σ u_w is the rule's score: tokens_w for
    ``min_token_weighted_bpb``, tokens_w / T_s (T_s: the source's scored tokens) for ``min_mean_bpb``."""
    tokens = keys.tokens.to_numpy(dtype=float)
    if rule == "min_token_weighted_bpb":
        return tokens
    return tokens / keys.groupby("source").tokens.transform("sum").to_numpy(dtype=float)


@dataclass(frozen=True)
class Margin:
    """Δ = score(other) − score(leader) (bits/byte) over ``seeds`` and its t interval [low, high]; ``seed_se`` and
    ``doc_se`` the standard-error parts of training seeds and held-out documents, ``df`` the t degrees of freedom
    (``evals.stats.seed_cluster_mean_ci``). ``per_seed``: the Δ_s; ``n_clusters``/``n_units``: (source, document)
    clusters and windows."""

    delta: float
    low: float
    high: float
    seed_se: float
    doc_se: float
    df: float
    per_seed: tuple[float, ...]
    seeds: tuple[int, ...]
    n_clusters: int
    n_units: int

    def as_dict(self) -> dict[str, Any]:
        return {"estimate": self.delta, "low": self.low, "high": self.high, "seed_se": self.seed_se,
                "doc_se": self.doc_se, "df": self.df if math.isfinite(self.df) else None,
                "per_seed": list(self.per_seed), "seeds": list(self.seeds), "clusters": self.n_clusters,
                "windows": self.n_units}

    def shortfall(self) -> str:
        """"" when the interval rests on enough seeds and documents to decide (``MIN_UNITS``); else the reason."""
        fix = "raise mixture.seeds" if len(self.seeds) < MIN_UNITS["seeds"] else ""
        return (units_shortfall("seeds", len(self.seeds), fix) or
                units_shortfall("documents", self.n_clusters, "score more held-out documents (eval_tokens)"))


def margin_interval(windows: pd.DataFrame, leader: str, other: str, seeds: Sequence[int],
                    tokens_per_byte: dict[str, float], rule: str, *, confidence: float,
                    seed: int = 0) -> Margin | None:
    """Δ = score(other) − score(leader) over ``seeds`` (both trained at each), with its t interval over training
    seeds and held-out (source, document) clusters (``evals.stats.seed_cluster_mean_ci``; docs/methods.md §16).
    None when the windows come from fewer than 2 documents. ``seed`` is unused (the interval is not resampled);
    it stays so that callers need not change.
    """
    bpb, keys = window_bpb(windows, [leader, other], seeds, tokens_per_byte)
    clusters = (keys.source + "\x00" + keys.doc.astype(str)).to_numpy()
    if len(np.unique(clusters)) < 2:
        return None
    weights = rule_weights(keys, rule)
    ci = seed_cluster_mean_ci(bpb[leader], bpb[other], clusters, weights=weights, confidence=confidence)
    per_seed = (bpb[other] - bpb[leader]) @ weights / weights.sum()  # (S,)
    return Margin(ci.delta, ci.low, ci.high, ci.seed_se, ci.doc_se, ci.df, tuple(float(d) for d in per_seed),
                  tuple(int(s) for s in seeds), ci.n_clusters, ci.n_units)


def most_repeated(weights: dict[str, float], unique: dict[str, int]) -> float:
    """max over sources of w_s / U_s: the main-run epochs of the candidate's most-repeated source per main-run
    token (epochs e_s = w_s·D/U_s, docs/methods.md §8). The natural mixture attains the minimum 1/Σ_s U_s."""
    ratios = [w / unique[s] if unique.get(s, 0) > 0 else math.inf for s, w in weights.items() if w > 0]
    return max(ratios, default=0.0)


@dataclass(frozen=True)
class MixtureDecision:
    """The outcome of the mixture rule under uncertainty.

    Attributes:
        choice: the mixture the platform goes on with (the leader when decided, else the fallback's pick).
        leader, runner_up: the rule's best and second-best eligible candidates (runner_up None: only one eligible).
        verdict: ``decided`` or ``undetermined``; ``reason`` says why.
        margin: Δ = runner-up − leader (bits/byte) over ``common_seeds`` with its interval; None without one.
        common_seeds: the seeds both leader and runner-up were trained at, in order.
        candidates: one row per candidate: candidate, score (mean over seeds), score_low, score_high (Student-t
            over seeds; NaN with one seed), seeds (count), vs_leader, vs_leader_low, vs_leader_high (Δ to the
            leader over the seeds both have), separable (its interval lies above 0 over ≥ 2 common seeds).
        seeds: candidate → the seeds it was trained at.
        selection: the rule applied to the seed-averaged results (scores, eligibility).
        fallback, resolve: when undetermined, what is done instead and what would settle it ("" when decided).
        pool: the candidates the fallback chose among.
    """

    choice: str
    leader: str
    runner_up: str | None
    verdict: str
    reason: str
    margin: Margin | None
    common_seeds: list[int]
    candidates: pd.DataFrame
    seeds: dict[str, list[int]]
    selection: MixtureChoice
    fallback: str = ""
    resolve: str = ""
    pool: list[str] = field(default_factory=list)

    def settle(self, record: DecisionRecord, confidence: float, evidence: dict[str, Any]) -> DecisionRecord:
        """``record`` settled with this outcome (estimate/low/high: the margin, NaN without an interval)."""
        m = self.margin
        estimate, low, high = (m.delta, m.low, m.high) if m is not None else (math.nan, math.nan, math.nan)
        units = (f"seeds × {m.n_clusters} documents" if m is not None else "seeds")
        return record.settle(choice=self.choice, verdict=self.verdict, estimate=estimate, low=low, high=high,
                             unit=UNIT, confidence=confidence, fallback=self.fallback, resolve=self.resolve,
                             evidence={**evidence, "leader": self.leader, "runner_up": self.runner_up,
                                       "seeds": self.common_seeds, "reason": self.reason},
                             n_units=len(self.common_seeds), units=units,
                             min_units=MIN_UNITS["seeds"] if self.runner_up is not None else 0)


def mean_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per (candidate, source): bits_per_byte and loss_nats averaged over the candidate's seeds.

    Raises:
        DataError: a (candidate, seed, source) appears twice, or one source's scored tokens differ across seeds.
    """
    if trials.duplicated(["candidate", "seed", "source"]).any():
        raise DataError("mixture trials have duplicate (candidate, seed, source) rows: keep one row per proxy run")
    grouped = trials.groupby(["candidate", "source"], sort=False)
    if (grouped.heldout_tokens.nunique() > 1).any():
        raise DataError("a source's held-out tokens differ across seeds: every proxy must score the same windows")
    return grouped.agg(loss_nats=("loss_nats", "mean"), bits_per_byte=("bits_per_byte", "mean"),
                       heldout_tokens=("heldout_tokens", "first")).reset_index()


def leading(trials: pd.DataFrame, cfg: MixtureConfig, *, natural: str, names: list[str]) -> list[str]:
    """The ``top_k`` eligible candidates with the lowest scores on ``trials`` (seed-averaged), best first."""
    choice = select_mixture(mean_trials(trials), cfg, natural=natural, names=names)
    ranked = _ranked(choice.scores, natural)
    return ranked[:cfg.top_k]


def _ranked(scores: pd.DataFrame, natural: str) -> list[str]:
    eligible = scores[scores["eligible"]].assign(_not_natural=lambda d: d["candidate"] != natural)
    return list(eligible.sort_values(["score", "_not_natural", "candidate"])["candidate"])


def decide(trials: pd.DataFrame, windows: pd.DataFrame, cfg: MixtureConfig, *, natural: str, names: list[str],
           weights: dict[str, dict[str, float]], unique: dict[str, int], tokens_per_byte: dict[str, float],
           seed: int = 0) -> MixtureDecision:
    """Apply the declared rule to every candidate's seeds and say whether the evidence decides it.

    Args:
        trials: one row per (candidate, seed, source): bits_per_byte, loss_nats, heldout_tokens.
        windows: ``WINDOW_COLUMNS`` rows of the same proxies (nats summed per held-out window).
        cfg: the mixture section (rule, δ, confidence, on_undetermined).
        natural: the reference candidate; names: every competing candidate.
        weights: candidate → source weights; unique: U_s, training tokens per source (``least_repeated``).
        tokens_per_byte: held-out tokens per UTF-8 byte of each source.
        seed: seeds the bootstrap.

    Raises:
        DataError: inconsistent trials (``select_mixture``, :func:`mean_trials`) or windows (:func:`window_bpb`).
    """
    selection = select_mixture(mean_trials(trials), cfg, natural=natural, names=names)
    have = {c: [int(s) for s in dict.fromkeys(g.seed)] for c, g in trials.groupby("candidate", sort=False)}
    per_seed = seed_scores(trials, cfg.rule)
    ranked = _ranked(selection.scores, natural)
    leader = ranked[0]
    rows, intervals = [], {}
    for row in selection.scores.itertuples():
        name, seeds = row.candidate, have.get(row.candidate, [])
        mean, low, high = (seed_interval(per_seed[per_seed.candidate == name].score, cfg.confidence) if seeds
                           else (math.nan, math.nan, math.nan))
        ci, common = None, [s for s in have[leader] if s in seeds]
        if row.eligible and name != leader and common:
            ci = margin_interval(windows, leader, name, common, tokens_per_byte, cfg.rule,
                                 confidence=cfg.confidence, seed=seed)
        intervals[name] = (ci, common)
        rows.append({"candidate": name, "score": mean, "score_low": low, "score_high": high, "seeds": len(seeds),
                     "vs_leader": ci.delta if ci else math.nan, "vs_leader_low": ci.low if ci else math.nan,
                     "vs_leader_high": ci.high if ci else math.nan,
                     "separable": bool(ci is not None and not ci.shortfall() and ci.low > 0
                                       and has_width(ci.low, ci.high, ci.delta))})
    candidates = pd.DataFrame(rows)
    if len(ranked) == 1:
        reason = (f"{leader!r} is the only eligible candidate: every other one is worse than {natural!r} by more "
                  f"than δ = {cfg.max_regression_bpb:g} bits/byte on some source, or has no results")
        near = selection.scores[~selection.scores.eligible & selection.scores.worst_regression_bpb.notna()]
        if not near.empty:  # δ is applied to seed means without an interval: say how close the nearest one came
            row = near.loc[near.worst_regression_bpb.idxmin()]
            reason += (f" (nearest: {row.candidate!r} at {row.worst_regression_bpb:+.4f}, mean over "
                       f"{len(have.get(row.candidate, []))} seed(s))")
        return MixtureDecision(leader, leader, None, "decided", reason, None, have[leader], candidates, have,
                               selection)
    runner_up = ranked[1]
    margin, common = intervals[runner_up]
    if len(common) < 2:
        few = [c for c in (leader, runner_up) if len(have[c]) < 2] or [leader, runner_up]
        reason = f"{' and '.join(map(repr, few))} trained at 1 seed: seed noise is unmeasured"
        if cfg.seeds < 2:
            resolve = (f"train {leader!r} and {runner_up!r} at ≥ 2 seeds (mixture.seeds ≥ 2, e.g. 3) so that the "
                       "margin's interval includes seed noise")
        else:
            resolve = (f"train {' and '.join(map(repr, few))} at {cfg.seeds} seeds too: not among round 1's "
                       f"{cfg.top_k} leading candidates (raise mixture.top_k)")
    elif margin is None:
        reason = "the held-out windows come from fewer than 2 documents: no interval"
        resolve = f"evaluate on more held-out documents (≥ {MIN_UNITS['documents']} among the general sources)"
    elif margin.shortfall():
        reason = f"the margin's interval {margin.shortfall()}"
        resolve = (f"train {leader!r} and {runner_up!r} at ≥ {MIN_UNITS['seeds']} seeds (mixture.seeds) and score "
                   f"≥ {MIN_UNITS['documents']} held-out documents: below that the interval's coverage is not "
                   "assured (docs/methods.md §16)")
    elif margin.low > 0 and has_width(margin.low, margin.high, margin.delta):
        return MixtureDecision(leader, leader, runner_up, "decided",
                               f"the margin's {cfg.confidence:.0%} interval lies above 0", margin, common,
                               candidates, have, selection)
    else:
        reason = f"the margin's {cfg.confidence:.0%} interval holds 0"
        resolve = _resolve(margin, cfg.confidence, leader, runner_up)
    choice, pool, fallback = _fallback(cfg, natural, leader, candidates, weights, unique, ranked)
    return MixtureDecision(choice, leader, runner_up, "undetermined", reason, margin, common, candidates, have,
                           selection, fallback=fallback, resolve=resolve, pool=pool)


def seeds_needed(margin: Margin, confidence: float, limit: int = MAX_SEEDS) -> int | None:
    """Fewest seeds N per leading candidate at which, were the margin and both noise parts to stay as measured,
    the interval's low bound would exceed 0: the seed part of the variance shrinks as 1/N, the held-out part does
    not; degrees of freedom as ``evals.stats.seed_cluster_mean_ci`` computes them. At least
    ``MIN_UNITS["seeds"]``. None when Δ ≤ 0 or more than ``limit`` seeds are needed."""
    m, n = margin.delta, len(margin.per_seed)
    if not m > 0:
        return None
    seed_var_1 = margin.seed_se ** 2 * n  # the variance of one seed's margin
    doc_var, doc_df = margin.doc_se ** 2, max(margin.n_clusters - 1, 1)
    for needed in range(max(n + 1, MIN_UNITS["seeds"]), limit + 1):
        seed_var = seed_var_1 / needed
        total = seed_var + doc_var
        parts = [(v, d) for v, d in ((seed_var, needed - 1), (doc_var, doc_df)) if v > 0]
        df = total ** 2 / sum(v * v / d for v, d in parts) if parts else math.inf
        if float(stats.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(total) < m:
            return needed
    return None


def _resolve(margin: Margin, confidence: float, leader: str, runner_up: str) -> str:
    needed = seeds_needed(margin, confidence)
    if needed is None:
        return (f"no practical number of seeds (≤ {MAX_SEEDS}) is expected to separate {leader!r} from "
                f"{runner_up!r}: their margin is {margin.delta:+.4f} bits/byte over {len(margin.seeds)} seeds; treat "
                "them as equal, or change the candidates")
    return (f"≈{needed} seeds per leading candidate (mixture.seeds = {needed}): the interval narrows as 1/√seeds "
            f"against a margin of {margin.delta:.4f} bits/byte measured at {len(margin.seeds)} seeds")


def _fallback(cfg: MixtureConfig, natural: str, leader: str, candidates: pd.DataFrame,
              weights: dict[str, dict[str, float]], unique: dict[str, int],
              ranked: list[str]) -> tuple[str, list[str], str]:
    if cfg.on_undetermined == "natural":
        return natural, [natural], f"keep the natural mixture {natural!r}"
    inseparable = set(candidates.loc[~candidates.separable, "candidate"])
    pool = [c for c in ranked if c == leader or c in inseparable]
    order = {c: i for i, c in enumerate(ranked)}
    choice = min(pool, key=lambda c: (most_repeated(weights[c], unique), order[c]))
    return choice, pool, (f"among the leader and the candidates not separable from it ({', '.join(pool)}), take "
                          f"the one whose most-repeated source has the smallest w_s/U_s: {choice!r}")
