"""Coverage of every interval a verdict rests on, by simulation with a known truth (docs/methods.md §16).

    .venv/bin/python benchmarks/interval_coverage.py --quick          # ~300 replicates per cell, a few minutes
    .venv/bin/python benchmarks/interval_coverage.py                  # 2,000 replicates per cell (the table in docs)
    .venv/bin/python benchmarks/interval_coverage.py --before         # also the intervals the verdicts used before

Each cell draws data in a shape the platform really sees (2–5 training seeds, 2–500 held-out documents of
unequal length with windows correlated within a document, paired items with few discordant pairs, 4–12 sweep
trials, ladders of 4–9 rungs), computes the nominal 95% interval with the production function
(``evals.stats``, ``tasks.ladder.fit``) and counts how often it covers the truth. One line per cell:

    coverage <method> <scenario> n=<units>: <rate> [<99% Monte Carlo interval>]

Cells below the method's minimum units (``evals.stats.MIN_UNITS``) are where the platform refuses to decide; they
are printed as refused, with the coverage the interval would have had. A replicate whose interval is unbounded
(an unresolved parabola, a degenerate ladder fit) is a refusal of that replicate, counted apart. The last line:

    coverage: <k> of <m> cells within [0.93, 0.99], <c> conservative above it, <r> refused below their minimum

A cell is within when its Monte Carlo interval overlaps [0.93, 0.99]; conservative when it lies wholly above 0.99
(an interval wider than it needs: at a true difference of exactly 0 with 1–2 discordant items expected, every
interval of nonzero width covers, so no method can be both safe there and under 0.99); under when it lies wholly
below 0.93, the failure: exit status 1 when any cell the platform decides on is under.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from evals.stats import (MIN_UNITS, cluster_bootstrap_ci, cluster_mean_ci, paired_bootstrap_ci,  # noqa: E402
                         paired_proportion_diff_ci, proportion_ci, loss_minimum_ci, seed_cluster_bootstrap_ci,
                         seed_cluster_mean_ci)

CONFIDENCE = 0.95
BAND = (0.93, 0.99)
SEQ_LEN = 256  # tokens per held-out window, as the demo's main model


@dataclass
class Cell:
    method: str
    scenario: str
    n: int
    units: str  # key of MIN_UNITS, or "" (no minimum: e.g. the ladder, which refuses per replicate)
    covered: int = 0
    total: int = 0
    refused: int = 0  # replicates whose interval was unbounded / undetermined
    seeds: int = 0  # training seeds per arm, for the methods that need MIN_UNITS["seeds"]

    @property
    def below_minimum(self) -> bool:
        return bool(self.units) and (self.n < MIN_UNITS[self.units]
                                     or (self.seeds > 0 and self.seeds < MIN_UNITS["seeds"]))

    @property
    def refused_all(self) -> bool:
        """Every replicate undetermined (a ladder too small or an extrapolation too long): nothing decided."""
        return self.total == 0 and self.refused > 0

    def minimum(self) -> str:
        seeds = f" and {MIN_UNITS['seeds']} seeds" if self.seeds else ""
        return f"{MIN_UNITS[self.units]} {self.units}{seeds}"

    def mc_interval(self) -> tuple[float, float]:
        if not self.total:
            return math.nan, math.nan
        ci = stats.binomtest(self.covered, self.total).proportion_ci(confidence_level=0.99, method="exact")
        return float(ci.low), float(ci.high)

    @property
    def within(self) -> bool:
        low, high = self.mc_interval()
        return bool(self.total) and low <= BAND[1] and high >= BAND[0]

    @property
    def conservative(self) -> bool:
        return bool(self.total) and self.mc_interval()[0] > BAND[1]

    def line(self) -> str:
        rate = self.covered / self.total if self.total else math.nan
        low, high = self.mc_interval()
        text = f"coverage {self.method} {self.scenario} n={self.n}: {rate:.3f} [{low:.3f}, {high:.3f}]"
        if self.refused:
            text += f" ({self.refused} of {self.total + self.refused} replicates refused)"
        if self.refused_all:
            text = f"coverage {self.method} {self.scenario} n={self.n}: refused: all {self.refused} replicates undetermined"
        elif self.below_minimum:
            text += f" refused: below the minimum of {self.minimum()}"
        elif self.conservative:
            text += "  (conservative: above 0.99)"
        elif not self.within:
            text += "  << under 0.93"
        return text


# ------------------------------------------------------------------------------------------- held-out documents

def documents(rng: np.random.Generator, n_docs: int, scenario: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Windows of ``n_docs`` held-out documents: (doc id (W,), tokens (W,), per-document effect (n_docs,)).

    ``even``: 1 + Poisson(3) windows per document, normal document effects (sd 0.05 nats).
    ``skewed``: lognormal lengths (1 to ~60 windows) and heavy-tailed effects (Student t with 3 df).
    ``size_linked``: skewed lengths, and longer documents gain more (the effect grows with log length).
    ``long``: 1–3 windows per document (long-context windows of a few long documents).
    The last window of each document is partial (a uniform share of ``SEQ_LEN`` tokens).
    """
    if scenario == "even":
        n_windows = 1 + rng.poisson(3, n_docs)
    elif scenario == "long":
        n_windows = rng.integers(1, 4, n_docs)
    else:
        n_windows = np.minimum(1 + rng.lognormal(1.0, 1.0, n_docs).astype(int), 60)
    if scenario == "even" or scenario == "long":
        effect = rng.normal(0.0, 0.05, n_docs)
    elif scenario == "skewed":
        effect = 0.05 * rng.standard_t(3, n_docs) / math.sqrt(3.0)
    else:
        effect = SIZE_LINK[scenario] * (np.log(n_windows) - SIZE_LINK_CENTRE) + 0.03 * rng.normal(size=n_docs)
    doc = np.repeat(np.arange(n_docs), n_windows)
    tokens = np.full(len(doc), SEQ_LEN, dtype=float)
    last = np.cumsum(n_windows) - 1
    tokens[last] = rng.integers(16, SEQ_LEN + 1, n_docs)
    return doc, tokens, effect


