"""The coverage benchmark (benchmarks/interval_coverage.py) runs the production intervals on simulated data and
classifies its cells as docs/methods.md §16 says."""

import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import interval_coverage as ic  # noqa: E402


def test_cells_are_within_conservative_refused_or_under_by_their_monte_carlo_interval():
    assert ic.Cell("m", "s", 10, "documents", 95, 100).within
    assert ic.Cell("m", "s", 10, "documents", 2000, 2000).conservative
    under = ic.Cell("m", "s", 10, "documents", 850, 1000)
    assert not under.within and not under.conservative and "under 0.93" in under.line()
    assert ic.Cell("m", "s", 2, "documents", 50, 100).below_minimum  # below MIN_UNITS["documents"]
    assert ic.Cell("m", "s", 50, "documents", 95, 100, seeds=2).below_minimum  # below MIN_UNITS["seeds"]
    refused = ic.Cell("ladder_forecast", "far", 9, "", 0, 0, 75)
    assert refused.refused_all and "all 75 replicates undetermined" in refused.line()


def test_every_scenario_of_the_plan_runs_on_the_production_functions():
    for scenario in ("even", "skewed", "long", *ic.SIZE_LINK):
        ic.TRUTH[scenario] = ic._truth(scenario)
    for scenario in ic.LR_NOISE:
        ic.TRUTH_LR[scenario] = ic._lr_truth(scenario)
    cells = ic.plan(quick=True, stress=False) + ic.plan(quick=True, stress=True)
    assert {c.method for c, _ in cells} >= {"gate_loss", "context_long_loss", "mixture_margin_s3", "cloze_delta",
                                            "retrieval_delta", "cloze_accuracy", "lr_optimum", "ablation_delta_s3"}
    for index, (cell, run) in enumerate(cells):
        rng = np.random.default_rng(index)
        for before in (False, True):
            run(rng, cell, before)
        assert cell.total + cell.refused == 2, cell.line()


def test_the_benchmark_prints_one_line_per_cell_and_the_tally():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "interval_coverage.py"), "--replicates", "40",
                          "--only", "cloze_accuracy"], capture_output=True, text=True, check=False, timeout=300)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 16 and all(line.startswith("coverage cloze_accuracy p0.") for line in lines[:15])
    assert lines[-1].startswith("coverage: ") and "refused below their minimum" in lines[-1]
