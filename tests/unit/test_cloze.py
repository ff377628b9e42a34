"""Cloze scoring against a bigram oracle whose log-probabilities are written down by hand (docs/methods.md §10)."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from evals.cloze import ClozeItem, cloze_accuracy, load_cloze_items, score_cloze
from infra.errors import DataError

DEMO = Path(__file__).resolve().parents[2] / "configs" / "cloze" / "demo.jsonl"

# Vocabulary: 0 'a', 1 'b', 2 'c', 3 ' ', 4 'c ' (a merged token used only by the merging encoder).
CHARS = "abc "
A, B, C, SP, C_SP = range(5)
# Row i: next-token distribution after token i (all entries positive, rows sum to 1).
P = [
    [0.10, 0.40, 0.20, 0.20, 0.10],
    [0.10, 0.10, 0.30, 0.30, 0.20],
    [0.30, 0.20, 0.10, 0.30, 0.10],
    [0.15, 0.05, 0.60, 0.10, 0.10],
    [0.50, 0.20, 0.10, 0.10, 0.10],
]


class BigramOracle(torch.nn.Module):
    """Logits at position t are log P[idx[t]]; records what each forward call saw."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.log(torch.tensor(P, dtype=torch.float64)))
        self.calls: list[tuple[int, bool, bool]] = []  # (T, training, grad enabled)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.calls.append((idx.shape[1], self.training, torch.is_grad_enabled()))
        return self.table[idx]  # (B, T, V)


def encode_chars(text: str) -> list[int]:
    return [CHARS.index(ch) for ch in text]


def encode_merging(text: str) -> list[int]:
    """Like encode_chars but 'c ' becomes one token, so a context ending in 'c' changes when ' x' is appended."""
    ids, i = [], 0
    while i < len(text):
        if text[i : i + 2] == "c ":
            ids.append(C_SP)
            i += 2
        else:
            ids.append(CHARS.index(text[i]))
            i += 1
    return ids


def lp(*pairs: tuple[int, int]) -> float:
    return sum(math.log(P[prev][nxt]) for prev, nxt in pairs)


def test_scores_are_summed_continuation_logprobs():
    items = [ClozeItem("x1", "general", "ab", [" a", " c", " cab"], 1)]
    df = score_cloze(BigramOracle(), encode_chars, items)
    row = df.iloc[0]
    expected = [lp((B, SP), (SP, A)), lp((B, SP), (SP, C)), lp((B, SP), (SP, C), (C, A), (A, B))]
    assert row["logprobs"] == pytest.approx(expected, abs=1e-9)
    assert row["n_option_tokens"] == [2, 2, 4]
    assert row["predicted"] == 1 and bool(row["correct"])
    assert row["logprob_answer"] == pytest.approx(expected[1], abs=1e-9)
    assert not row["boundary_shift"]


def test_wrong_prediction_is_reported():
    items = [ClozeItem("x2", "domain", "ab", [" a", " c"], 0)]
    row = score_cloze(BigramOracle(), encode_chars, items).iloc[0]
    assert row["predicted"] == 1 and not row["correct"]


def test_boundary_merge_scores_tokens_beyond_common_prefix():
    items = [ClozeItem("x3", "general", "abc", [" a", " b"], 0)]
    plain = score_cloze(BigramOracle(), encode_chars, items).iloc[0]
    merged = score_cloze(BigramOracle(), encode_merging, items).iloc[0]
    assert not plain["boundary_shift"]
    assert merged["boundary_shift"]
    assert merged["n_option_tokens"] == [2, 2]
    assert merged["logprobs"] == pytest.approx([lp((B, C_SP), (C_SP, A)), lp((B, C_SP), (C_SP, B))], abs=1e-9)


def test_left_truncation_feeds_at_most_max_len_tokens():
    model = BigramOracle()
    items = [ClozeItem("x4", "general", "abcabcab", [" a", " cab"], 0)]
    full = score_cloze(model, encode_chars, items).iloc[0]
    model.calls.clear()
    cut = score_cloze(model, encode_chars, items, max_len=4).iloc[0]
    assert max(t for t, _, _ in model.calls) == 4
    assert cut["logprobs"] == pytest.approx(full["logprobs"], abs=1e-9)  # a bigram needs one token of context
    with pytest.raises(DataError, match="max_len"):
        score_cloze(model, encode_chars, items, max_len=3)


def test_runs_in_eval_mode_without_grad_and_restores_mode():
    model = BigramOracle()
    model.train()
    score_cloze(model, encode_chars, [ClozeItem("x5", "general", "ab", [" a", " b"], 0)])
    assert model.training
    assert all(not training and not grad for _, training, grad in model.calls)