SIZE_LINK_CENTRE = 1.0
# nats per e-fold of document length: the gain rises from 0.08 to 0.16 nats between a 1-window and a 60-window
# document (size_linked); from 0.06 to 0.22 under ``stress_size_linked`` (--stress): a few long documents then
# carry the token-weighted mean, and the t interval under-covers (docs/methods.md §16 gives the figures).
SIZE_LINK = {"size_linked": 0.02, "stress_size_linked": 0.04}


def _truth(scenario: str) -> float:
    """The population Δ that the token-weighted mean estimates: E[tokens·effect] / E[tokens] over documents, by a
    large draw (1e6 documents) for the size-linked scenario; TRUE_DELTA plus zero-mean effects otherwise."""
    if scenario not in SIZE_LINK:
        return TRUE_DELTA
    doc, tokens, effect = documents(np.random.default_rng(12345), 1_000_000, scenario)
    doc_tokens = np.bincount(doc, weights=tokens)
    return TRUE_DELTA + float(doc_tokens @ effect / doc_tokens.sum())


TRUE_DELTA = 0.1
WINDOW_SD = 0.08  # nats/token: window-to-window noise within a document


def loss_pair(rng, n_docs: int, scenario: str):
    """(base (W,), candidate (W,), doc (W,), tokens (W,)) nats/token per window; Δ = base − candidate."""
    doc, tokens, effect = documents(rng, n_docs, scenario)
    base = 3.0 + rng.normal(0.0, 0.3, n_docs)[doc]  # documents differ in difficulty; it cancels in the pair
    cand = base - (TRUE_DELTA + effect[doc]) + WINDOW_SD * rng.normal(size=len(doc)) * np.sqrt(SEQ_LEN / tokens)
    return base, cand, doc, tokens


