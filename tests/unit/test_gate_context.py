"""The gate on context-extension candidates (docs/methods.md §15): loss on the long windows, judged per held-out
document like the domain loss, and passkey-retrieval accuracy per prompt length (Wilson; paired with McNemar)."""

import hashlib
import json
import zlib

import numpy as np
import pydantic
import pytest
from scipy import stats

from evals.decision import DecisionRecord
from evals.gate import (CONTEXT_METRICS, CandidateEval, GateConfig, GateCriterion, HeldoutArrays, decide,
                        gate_hash)
from evals.stats import MIN_UNITS, mcnemar_exact
from infra.errors import DataError

N_DOCS, PER_DOC, TOKENS = 12, 4, 256
LENGTHS = (128, 256, 512)
PER_LENGTH = 40  # prompts per length: MIN_UNITS["items"], the least a retrieval verdict rests on
DOCS = np.repeat(np.arange(N_DOCS) * 5 + 1, PER_DOC).astype(np.int64)
DOC_EFFECT = np.repeat(np.linspace(-0.3, 0.3, N_DOCS), PER_DOC)  # shared by base and candidates: it cancels
FORGETTING = GateCriterion(name="forgetting", metric="general_loss_rise_nats", op="<=", threshold=0.1)


def _windows(nats, docs=DOCS):
    return HeldoutArrays(np.asarray(nats, float), np.full(len(nats), TOKENS), docs)


