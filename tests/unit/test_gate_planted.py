"""The gate's verdicts on planted evidence whose answer is known (docs/methods.md §14).

Each test plants per-document loss changes or per-item correctness with a known true value, runs the gate's own
code on it (``evals.gate.decide``, which turns per-window and per-item arrays into each criterion's status; the gate
stage's ``decision_record``; the whole ``tasks.gate.stage.run`` on evaluation files) and expects exactly one
verdict, never a set of allowed ones. Every metric the gate judges is covered, under both ops.

The seeds are fixed, and the planted effects sit so far from their thresholds that the expected verdict would hold
for any seed but with vanishing probability (the margins are stated where they are planted, in interval
half-widths); the undetermined cases hold for every draw by construction.
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evals.decision import DecisionRecord
from evals.gate import CandidateEval, GateConfig, GateCriterion, HeldoutArrays, decide
from evals.stats import MIN_UNITS
from infra.runs import RunsLayout
from infra.stage import StageContext
from tasks.gate.stage import decision_record

MORE_DOCUMENTS = ("score more held-out documents (the budget's eval_tokens while documents lack a window, else a "
                  "larger held-out split: [tokenizer] heldout_fraction or min_heldout_docs)")
MORE_ITEMS = "score more items (gate.cloze_items, passkey prompts or the harness task's limit)"

LOSS_METRICS = ("domain_loss_reduction_nats", "general_loss_rise_nats", "long_loss_reduction_nats")
ACCURACY_METRICS = ("cloze_accuracy", "harness_accuracy", "retrieval_accuracy")
DELTA_METRICS = ("cloze_accuracy_delta", "harness_accuracy_delta", "retrieval_accuracy_delta")
ITEM_METRICS = ACCURACY_METRICS + DELTA_METRICS
HELDOUT_OF = {"domain_loss_reduction_nats": "domain", "general_loss_rise_nats": "general",
              "long_loss_reduction_nats": "long"}
TASK, HARNESS_KEY, PROMPT_LENGTH = "planted_task", "planted_task.acc", 256

N_DOCS, PER_DOC, TOKENS = 30, 4, 128
N_ITEMS = 400
# Thresholds and the true values planted on either side of them, for each kind of metric:
# - losses (nats/token): threshold 0.1, true mean 0.1 ± 0.4, per-document sd DOC_SD = 0.1 over 30 documents (the
#   candidate's own window noise, sd 0.02 over 4 windows, adds 1e-4 to the variance): the t(29) interval's
#   half-width is 2.045 · 0.1 / √30 ≈ 0.037, so the truth is ~11 half-widths from the threshold. A wrong verdict
#   needs the documents' mean 0.2 off the truth (11 standard errors of 0.018) or a half-width of 0.2 (the sd
#   estimated 5× too large): probability below 1e-26.
# - accuracies (Wilson): threshold 0.5, true accuracy 0.5 ± 0.3 on 400 items: half-width ~0.039, ~7.5 half-widths.
#   A wrong verdict needs the sample accuracy 0.25 off (219 of 400 right where 320 are expected; 12 binomial
#   standard errors): probability 4e-30 (exact binomial).
# - accuracy differences (Newcombe, paired): threshold 0.0, true difference ±0.3 on 400 items, all discordant
#   items going one way (60% of the base's wrong items fixed, or of its right ones broken): half-width ~0.045,
#   ~6.5 half-widths. A wrong verdict needs the sample difference ~11 standard errors (0.023) off: below 1e-25.
LOSS_THRESHOLD, LOSS_MARGIN, DOC_SD = 0.1, 0.4, 0.1
ACCURACY_THRESHOLD, ACCURACY_MARGIN = 0.5, 0.3
DELTA_THRESHOLD, DELTA_MARGIN = 0.0, 0.3
MIN_HALF_WIDTHS = 4  # what each planted interval is checked to clear (a guard on the plant, not the claim)


def _rng(*key) -> np.random.Generator:
    """A fixed generator of its own for each planted piece of evidence."""
    return np.random.default_rng(zlib.crc32("/".join(map(str, key)).encode()))


def threshold_of(metric: str) -> float:
    return (LOSS_THRESHOLD if metric in LOSS_METRICS else ACCURACY_THRESHOLD if metric in ACCURACY_METRICS
            else DELTA_THRESHOLD)


def criterion(metric: str, op: str, threshold: float | None = None, **extra) -> GateCriterion:
    """A criterion named ``c`` on ``metric``; harness criteria read the planted task, retrieval ones the planted
    prompt length."""
    if metric.startswith("harness"):
        extra["task"] = TASK
    if metric.startswith("retrieval"):
        extra["length"] = PROMPT_LENGTH
    return GateCriterion(name="c", metric=metric, op=op,
                         threshold=threshold_of(metric) if threshold is None else threshold, **extra)


# ------------------------------------------------------------------------------------------- planted evidence

def heldout_pair(doc_effects, *, rise: bool, rng: np.random.Generator, per_doc: int = PER_DOC,
                 window_sd: float = 0.02) -> tuple[HeldoutArrays, HeldoutArrays]:
    """Base and candidate windows on ``len(doc_effects)`` documents of ``per_doc`` windows each, whose loss metric on
    document g is ``doc_effects[g]`` (candidate − base for a rise, base − candidate for a reduction) plus the
    candidate's own per-window noise (sd ``window_sd``). Each document has its own difficulty, shared by both models
    (sd 0.3 nats: it cancels in the paired difference), and each window its own (sd 0.03)."""
    effects = np.asarray(doc_effects, float)
    n_docs = len(effects)
    docs = np.repeat(np.arange(n_docs) * 7 + 3, per_doc)  # any integer ids
    base = 4.0 + np.repeat(rng.normal(0.0, 0.3, n_docs), per_doc) + rng.normal(0.0, 0.03, n_docs * per_doc)
    change = np.repeat(effects, per_doc) + (rng.normal(0.0, window_sd, len(docs)) if window_sd else 0.0)
    cand = base + change if rise else base - change
    tokens = np.full(len(docs), TOKENS)
    return HeldoutArrays(base, tokens, docs), HeldoutArrays(cand, tokens, docs)


def accuracy_items(p: float, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per-item correctness of a base (true accuracy 0.5) and a candidate of true accuracy ``p``, drawn apart."""
    return rng.random(n) < 0.5, rng.random(n) < p


