"""The predeclared continued-pretraining gate (docs/methods.md §11): decide which candidate, if any, replaces the base.

The gate is written down before any candidate is evaluated and identified by ``gate_hash``; changing it after
results exist is a GateError for the caller to raise. Each criterion compares one metric to a threshold, with a
confidence interval from paired data — the same held-out windows and the same cloze items for base and every
candidate (docs/methods.md §10) — so a criterion is ``pass`` only when the whole interval is on the right side,
``fail`` when the whole interval is on the wrong side, and ``undetermined`` otherwise.

Held-out windows cut from one document share its content, so their losses are correlated and a bootstrap over
windows gives too narrow an interval. The loss intervals therefore treat whole documents as the units: a t
interval over documents with the delete-one-document jackknife variance (Cameron, Gelbach & Miller 2008; MacKinnon,
Nielsen & Webb 2023; ``evals.stats.cluster_mean_ci``): the number of documents is the effective number of
independent units. Every criterion has a minimum of such units (``evals.stats.MIN_UNITS``, from the coverage
study of docs/methods.md §16: 5 documents, 40 items); below it, or on an interval of zero width, it is
``undetermined`` with the reason (``reason_<name>``: "needs >= 5 documents, has 2: …"). Windows without
document ids (``HeldoutArrays.window_docs`` None) are each their own cluster, and the table says so. The
window-level interval (paired bootstrap over windows) is kept beside it for comparison only.

Metrics (losses in nats per token, accuracies as fractions in [0, 1]):

- ``domain_loss_reduction_nats`` = base − candidate domain held-out loss (t interval over documents);
- ``general_loss_rise_nats``     = candidate − base general held-out loss (t interval over documents);
- ``cloze_accuracy``             = candidate cloze accuracy (Wilson interval, ``evals.stats.proportion_ci``);
- ``cloze_accuracy_delta``       = candidate − base accuracy (Newcombe's paired interval,
  ``evals.stats.paired_proportion_diff_ci``, never of zero width; exact McNemar p beside it);
  each under the criterion's ``scoring`` of the options (``evals.cloze.SCORINGS``: ``sum`` of log-probabilities,
  the default; ``per_token``; ``per_byte``), declared with the gate;
- ``harness_accuracy``, ``harness_accuracy_delta``: the same two on the documents of an lm-evaluation-harness task
  (``task``), each document correct when it scores 1 on the per-item metric ``task_metric`` of the harness's logged
  samples (``evals.harness.per_item_correct``); paired by document as cloze criteria are by item.

Context-extension metrics (``CONTEXT_METRICS``; the CPT stage scores them for ``[cpt] kind = "context_extension"``,
docs/methods.md §15):

- ``long_loss_reduction_nats``  = base − candidate loss on the held-out long windows (``CandidateEval.long``, windows
  of the target length), judged as the domain reduction is (t interval over documents);
- ``retrieval_accuracy``        = candidate passkey-retrieval accuracy on the prompts of one length (``length``
  tokens; 0 = the longest evaluated), Wilson interval as for cloze;
- ``retrieval_accuracy_delta``  = candidate − base retrieval accuracy on those prompts (Newcombe's paired interval,
  exact McNemar p).

Lab-5 toy gate (docs/methods.md §11)::

    GateConfig(criteria=[
        GateCriterion(name="domain", metric="domain_loss_reduction_nats", op=">=", threshold=1.0),
        GateCriterion(name="general", metric="general_loss_rise_nats", op="<=", threshold=0.20)])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from evals.cloze import NORMALISED_SCORINGS
from evals.stats import (MIN_UNITS, BootstrapCI, binomial_se, cluster_mean_ci, items_needed, mcnemar_exact,
                         has_width, paired_bootstrap_ci, paired_proportion_diff_ci, proportion_ci)
from evals.gate_config import (ACCURACY_METRICS, CLOZE_METRICS, CONTEXT_METRICS, HARNESS_METRICS,  # noqa: F401
                               ITEM_METRICS, LOSS_METRICS, METRICS, RETRIEVAL_METRICS, SELECTIONS, _CONTEXT_FIX,
                               GateConfig, GateCriterion, Metric, cloze_column, gate_hash)
from infra.errors import DataError

@dataclass(frozen=True)
class HeldoutArrays:
    """Per-window held-out results: ``window_nats`` (N,) mean loss of each window in nats per predicted token,
    ``window_tokens`` (N,) predicted tokens per window (the interval's weights), ``window_docs`` (N,) integer id of
    the document each window starts in, unique across sources (the interval's clusters); None: unknown, each window
    is its own cluster.

    Raises:
        DataError: ``window_docs`` is not of the windows' shape.
    """

    window_nats: np.ndarray
    window_tokens: np.ndarray
    window_docs: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.window_docs is not None and np.shape(self.window_docs) != np.shape(self.window_nats):
            raise DataError(f"window_docs has shape {np.shape(self.window_docs)}, the windows "
                            f"{np.shape(self.window_nats)}: give one document id per window")


@dataclass(frozen=True)
class CandidateEval:
    """One model's evaluation on the shared windows and items.

    ``cloze_correct``: bool (M,) per cloze item, same items in the same order for every model, under the summed
    log-probability; ``cloze_normalised``: ``per_token`` / ``per_byte`` → bool (M,) per item under that scoring
    (``evals.cloze``; empty: only the sum was scored); ``params``:
    what distinguishes the run (e.g. ``{"replay_fraction": 0.3, "peak_lr": 3e-4}``), copied into the table.
    ``harness_correct``: ``<task>.<task_metric>`` → bool (M_t,) per document of that harness task, in document
    order, the same documents for every model.
    Context extension (docs/methods.md §15): ``long``, the held-out long windows (target length) with their
    documents; ``retrieval_correct`` bool (R,) per passkey prompt and ``retrieval_length`` int (R,) its length in
    tokens, the same prompts in the same order for every model (empty: not scored).

    Raises:
        DataError: ``retrieval_length`` is not of ``retrieval_correct``'s shape; ``cloze_normalised`` names a scoring
            other than per_token / per_byte, or an array not of ``cloze_correct``'s shape.
    """

    name: str
    general: HeldoutArrays
    domain: HeldoutArrays
    cloze_correct: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    params: dict = field(default_factory=dict)
    harness_correct: dict[str, np.ndarray] = field(default_factory=dict)
    long: HeldoutArrays | None = None
    retrieval_correct: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    retrieval_length: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    cloze_normalised: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if np.shape(self.retrieval_length) != np.shape(self.retrieval_correct):
            raise DataError(f"{self.name}: retrieval_length has shape {np.shape(self.retrieval_length)}, "
                            f"retrieval_correct {np.shape(self.retrieval_correct)}: give one length per prompt")
        for scoring, correct in self.cloze_normalised.items():
            if scoring not in NORMALISED_SCORINGS:
                raise DataError(f"{self.name}: cloze_normalised names scoring {scoring!r}; use one of "
                                f"{list(NORMALISED_SCORINGS)} (the sum is cloze_correct)")
            if np.shape(correct) != np.shape(self.cloze_correct):
                raise DataError(f"{self.name}: cloze_normalised[{scoring!r}] has shape {np.shape(correct)}, "
                                f"cloze_correct {np.shape(self.cloze_correct)}: score the same items under each "
                                "scoring")

    def cloze(self, scoring: str) -> np.ndarray | None:
        """Per-item cloze correctness (M,) under ``scoring``; None when that scoring was not scored."""
        if scoring == "sum":
            return np.asarray(self.cloze_correct, bool)
        found = self.cloze_normalised.get(scoring)
        return None if found is None else np.asarray(found, bool)


@dataclass(frozen=True)
class GateDecision:
    """``table``: one row per candidate (see ``decide``); ``kept``: the chosen candidate's name, or "base"."""

    table: pd.DataFrame
    kept: str
    gate_hash: str
    criteria: tuple[GateCriterion, ...] = ()

    def summary(self) -> str:
        """A short human-readable report: gate hash, one line per candidate with criterion statuses (loss criteria
        with the documents and windows behind their interval, retrieval criteria with their prompts and length),
        the choice."""
        lines = [f"gate {self.gate_hash[:12]}: {len(self.table)} candidate(s)"]
        for _, row in self.table.iterrows():
            parts = []
            for c in self.criteria:
                value = row[c.column]
                if c.metric in RETRIEVAL_METRICS:
                    units = f" over {row[f'retrieval_items@{c.length}']} items of {c.length} tokens"
                elif c.metric in LOSS_METRICS:
                    units = (f" over {row[c.column + '_docs']} documents/{row[c.column + '_windows']} windows"
                             if row[c.column + "_cluster_unit"] == "document" else
                             f" over {row[c.column + '_windows']} windows (no document ids)")
                else:
                    units = ""
                parts.append(f"{c.name} {value:+.3f} [{row[c.column + '_ci_low']:+.3f}, "
                             f"{row[c.column + '_ci_high']:+.3f}]{units} {c.op} {c.threshold:g}: "
                             f"{row['status_' + c.name]}")
            lines.append(f"  {row['candidate']}: {row['decision']}  (" + "; ".join(parts) + ")")
        lines.append(f"kept: {self.kept}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- metric intervals

@dataclass(frozen=True)
class _Interval:
    point: float
    low: float
    high: float
    n: int  # independent units behind the interval: documents (clusters) for losses, else items
    windows: int = 0  # losses: windows behind the interval
    window_low: float = math.nan  # losses: the window-level interval, for comparison only
    window_high: float = math.nan
    by_document: bool = False  # losses: clusters are documents (False: each window its own cluster)


def _window_docs(base: HeldoutArrays, cand: HeldoutArrays, what: str) -> np.ndarray | None:
    """The shared (N,) document ids of the windows, or None when neither model has them."""
    docs = [None if h.window_docs is None else np.asarray(h.window_docs) for h in (base, cand)]
    if docs[0] is None and docs[1] is None:
        return None
    if docs[0] is None or docs[1] is None or not np.array_equal(docs[0], docs[1]):
        raise DataError(f"{what}: the windows' document ids differ from the base's (or only one has them); "
                        "evaluate every model on the same held-out windows")
    return docs[0]


def _paired_loss(base: HeldoutArrays, cand: HeldoutArrays, *, rise: bool, confidence: float, seed: int,
                 what: str) -> _Interval:
    """Token-weighted paired loss difference: rise = cand − base, reduction = base − cand (nats/token).

    The interval is the t interval over documents with the delete-one-document jackknife variance
    (``evals.stats.cluster_mean_ci``; docs/methods.md §16); the window-level one resamples windows
    (``paired_bootstrap_ci``, for comparison only). With fewer than 2 documents of positive weight there is no
    document-level interval: (−inf, +inf). Below ``MIN_UNITS["documents"]`` every criterion on it is undetermined
    (``_status``).
    """
    if base.window_nats.shape != cand.window_nats.shape or not np.array_equal(base.window_tokens,
                                                                               cand.window_tokens):
        raise DataError(f"{what}: candidate windows differ from the base's (shape or tokens per window); "
                        "evaluate every model on the same held-out windows")
    docs = _window_docs(base, cand, what)
    a, b = (base.window_nats, cand.window_nats) if rise else (cand.window_nats, base.window_nats)
    weights = np.asarray(base.window_tokens, dtype=float)
    if int((weights > 0).sum()) < 2:  # one window: neither interval exists
        delta = float(np.sum(weights * (b - a)) / max(float(np.sum(weights)), 1e-300))
        return _Interval(delta, -math.inf, math.inf, int((weights > 0).sum()), int(len(a)), math.nan, math.nan,
                         docs is not None)
    by_window: BootstrapCI = paired_bootstrap_ci(a, b, weights=weights, confidence=confidence, seed=seed)
    clusters = np.arange(len(a)) if docs is None else docs
    _, cluster = np.unique(clusters, return_inverse=True)
    live = int((np.bincount(cluster, weights=weights) > 0).sum())
    if live < 2:
        return _Interval(by_window.delta, -math.inf, math.inf, live, int(len(a)), by_window.low, by_window.high,
                         docs is not None)
    ci = cluster_mean_ci(a, b, clusters, weights=weights, confidence=confidence)
    return _Interval(ci.delta, ci.low, ci.high, ci.n_clusters, ci.n_units, by_window.low, by_window.high,
                     docs is not None)


def _cloze_accuracy(cand: np.ndarray, confidence: float) -> _Interval:
    ci = proportion_ci(int(cand.sum()), int(cand.size), confidence)
    return _Interval(ci.estimate, ci.low, ci.high, ci.n)


def _cloze_delta(base: np.ndarray, cand: np.ndarray, confidence: float) -> _Interval:
    ci = paired_proportion_diff_ci(base, cand, confidence)
    return _Interval(ci.delta + 0.0, ci.low, ci.high, ci.n)


def _interval(metric: str, base: CandidateEval, cand: CandidateEval, confidence: float, seed: int,
              key: str | int = "") -> _Interval:
    """The interval of ``metric`` for ``cand`` against ``base``; ``key``: the harness key of a harness metric, the
    prompt length (tokens) of a retrieval metric, the scoring of a cloze metric ("" = sum)."""
    if metric == "domain_loss_reduction_nats":
        return _paired_loss(base.domain, cand.domain, rise=False, confidence=confidence, seed=seed,
                            what=f"{cand.name} domain")
    if metric == "general_loss_rise_nats":
        return _paired_loss(base.general, cand.general, rise=True, confidence=confidence, seed=seed,
                            what=f"{cand.name} general")
    if metric == "long_loss_reduction_nats":
        if base.long is None or cand.long is None:
            raise DataError(f"{cand.name if cand.long is None else 'base'}: no long-window results; {_CONTEXT_FIX}")
        return _paired_loss(base.long, cand.long, rise=False, confidence=confidence, seed=seed,
                            what=f"{cand.name} long")
    if metric in HARNESS_METRICS:
        found = [m.harness_correct.get(key) for m in (base, cand)]
        if any(f is None for f in found):
            missing = [m.name for m, f in zip((base, cand), found) if f is None]
            raise DataError(f"{', '.join(missing)}: no harness results for {key}; score the base and every "
                            "candidate on that task with log_samples")
        what, units, fix = f"{key} has", "documents", "documents (same limit)"
    elif metric in RETRIEVAL_METRICS:
        at = np.asarray(base.retrieval_length) == int(key)  # same prompts for every model (checked in decide)
        found = [np.asarray(m.retrieval_correct)[at] for m in (base, cand)]
        what, units, fix = f"retrieval results of length {key} have", "prompts", "passkey prompts"
    else:
        scoring = str(key or "sum")
        found = [m.cloze(scoring) for m in (base, cand)]
        if any(f is None for f in found):
            missing = [m.name for m, f in zip((base, cand), found) if f is None]
            raise DataError(f"{', '.join(missing)}: no {scoring} cloze results; score the base and every candidate "
                            "with evals.cloze.score_cloze, which gives every scoring (refresh the cpt stage)")
        what = "cloze results have" if scoring == "sum" else f"{scoring} cloze results have"
        units, fix = "items", "item list"
    base_c, cand_c = (np.asarray(f, bool) for f in found)
    if cand_c.size == 0 or base_c.shape != cand_c.shape:
        raise DataError(f"{cand.name}: {what} {cand_c.size} {units} vs the base's {base_c.size}; score base and "
                        f"candidates on the same non-empty {fix}")
    if metric in ACCURACY_METRICS:
        return _cloze_accuracy(cand_c, confidence)
    return _cloze_delta(base_c, cand_c, confidence)


# ------------------------------------------------------------------------------------------------- judging

def _minimum(c: GateCriterion) -> tuple[str, int]:
    """The unit kind a criterion's interval counts and the least of them it needs to pass or fail: held-out
    documents for loss metrics, items (or prompts, documents of a harness task) otherwise, at least
    ``MIN_UNITS`` (the coverage study, docs/methods.md §16) and at least the criterion's ``min_items``."""
    if c.metric in LOSS_METRICS:
        return "documents", MIN_UNITS["documents"]
    return "items", max(MIN_UNITS["items"], c.min_items)


_MORE = {"documents": "score more held-out documents (the budget's eval_tokens while documents lack a window, "
                      "else a larger held-out split: [tokenizer] heldout_fraction or min_heldout_docs)",
         "items": "score more items (gate.cloze_items, passkey prompts or the harness task's limit)"}


def _shortfall(c: GateCriterion, iv: _Interval) -> str:
    """"" when the interval rests on enough independent units; else ``needs >= N <units>, has M: <how>``."""
    units, need = _minimum(c)
    if iv.n >= need:
        return ""
    return f"needs >= {need} {units}, has {iv.n}: {_MORE[units]}"


def _status(c: GateCriterion, iv: _Interval) -> str:
    """pass / fail when the whole CI is on one side of the threshold; undetermined when it straddles it, when it
    rests on fewer units than its minimum (``_shortfall``), or when it has no width (no evidence of spread is no
    evidence of none)."""
    if _shortfall(c, iv) or not has_width(iv.low, iv.high, iv.point):
        return "undetermined"
    good_low, good_high = (iv.low, iv.high) if c.op == ">=" else (-iv.high, -iv.low)
    t = c.threshold if c.op == ">=" else -c.threshold
    if good_low >= t:
        return "pass"
    if good_high < t:
        return "fail"
    return "undetermined"


def _units_needed(c: GateCriterion, iv: _Interval) -> float:
    """Rough documents (loss metrics) or items (cloze, harness, retrieval) for the CI to clear the threshold at the
    current point value.

    Accuracy: ``items_needed`` with half-width |p − threshold| (docs/methods.md §10). Other metrics: the CI half-width
    shrinks as 1/√n in the n independent units (held-out documents for losses, Cameron, Gelbach & Miller 2008), so
    n · (half-width / |point − threshold|)². Infinite when the point sits on the threshold; the criterion's minimum
    (``_minimum``: 5 documents, 40 items or its ``min_items``) when the interval rests on fewer units than that.
    """
    _, need = _minimum(c)
    if iv.n < need:
        return float(need)
    gap = abs(iv.point - c.threshold)
    if gap == 0:
        return math.inf
    if c.metric in ACCURACY_METRICS:
        needed = items_needed(iv.point, gap, c.confidence)
    else:
        half_width = (iv.high - iv.low) / 2.0
        needed = math.ceil(iv.n * (half_width / gap) ** 2)
    needed = max(needed, iv.n + 1)
    if c.metric in ITEM_METRICS:
        needed = max(needed, c.min_items)
    return float(needed)


def _shown_confidence(criteria, metric: str, key: str | int | None = None) -> float:
    """The confidence of the table's interval for ``metric``: the first criterion on it (preferring one whose
    ``key`` is ``key``: the prompt length of a retrieval metric, the scoring of a cloze metric), else 0.95."""
    on_metric = [c for c in criteria if c.metric == metric]
    shown = [c for c in on_metric if c.key == key] or on_metric
    return shown[0].confidence if shown else 0.95


def _candidate_row(criteria: list[GateCriterion], base: CandidateEval, cand: CandidateEval, seed: int, *,
                   has_long: bool, lengths: list[int], scorings: list[str]) -> dict:
    cache: dict[tuple[str, str | int, float], _Interval] = {}

    def interval(metric: str, confidence: float, key: str | int = "") -> _Interval:
        if (metric, key, confidence) not in cache:
            cache[metric, key, confidence] = _interval(metric, base, cand, confidence, seed, key)
        return cache[metric, key, confidence]

    row: dict = {"candidate": cand.name, **{f"param_{k}": v for k, v in cand.params.items()}}
    has_cloze = np.asarray(cand.cloze_correct).size > 0
    for metric in METRICS + (("long_loss_reduction_nats",) if has_long else ()):
        if metric in CLOZE_METRICS and not has_cloze:
            row.update({metric: math.nan, f"{metric}_ci_low": math.nan, f"{metric}_ci_high": math.nan})
            continue
        key = "sum" if metric in CLOZE_METRICS else ""
        iv = interval(metric, _shown_confidence(criteria, metric, key), key)
        row.update({metric: iv.point, f"{metric}_ci_low": iv.low, f"{metric}_ci_high": iv.high})
        if metric in LOSS_METRICS:
            row.update({f"{metric}_docs": iv.n, f"{metric}_windows": iv.windows,
                        f"{metric}_cluster_unit": "document" if iv.by_document else "window",
                        f"{metric}_window_ci_low": iv.window_low, f"{metric}_window_ci_high": iv.window_high})
    if has_cloze:
        base_c, cand_c = np.asarray(base.cloze_correct, bool), np.asarray(cand.cloze_correct, bool)
        row["cloze_accuracy_se_pts"] = 100.0 * binomial_se(float(cand_c.mean()), int(cand_c.size))
        row["cloze_accuracy_delta_mcnemar_p"] = mcnemar_exact(base_c, cand_c).p_value
    for scoring in scorings if has_cloze else ():  # the normalised scorings, beside the sum
        for metric in ("cloze_accuracy", "cloze_accuracy_delta"):
            iv = interval(metric, _shown_confidence(criteria, metric, scoring), scoring)
            column = cloze_column(metric, scoring)
            row.update({column: iv.point, f"{column}_ci_low": iv.low, f"{column}_ci_high": iv.high})
        base_c, cand_c = base.cloze(scoring), cand.cloze(scoring)
        accuracy, delta = cloze_column("cloze_accuracy", scoring), cloze_column("cloze_accuracy_delta", scoring)
        row[f"{accuracy}_se_pts"] = 100.0 * binomial_se(float(cand_c.mean()), int(cand_c.size))
        row[f"{delta}_mcnemar_p"] = mcnemar_exact(base_c, cand_c).p_value
    for length in lengths:
        at = np.asarray(base.retrieval_length) == length
        row[f"retrieval_items@{length}"] = int(at.sum())
        for metric in ("retrieval_accuracy", "retrieval_accuracy_delta"):
            iv, column = interval(metric, _shown_confidence(criteria, metric, length), length), f"{metric}@{length}"
            row.update({column: iv.point, f"{column}_ci_low": iv.low, f"{column}_ci_high": iv.high})
        pair = (np.asarray(m.retrieval_correct, bool)[at] for m in (base, cand))
        row[f"retrieval_accuracy_delta@{length}_mcnemar_p"] = mcnemar_exact(*pair).p_value
    for c in criteria:
        if c.metric in HARNESS_METRICS:
            iv = interval(c.metric, c.confidence, c.harness_key)
            row.update({c.column: iv.point, f"{c.column}_ci_low": iv.low, f"{c.column}_ci_high": iv.high})
            if c.metric == "harness_accuracy_delta":
                pair = (np.asarray(m.harness_correct[c.harness_key], bool) for m in (base, cand))
                row[f"{c.column}_mcnemar_p"] = mcnemar_exact(*pair).p_value
    for c in criteria:
        iv = interval(c.metric, c.confidence, c.key)
        status = _status(c, iv)
        row[f"status_{c.name}"] = status
        if c.metric in CLOZE_METRICS:  # which comparison of the options the verdict rests on
            row[f"scoring_{c.name}"] = c.scoring
        row[f"needed_{c.name}"] = _units_needed(c, iv) if status == "undetermined" else math.nan
        row[f"units_{c.name}"] = iv.n
        row[f"reason_{c.name}"] = _shortfall(c, iv)
        if c.metric in LOSS_METRICS:  # what the window-level interval would have said (comparison only)
            row[f"window_status_{c.name}"] = _status(c, _Interval(iv.point, iv.window_low, iv.window_high,
                                                                  iv.windows))
    statuses = [row[f"status_{c.name}"] for c in criteria]
    row["decision"] = ("pass" if all(s == "pass" for s in statuses)
                       else "fail" if "fail" in statuses else "undetermined")
    return row


def _context_inputs(cfg: GateConfig, models: list[CandidateEval]) -> tuple[bool, list[int]]:
    """Whether the models carry long windows, and the retrieval prompt lengths evaluated (sorted, tokens).

    Raises:
        DataError: only some models carry long windows or retrieval prompts, the prompts' lengths differ from the
            base's, or a context criterion or selection has nothing to judge.
    """
    base = models[0]
    has_long = any(m.long is not None for m in models)
    if has_long and any(m.long is None for m in models):
        lacking = [m.name for m in models if m.long is None]
        raise DataError(f"{', '.join(lacking)}: no long-window results while other models have them; {_CONTEXT_FIX}")
    has_retrieval = any(np.asarray(m.retrieval_correct).size for m in models)
    for m in models if has_retrieval else ():
        if not np.array_equal(np.asarray(m.retrieval_length), np.asarray(base.retrieval_length)):
            raise DataError(f"{m.name}: retrieval prompts ({np.size(m.retrieval_length)}, or their lengths) differ "
                            f"from the base's ({np.size(base.retrieval_length)}); score every model on the same "
                            "passkey prompts in the same order")
    lengths = sorted(int(n) for n in np.unique(np.asarray(base.retrieval_length)))
    wanted = [c.name for c in cfg.criteria if c.metric == "long_loss_reduction_nats"]
    if cfg.select == "max_long_loss_reduction":
        wanted.append("select = max_long_loss_reduction")
    if wanted and not has_long:
        raise DataError(f"{', '.join(wanted)}: the models carry no long-window results; {_CONTEXT_FIX}")
    retrieval = [c.name for c in cfg.criteria if c.metric in RETRIEVAL_METRICS]
    if retrieval and not has_retrieval:
        raise DataError(f"{', '.join(retrieval)}: the models carry no passkey-retrieval results; {_CONTEXT_FIX}")
    return has_long, lengths


def decide(cfg: GateConfig, base: CandidateEval, candidates: list[CandidateEval], *, seed: int = 0) -> GateDecision:
    """Judge every candidate against the predeclared gate and keep the best passing one (docs/methods.md §11).

    Table columns, one row per candidate: ``candidate``, ``param_<key>`` per params entry; for each metric
    ``<metric>``, ``<metric>_ci_low``, ``<metric>_ci_high`` (losses in nats/token, accuracies as fractions;
    interval at the confidence of the first criterion on that metric, else 0.95; NaN when no cloze results; for
    losses a t interval over held-out documents, ``evals.stats.cluster_mean_ci``, and (−inf, +inf) under 2
    documents);
    ``long_loss_reduction_nats`` only when the models carry long windows (``CandidateEval.long``);
    for each loss metric ``<metric>_docs`` (independent clusters: the effective units), ``<metric>_windows``,
    ``<metric>_cluster_unit`` ("document", or "window" when the windows carry no document ids and each is its
    own cluster) and ``<metric>_window_ci_low``/``_window_ci_high`` (paired bootstrap over windows, for
    comparison only: no verdict uses it);
    ``cloze_accuracy_se_pts`` (binomial SE of the candidate's accuracy, points) and
    ``cloze_accuracy_delta_mcnemar_p`` (exact McNemar vs base), all under the summed log-probability; the same
    columns under each normalised scoring that every model carries (``CandidateEval.cloze_normalised``), named
    ``cloze_accuracy_<scoring>``, ``cloze_accuracy_delta_<scoring>`` (``_ci_low``/``_ci_high`` at the confidence of
    the first cloze criterion of that scoring, else of that metric, else 0.95), ``cloze_accuracy_<scoring>_se_pts``
    and ``cloze_accuracy_delta_<scoring>_mcnemar_p``; per cloze criterion ``scoring_<name>`` (the scoring its
    verdict rests on); per harness criterion ``<metric>.<task>.<task_metric>``
    with ``_ci_low``/``_ci_high`` at its confidence (and ``_mcnemar_p`` for a delta);
    only when the models carry passkey prompts, for each prompt length L evaluated (tokens): ``retrieval_items@L``
    (prompts of that length), ``retrieval_accuracy@L`` (Wilson), ``retrieval_accuracy_delta@L`` (Newcombe
    over prompts), each with ``_ci_low``/``_ci_high`` at the confidence of the first criterion on that metric and
    length (else on that metric, else 0.95), and ``retrieval_accuracy_delta@L_mcnemar_p`` (exact McNemar vs base);
    per criterion ``status_<name>``
    (pass/fail/undetermined), ``needed_<name>`` (for undetermined ones: estimated documents — loss metrics —
    or items to resolve it, NaN otherwise), ``units_<name>`` (the independent units its interval rests on:
    documents or items) and ``reason_<name>`` ("needs >= N <units>, has M: <how to get more>" below the
    minimum, else ""); per loss criterion ``window_status_<name>`` (its status under the
    window-level interval, for comparison); ``decision`` (pass only if every criterion passes; fail if any fails;
    else undetermined) and ``kept`` (bool).

    A retrieval criterion of ``length`` 0 judges the longest length evaluated; the decision's ``criteria`` carry
    the resolved length, so their ``column`` names the table's column.

    ``kept`` is the passing candidate with the largest domain-loss reduction (``select=
    "max_domain_loss_reduction"``), the smallest general-loss rise (``"min_general_loss_rise"``) or the largest
    long-window loss reduction (``"max_long_loss_reduction"``); "base" when none passes. Raises DataError for no
    candidates, duplicate names or a candidate named "base", for windows (tokens or document ids) or items that
    differ from the base's, for a harness criterion whose task results a model lacks, for a cloze criterion whose
    scoring a model lacks, for a context criterion or
    selection (``CONTEXT_METRICS``) on models without long windows or passkey prompts (the fix: ``[cpt] kind =
    "context_extension"``), and for a retrieval criterion on a length not evaluated.
    """
    names = [c.name for c in candidates]
    if not names or len(set(names)) != len(names) or "base" in names:
        raise DataError(f"need >= 1 candidate with unique names other than 'base', got {names}")
    has_long, lengths = _context_inputs(cfg, [base, *candidates])
    criteria = [c.resolved(lengths) for c in cfg.criteria]
    models = [base, *candidates]
    scorings = [s for s in NORMALISED_SCORINGS if all(m.cloze(s) is not None for m in models)]
    table = pd.DataFrame([_candidate_row(criteria, base, cand, seed, has_long=has_long, lengths=lengths,
                                         scorings=scorings) for cand in candidates])
    kept = "base"
    passing = table[table["decision"] == "pass"]
    if len(passing):
        metric, largest = SELECTIONS[cfg.select]
        key = passing[metric]
        kept = str(passing.loc[key.idxmax() if largest else key.idxmin(), "candidate"])
    table["kept"] = table["candidate"] == kept
    return GateDecision(table=table, kept=kept, gate_hash=gate_hash(cfg), criteria=tuple(criteria))
