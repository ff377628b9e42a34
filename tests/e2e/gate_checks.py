"""Checks shared by the end-to-end tests that read a gate's decisions: does the table agree with itself?"""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def implied_verdict(table: pd.DataFrame, record: dict, config: Path) -> str:
    """Check every gate row against the evidence it rests on and return the verdict the rows imply.

    Each pass/fail rests on at least its minimum of independent units (``evals.stats.MIN_UNITS``: documents for
    loss criteria, prompts or items otherwise, and the criterion's ``min_items``), on an interval of non-zero width
    wholly on one side of the threshold, and has no shortfall reason; a criterion under its minimum is undetermined
    and says why. A row's decision follows from its statuses, and the record's verdict and kept model from the rows
    (docs/methods.md §14).

    This is a consistency check only: a table whose every verdict is wrong but agrees with its own intervals
    passes it. Which verdict a given piece of evidence must get is tested on planted evidence
    (tests/unit/test_gate_planted.py).
    """
    from evals.gate import LOSS_METRICS, SELECTIONS
    from evals.stats import MIN_UNITS
    from flows.config import load_config

    gate = load_config(config).gate
    for row in table.to_dict("records"):
        statuses = []
        for c in gate.criteria:
            status, units, reason = row[f"status_{c.name}"], int(row[f"units_{c.name}"]), row[f"reason_{c.name}"]
            minimum = MIN_UNITS["documents"] if c.metric in LOSS_METRICS else max(MIN_UNITS["items"], c.min_items)
            low, high = row[f"{c.column}_ci_low"], row[f"{c.column}_ci_high"]
            where = (row["candidate"], c.name, status, units, low, high, reason)
            if c.metric in LOSS_METRICS:
                assert units == row[f"{c.column}_docs"], where
            good_low, good_high = (low, high) if c.op == ">=" else (-high, -low)
            threshold = c.threshold if c.op == ">=" else -c.threshold
            # The one status this evidence allows: too few units or a zero-width interval decide nothing; an
            # interval wholly on one side of the threshold passes or fails; one across it is undetermined.
            expected = ("undetermined" if units < minimum or not low < high else
                        "pass" if good_low >= threshold else "fail" if good_high < threshold else "undetermined")
            assert status == expected, (*where, expected)
            if units < minimum:
                assert reason.startswith(f"needs >= {minimum} ") and f"has {units}" in reason, where
            if expected != "undetermined":
                assert not reason, where
            statuses.append(status)
        implied = ("pass" if all(s == "pass" for s in statuses) else "fail" if "fail" in statuses
                   else "undetermined")
        assert row["decision"] == implied, (row["candidate"], statuses, row["decision"])
    passing = table[table["decision"] == "pass"]
    if len(passing):
        metric, largest = SELECTIONS[gate.select]
        best = passing.loc[passing[metric].idxmax() if largest else passing[metric].idxmin(), "candidate"]
        verdict, kept = "decided", best
    else:  # nothing passes: the base is kept, decided only when every candidate failed
        verdict = "undetermined" if (table["decision"] == "undetermined").any() else "decided"
        kept = "base"
    assert record["decision"]["verdict"] == verdict and record["kept"] == kept
    assert table.loc[table["kept"], "candidate"].tolist() == ([] if kept == "base" else [kept])
    return verdict
