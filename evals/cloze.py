"""Cloze / multiple-choice scoring by continuation log-probability (docs/methods.md §10).

Each option is scored from the log-probabilities, in nats, of all its tokens given the context; the option
carries its own leading space. The context's tokens must be a prefix of the tokens of context+option; when a
tokenizer merges across the boundary, the option is scored as the tokens beyond the longest common prefix and
the row is flagged ``boundary_shift``.

Three scorings (``SCORINGS``) choose among the options from the same log-probabilities, in one forward pass:

- ``sum``: Σ log p over the option's scored tokens (Brown et al. 2020; the lm-evaluation-harness ``acc``);
- ``per_token``: Σ log p / number of scored tokens (Brown et al. 2020 §2.4 normalise per token);
- ``per_byte``: Σ log p / UTF-8 bytes of the option string, leading space included (the lm-evaluation-harness
  ``acc_bytes``, Gao et al. 2021; its ``acc_norm`` divides by characters, the same for ASCII options).

The sum favours short options (every token adds a negative term); the normalised scorings remove most of that
length bias, per byte also independently of the tokenizer.

Item file (JSON lines, one item per line)::

    {"item_id": "gen-001", "group": "general", "source": "handbook_en", "kind": "local",
     "context": "To install a package, run apt", "correct": " install", "distractor": " remove"}

``kind`` says what the answer depends on: ``local`` (the last few words) or ``earlier_context`` (something stated
several words back, docs/methods.md §10 (TinyStories small-decoder run) split). ``distractor`` may also be a list of wrong continuations. The older
form with ``options`` and an ``answer`` index is still read (kind and source then empty).

Usage::

    items = load_cloze_items(Path("configs/cloze/demo.jsonl"))
    df = score_cloze(model, tokenizer_encode, items, max_len=256)
    cloze_accuracy(df)  # {"general": (correct, n, accuracy), "domain": ..., "all": ...}
    cloze_accuracy(df, scoring="per_byte")
    cloze_summary(df)   # per group and kind, accuracy under each scoring with its SE and Wilson interval
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from evals.scorings import NORMALISED_SCORINGS, SCORINGS, Scoring, check_scoring  # noqa: F401
from infra.errors import DataError
from infra.jsonl import jsonl_lines

# Shape legend: B = options of one item, T = tokens fed to the model, V = vocabulary size.

# The columns of ``score_cloze`` (the frames of cloze.parquet and DuckDB cloze_results), in order.
CLOZE_COLUMNS = ["item_id", "group", "kind", "source", "answer", "predicted", "correct", "logprob_answer", "logprobs",
                 "n_option_tokens", "boundary_shift", "n_option_bytes", "predicted_per_token", "correct_per_token",
                 "predicted_per_byte", "correct_per_byte"]


def correct_column(scoring: str) -> str:
    """The ``score_cloze`` column of per-item correctness under ``scoring``: ``correct`` for the sum,
    ``correct_per_token`` / ``correct_per_byte`` otherwise. Raises ValueError for an unknown scoring."""
    return "correct" if check_scoring(scoring) == "sum" else f"correct_{scoring}"


def predicted_column(scoring: str) -> str:
    """The ``score_cloze`` column of the chosen option under ``scoring`` (``predicted``, ``predicted_per_token``,
    ``predicted_per_byte``). Raises ValueError for an unknown scoring."""
    return "predicted" if check_scoring(scoring) == "sum" else f"predicted_{scoring}"


def option_scores(logprobs: Sequence[float], n_tokens: Sequence[int], n_bytes: Sequence[int],
                  scoring: str) -> list[float]:
    """Each option's score under ``scoring``: Σ log p (nats), / its scored tokens, or / its UTF-8 bytes.

    Args:
        logprobs: (B,) summed log-probability of each option, nats.
        n_tokens: (B,) scored tokens of each option (>= 1).
        n_bytes: (B,) UTF-8 bytes of each option string (>= 1).

    Raises:
        ValueError: an unknown scoring, or a count below 1.
    """
    check_scoring(scoring)
    if scoring == "sum":
        return [float(v) for v in logprobs]
    counts = n_tokens if scoring == "per_token" else n_bytes
    if min(counts) < 1:
        raise ValueError(f"{scoring} scoring needs every option to have >= 1 {scoring[4:]}, got {list(counts)}")
    return [float(v) / c for v, c in zip(logprobs, counts)]


def _argmax(scores: Sequence[float]) -> int:
    """The best option; ties go to the lower index."""
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


@dataclass(frozen=True)
class ClozeItem:
    """One cloze item: ``options[answer]`` is the correct continuation of ``context``.

    ``group`` labels the item's register (e.g. "general" or "domain"); ``source`` the corpus source it tests;
    ``kind`` is "local" or "earlier_context"; each option starts with its leading space (docs/methods.md §10), except in
    scripts written without spaces (then no option has one).
    """

    item_id: str
    group: str
    context: str
    options: list[str]
    answer: int
    kind: str = ""
    source: str = ""


KINDS = ("local", "earlier_context")


def _item_from_record(record: object) -> ClozeItem:
    """Build and check one item; raises ValueError with the reason (wrapped by the caller)."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if "correct" in record:
        return _item_from_pair(record)
    fields = {"item_id", "group", "context", "options", "answer"}
    missing, unknown = fields - record.keys(), record.keys() - fields
    if missing or unknown:
        raise ValueError(f"missing fields {sorted(missing)}, unknown fields {sorted(unknown)}")
    options = record["options"]
    if not isinstance(options, list) or len(options) < 2 or not all(isinstance(o, str) for o in options):
        raise ValueError(f"options must be a list of >= 2 strings, got {options!r}")
    if len(set(options)) != len(options):
        raise ValueError(f"options must be distinct, got {options!r}")
    if not all(o.startswith(" ") and o.strip() for o in options):
        raise ValueError(f"every option needs its leading space and a word (docs/methods.md §10), got {options!r}")
    answer = record["answer"]
    if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(options):
        raise ValueError(f"answer must be an index in [0, {len(options)}), got {answer!r}")
    for key in ("item_id", "group", "context"):
        if not isinstance(record[key], str) or not record[key].strip():
            raise ValueError(f"{key} must be a non-empty string, got {record[key]!r}")
    return ClozeItem(record["item_id"], record["group"], record["context"], list(options), answer)


