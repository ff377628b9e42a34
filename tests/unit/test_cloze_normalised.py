"""Length-normalised cloze scoring (per token, Brown et al. 2020 §2.4; per byte, the lm-evaluation-harness's
acc_bytes, Gao et al. 2021) against log-probabilities written down by hand, and a gate judged on it."""

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pydantic
import pytest
import torch
from scipy import stats

from evals.cloze import ClozeItem, cloze_accuracy, cloze_summary, option_scores, score_cloze
from evals.gate import CandidateEval, GateConfig, GateCriterion, HeldoutArrays, decide, gate_hash
from infra.errors import ConfigError, DataError
from infra.runs import RunsLayout
from infra.stage import StageContext

# Vocabulary: one token per character; 'é' is one token of two UTF-8 bytes.
CHARS = "abc é"
A, B, C, SP, E = range(5)
# Row i: next-token distribution after token i (rows sum to 1).
P = [
    [0.025, 0.900, 0.025, 0.025, 0.025],  # after 'a'
    [0.200, 0.100, 0.100, 0.500, 0.100],  # after 'b'
    [0.900, 0.025, 0.025, 0.025, 0.025],  # after 'c'
    [0.400, 0.050, 0.250, 0.050, 0.250],  # after ' '
    [0.100, 0.100, 0.100, 0.100, 0.600],  # after 'é'
]


class Bigram(torch.nn.Module):
    """Logits at position t are log table[idx[t]]; counts its forward calls."""

    def __init__(self, table) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.log(torch.tensor(table, dtype=torch.float64)))
        self.calls = 0

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.table[idx]  # (B, T, V)


def encode(text: str) -> list[int]:
    return [CHARS.index(ch) for ch in text]


def lp(table, text: str) -> float:
    """Summed log-probability of the characters of ``text`` after its first one, under the bigram ``table``."""
    ids = encode(text)
    return sum(math.log(table[prev][nxt]) for prev, nxt in zip(ids, ids[1:]))


def reference_choice(table, item: ClozeItem, scoring: str) -> int:
    """The option chosen under ``scoring``, computed directly (ties to the lower index)."""
    scores = []
    for option in item.options:
        total = lp(table, item.context[-1] + option)  # a bigram needs only the context's last character
        divisor = {"sum": 1, "per_token": len(encode(option)), "per_byte": len(option.encode("utf-8"))}[scoring]
        scores.append(total / divisor)
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


# Sum prefers the short option; per token (and per byte: one byte per token here) the long one.
SHORT_VS_LONG = ClozeItem("len", "general", "b", [" a", " cab"], 1)
# Same token counts, so sum and per token agree; per byte prefers the option of two-byte tokens.
TOKENS_VS_BYTES = ClozeItem("bytes", "domain", "b", [" ab", " éé"], 1)


def test_hand_computed_log_probs_pick_different_options_under_each_scoring():
    # Closed form from the table: ln .5 + ln .4 against ln .5 + ln .25 + 2 ln .9.
    assert lp(P, "b a") == pytest.approx(math.log(0.5) + math.log(0.4))
    assert lp(P, "b cab") == pytest.approx(math.log(0.5) + math.log(0.25) + 2 * math.log(0.9))
    assert lp(P, "b a") > lp(P, "b cab") and lp(P, "b a") / 2 < lp(P, "b cab") / 4
    assert lp(P, "b ab") > lp(P, "b éé") and lp(P, "b ab") / 3 < lp(P, "b éé") / 5
    frame = score_cloze(Bigram(P), encode, [SHORT_VS_LONG, TOKENS_VS_BYTES]).set_index("item_id")
    assert frame.loc["len", "n_option_tokens"] == [2, 4] and frame.loc["len", "n_option_bytes"] == [2, 4]
    assert frame.loc["bytes", "n_option_tokens"] == [3, 3] and frame.loc["bytes", "n_option_bytes"] == [3, 5]
    assert frame.loc["len", "logprobs"] == pytest.approx([lp(P, "b a"), lp(P, "b cab")], abs=1e-12)
    expected = {"len": (0, 1, 1), "bytes": (0, 0, 1)}  # (sum, per_token, per_byte)
    for item_id, (by_sum, by_token, by_byte) in expected.items():
        row = frame.loc[item_id]
        assert (row["predicted"], row["predicted_per_token"], row["predicted_per_byte"]) == (by_sum, by_token, by_byte)
        assert row["correct"] == (by_sum == 1) and row["correct_per_token"] == (by_token == 1)
        assert row["correct_per_byte"] == (by_byte == 1)