def cell_gate_loss(rng, cell: Cell, before: bool) -> None:
    truth = TRUTH[cell.scenario]
    base, cand, doc, tokens = loss_pair(rng, cell.n, cell.scenario)
    if before:
        ci = cluster_bootstrap_ci(cand, base, doc, weights=tokens, n_resamples=1000,
                                  seed=int(rng.integers(1 << 31)))
    else:
        ci = cluster_mean_ci(cand, base, doc, weights=tokens, confidence=CONFIDENCE)
    cell.total += 1
    cell.covered += ci.low <= truth <= ci.high


# ------------------------------------------------------------------------------------------- seeds × documents

SEED_SD = {"seed_dominated": 0.02, "doc_dominated": 0.004, "ablation": 0.003}  # bits/byte per training seed


def seeded_pair(rng, n_seeds: int, n_docs: int, scenario: str):
    """(a (S, W), b (S, W), doc (W,), weights (W,)) bits/byte per window for two arms trained with S seeds each;
    truth Δ = TRUE_MARGIN (ablation: TRUE_ABLATION)."""
    doc, tokens, effect = documents(rng, n_docs, "skewed" if scenario != "doc_dominated" else "even")
    truth = TRUE_ABLATION if scenario == "ablation" else TRUE_MARGIN
    scale = 0.1 if scenario == "ablation" else 0.4  # document effects relative to the loss-pair scenarios
    seed_effect = SEED_SD[scenario] * rng.normal(size=(n_seeds, 1))
    interaction = 0.01 * rng.normal(size=(n_seeds, n_docs))[:, doc]
    noise = 0.03 * rng.normal(size=(n_seeds, len(doc))) * np.sqrt(SEQ_LEN / tokens)
    a = 1.5 + rng.normal(0.0, 0.2, n_docs)[doc]
    b = a + truth + scale * effect[doc] + seed_effect + interaction + noise
    return np.broadcast_to(a, b.shape), b, doc, tokens


TRUE_MARGIN = 0.02
TRUE_ABLATION = 0.005


def cell_seeds_docs(rng, cell: Cell, before: bool, n_seeds: int) -> None:
    a, b, doc, weights = seeded_pair(rng, n_seeds, cell.n, cell.scenario)
    truth = TRUE_ABLATION if cell.scenario == "ablation" else TRUE_MARGIN
    if before:  # the mixture's former interval: the hull of the two-stage bootstrap and the t over seed margins
        boot = seed_cluster_bootstrap_ci(a, b, doc, weights=weights, n_resamples=1000,
                                         seed=int(rng.integers(1 << 31)))
        per_seed = (b - a) @ weights / weights.sum()
        half = float(stats.t.ppf(0.975, n_seeds - 1)) * per_seed.std(ddof=1) / math.sqrt(n_seeds)
        low, high = min(boot.low, per_seed.mean() - half), max(boot.high, per_seed.mean() + half)
    else:
        ci = seed_cluster_mean_ci(a, b, doc, weights=weights, confidence=CONFIDENCE)
        low, high = ci.low, ci.high
    cell.total += 1
    cell.covered += low <= truth <= high


# ------------------------------------------------------------------------------------------------ paired items

ITEM_SCENARIOS = {  # (p both right, p only base right, p only candidate right); the rest: both wrong
    "no_change": (0.45, 0.02, 0.02),
    "small_gain": (0.45, 0.03, 0.08),
    "regression": (0.45, 0.10, 0.02),
    "retrieval_gain": (0.15, 0.02, 0.60),
}


def paired_items(rng, n: int, scenario: str) -> tuple[np.ndarray, np.ndarray, float]:
    both, only_base, only_cand = ITEM_SCENARIOS[scenario]
    cells = rng.choice(4, size=n, p=[both, only_base, only_cand, 1 - both - only_base - only_cand])
    base = (cells == 0) | (cells == 1)
    cand = (cells == 0) | (cells == 2)
    return base, cand, only_cand - only_base