def _item_from_pair(record: dict) -> ClozeItem:
    """The (correct, distractor) schema; the correct continuation becomes option 0."""
    fields = {"item_id", "group", "source", "kind", "context", "correct", "distractor"}
    missing, unknown = fields - record.keys(), record.keys() - fields
    if missing or unknown:
        raise ValueError(f"missing fields {sorted(missing)}, unknown fields {sorted(unknown)}")
    for key in ("item_id", "group", "source", "context", "kind"):
        if not isinstance(record[key], str) or not record[key].strip():
            raise ValueError(f"{key} must be a non-empty string, got {record[key]!r}")
    distractors = record["distractor"] if isinstance(record["distractor"], list) else [record["distractor"]]
    if not distractors:
        raise ValueError("give at least one distractor: an item with one option is always scored correct")
    options = [record["correct"], *distractors]
    if not all(isinstance(o, str) and o.strip() for o in options):
        raise ValueError(f"correct and distractor must be non-empty strings, got {options!r}")
    if len(set(options)) != len(options):
        raise ValueError(f"the distractor must differ from the correct continuation, got {options!r}")
    spaced = [o.startswith(" ") for o in options]
    if any(spaced) and not all(spaced):
        raise ValueError(f"either every option carries its leading space or none does (docs/methods.md §10), got {options!r}")
    if not all(spaced) and record["context"][-1:].isascii() and record["context"][-1:].isalnum():
        raise ValueError(f"options without a leading space after a Latin word would glue onto it: {options!r}")
    if record["kind"] not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {record['kind']!r}")
    return ClozeItem(record["item_id"], record["group"], record["context"], options, 0, record["kind"],
                     record["source"])


def cloze_files(paths: Sequence[str | Path]) -> list[Path]:
    """The cloze item files ``[gate] cloze_paths`` names, as paths.

    Raises:
        ConfigError: a file does not exist (relative paths are read from the working directory).
    """
    from infra.errors import ConfigError

    files = [Path(p) for p in paths]
    for path in files:
        if not path.is_file():
            raise ConfigError(f"gate.cloze_items: {path} not found (relative paths are read from the working "
                              "directory)")
    return files


def load_cloze_sets(paths: Sequence[Path]) -> list[ClozeItem]:
    """``load_cloze_items`` over several files; item ids must be unique across all of them.

    Raises:
        DataError: as ``load_cloze_items``, or an item id repeated across files (names both files).
    """
    items: list[ClozeItem] = []
    seen: dict[str, Path] = {}
    for path in paths:
        for item in load_cloze_items(path):
            if item.item_id in seen:
                raise DataError(f"cloze item_id {item.item_id!r} appears in {seen[item.item_id]} and {path}; "
                                "item ids must be unique across sets")
            seen[item.item_id] = Path(path)
            items.append(item)
    return items