def test_all_three_scorings_match_a_direct_computation_in_one_forward_per_item():
    rng = np.random.default_rng(7)
    table = rng.dirichlet(np.ones(len(CHARS)), size=len(CHARS)).tolist()
    words = ["".join(rng.choice(list("abcé"), size=int(rng.integers(1, 5)))) for _ in range(60)]
    items = []
    for i in range(40):
        options = list(dict.fromkeys(" " + w for w in rng.choice(words, size=3)))
        if len(options) < 2:
            continue
        context = "".join(rng.choice(list("abcé "), size=int(rng.integers(1, 6)))) + "a"
        items.append(ClozeItem(f"r{i}", "general" if i % 2 else "domain", context, options,
                               int(rng.integers(0, len(options)))))
    model = Bigram(table)
    frame = score_cloze(model, encode, items)
    assert model.calls == len(items)  # the normalised scorings reuse the sum's log-probabilities
    disagree = 0
    for item, row in zip(items, frame.to_dict("records")):
        choices = {s: reference_choice(table, item, s) for s in ("sum", "per_token", "per_byte")}
        assert row["predicted"] == choices["sum"]
        assert row["predicted_per_token"] == choices["per_token"]
        assert row["predicted_per_byte"] == choices["per_byte"]
        disagree += len(set(choices.values())) > 1
    assert disagree > 0  # the items exercise the normalisation


def test_option_scores_divide_by_tokens_or_bytes_and_refuse_unknown_scorings():
    assert option_scores([-4.0, -6.0], [2, 3], [4, 3], "per_token") == [-2.0, -2.0]
    assert option_scores([-4.0, -6.0], [2, 3], [4, 3], "per_byte") == [-1.0, -2.0]
    assert option_scores([-4.0, -6.0], [2, 3], [4, 3], "sum") == [-4.0, -6.0]
    with pytest.raises(ValueError, match="scoring must be 'sum'"):
        option_scores([-4.0], [1], [1], "per_char")


def test_accuracy_and_summary_under_each_scoring_with_wilson_intervals():
    frame = pd.DataFrame({"group": ["general", "general", "domain", "domain"], "kind": ["local"] * 4,
                          "correct": [True, False, False, False], "correct_per_token": [True, True, False, True],
                          "correct_per_byte": [False, True, True, True]})
    assert cloze_accuracy(frame) == {"domain": (0, 2, 0.0), "general": (1, 2, 0.5), "all": (1, 4, 0.25)}
    assert cloze_accuracy(frame, "per_token")["all"] == (3, 4, 0.75)
    assert cloze_accuracy(frame, "per_byte")["domain"] == (2, 2, 1.0)
    with pytest.raises(DataError, match="correct_per_byte"):
        cloze_accuracy(frame.drop(columns="correct_per_byte"), "per_byte")
    summary = cloze_summary(frame).set_index(["group", "scoring"])
    z = 1.959963984540054  # two-sided 95% normal quantile
    for scoring, k in (("sum", 1), ("per_token", 3), ("per_byte", 3)):
        row, n = summary.loc[("all", scoring)], 4
        p = k / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)  # Wilson 1927
        assert (row["correct"], row["items"], row["accuracy"]) == (k, n, p)
        assert row["se_points"] == pytest.approx(100 * math.sqrt(p * (1 - p) / n))
        assert (row["ci_low"], row["ci_high"]) == (pytest.approx(centre - half), pytest.approx(centre + half))
    assert summary.loc[("general", "per_byte"), "correct"] == 1


# ------------------------------------------------------------------------------------------------ the gate

WINDOWS = HeldoutArrays(np.full(4, 3.0), np.full(4, 64))


def _gate(scoring: str) -> GateConfig:
    return GateConfig(criteria=[GateCriterion(name="cloze", metric="cloze_accuracy_delta", op=">=", threshold=-0.05,
                                              scoring=scoring)])