def _model(name, long_reduction=None, correct=None, lengths=None, params=None):
    """A model with short-context losses at the base's level (general: with its own per-window noise, sd 0.02;
    domain: flat, the same for every model), long windows ``long_reduction`` nats below the base's with its own
    per-window noise (None: no long windows) and passkey results ``correct`` on prompts of ``lengths`` tokens."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))  # each model its own noise
    n = N_DOCS * PER_DOC
    flat = HeldoutArrays(np.full(n, 3.0), np.full(n, TOKENS), DOCS)
    general = _windows(3.0 + DOC_EFFECT + rng.normal(0, 0.02, n))
    long = None
    if long_reduction is not None:
        long = _windows(4.0 + DOC_EFFECT - long_reduction + rng.normal(0, 0.02, n))
    extra = {}
    if correct is not None:
        extra = {"retrieval_correct": np.asarray(correct, bool), "retrieval_length": np.asarray(lengths, np.int64)}
    return CandidateEval(name, general, flat, params=params or {}, long=long, **extra)


def _retrieval(accuracy_by_length, seed=0):
    """Correctness and prompt lengths: PER_LENGTH prompts per length, ``round(acc · PER_LENGTH)`` of them correct."""
    rng = np.random.default_rng(seed)
    correct, lengths = [], []
    for length, acc in zip(LENGTHS, accuracy_by_length):
        hits = np.zeros(PER_LENGTH, bool)
        hits[rng.permutation(PER_LENGTH)[:round(acc * PER_LENGTH)]] = True
        correct.append(hits)
        lengths.append(np.full(PER_LENGTH, length))
    return np.concatenate(correct), np.concatenate(lengths)


def test_context_metrics_are_the_three():
    assert CONTEXT_METRICS == {"long_loss_reduction_nats", "retrieval_accuracy", "retrieval_accuracy_delta"}


def test_a_candidate_clearly_better_on_long_windows_passes_a_long_criterion():
    gate = GateConfig(criteria=[FORGETTING, GateCriterion(name="long", metric="long_loss_reduction_nats", op=">=",
                                                          threshold=0.2)],
                      select="max_long_loss_reduction")
    base, better, flat = _model("base", 0.0), _model("better", 0.5), _model("flat", 0.0)
    result = decide(gate, base, [better, flat])
    table = result.table.set_index("candidate")
    m = "long_loss_reduction_nats"
    assert table.loc["better", m] == pytest.approx(0.5, abs=0.01)
    assert table.loc["better", f"{m}_ci_low"] > 0.2
    assert (table.loc["better", f"{m}_docs"], table.loc["better", f"{m}_windows"]) == (N_DOCS, N_DOCS * PER_DOC)
    assert table.loc["better", f"{m}_cluster_unit"] == "document"
    assert table.loc["better", f"{m}_window_ci_low"] <= table.loc["better", m]
    assert table.loc["better", "status_long"] == "pass" and table.loc["better", "window_status_long"] == "pass"
    assert table.loc["flat", "status_long"] == "fail" and table.loc["flat", "decision"] == "fail"
    assert result.kept == "better"
    assert f"over {N_DOCS} documents/{N_DOCS * PER_DOC} windows" in result.summary()


def test_an_open_long_criterion_counts_the_documents_that_would_settle_it():
    gate = GateConfig(criteria=[GateCriterion(name="long", metric="long_loss_reduction_nats", op=">=",
                                              threshold=0.1)])
    base = _model("base", 0.0)
    spread = np.repeat(np.linspace(-0.4, 0.4, N_DOCS), PER_DOC)  # the gain varies by document: wide interval
    noisy = CandidateEval("noisy", base.general, base.domain,
                          long=_windows(base.long.window_nats - 0.12 - spread))
    row = decide(gate, base, [noisy]).table.iloc[0]
    assert row["long_loss_reduction_nats_ci_low"] < 0.1 < row["long_loss_reduction_nats_ci_high"]
    assert row["status_long"] == "undetermined"
    assert row["needed_long"] > N_DOCS  # in documents, the units the interval resamples


def test_retrieval_accuracy_has_scipys_wilson_bounds_per_length():
    correct, lengths = _retrieval([0.9, 0.6, 0.3])
    base_correct, _ = _retrieval([0.5, 0.5, 0.5], seed=1)
    gate = GateConfig(criteria=[GateCriterion(name="passkey", metric="retrieval_accuracy", op=">=", threshold=0.5,
                                              length=256, confidence=0.9),
                                GateCriterion(name="long_passkey", metric="retrieval_accuracy", op=">=",
                                              threshold=0.6, length=512, confidence=0.99)])
    row = decide(gate, _model("base", correct=base_correct, lengths=lengths),
                 [_model("cand", correct=correct, lengths=lengths)]).table.iloc[0]
    for length, acc in zip(LENGTHS, (0.9, 0.6, 0.3)):
        k = round(acc * PER_LENGTH)
        confidence = 0.99 if length == 512 else 0.9  # a criterion's at its length, else the first's
        ci = stats.binomtest(k, PER_LENGTH).proportion_ci(confidence_level=confidence, method="wilson")
        column = f"retrieval_accuracy@{length}"
        assert row[column] == pytest.approx(k / PER_LENGTH)
        assert (row[f"{column}_ci_low"], row[f"{column}_ci_high"]) == pytest.approx((ci.low, ci.high))
        assert row[f"retrieval_items@{length}"] == PER_LENGTH
    assert row["status_passkey"] == "undetermined"  # 0.6 on 40 prompts: the 90% interval holds 0.5
    assert row["reason_passkey"] == ""  # undetermined by its interval, not for want of prompts
    assert row["status_long_passkey"] == "fail"  # 0.3 on 40: the 99% interval ends below 0.6
    assert "long_loss_reduction_nats" not in row  # no long windows, no long columns


def test_retrieval_delta_is_paired_over_prompts_with_an_exact_mcnemar_p():
    base_correct = np.zeros(3 * PER_LENGTH, bool)
    lengths = np.repeat(LENGTHS, PER_LENGTH)
    cand_correct = base_correct.copy()
    at_512 = np.flatnonzero(lengths == 512)
    cand_correct[at_512[:9]] = True  # 9 prompts fixed, 1 broken at 512 tokens
    base_correct[at_512[9]] = True
    gate = GateConfig(criteria=[GateCriterion(name="gain", metric="retrieval_accuracy_delta", op=">=",
                                              threshold=0.0)])
    row = decide(gate, _model("base", correct=base_correct, lengths=lengths),
                 [_model("cand", correct=cand_correct, lengths=lengths)], seed=3).table.iloc[0]
    assert row["retrieval_accuracy_delta@512"] == pytest.approx(8 / PER_LENGTH)
    assert row["retrieval_accuracy_delta@512_mcnemar_p"] == pytest.approx(stats.binomtest(9, 10, 0.5).pvalue)
    assert row["retrieval_accuracy_delta@512_mcnemar_p"] == mcnemar_exact(base_correct[at_512],
                                                                          cand_correct[at_512]).p_value
    low, high = row["retrieval_accuracy_delta@512_ci_low"], row["retrieval_accuracy_delta@512_ci_high"]
    assert 0.0 < low < 8 / PER_LENGTH < high  # Newcombe's paired interval: 9 gains against 1 loss clear zero
    for length in (128, 256):  # the same answers on every prompt: no discordant pair, still an interval with width
        column = f"retrieval_accuracy_delta@{length}"
        assert row[column] == 0.0 and row[f"{column}_mcnemar_p"] == 1.0
        assert row[f"{column}_ci_low"] < 0.0 < row[f"{column}_ci_high"]
    assert row["status_gain"] == "pass"  # judged at 512, the longest length
    assert (row["units_gain"], row["reason_gain"]) == (PER_LENGTH, "")


def test_length_zero_resolves_to_the_longest_length_evaluated():
    correct, lengths = _retrieval([1.0, 1.0, 0.2])
    criterion = GateCriterion(name="passkey", metric="retrieval_accuracy", op=">=", threshold=0.5, min_items=10)
    assert criterion.column == "retrieval_accuracy@longest"
    result = decide(GateConfig(criteria=[criterion]), _model("base", correct=correct, lengths=lengths),
                    [_model("cand", correct=correct, lengths=lengths)])
    assert result.criteria[0].length == 512 and result.criteria[0].column == "retrieval_accuracy@512"
    row = result.table.iloc[0]
    assert row["status_passkey"] == "fail"  # 0.2 at 512 tokens; 1.0 at the shorter lengths would pass
    assert row["units_passkey"] == PER_LENGTH == max(MIN_UNITS["items"], criterion.min_items)
    assert f"over {PER_LENGTH} items of 512 tokens" in result.summary()
    assert "documents" not in result.summary()


def test_a_criterion_on_a_length_not_evaluated_is_a_data_error():
    correct, lengths = _retrieval([0.5, 0.5, 0.5])
    gate = GateConfig(criteria=[GateCriterion(name="passkey", metric="retrieval_accuracy", op=">=", threshold=0.5,
                                              length=1024)])
    models = _model("base", correct=correct, lengths=lengths), [_model("cand", correct=correct, lengths=lengths)]
    with pytest.raises(DataError, match=r"length 1024.*\[128, 256, 512\]"):
        decide(gate, *models)


@pytest.mark.parametrize("criterion, select", [
    (GateCriterion(name="long", metric="long_loss_reduction_nats", op=">=", threshold=0.1),
     "max_domain_loss_reduction"),
    (GateCriterion(name="passkey", metric="retrieval_accuracy_delta", op=">=", threshold=0.0),
     "max_domain_loss_reduction"),
    (FORGETTING, "max_long_loss_reduction"),
])
def test_context_criteria_on_models_without_context_results_name_the_fix(criterion, select):
    gate = GateConfig(criteria=[criterion], select=select)
    with pytest.raises(DataError, match='kind = "context_extension"'):
        decide(gate, _model("base"), [_model("cand")])


def test_models_must_share_the_long_windows_and_prompts():
    gate = GateConfig(criteria=[FORGETTING])
    with pytest.raises(DataError, match="no long-window results"):
        decide(gate, _model("base", 0.0), [_model("cand")])
    correct, lengths = _retrieval([0.5, 0.5, 0.5])
    with pytest.raises(DataError, match="same passkey prompts"):
        decide(gate, _model("base", correct=correct, lengths=lengths),
               [_model("cand", correct=correct, lengths=np.sort(lengths)[::-1])])
    with pytest.raises(DataError, match="one length per prompt"):
        CandidateEval("cand", _model("x").general, _model("x").domain, retrieval_correct=correct)


def test_length_applies_to_retrieval_metrics_only():
    with pytest.raises(pydantic.ValidationError, match="retrieval metrics only"):
        GateCriterion(name="x", metric="cloze_accuracy", op=">=", threshold=0.5, length=256)
    with pytest.raises(pydantic.ValidationError, match="length must be >= 0"):
        GateCriterion(name="x", metric="retrieval_accuracy", op=">=", threshold=0.5, length=-1)


def test_the_hash_of_a_gate_without_context_criteria_is_unchanged():
    gate = GateConfig(criteria=[FORGETTING, GateCriterion(name="domain", metric="domain_loss_reduction_nats",
                                                          op=">=", threshold=1.0)])
    # the canonical form before length existed: no length (and no harness fields) in any criterion
    before = json.dumps({"cloze_items": "configs/cloze/demo.jsonl", "criteria": [
        {"confidence": 0.95, "metric": "domain_loss_reduction_nats", "min_items": 0, "name": "domain", "op": ">=",
         "threshold": 1.0},
        {"confidence": 0.95, "metric": "general_loss_rise_nats", "min_items": 0, "name": "forgetting", "op": "<=",
         "threshold": 0.1}], "rule": "all", "select": "max_domain_loss_reduction"},
        sort_keys=True, separators=(",", ":"))
    assert gate_hash(gate) == hashlib.sha256(before.encode()).hexdigest()
    at = [GateConfig(criteria=[GateCriterion(name="p", metric="retrieval_accuracy", op=">=", threshold=0.5,
                                             length=length)]) for length in (0, 256, 512)]
    assert len({gate_hash(g) for g in at}) == 3


def test_select_max_long_loss_reduction_keeps_the_best_long_candidate_and_records_it():
    from tasks.gate.stage import decision_record, gate_rule

    gate = GateConfig(criteria=[FORGETTING], select="max_long_loss_reduction")
    candidates = [_model("small", 0.2, params={"recipe": "none"}), _model("large", 0.6),
                  _model("middle", 0.4)]
    result = decide(gate, _model("base", 0.0), candidates)
    assert result.kept == "large"
    assert decide(gate.model_copy(update={"select": "max_domain_loss_reduction"}), _model("base", 0.0),
                  candidates).kept == "small"  # equal domain reduction: the first
    assert "the largest long-window loss reduction" in gate_rule(gate)
    declared = DecisionRecord.declare("gate", rule=gate_rule(gate), rule_config=gate.model_dump(mode="json"))
    record = decision_record(gate, result, declared, evidence={})
    kept = result.table.set_index("candidate").loc["large"]
    assert (record.estimate, record.low, record.high) == (
        kept["long_loss_reduction_nats"], kept["long_loss_reduction_nats_ci_low"],
        kept["long_loss_reduction_nats_ci_high"])
    assert record.unit == "nats/token" and record.choice == "large"


def test_load_eval_reads_the_context_keys_and_older_files_without_them(tmp_path):
    from tasks.gate.stage import load_eval, plot_decision

    correct, lengths = _retrieval([0.9, 0.6, 0.3])
    model = _model("cand", 0.5, correct=correct, lengths=lengths)
    (tmp_path / "evals").mkdir()
    short = dict(general_window_nats=model.general.window_nats, general_window_tokens=model.general.window_tokens,
                 general_window_docs=model.general.window_docs, domain_window_nats=model.domain.window_nats,
                 domain_window_tokens=model.domain.window_tokens, domain_window_docs=model.domain.window_docs,
                 cloze_correct=np.zeros(0, bool))
    np.savez(tmp_path / "evals" / "cand.npz", **short, long_window_nats=model.long.window_nats,
             long_window_tokens=model.long.window_tokens, long_window_docs=model.long.window_docs,
             retrieval_correct=correct, retrieval_length=lengths,
             retrieval_depth=np.tile([0.1, 0.5, 0.9], len(lengths) // 3))
    np.savez(tmp_path / "evals" / "old.npz", **short)
    loaded = load_eval(tmp_path, "cand", {"recipe": "interpolation"})
    for got, want in ((loaded.long.window_nats, model.long.window_nats),
                      (loaded.long.window_tokens, model.long.window_tokens),
                      (loaded.long.window_docs, DOCS), (loaded.retrieval_correct, correct),
                      (loaded.retrieval_length, lengths)):
        np.testing.assert_array_equal(got, want)
    assert loaded.retrieval_correct.dtype == bool and loaded.retrieval_length.dtype == np.int64
    assert loaded.params == {"recipe": "interpolation"}
    old = load_eval(tmp_path, "old", {})
    assert old.long is None and old.retrieval_correct.size == old.retrieval_length.size == 0
    gate = GateConfig(criteria=[GateCriterion(name="long", metric="long_loss_reduction_nats", op=">=",
                                              threshold=0.2),
                                GateCriterion(name="passkey", metric="retrieval_accuracy", op=">=", threshold=0.1)])
    base = _model("base", 0.0, correct=np.zeros_like(correct), lengths=lengths)
    table = decide(gate, base, [loaded]).table
    row = table.iloc[0]
    assert row["status_long"] == "pass" and row["status_passkey"] == "pass"  # 0.3 of 40 at 512 clears 0.1
    few = GateConfig(criteria=[gate.criteria[1].model_copy(update={"min_items": 60})])  # more than were scored
    row = decide(few, base, [loaded]).table.iloc[0]
    assert (row["status_passkey"], row["units_passkey"], row["needed_passkey"]) == ("undetermined", PER_LENGTH, 60)
    assert row["reason_passkey"].startswith(f"needs >= 60 items, has {PER_LENGTH}: ")
    plot_decision(table, gate, tmp_path / "gate_scatter.png")
    assert (tmp_path / "gate_scatter.png").stat().st_size > 0
