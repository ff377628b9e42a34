"""Coverage of the scaling-ladder forecast, by simulation from a known law (docs/methods.md §5).

    .venv/bin/python benchmarks/coverage_ladder.py --quick     # 100 replicates per cell, 100 resamples: ~1 min
    .venv/bin/python benchmarks/coverage_ladder.py             # 2,000 replicates per cell, 1000 resamples
    .venv/bin/python benchmarks/coverage_ladder.py --before    # also the rule and interval the stage used before
    .venv/bin/python benchmarks/coverage_ladder.py --variants  # also the interval rules not chosen

Each replicate draws a ladder as ``LadderConfig`` makes one: a grid of widths × budgets (4 = 2 × 2, 6 = 3 × 2,
8 = 2 × 4, 9 = 3 × 3 rungs; N geometric over 1e4–2e5 non-embedding parameters, D over 3e4–5e5 tokens, like the
demo's ladder), the largest-width × largest-budget rung held out from 5 rungs on (the default ``holdout``), and each
rung's loss from the KNOWN law ``LAW`` times exp(σ·z), z standard normal, σ drawn log-uniformly in [0.5%, 2%] per
ladder. The target (the "main run") lies at F × the largest rung's compute, F log-uniform in [3, 10] (``near``; the
demo's main run is 8.9× its largest rung) or [300, 3000] (``far``), N and D scaled by F^u and F^(1−u),
u ~ U(0.2, 0.6); ``demo``: the demo's own ladder (``DEMO``) and main run. Each replicate calls the production
procedure ``tasks.ladder.forecast.forecast_from_points`` with the default ``[ladder]`` rules and counts whether the
nominal 95% interval covers the true L at the target among the replicates it decided, and how many it judged
undetermined (refused).

The cost is in the bootstrap (the fit's and the backtest's, one batch per replicate): ``--bootstrap`` resamples,
1000 by default as ``[ladder] bootstrap``; ``--quick`` lowers it to 100 (cruder percentile ends) to stay near a
minute on one core. ``--before``: the rule the stage used before (the full form and every held-out rung within
``forecast_tolerance``; the bootstrap percentile interval alone), judged on the same fits. ``--variants``: the
decided replicates' coverage had the model error been combined in quadrature, or left out.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.ladder.fit import ScalingLaw  # noqa: E402
from tasks.ladder.forecast import ForecastRules, forecast_from_points  # noqa: E402

# Hoffmann et al. 2022's exponents (α 0.34, β 0.28) with A, B and E scaled so that the rungs' losses fall in
# 4.5–8.1 nats/token at these sizes, as the demo's do.
LAW = ScalingLaw(E=2.0, A=70.0, alpha=0.34, B=55.0, beta=0.28)
GRIDS = {4: (2, 2), 6: (3, 2), 8: (2, 4), 9: (3, 3)}  # rungs: (widths, budgets)
N_SPAN, D_SPAN = (1e4, 2e5), (3e4, 5e5)
NOISE = (0.005, 0.02)  # σ of the multiplicative noise per rung, log-uniform
SCENARIOS = {"near": (3.0, 10.0), "far": (300.0, 3000.0)}  # target compute / the largest rung's
# configs/demo.toml's ladder exactly: widths 32/64/96 of the main model (N non-embedding), 15/30/60 steps of
# 8 × 256 tokens, and its main run (N 738,304, D 614,400: 8.9× the largest rung's compute).
DEMO = {"n": (46_336, 184_832, 415_488), "d": (30_720, 61_440, 122_880), "target": (738_304, 614_400)}
CELLS = [(scenario, rungs) for scenario in SCENARIOS for rungs in GRIDS] + [("demo", 9)]
CONFIDENCE = 0.95


def simulate(rng: np.random.Generator, rungs: int, scenario: str, law: ScalingLaw = LAW) -> dict:
    """One ladder: n, d, loss, held_out (arrays (rungs,)), the target's N and D, σ and F (``demo``: the demo's
    ladder and main run, ``rungs`` = 9)."""
    if scenario == "demo":
        n_axis, d_axis = np.array(DEMO["n"], dtype=float), np.array(DEMO["d"], dtype=float)
    else:
        widths, budgets = GRIDS[rungs]
        n_axis, d_axis = np.geomspace(*N_SPAN, widths), np.geomspace(*D_SPAN, budgets)
    n, d = (a.ravel() for a in np.meshgrid(n_axis, d_axis, indexing="ij"))
    held = (n == n.max()) & (d == d.max()) if rungs >= 5 else np.zeros(rungs, dtype=bool)
    sigma = math.exp(rng.uniform(*np.log(NOISE)))
    loss = law.loss(n, d) * np.exp(sigma * rng.normal(size=rungs))
    if scenario == "demo":
        target_n, target_d = (float(x) for x in DEMO["target"])
    else:
        factor, u = math.exp(rng.uniform(*np.log(SCENARIOS[scenario]))), rng.uniform(0.2, 0.6)
        target_n, target_d = float(n.max() * factor ** u), float(d.max() * factor ** (1 - u))
    return {"n": n, "d": d, "loss": loss, "held_out": held, "target_n": target_n, "target_d": target_d,
            "sigma": sigma, "factor": target_n * target_d / float((n * d).max())}


def _before(result, rules: ForecastRules) -> tuple[bool, float, float]:
    """The former rule and interval on the same fit: decided when the full form predicts every held-out rung within
    the tolerance (and one is held out); the bootstrap percentile interval widened to contain the forecast."""
    decided = result.form == "full" and bool(result.goodness) and all(
        abs(g["relative_error"]) <= rules.forecast_tolerance for g in result.goodness)
    low, high = min(result.bootstrap_low, result.predicted), max(result.bootstrap_high, result.predicted)
    return decided, low, high


def ladder_cells(replicates: int, seed: int, bootstrap: int = 1000, before: bool = False,
                 variants: bool = False, only: tuple[str, ...] = ()) -> list[dict]:
    """One dict per (scenario, rungs) cell: {"method", "scenario", "n" (rungs), "covered", "total" (decided
    replicates with an interval), "refused" (replicates judged undetermined)}, ``replicates`` ladders each, seeded
    by ``seed``. ``before``: method ``ladder_forecast(before)``, the former rule and interval on the same fits, as
    extra cells; ``variants``: ``ladder_forecast(quadrature)`` and ``ladder_forecast(bootstrap only)``, the same
    decided replicates with the model error combined in quadrature, or left out. ``only``: these scenarios (each
    cell draws from its own seed, so a subset gives the same numbers as the whole)."""
    return [cell for cells in iter_cells(replicates, seed, bootstrap, before, variants, only) for cell in cells]


def _variant(result, name: str) -> tuple[float, float]:
    low, high = min(result.bootstrap_low, result.predicted), max(result.bootstrap_high, result.predicted)
    if name == "bootstrap only":
        return low, high
    m, p = result.model_error, result.predicted
    return p - math.hypot(p - low, m), p + math.hypot(high - p, m)


def iter_cells(replicates: int, seed: int, bootstrap: int = 1000, before: bool = False, variants: bool = False,
               only: tuple[str, ...] = ()):
    """``ladder_cells`` one cell at a time (with its ``before`` and ``variants`` twins), as each is done."""
    rules = ForecastRules(bootstrap=bootstrap)
    names = ("quadrature", "bootstrap only") if variants else ()
    for index, (scenario, rungs) in enumerate(CELLS):
        if only and scenario not in only:
            continue
        rng = np.random.default_rng([seed, index, rungs])
        now = {"method": "ladder_forecast", "scenario": scenario, "n": rungs, "covered": 0, "total": 0,
               "refused": 0}
        old = {**now, "method": "ladder_forecast(before)"}
        other = {name: {**now, "method": f"ladder_forecast({name})"} for name in names}
        for replicate in range(replicates):
            sim = simulate(rng, rungs, scenario)
            truth = float(LAW.loss(sim["target_n"], sim["target_d"]))
            result = forecast_from_points(sim["n"], sim["d"], sim["loss"], sim["held_out"], sim["target_n"],
                                          sim["target_d"], rules, seed=replicate)
            if result.verdict == "decided":
                now["total"] += 1
                now["covered"] += int(result.low <= truth <= result.high)
            else:
                now["refused"] += 1
            for name, cell in other.items():
                low, high = _variant(result, name)
                cell["total" if result.verdict == "decided" else "refused"] += 1
                cell["covered"] += int(result.verdict == "decided" and low <= truth <= high)
            if before:
                decided, low, high = _before(result, rules)
                old["total" if decided else "refused"] += 1
                old["covered"] += int(decided and low <= truth <= high)
        yield [now] + ([old] if before else []) + list(other.values())


def line(cell: dict) -> str:
    total, refused = cell["total"], cell["refused"]
    rate = f"{cell['covered'] / total:.3f}" if total else "n/a"
    return (f"coverage {cell['method']} {cell['scenario']} n={cell['n']}: {rate} ({cell['covered']}/{total} decided "
            f"covered), refused {refused}/{total + refused} ({refused / max(total + refused, 1):.0%})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100 replicates per cell (a check, not the table)")
    parser.add_argument("--replicates", type=int, default=0, help="replicates per cell (default 2,000; quick 100)")
    parser.add_argument("--bootstrap", type=int, default=0, help="resamples per bootstrap (default 1000; quick 100)")
    parser.add_argument("--before", action="store_true", help="also the former rule and interval")
    parser.add_argument("--variants", action="store_true", help="also the interval in quadrature and without m")
    parser.add_argument("--only", default="", help="comma-separated scenarios (near, far, demo); default all")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    replicates = args.replicates or (100 if args.quick else 2000)
    bootstrap = args.bootstrap or (100 if args.quick else 1000)
    started = time.process_time()
    only = tuple(s for s in args.only.split(",") if s)
    for cells in iter_cells(replicates, args.seed, bootstrap, args.before, args.variants, only):
        for cell in cells:
            print(line(cell), flush=True)
    print(f"coverage_ladder: {replicates:,} replicates per cell, {bootstrap} bootstrap resamples, "
          f"{time.process_time() - started:.0f} s CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