def test_the_gate_judges_a_per_token_criterion_on_the_per_token_column():
    n = 40
    base_sum, cand_sum = np.ones(n, bool), np.ones(n, bool)
    cand_sum[:12] = False  # the summed scoring loses 12 items: a 30-point drop
    base_tok, cand_tok = np.zeros(n, bool), np.zeros(n, bool)
    base_tok[:20], cand_tok[:20] = True, True
    cand_tok[20:26] = True  # per token the candidate gains 6 items and loses none
    base = CandidateEval("base", WINDOWS, WINDOWS, base_sum, cloze_normalised={"per_token": base_tok,
                                                                               "per_byte": base_tok})
    cand = CandidateEval("cand", WINDOWS, WINDOWS, cand_sum, cloze_normalised={"per_token": cand_tok,
                                                                               "per_byte": base_tok})
    by_token = decide(_gate("per_token"), base, [cand]).table.iloc[0]
    by_sum = decide(_gate("sum"), base, [cand]).table.iloc[0]
    assert by_token["cloze_accuracy_delta_per_token"] == pytest.approx(6 / n)
    assert by_token["cloze_accuracy_delta_per_token_ci_low"] > 0
    assert by_token["cloze_accuracy_per_token"] == pytest.approx(26 / n)
    assert by_token["cloze_accuracy_delta_per_token_mcnemar_p"] == pytest.approx(2 / 2**6)
    assert by_token["cloze_accuracy_delta_per_byte"] == 0.0
    assert by_token["cloze_accuracy_delta"] == pytest.approx(-12 / n)  # the sum is reported beside it
    assert (by_token["status_cloze"], by_token["scoring_cloze"]) == ("pass", "per_token")
    assert (by_sum["status_cloze"], by_sum["scoring_cloze"]) == ("fail", "sum")
    for column in ("cloze_accuracy_delta_per_token", "cloze_accuracy_per_byte_se_pts"):
        assert by_sum[column] == by_token[column]  # every scoring is in the table whatever the gate judges
    only_sum = CandidateEval("cand", WINDOWS, WINDOWS, cand_sum)
    with pytest.raises(DataError, match="no per_token cloze results"):
        decide(_gate("per_token"), base, [only_sum])
    assert "cloze_accuracy_per_token" not in decide(_gate("sum"), CandidateEval("base", WINDOWS, WINDOWS, base_sum),
                                                    [only_sum]).table.columns


def test_the_gate_stage_reads_each_scoring_from_the_cpt_cloze_rows(tmp_path):
    """score_cloze rows of two models in a CPT artifact's cloze.parquet: the gate stage judges the per-byte criterion
    on their per-byte correctness and records the scoring in the decision table."""
    from tasks.gate.stage import run
    from tasks.gate.views import decision_frame

    other = [row[:] for row in P]
    other[SP] = [0.10, 0.05, 0.40, 0.05, 0.40]  # the candidate prefers ' c' and ' é' after a space
    four = [SHORT_VS_LONG, TOKENS_VS_BYTES,
            ClozeItem("x", "general", "c", [" a", " b", " cé"], 2), ClozeItem("y", "general", "a", [" é", " ca"], 0)]
    # ten copies of each: 40 items, MIN_UNITS["items"], the least a cloze verdict rests on
    items = [dataclasses.replace(item, item_id=f"{item.item_id}{k}") for k in range(10) for item in four]
    cpt = tmp_path / "cpt"
    (cpt / "evals").mkdir(parents=True)
    (cpt / "candidates.json").write_text(json.dumps({"base": {"checkpoint": str(tmp_path / "base")},
                                                     "cand": {"replay_fraction": 0.1, "peak_lr": 1e-3}}))
    frames = []
    for name, table in (("base", P), ("cand", other)):
        scored = score_cloze(Bigram(table), encode, items).assign(checkpoint=name)
        np.savez(cpt / "evals" / f"{name}.npz", general_window_nats=np.full(4, 3.0),
                 general_window_tokens=np.full(4, 64), domain_window_nats=np.full(4, 3.0),
                 domain_window_tokens=np.full(4, 64), cloze_correct=scored["correct"].to_numpy(bool))
        frames.append(scored)
    cloze = pd.concat(frames, ignore_index=True)
    cloze["logprobs"] = cloze["logprobs"].map(json.dumps)  # as the CPT stage writes it
    cloze.to_parquet(cpt / "cloze.parquet", index=False)
    out = tmp_path / "gate"
    out.mkdir()
    # 40/40 per byte: Wilson interval [0.912, 1] clears 0.9; 30/40 under the sum and per token: [0.598, 0.858], wholly
    # below it.
    gate = GateConfig(criteria=[GateCriterion(name="bytes", metric="cloze_accuracy", op=">=", threshold=0.9,
                                              scoring="per_byte"),
                                GateCriterion(name="summed", metric="cloze_accuracy", op=">=", threshold=0.9)])
    run(StageContext(out=out, inputs={"cpt": cpt, "main": tmp_path}, layout=RunsLayout(tmp_path / "runs"), key="g",
                     experiment="t"), gate)
    row = pd.read_parquet(out / "decisions.parquet").iloc[0]
    cand = frames[1]
    for scoring, column in (("sum", "correct"), ("per_token", "correct_per_token"), ("per_byte", "correct_per_byte")):
        name = "cloze_accuracy" if scoring == "sum" else f"cloze_accuracy_{scoring}"
        assert row[name] == pytest.approx(cand[column].mean())
        expected = [reference_choice(other, item, scoring) == item.answer for item in items]
        assert cand[column].tolist() == expected
    assert (row["cloze_accuracy"], row["cloze_accuracy_per_token"], row["cloze_accuracy_per_byte"]) == (0.75, 0.75, 1.0)
    for column, k in (("cloze_accuracy", 30), ("cloze_accuracy_per_token", 30), ("cloze_accuracy_per_byte", 40)):
        wilson = stats.binomtest(k, 40).proportion_ci(confidence_level=0.95, method="wilson")
        assert (row[f"{column}_ci_low"], row[f"{column}_ci_high"]) == pytest.approx((wilson.low, wilson.high))
    assert row["cloze_accuracy_per_byte_ci_low"] > 0.9 > row["cloze_accuracy_ci_high"]
    assert (row["scoring_bytes"], row["scoring_summed"]) == ("per_byte", "sum")
    assert (row["status_bytes"], row["units_bytes"], row["reason_bytes"]) == ("pass", 40, "")
    assert row["status_summed"] == "fail"  # the same items under the sum
    assert "cloze_accuracy_per_byte >= 0.9" in json.loads((out / "decision.json").read_text())["decision"]["rule"]
    shown = decision_frame(pd.read_parquet(out / "decisions.parquet")).iloc[0]
    assert (shown["cloze acc"], shown["cloze acc/token"], shown["cloze acc/byte"]) == (
        f"0.750 ± {math.sqrt(0.75 * 0.25 / 40):.3f}", f"0.750 ± {math.sqrt(0.75 * 0.25 / 40):.3f}", "1.000 ± 0.000")

    def rerun(frame):
        frame.to_parquet(cpt / "cloze.parquet", index=False)
        run(StageContext(out=out, inputs={"cpt": cpt, "main": tmp_path}, layout=RunsLayout(tmp_path / "runs"),
                         key="g", experiment="t"), gate)

    broken = cloze.copy()
    broken.loc[0, "correct_per_byte"] = not broken.loc[0, "correct_per_byte"]  # correct is not predicted = answer
    with pytest.raises(DataError, match="expectation suite 'cloze_results' failed.*consistent_per_byte"):
        rerun(broken)
    with pytest.raises(DataError, match="the 39 rows of cloze.parquet are not the 40 cloze items of evals/cand.npz"):
        rerun(cloze.drop(index=len(cloze) - 1))


