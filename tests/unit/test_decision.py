"""The shared decision record: declared before the evidence, settled with an interval, rows for DuckDB."""

import json
import math

import pytest

from evals.decision import DECISION_COLUMNS, DecisionRecord, decisions_frame, rule_hash
from infra.errors import DataError


def test_rule_hash_ignores_key_order_and_changes_with_the_rule():
    assert rule_hash({"a": 1, "b": [1, 2]}) == rule_hash({"b": [1, 2], "a": 1})
    assert rule_hash({"a": 1}) != rule_hash({"a": 2})


def test_declared_then_settled_keeps_the_declaration_and_fills_the_outcome():
    declared = DecisionRecord.declare("mixture", rule="margin interval above 0", rule_config={"confidence": 0.95},
                                      declared_at="2026-01-01T00:00:00+00:00")
    assert declared.verdict == "" and declared.declared_at == "2026-01-01T00:00:00+00:00"
    settled = declared.settle(choice="temp0.3", verdict="decided", estimate=0.05, low=0.01, high=0.09,
                              unit="bits/byte", evidence={"table": "mixture_trials", "artifact_key": "k"})
    assert settled.declared_at == declared.declared_at and settled.rule_hash == declared.rule_hash
    assert settled.decided_at >= declared.declared_at
    assert settled.fallback == "" and settled.resolve == ""
    row = settled.row()
    assert list(row) == list(DECISION_COLUMNS)
    assert json.loads(row["evidence"]) == {"artifact_key": "k", "table": "mixture_trials"}
    assert DecisionRecord.from_dict(settled.as_dict()) == settled
    assert "decided +0.05 [+0.01, +0.09] bits/byte" in settled.line()


def test_undetermined_needs_a_fallback_and_what_would_resolve_it():
    declared = DecisionRecord.declare("peak_lr", rule="interval narrower than 3x", rule_config={"factor": 3})
    with pytest.raises(DataError, match="falls back"):
        declared.settle(choice="1e-3", verdict="undetermined")
    record = declared.settle(choice="1e-3", verdict="undetermined", fallback="best trial's LR",
                             resolve="add 4 trials between 1e-3 and 1e-2")
    assert "to resolve: add 4 trials" in record.line()
    frame = decisions_frame([record])
    assert frame.loc[0, "verdict"] == "undetermined" and math.isnan(frame.loc[0, "estimate"])


@pytest.mark.parametrize("verdict, bounds", [("maybe", (0.0, -1.0, 1.0)), ("decided", (2.0, -1.0, 1.0))])
def test_bad_verdicts_and_intervals_are_refused(verdict, bounds):
    declared = DecisionRecord.declare("gate", rule="all pass", rule_config={})
    estimate, low, high = bounds
    with pytest.raises(DataError):
        declared.settle(choice="base", verdict=verdict, estimate=estimate, low=low, high=high)


def test_a_brief_line_leaves_the_fallback_and_resolution_to_the_closing_block():
    record = DecisionRecord.declare("forecast", rule="r", rule_config={}).settle(
        choice="x", verdict="undetermined", fallback="keep going", resolve="more rungs")
    assert record.line().endswith("; keep going; to resolve: more rungs")
    assert record.line(tail=False) == "forecast: x — undetermined"
