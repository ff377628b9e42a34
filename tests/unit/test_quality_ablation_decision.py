"""The quality ablation's decision record: settled from the overall row, published to DuckDB ``decisions`` and
shown in the summary's closing decisions block like the other decisions."""

from __future__ import annotations

import json

from flows.summary import collect_decisions
from infra.artifacts import Artifact
from infra.stage import PublishContext
from tasks.ablation.publish import publish
from tasks.ablation.stage import declare, settle
from test_quality_ablation import _compare, _windows


def _artifact(tmp_path, shift: float):
    table, overall = _compare(_windows({"a": shift, "b": shift}))
    record = settle(declare(3), overall, readded_docs=10, evidence={"table": "quality_ablation", "artifact_key": "k"})
    out = tmp_path / "quality_ablation"
    out.mkdir(parents=True)
    table.to_parquet(out / "ablation.parquet", index=False)
    (out / "ablation.json").write_text(json.dumps({
        "requested": True, "overall": overall, "verdicts": dict(zip(table.source, table.verdict)),
        "readded_docs": 10, "removed_docs": 12, "decontaminated_docs": 2, "confidence": 0.95,
        "proxy": {"tokens": 1000}, "decision": json.loads(record.to_json())}, default=float))
    return out, record


def test_a_planted_gain_is_decided_and_a_null_one_says_what_would_settle_it(tmp_path):
    _, helped = _artifact(tmp_path / "a", 0.2)
    assert helped.kind == "quality_ablation" and helped.verdict == "decided"
    assert helped.choice == "classifier helped" and helped.low > 0 and helped.unit == "bits/byte"
    assert helped.n_units == 3 and helped.units.startswith("seeds × ")
    _, null = _artifact(tmp_path / "b", 0.0)
    assert null.verdict == "undetermined" and null.choice == "classifier kept"
    assert "interval holds 0" in null.resolve and null.fallback


def test_nothing_drawn_is_undetermined_with_a_longer_proxy_as_the_fix():
    overall = {"verdict": "unchanged", "delta_bpb": 0.0, "delta_low": 0.0, "delta_high": 0.0, "seeds": 3,
               "heldout_docs": 30, "sources": ["a"], "reason": ""}
    record = settle(declare(3), overall, readded_docs=4, evidence={})
    assert record.verdict == "undetermined" and "budget.steps" in record.resolve


def test_the_record_goes_to_duckdb_decisions_and_the_closing_block(tmp_path):
    out, _ = _artifact(tmp_path, 0.2)
    published = publish(PublishContext(Artifact("quality_ablation", "k", out, {}), {}, None, False))
    rows = published.tables["decisions"]
    assert rows["kind"].tolist() == ["quality_ablation"] and rows["verdict"].tolist() == ["decided"]
    assert published.tags["decision.quality_ablation.verdict"] == "decided"
    [record] = collect_decisions({"quality_ablation": out})
    assert record.line().startswith("quality_ablation: classifier helped — decided +")