def cell_item_delta(rng, cell: Cell, before: bool) -> None:
    base, cand, truth = paired_items(rng, cell.n, cell.scenario)
    if before:
        if cell.n < 2:
            return
        ci = paired_bootstrap_ci(base.astype(float), cand.astype(float), n_resamples=1000,
                                 seed=int(rng.integers(1 << 31)))
    else:
        ci = paired_proportion_diff_ci(base, cand, CONFIDENCE)
    cell.total += 1
    cell.covered += ci.low <= truth <= ci.high


ACCURACY = {"p0.25": 0.25, "p0.50": 0.5, "p0.90": 0.9}


def cell_accuracy(rng, cell: Cell, before: bool) -> None:
    p = ACCURACY[cell.scenario]
    ci = proportion_ci(int(rng.binomial(cell.n, p)), cell.n, CONFIDENCE)
    cell.total += 1
    cell.covered += ci.low <= p <= ci.high


# ------------------------------------------------------------------------------------------------ LR optimum

LR_RANGE = (math.log(1e-3), math.log(5e-2))
LR_OPT = math.log(8e-3)
LR_CURVATURE = 0.06  # nats per (ln LR)²: +0.32 nats at a factor 10 from the optimum
LR_NOISE = {"parabola": 0.02, "noisy": 0.06, "asymmetric": 0.02}


def lr_loss(x: np.ndarray, scenario: str) -> np.ndarray:
    """True held-out loss (nats/token) at x = ln(peak LR); ``asymmetric`` rises faster above the optimum."""
    u = x - LR_OPT
    if scenario == "asymmetric":
        return 3.0 + LR_CURVATURE * u * u + 0.008 * u**3
    return 3.0 + LR_CURVATURE * u * u


def _lr_truth(scenario: str) -> float:
    if scenario != "asymmetric":
        return LR_OPT
    grid = np.linspace(*LR_RANGE, 200_001)
    return float(grid[np.argmin(lr_loss(grid, scenario))])


def cell_lr(rng, cell: Cell, before: bool) -> None:
    from tasks.sweep.lr_fit import bootstrap_optima, percentile_interval, quadratic_fit, optimum_log_lr

    x = rng.uniform(*LR_RANGE, cell.n)
    y = lr_loss(x, cell.scenario) + LR_NOISE[cell.scenario] * rng.normal(size=cell.n)
    truth = TRUTH_LR[cell.scenario]
    if before:
        optima, _ = bootstrap_optima(x, y, replicates=500, seed=int(rng.integers(1 << 31)))
        low, high = percentile_interval(optima, CONFIDENCE)
        a, b, _ = quadratic_fit(x, y)
        x_opt = optimum_log_lr(a, b)
        if not (math.isfinite(low) and math.isfinite(x_opt)):
            cell.refused += 1
            return
        low, high = min(low, x_opt), max(high, x_opt)
    else:
        ci = loss_minimum_ci(x, y, CONFIDENCE)
        if not ci.bounded:
            cell.refused += 1
            return
        low, high = ci.low, ci.high
    cell.total += 1
    cell.covered += low <= truth <= high


# ------------------------------------------------------------------------------------------------ the table

TRUTH: dict[str, float] = {}
TRUTH_LR: dict[str, float] = {}


