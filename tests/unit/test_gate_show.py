"""`pretrain gate show` prints every candidate and criterion name whole, however narrow the terminal
(tasks/gate/views.py ``gate_tables``)."""

import io

import pandas as pd
from rich.console import Console

from flows.config import load_config
from tasks.gate.views import gate_tables

CANDIDATES = ["replay0.1_lr0.0003_domain_heavy", "replay0.3_lr0.0001_domain_heavy"]
CRITERIA = ["general_loss_rise_nats_at_most", "domain_loss_reduction_nats_at_least"]


def _decisions() -> pd.DataFrame:
    rows = []
    for i, name in enumerate(CANDIDATES):
        row = {"candidate": name, "param_replay_fraction": 0.1, "param_peak_lr": 3e-4, "gate_hash": "ab" * 32,
               "artifact_key": "k", "decision": "pass" if i == 0 else "fail", "kept": i == 0}
        for metric in ("general_loss_rise_nats", "domain_loss_reduction_nats"):
            row |= {metric: 0.01, f"{metric}_ci_low": -0.02, f"{metric}_ci_high": 0.04}
        row |= {f"status_{c}": "pass" if i == 0 else "undetermined" for c in CRITERIA}
        rows.append(row)
    return pd.DataFrame(rows)


def _shown(width: int) -> str:
    gates = pd.DataFrame({"gate_hash": ["ab" * 32], "declared_at": ["2026-01-01T00:00:00+00:00"],
                          "declared_after_evidence": [False], "evidence_before": [""]})
    out = io.StringIO()
    console = Console(file=out, width=width)
    for item in gate_tables(gates, _decisions(), load_config("configs/smoke.toml").gate):
        console.print(item)
    return out.getvalue()


def test_a_narrow_terminal_folds_names_rather_than_cutting_them():
    text = _shown(60)
    assert "…" not in text and all(len(line) <= 60 for line in text.splitlines())


def test_candidate_and_criterion_names_are_never_cut():
    text = _shown(100)
    assert "…" not in text
    for name in CANDIDATES + CRITERIA:
        assert name in text, name
    assert text.count("undetermined") == len(CRITERIA)  # one row per candidate and criterion


def test_every_cell_and_verdict_is_whole_at_100_and_60_columns():
    from test_report_blocks import assert_whole

    for width in (100, 60):
        text = _shown(width)
        assert_whole(text, CANDIDATES + CRITERIA + ["undetermined", "pass (kept)", "fail", "+0.010 [-0.020, +0.040]"],
                     width)