def test_the_scoring_field_keeps_dumps_and_hashes_at_sum_and_is_validated():
    fields = dict(name="c", metric="cloze_accuracy_delta", op=">=", threshold=-0.1)
    plain, explicit = GateCriterion(**fields), GateCriterion(**fields, scoring="sum")
    assert "scoring" not in plain.model_dump() and plain.model_dump() == explicit.model_dump()
    assert gate_hash(GateConfig(criteria=[plain])) == gate_hash(GateConfig(criteria=[explicit]))
    per_token = GateCriterion(**fields, scoring="per_token")
    assert per_token.model_dump()["scoring"] == "per_token" and per_token.column == "cloze_accuracy_delta_per_token"
    assert gate_hash(GateConfig(criteria=[per_token])) != gate_hash(GateConfig(criteria=[plain]))
    with pytest.raises(ConfigError, match=r"criteria\.0\.scoring: scoring must be 'sum'.*got 'per_char'"):
        GateConfig.validate_strict({"criteria": [{**fields, "scoring": "per_char"}]}, "gate.toml")
    with pytest.raises(pydantic.ValidationError, match="applies to cloze metrics only"):
        GateCriterion(name="d", metric="domain_loss_reduction_nats", op=">=", threshold=0.1, scoring="per_byte")


def test_an_experiment_config_with_an_unknown_scoring_is_refused(tmp_path):
    from pathlib import Path

    from flows.config import load_config

    root = Path(__file__).resolve().parents[2]
    text = (root / "configs" / "demo.toml").read_text()
    old = 'threshold = -0.10, min_items = 24 }'
    assert old in text
    path = tmp_path / "demo.toml"
    path.write_text(text.replace(old, 'threshold = -0.10, min_items = 24, scoring = "per_word" }'))
    with pytest.raises(ConfigError, match="gate.criteria.2.scoring: scoring must be 'sum'"):
        load_config(path)
    path.write_text(text.replace(old, 'threshold = -0.10, min_items = 24, scoring = "per_token" }'))
    assert load_config(path).gate.criteria[2].scoring == "per_token"