def test_cloze_accuracy_per_group_and_all():
    df = pd.DataFrame({"group": ["general", "general", "general", "domain"], "correct": [True, False, True, True]})
    acc = cloze_accuracy(df)
    assert acc["general"] == (2, 3, pytest.approx(2 / 3))
    assert acc["domain"] == (1, 1, 1.0)
    assert acc["all"] == (3, 4, 0.75)


def test_demo_items_load_with_both_groups():
    items = load_cloze_items(DEMO)
    groups = [item.group for item in items]
    assert len(items) >= 24
    assert groups.count("general") >= 12 and groups.count("domain") >= 12
    assert all(2 <= len(item.options) <= 4 and all(o.startswith(" ") for o in item.options) for item in items)
    assert len({item.answer for item in items}) > 1  # the answer is not always in the same slot


GOOD = {"item_id": "a", "group": "general", "context": "apt", "options": [" update", " moo"], "answer": 0}


@pytest.mark.parametrize("bad", [
    {**GOOD, "answer": 2},
    {**GOOD, "options": [" update"]},
    {**GOOD, "options": ["update", " moo"]},
    {**GOOD, "item_id": "a"},  # duplicate of line 1
    {**GOOD, "item_id": "b", "extra": 1},
    "not json",
])
def test_bad_line_names_its_line_number(tmp_path, bad):
    path = tmp_path / "items.jsonl"
    second = bad if isinstance(bad, str) else json.dumps(bad)
    path.write_text(json.dumps(GOOD) + "\n" + second + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="line 2"):
        load_cloze_items(path)


def test_shipped_sets_use_the_pair_schema_with_enough_items_of_both_kinds():
    from evals.cloze import load_cloze_sets

    folder = DEMO.parent
    items = load_cloze_sets([folder / "general.jsonl", folder / "domain.jsonl"])
    for group in ("general", "domain"):
        mine = [i for i in items if i.group == group]
        assert len(mine) >= 24
        assert {i.kind for i in mine} == {"local", "earlier_context"}
        assert all(i.answer == 0 and len(i.options) == 2 and i.source for i in mine)


@pytest.mark.parametrize("change, message", [
    ({"kind": "global"}, "kind must be one of"),
    ({"distractor": " install"}, "must differ"),
    ({"distractor": "remove"}, "leading space"),
    ({"source": ""}, "source must be a non-empty"),
])
def test_pair_schema_errors_name_the_line_and_the_fix(tmp_path, change, message):
    from evals.cloze import load_cloze_sets

    good = {"item_id": "x-1", "group": "general", "source": "handbook_en", "kind": "local",
            "context": "To install a package, run apt", "correct": " install", "distractor": " remove"}
    path = tmp_path / "items.jsonl"
    path.write_text(json.dumps({**good, **change}) + "\n")
    with pytest.raises(DataError, match=message):
        load_cloze_sets([path])
    path.write_text(json.dumps(good) + "\n")
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps(good) + "\n")
    with pytest.raises(DataError, match="unique across sets"):
        load_cloze_sets([path, other])


def test_one_option_items_and_non_utf8_files_are_refused(tmp_path):
    from evals.cloze import load_cloze_sets

    item = {"item_id": "x-1", "group": "general", "source": "s", "kind": "local", "context": "run apt",
            "correct": " install", "distractor": []}
    path = tmp_path / "items.jsonl"
    path.write_text(json.dumps(item) + "\n")
    with pytest.raises(DataError, match="at least one distractor"):
        load_cloze_sets([path])
    path.write_text(json.dumps({**item, "distractor": " remove", "context": 7}) + "\n")
    with pytest.raises(DataError, match="context must be a non-empty string"):
        load_cloze_sets([path])
    path.write_bytes(b"\xff\xfe not utf-8\n")
    with pytest.raises(DataError, match="not UTF-8"):
        load_cloze_sets([path])


def test_raw_line_separators_inside_json_strings_do_not_split_an_item(tmp_path):
    item = {**GOOD, "context": "apt\u2028get\u0085x"}
    path = tmp_path / "items.jsonl"
    path.write_text(json.dumps(item, ensure_ascii=False) + "\r\n" + json.dumps({**GOOD, "item_id": "b"}) + "\n",
                    encoding="utf-8", newline="")
    items = load_cloze_items(path)
    assert [i.item_id for i in items] == ["a", "b"] and items[0].context == "apt\u2028get\u0085x"