def plan(quick: bool, stress: bool) -> list[tuple[Cell, Callable]]:
    docs = [2, 3, 5, 10, 30, 100] + ([] if quick else [500])
    items = [10, 20, 40, 100, 500]
    cells: list[tuple[Cell, Callable]] = []
    if stress:
        return [(Cell("gate_loss", "stress_size_linked", n, "documents"), cell_gate_loss) for n in docs]
    for scenario in ("even", "skewed", "size_linked"):
        for n in docs:
            cells.append((Cell("gate_loss", scenario, n, "documents"), cell_gate_loss))
    for n in (2, 3, 5, 10):
        cells.append((Cell("context_long_loss", "long", n, "documents"), cell_gate_loss))
    for scenario in ("seed_dominated", "doc_dominated"):
        for seeds in (2, 3, 5):
            for n in (3, 5, 20, 100):
                cells.append((Cell(f"mixture_margin_s{seeds}", scenario, n, "documents", seeds=seeds),
                              lambda rng, c, before, s=seeds: cell_seeds_docs(rng, c, before, s)))
    for seeds in (2, 3, 5):
        for n in (3, 10, 50):
            cells.append((Cell(f"ablation_delta_s{seeds}", "ablation", n, "documents", seeds=seeds),
                          lambda rng, c, before, s=seeds: cell_seeds_docs(rng, c, before, s)))
    for scenario in ITEM_SCENARIOS:
        method = "retrieval_delta" if scenario.startswith("retrieval") else "cloze_delta"
        for n in items:
            cells.append((Cell(method, scenario, n, "items"), cell_item_delta))
    for scenario in ACCURACY:
        for n in items:
            cells.append((Cell("cloze_accuracy", scenario, n, "items"), cell_accuracy))
    for scenario in LR_NOISE:
        for n in (6, 8, 10, 12, 20):
            cells.append((Cell("lr_optimum", scenario, n, "trials"), cell_lr))
    return cells


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer replicates per cell (a check, not the table)")
    parser.add_argument("--replicates", type=int, default=0, help="replicates per cell (default 2,000; quick 300)")
    parser.add_argument("--before", action="store_true", help="measure the intervals the verdicts used before")
    parser.add_argument("--only", default="", help="run only methods whose name contains this text")
    parser.add_argument("--stress", action="store_true",
                        help="only the stress scenarios: beyond the shapes the platform is sized for")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    replicates = args.replicates or (300 if args.quick else 2000)
    for scenario in ("even", "skewed", "long", *SIZE_LINK):
        TRUTH[scenario] = _truth(scenario)
    for scenario in LR_NOISE:
        TRUTH_LR[scenario] = _lr_truth(scenario)
    started = time.perf_counter()
    results: list[Cell] = []
    for index, (cell, run) in enumerate(plan(args.quick, args.stress)):
        if args.only and args.only not in cell.method:
            continue
        rng = np.random.default_rng([args.seed, index])
        if args.before:
            cell.method += "(before)"
        for _ in range(replicates):
            run(rng, cell, args.before)
        results.append(cell)
        print(cell.line(), flush=True)
    if not args.stress and (not args.only or "ladder" in args.only):
        results += ladder(replicates, args.seed, args.quick)
    below = [c for c in results if c.below_minimum or c.refused_all]
    decided = [c for c in results if not (c.below_minimum or c.refused_all)]
    inside = sum(c.within for c in decided)
    conservative = sum(c.conservative for c in decided)
    print(f"coverage: {inside} of {len(decided)} cells within [{BAND[0]}, {BAND[1]}], {conservative} conservative "
          f"above it, {len(below)} refused below their minimum ({time.perf_counter() - started:.0f} s, "
          f"{replicates:,} replicates per cell)")
    return 0 if inside + conservative == len(decided) else 1


def ladder(replicates: int, seed: int, quick: bool) -> list[Cell]:
    """The scaling-ladder forecast's cells (``coverage_ladder.ladder_cells``: the production fit on simulated
    ladders); fewer replicates, since each one fits a law and its bootstrap."""
    try:
        from coverage_ladder import ladder_cells
    except ImportError:
        return []
    cells = []
    for row in ladder_cells(max(50, replicates // (4 if quick else 2)), seed):
        cell = Cell(row["method"], row["scenario"], int(row["n"]), "", int(row["covered"]), int(row["total"]),
                    int(row["refused"]))
        print(cell.line(), flush=True)
        cells.append(cell)
    return cells


if __name__ == "__main__":
    raise SystemExit(main())