def load_cloze_items(path: Path) -> list[ClozeItem]:
    """Read cloze items from a JSON-lines file; blank lines are skipped.

    Raises DataError naming the file and 1-based line number for unreadable JSON, missing/unknown fields,
    fewer than 2 options, duplicate options, an option without its leading space, an answer out of range, or
    a repeated ``item_id``; and when the file is missing or holds no items.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"cloze item file {path} does not exist; pass the path of a JSON-lines item file")
    items: list[ClozeItem] = []
    seen: dict[str, int] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path} is not UTF-8 text ({err}); save the item file as UTF-8") from err
    for line_no, line in jsonl_lines(text):  # "\n" only: U+2028 may sit raw in a JSON string
        if not line.strip():
            continue
        try:
            item = _item_from_record(json.loads(line))
        except ValueError as err:  # json.JSONDecodeError is a ValueError
            raise DataError(f"{path} line {line_no}: {err}; fix the item or remove the line") from err
        if item.item_id in seen:
            raise DataError(f"{path} line {line_no}: item_id {item.item_id!r} already used on line "
                            f"{seen[item.item_id]}; item ids must be unique")
        seen[item.item_id] = line_no
        items.append(item)
    if not items:
        raise DataError(f"{path} holds no cloze items; add at least one JSON line")
    return items


def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _split_option(encode: Callable[[str], list[int]], context: str, option: str) -> tuple[list[int], int, bool]:
    """Tokens of context+option, the index where the scored option tokens start, and whether it shifted.

    The scored tokens are those beyond the longest common prefix with the context's own tokens (docs/methods.md §10).
    At least one token must stay as conditioning, so a common prefix of zero starts scoring at token 1.
    """
    context_ids = list(encode(context))
    full_ids = list(encode(context + option))
    start = _common_prefix_len(context_ids, full_ids)
    shifted = start != len(context_ids)
    if start == 0:
        start, shifted = 1, True
    if start >= len(full_ids):
        raise DataError(f"option {option!r} adds no scorable token after context {context[-40:]!r}; "
                        "check that encode() is lossless")
    return full_ids, start, shifted


def _option_logprobs(model: torch.nn.Module, sequences: list[list[int]], starts: list[int],
                     max_len: int | None, device: torch.device) -> list[float]:
    """Summed log-probabilities (nats) of ``seq[start:]`` given ``seq[:start]`` for each sequence, one batch."""
    inputs, targets, n_scored = [], [], []
    for seq, start in zip(sequences, starts):
        x, y = seq[:-1], seq[1:]
        if max_len is not None and len(x) > max_len:  # left-truncate: keep the last max_len positions
            x, y = x[-max_len:], y[-max_len:]
        inputs.append(x)
        targets.append(y)
        n_scored.append(len(seq) - start)
    width = max(len(x) for x in inputs)
    idx = torch.zeros(len(inputs), width, dtype=torch.long)  # (B, T), right-padded: causal, so padding is unseen
    for row, x in enumerate(inputs):
        idx[row, : len(x)] = torch.tensor(x, dtype=torch.long)
    out = model(idx.to(device))
    logits = out[0] if isinstance(out, tuple) else out  # (B, T, V)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # half precision → fp32, fp64 kept
    logprobs = F.log_softmax(logits, dim=-1)  # (B, T, V)
    totals = []
    for row, (y, k) in enumerate(zip(targets, n_scored)):
        positions = torch.arange(len(y) - k, len(y), device=logprobs.device)  # (k,)
        target_ids = torch.tensor(y[-k:], dtype=torch.long, device=logprobs.device)  # (k,)
        totals.append(float(logprobs[row, positions, target_ids].sum()))
    return totals


def score_cloze(model: torch.nn.Module, encode: Callable[[str], list[int]], items: Sequence[ClozeItem], *,
                max_len: int | None = None) -> pd.DataFrame:
    """Score every option of every item by its log-probability given the context (docs/methods.md §10), under the
    three scorings of ``SCORINGS`` from one forward pass per item.

    ``model.forward(idx)`` takes a LongTensor (B, T) and returns logits (B, T, V) (a tuple's first element is
    used). The model runs under ``torch.no_grad()`` in eval mode; its previous mode is restored. All options of
    one item form one right-padded batch. With ``max_len`` the model sees only the last ``max_len`` input
    tokens of context+option (left truncation).

    Returns one row per item with columns: ``item_id, group, kind, source, answer, predicted`` (argmax option; ties go to
    the lower index), ``correct`` (bool), ``logprob_answer`` (nats), ``logprobs`` (list[float] per option,
    nats), ``n_option_tokens`` (list[int] per option, tokens scored), ``boundary_shift`` (bool: some option's
    context tokens changed when the option was appended, so the scored tokens start earlier); then
    ``n_option_bytes`` (list[int] per option, UTF-8 bytes of the option string) and, for the normalised scorings,
    ``predicted_per_token``, ``correct_per_token``, ``predicted_per_byte``, ``correct_per_byte`` (``predicted`` and
    ``correct`` are the sum's). Per token divides by the scored tokens (those beyond the common prefix, so under a
    boundary shift they include the merged boundary token); per byte by the option string's bytes, whatever the
    tokenizer.

    Raises DataError if an option yields no scorable token, or if ``max_len`` is smaller than an option's
    token count (the option could not be scored in full).
    """
    if max_len is not None and max_len < 1:
        raise DataError(f"max_len must be >= 1 token, got {max_len}")
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    was_training = model.training
    model.eval()
    rows = []
    try:
        with torch.no_grad():
            for item in items:
                splits = [_split_option(encode, item.context, opt) for opt in item.options]
                n_tokens = [len(seq) - start for seq, start, _ in splits]
                if max_len is not None and max(n_tokens) > max_len:
                    raise DataError(f"item {item.item_id}: an option has {max(n_tokens)} tokens but max_len is "
                                    f"{max_len}; raise max_len or shorten the option")
                lps = _option_logprobs(model, [s[0] for s in splits], [s[1] for s in splits], max_len, device)
                n_bytes = [len(opt.encode("utf-8")) for opt in item.options]
                predicted = _argmax(lps)
                row = {
                    "item_id": item.item_id, "group": item.group, "kind": item.kind, "source": item.source,
                    "answer": item.answer,
                    "predicted": predicted, "correct": predicted == item.answer,
                    "logprob_answer": lps[item.answer], "logprobs": lps, "n_option_tokens": n_tokens,
                    "boundary_shift": any(s[2] for s in splits), "n_option_bytes": n_bytes,
                }
                for scoring in NORMALISED_SCORINGS:  # the same log-probabilities, only the divisor differs
                    chosen = _argmax(option_scores(lps, n_tokens, n_bytes, scoring))
                    row[predicted_column(scoring)] = chosen
                    row[correct_column(scoring)] = chosen == item.answer
                rows.append(row)
    finally:
        model.train(was_training)
    return pd.DataFrame(rows, columns=CLOZE_COLUMNS)



def cloze_accuracy(df: pd.DataFrame, scoring: str = "sum") -> dict[str, tuple[int, int, float]]:
    """Per-group ``(correct, n, accuracy)`` from a ``score_cloze`` frame under ``scoring`` (``SCORINGS``), plus an
    ``"all"`` entry.

    Accuracy is a fraction in [0, 1] (NaN for an empty frame). Raises ValueError for an unknown scoring and
    DataError if the frame lacks the ``group`` column or the scoring's correctness column (``correct_column``).
    """
    column = correct_column(scoring)
    if not {"group", column} <= set(df.columns):
        raise DataError(f"cloze frame needs 'group' and {column!r} columns for {scoring} scoring, got "
                        f"{list(df.columns)}; score the items again with evals.cloze.score_cloze")

    def summarise(correct: pd.Series) -> tuple[int, int, float]:
        k, n = int(correct.sum()), int(len(correct))
        return k, n, (k / n if n else float("nan"))

    result = {str(group): summarise(part[column].astype(bool)) for group, part in df.groupby("group", sort=True)}
    result["all"] = summarise(df[column].astype(bool))
    return result


def cloze_summary(df: pd.DataFrame, *, confidence: float = 0.95) -> pd.DataFrame:
    """Accuracy per (group, kind) and over all items under each scoring the frame carries (``SCORINGS``).

    Rows: ``group``, ``kind`` ("-" when empty; "all" for the all-items row, whose group is "all"), ``scoring``,
    ``correct``, ``items``, ``accuracy`` (fraction), ``se_points`` (binomial SE ×100, docs/methods.md §10),
    ``ci_low``/``ci_high`` (Wilson 1927 interval at ``confidence``, ``scipy.stats.binomtest``). A scoring whose
    column is missing (frames written before normalised scores) is left out.

    Raises:
        DataError: the frame has no items, or lacks ``group``/``kind``/``correct``.
    """
    from scipy import stats

    from evals.stats import binomial_se

    if len(df) == 0 or not {"group", "kind", "correct"} <= set(df.columns):
        raise DataError(f"cloze summary needs scored items with 'group', 'kind' and 'correct', got {len(df)} rows "
                        f"and columns {list(df.columns)}")
    rows = []
    parts = [((str(g), str(k) or "-"), p) for (g, k), p in df.groupby(["group", "kind"], sort=True)]
    for (group, kind), part in parts + [(("all", "all"), df)]:
        for scoring in SCORINGS:
            if correct_column(scoring) not in part.columns:
                continue
            k, n = int(part[correct_column(scoring)].astype(bool).sum()), int(len(part))
            ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
            rows.append({"group": group, "kind": kind, "scoring": scoring, "correct": k, "items": n,
                         "accuracy": k / n, "se_points": 100.0 * binomial_se(k / n, n),
                         "ci_low": float(ci.low), "ci_high": float(ci.high)})
    return pd.DataFrame(rows)