def delta_items(delta: float, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Paired correctness whose true difference (candidate − base) is ``delta``: the base right with probability
    0.5; the candidate fixes each item the base got wrong with probability 2·delta (delta > 0), or breaks each
    item the base got right with probability 2·|delta| (delta < 0), and agrees with the base elsewhere."""
    base = rng.random(n) < 0.5
    flip = rng.random(n) < 2 * abs(delta)
    cand = base | (~base & flip) if delta > 0 else base & ~flip
    return base, cand


FILLER = HeldoutArrays(np.linspace(3.0, 4.0, 10), np.full(10, TOKENS), np.arange(10))  # same for both models


def planted_models(metric: str, base_evidence, cand_evidence) -> tuple[CandidateEval, CandidateEval]:
    """Base and candidate that differ only in ``metric``'s evidence: held-out windows (loss metrics) or per-item
    correctness (cloze items, the documents of a harness task, passkey prompts of one length); every other split
    is the same ``FILLER`` windows for both."""
    models = []
    for name, evidence in (("base", base_evidence), ("cand", cand_evidence)):
        fields: dict = {"general": FILLER, "domain": FILLER}
        if metric in LOSS_METRICS:
            fields[HELDOUT_OF[metric]] = evidence
        elif metric.startswith("cloze"):
            fields["cloze_correct"] = evidence
        elif metric.startswith("harness"):
            fields["harness_correct"] = {HARNESS_KEY: evidence}
        else:
            fields["retrieval_correct"] = evidence
            fields["retrieval_length"] = np.full(len(evidence), PROMPT_LENGTH)
        models.append(CandidateEval(name, **fields))
    return models[0], models[1]


def plant(metric: str, truth: float) -> tuple[CandidateEval, CandidateEval]:
    """Evidence on ``metric`` whose true value is ``truth``: N_DOCS documents (loss metrics, per-document sd
    DOC_SD) or N_ITEMS items."""
    rng = _rng(metric, truth)
    if metric in LOSS_METRICS:
        base, cand = heldout_pair(rng.normal(truth, DOC_SD, N_DOCS), rise=metric == "general_loss_rise_nats",
                                  rng=rng)
    elif metric in ACCURACY_METRICS:
        base, cand = accuracy_items(truth, N_ITEMS, rng)
    else:
        base, cand = delta_items(truth, N_ITEMS, rng)
    return planted_models(metric, base, cand)


def judge(c: GateCriterion, base: CandidateEval, cand: CandidateEval) -> dict:
    """The decision table's row of the one candidate under a gate of ``c`` alone."""
    return decide(GateConfig(criteria=[c]), base, [cand]).table.iloc[0].to_dict()


def interval(row: dict, c: GateCriterion) -> tuple[float, float, float]:
    return row[c.column], row[f"{c.column}_ci_low"], row[f"{c.column}_ci_high"]


def units_of(metric: str) -> int:
    return N_DOCS if metric in LOSS_METRICS else N_ITEMS


# ---------------------------------------------------------------------------------------- one criterion's status

@pytest.mark.parametrize("side", ["above", "below"])
@pytest.mark.parametrize("op", [">=", "<="])
@pytest.mark.parametrize("metric", LOSS_METRICS + ITEM_METRICS)
def test_evidence_far_from_the_threshold_gets_exactly_the_true_verdict(metric, op, side):
    """True value well above the threshold: ``>=`` passes and ``<=`` fails; well below: the reverse."""
    margin = (LOSS_MARGIN if metric in LOSS_METRICS else ACCURACY_MARGIN if metric in ACCURACY_METRICS
              else DELTA_MARGIN)
    truth = threshold_of(metric) + (margin if side == "above" else -margin)
    expected = "pass" if (op == ">=") == (side == "above") else "fail"
    c = criterion(metric, op)
    row = judge(c, *plant(metric, truth))
    point, low, high = interval(row, c)
    assert abs(point - c.threshold) > MIN_HALF_WIDTHS * (high - low) / 2  # the plant is as far out as stated
    assert (row["status_c"], row["decision"]) == (expected, expected), (point, low, high)
    assert (row["units_c"], row["reason_c"]) == (units_of(metric), "")
    assert math.isnan(row["needed_c"])  # nothing to resolve


@pytest.mark.parametrize("op", [">=", "<="])
@pytest.mark.parametrize("metric", LOSS_METRICS + ITEM_METRICS)
def test_too_few_units_are_undetermined_with_the_reason_however_clear_the_evidence(metric, op):
    """One unit under the minimum (4 documents, 39 items), with evidence whose interval lies wholly above the
    threshold (a reduction of 0.5 ± 0.02 nats per document: 12 half-widths above 0.1; every item right, or every
    item fixed: a Wilson/Newcombe low bound of ~0.91, above 0.5 and 0.0): neither pass (``>=``) nor fail
    (``<=``)."""
    loss = metric in LOSS_METRICS
    need = MIN_UNITS["documents"] if loss else MIN_UNITS["items"]
    have = need - 1
    rng = _rng("few", metric)
    if loss:
        base, cand = planted_models(metric, *heldout_pair(rng.normal(LOSS_THRESHOLD + LOSS_MARGIN, 0.02, have),
                                                          rise=metric == "general_loss_rise_nats", rng=rng))
    elif metric in ACCURACY_METRICS:
        base, cand = planted_models(metric, rng.random(have) < 0.5, np.ones(have, bool))
    else:
        base, cand = planted_models(metric, np.zeros(have, bool), np.ones(have, bool))
    c = criterion(metric, op)
    row = judge(c, base, cand)
    _, low, _ = interval(row, c)
    assert low > c.threshold  # the interval alone would settle it
    assert (row["status_c"], row["decision"]) == ("undetermined", "undetermined")
    units = "documents" if loss else "items"
    assert row["reason_c"] == f"needs >= {need} {units}, has {have}: {MORE_DOCUMENTS if loss else MORE_ITEMS}"
    assert (row["units_c"], row["needed_c"]) == (have, need)


@pytest.mark.parametrize("metric", ITEM_METRICS)
def test_a_declared_min_items_above_the_minimum_holds_back_clear_item_evidence(metric):
    """60 items, above MIN_UNITS' 40 but under the criterion's min_items = 100, all right or all fixed."""
    base, cand = planted_models(metric, np.zeros(60, bool), np.ones(60, bool))
    c = criterion(metric, ">=", min_items=100)
    row = judge(c, base, cand)
    assert interval(row, c)[1] > c.threshold
    assert (row["status_c"], row["units_c"], row["needed_c"]) == ("undetermined", 60, 100)
    assert row["reason_c"] == f"needs >= 100 items, has 60: {MORE_ITEMS}"


@pytest.mark.parametrize("op", [">=", "<="])
@pytest.mark.parametrize("metric", LOSS_METRICS)
def test_a_constant_loss_change_has_no_width_and_gets_no_verdict(metric, op):
    """Every window of 30 documents changes by exactly 0.5 nats, 0.4 past the threshold 0.1: the interval has the
    width of floating-point rounding, which is no evidence of spread, so neither pass (``>=``) nor fail (``<=``)."""
    rng = _rng("constant", metric)
    base, cand = planted_models(metric, *heldout_pair(np.full(N_DOCS, LOSS_THRESHOLD + LOSS_MARGIN),
                                                      rise=metric == "general_loss_rise_nats", rng=rng, window_sd=0))
    c = criterion(metric, op)
    row = judge(c, base, cand)
    point, low, high = interval(row, c)
    assert point == pytest.approx(LOSS_THRESHOLD + LOSS_MARGIN, abs=1e-12) and high - low < 1e-12
    assert (row["status_c"], row["decision"]) == ("undetermined", "undetermined")
    assert (row["units_c"], row["reason_c"]) == (N_DOCS, "")  # enough documents: the width is what is missing


@pytest.mark.parametrize("op", [">=", "<="])
@pytest.mark.parametrize("metric", LOSS_METRICS + ITEM_METRICS)
def test_evidence_centred_on_the_threshold_with_few_units_is_undetermined(metric, op):
    """6 documents whose loss changes (sd 0.3) are centred exactly on the threshold, 25 of 50 items right against
    0.5, or 6 items fixed and 6 broken of 50 against 0.0: the point is the threshold, so every interval of
    positive width straddles it, whatever the draw."""
    c = criterion(metric, op)
    rng = _rng("centred", metric)
    if metric in LOSS_METRICS:
        spread = rng.normal(0.0, 0.3, 6)
        base, cand = planted_models(metric, *heldout_pair(c.threshold + spread - spread.mean(), window_sd=0,
                                                          rise=metric == "general_loss_rise_nats", rng=rng))
        units = 6
    else:
        units, order = 50, rng.permutation(50)
        base_correct = np.zeros(units, bool)
        base_correct[order[:25]] = True
        cand_correct = base_correct.copy()
        if metric in DELTA_METRICS:
            cand_correct[order[:6]] = False  # broken
            cand_correct[order[25:31]] = True  # fixed
        base, cand = planted_models(metric, base_correct, cand_correct)
    row = judge(c, base, cand)
    point, low, high = interval(row, c)
    assert point == pytest.approx(c.threshold, abs=1e-12)
    assert low < c.threshold < high
    assert (row["status_c"], row["decision"]) == ("undetermined", "undetermined")
    assert (row["units_c"], row["reason_c"]) == (units, "")


# ------------------------------------------------------------------------------- the candidates and the record

GATE = GateConfig(criteria=[
    GateCriterion(name="domain_gain", metric="domain_loss_reduction_nats", op=">=", threshold=LOSS_THRESHOLD),
    GateCriterion(name="forgetting", metric="general_loss_rise_nats", op="<=", threshold=LOSS_THRESHOLD),
    GateCriterion(name="no_regression", metric="cloze_accuracy_delta", op=">=", threshold=-0.1)])
# Candidate -> (true domain reduction, true general rise, true cloze accuracy difference), each per document
# (sd DOC_SD) on 30 documents or over 400 items; every true value is at least 0.4 from its threshold (~11 loss
# half-widths, ~9 for the accuracy difference), except "unsure"'s domain reduction, whose documents are centred
# exactly on the threshold with sd 0.3 (never settled). Expected statuses in criterion order, and the decision.
PLANTED = {
    "good": ((0.5, -0.3, 0.3), ("pass", "pass", "pass"), "pass"),
    "better": ((0.9, -0.3, 0.3), ("pass", "pass", "pass"), "pass"),
    "forgets": ((1.5, 0.5, 0.3), ("pass", "fail", "pass"), "fail"),  # the largest domain gain, but it forgets
    "regresses": ((1.5, -0.3, -0.5), ("pass", "pass", "fail"), "fail"),
    "flat": ((-0.3, -0.3, 0.3), ("fail", "pass", "pass"), "fail"),
    "unsure": ((None, -0.3, 0.3), ("undetermined", "pass", "pass"), "undetermined"),
    "unsure_forgets": ((None, 0.5, 0.3), ("undetermined", "fail", "pass"), "fail"),  # a fail settles the row
}


def candidate_set(names) -> dict[str, CandidateEval]:
    """The base and the named candidates of ``PLANTED`` on shared windows (30 domain and 30 general documents) and
    400 shared cloze items."""
    rng = _rng("record")
    docs = np.repeat(np.arange(N_DOCS) * 7 + 3, PER_DOC)
    tokens = np.full(len(docs), TOKENS)

    def level(value):
        return value + np.repeat(rng.normal(0.0, 0.3, N_DOCS), PER_DOC) + rng.normal(0.0, 0.03, len(docs))

    general, domain = level(3.5), level(5.0)
    base_cloze = np.random.default_rng(7).random(N_ITEMS) < 0.5
    models = {"base": CandidateEval("base", HeldoutArrays(general, tokens, docs), HeldoutArrays(domain, tokens, docs),
                                    base_cloze)}
    for name in names:
        (reduction, rise, delta), *_ = PLANTED[name]
        own = _rng("record", name)
        if reduction is None:
            spread = own.normal(0.0, 0.3, N_DOCS)
            per_doc = LOSS_THRESHOLD + spread - spread.mean()
        else:
            per_doc = own.normal(reduction, DOC_SD, N_DOCS)
        cand_domain = domain - np.repeat(per_doc, PER_DOC) - own.normal(0.0, 0.02, len(docs))
        cand_general = general + np.repeat(own.normal(rise, DOC_SD, N_DOCS), PER_DOC) + own.normal(0.0, 0.02,
                                                                                                  len(docs))
        flip = own.random(N_ITEMS) < 2 * abs(delta)
        cloze = base_cloze | (~base_cloze & flip) if delta > 0 else base_cloze & ~flip
        models[name] = CandidateEval(name, HeldoutArrays(cand_general, tokens, docs),
                                     HeldoutArrays(cand_domain, tokens, docs), cloze, {"replay_fraction": 0.1})
    return models


def assert_planted_statuses(table: pd.DataFrame) -> None:
    for row in table.to_dict("records"):
        _, statuses, decision = PLANTED[row["candidate"]]
        found = tuple(row[f"status_{c.name}"] for c in GATE.criteria)
        assert (found, row["decision"]) == (statuses, decision), (row["candidate"], found)


# (candidates, the record's verdict, the kept model): a passing candidate is kept (the best of them by the largest
# domain reduction) and the verdict is decided, undetermined ones beside it or not; when all fail the base is kept
# and that is decided too; when none passes and any is undetermined the base is kept undetermined.
SCENARIOS = [
    (["good", "forgets"], "decided", "good"),
    (["good", "better", "forgets", "regresses"], "decided", "better"),
    (["unsure", "good"], "decided", "good"),
    (["forgets", "regresses", "flat", "unsure_forgets"], "decided", "base"),
    (["forgets", "unsure"], "undetermined", "base"),
    (["unsure"], "undetermined", "base"),
]


@pytest.mark.parametrize("names, verdict, kept", SCENARIOS)
def test_the_record_keeps_the_best_passing_candidate_or_the_base_with_the_right_verdict(names, verdict, kept):
    models = candidate_set(names)
    decision = decide(GATE, models["base"], [models[n] for n in names])
    table = decision.table
    assert_planted_statuses(table)
    assert decision.kept == kept
    assert table.loc[table["kept"], "candidate"].tolist() == ([] if kept == "base" else [kept])
    declared = DecisionRecord.declare("gate", rule="planted", rule_config=GATE.model_dump(mode="json"))
    record = decision_record(GATE, decision, declared, evidence={})
    assert (record.choice, record.verdict) == (kept, verdict)
    m = "domain_loss_reduction_nats"
    if verdict == "undetermined":  # the base is the fallback; the interval shown is the undetermined candidate's
        shown = table.set_index("candidate").loc["unsure"]
        assert record.fallback == "keep the base" and "domain_gain of unsure" in record.resolve
        assert (record.estimate, record.low, record.high) == (shown[m], shown[f"{m}_ci_low"], shown[f"{m}_ci_high"])
        assert record.low < LOSS_THRESHOLD < record.high
    elif kept == "base":  # every candidate failed: nothing to show
        assert (record.fallback, record.resolve) == ("", "") and math.isnan(record.estimate)
    else:
        shown = table.set_index("candidate").loc[kept]
        assert (record.fallback, record.resolve) == ("", "")
        assert (record.estimate, record.low, record.high) == (shown[m], shown[f"{m}_ci_low"], shown[f"{m}_ci_high"])
        assert record.low > LOSS_THRESHOLD
    if verdict == "undetermined" or kept != "base":  # the units behind the shown candidate's verdict
        assert (record.n_units, record.units) == (N_DOCS, "documents")


# --------------------------------------------------------------------------- the gate stage on evaluation files

def cpt_artifact(folder: Path, models: dict[str, CandidateEval]) -> Path:
    """A CPT artifact as the CPT stage leaves it for the gate: ``candidates.json`` and ``evals/<name>.npz``."""
    (folder / "evals").mkdir(parents=True)
    described = {"base": {"checkpoint": str(folder / "base")}}
    described |= {name: {"replay_fraction": 0.1, "peak_lr": 1e-3} for name in models if name != "base"}
    (folder / "candidates.json").write_text(json.dumps(described))
    for name, m in models.items():
        np.savez(folder / "evals" / f"{name}.npz", cloze_correct=m.cloze_correct,
                 **{f"{role}_window_{part}": getattr(getattr(m, role), f"window_{part}")
                    for role in ("general", "domain") for part in ("nats", "tokens", "docs")})
    return folder


@pytest.mark.parametrize("names, verdict, kept", [SCENARIOS[1], SCENARIOS[3], SCENARIOS[4]])
def test_the_gate_stage_on_planted_evaluation_files_keeps_the_expected_model(tmp_path, names, verdict, kept):
    """The stage reads the files, judges and writes the table and the record: each candidate's statuses are the
    planted ones, and decision.json keeps the expected checkpoint with the expected verdict."""
    from tasks.gate.stage import run

    cpt = cpt_artifact(tmp_path / "cpt", candidate_set(names))
    out = tmp_path / "gate"
    out.mkdir()
    run(StageContext(out=out, inputs={"cpt": cpt, "main": tmp_path}, layout=RunsLayout(tmp_path / "runs"),
                     key="planted", experiment="t"), GATE)
    table = pd.read_parquet(out / "decisions.parquet")
    assert sorted(table["candidate"]) == sorted(names)
    assert_planted_statuses(table)
    assert table.loc[table["kept"], "candidate"].tolist() == ([] if kept == "base" else [kept])
    record = json.loads((out / "decision.json").read_text())
    assert record["kept"] == record["decision"]["choice"] == kept
    assert record["decision"]["verdict"] == verdict
    assert record["kept_checkpoint"] == str(cpt / "base" if kept == "base" else cpt / "candidates" / kept)
