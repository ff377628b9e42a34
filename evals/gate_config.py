"""The gate's declaration (docs/methods.md §11): its criteria, metrics, selection rule and ``gate_hash``.

Only what a config needs to be read and checked lives here (pydantic and the standard library): ``pretrain``
validates a config without importing the evaluation stack. ``evals.gate`` decides on these declarations and
re-exports every name.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Literal

from pydantic import SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from evals.scorings import Scoring, check_scoring
from infra.errors import DataError
from infra.section import Section

Metric = Literal["domain_loss_reduction_nats", "general_loss_rise_nats", "cloze_accuracy", "cloze_accuracy_delta",
                 "harness_accuracy", "harness_accuracy_delta", "long_loss_reduction_nats", "retrieval_accuracy",
                 "retrieval_accuracy_delta"]
METRICS: tuple[str, ...] = ("domain_loss_reduction_nats", "general_loss_rise_nats", "cloze_accuracy",
                            "cloze_accuracy_delta")
CLOZE_METRICS = frozenset({"cloze_accuracy", "cloze_accuracy_delta"})
HARNESS_METRICS = frozenset({"harness_accuracy", "harness_accuracy_delta"})
RETRIEVAL_METRICS = frozenset({"retrieval_accuracy", "retrieval_accuracy_delta"})  # judged per prompt length
ITEM_METRICS = CLOZE_METRICS | HARNESS_METRICS | RETRIEVAL_METRICS  # judged on paired items (min_items applies)
ACCURACY_METRICS = frozenset({"cloze_accuracy", "harness_accuracy", "retrieval_accuracy"})
LOSS_METRICS = frozenset({"domain_loss_reduction_nats", "general_loss_rise_nats",
                          "long_loss_reduction_nats"})  # judged on held-out documents
CONTEXT_METRICS = frozenset({"long_loss_reduction_nats", "retrieval_accuracy", "retrieval_accuracy_delta"})
# select -> (table column, True to keep the largest / False the smallest)
SELECTIONS: dict[str, tuple[str, bool]] = {"max_domain_loss_reduction": ("domain_loss_reduction_nats", True),
                                           "min_general_loss_rise": ("general_loss_rise_nats", False),
                                           "max_long_loss_reduction": ("long_loss_reduction_nats", True)}
_CONTEXT_FIX = 'score the base and every candidate with [cpt] kind = "context_extension"'


def cloze_column(metric: str, scoring: str) -> str:
    """The decision table's column of a cloze metric under ``scoring``: the metric itself for the sum (as before
    scorings could be chosen), ``<metric>_<scoring>`` otherwise."""
    return metric if scoring == "sum" else f"{metric}_{scoring}"


class GateCriterion(Section):
    """One predeclared condition ``metric op threshold`` judged at ``confidence``.

    ``threshold`` is in the metric's unit (nats per token, or an accuracy fraction: -0.01 = one point).
    ``min_items``: for cloze, harness and retrieval metrics, fewer items than this makes the criterion undetermined.
    ``task``, ``task_metric``: for harness metrics only, the lm-evaluation-harness task and its per-item 0/1 metric.
    ``length``: for retrieval metrics only, the passkey prompt length in tokens whose items are judged; 0 = the
    longest length evaluated (``resolved``).
    ``scoring``: for cloze metrics only, how an item's options are compared (``evals.cloze.SCORINGS``): ``sum``
    (summed log-probability, the default), ``per_token`` or ``per_byte`` (divided by the option's scored tokens or
    UTF-8 bytes; Brown et al. 2020 §2.4, Gao et al. 2021). Left out of dumps and the gate hash at ``sum``.
    """

    name: str
    metric: Metric
    op: Literal[">=", "<="]
    threshold: float
    confidence: float = 0.95
    min_items: int = 0
    task: str = ""
    task_metric: str = "acc"
    length: int = 0
    scoring: Scoring = "sum"

    @field_validator("scoring", mode="before")
    @classmethod
    def _known_scoring(cls, v):
        return check_scoring(v) if isinstance(v, str) else v

    @field_validator("confidence")
    @classmethod
    def _confidence_in_unit_interval(cls, v: float) -> float:
        if not 0.0 < v < 1.0:
            raise ValueError(f"confidence must lie in (0, 1), got {v}; use e.g. 0.95")
        return v

    @field_validator("min_items")
    @classmethod
    def _min_items_non_negative(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"min_items must be >= 0, got {v}")
        return v

    @field_validator("threshold")
    @classmethod
    def _threshold_finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"threshold must be finite, got {v}")
        return v

    @model_validator(mode="after")
    def _task_with_harness_metrics(self) -> "GateCriterion":
        if self.metric in HARNESS_METRICS and not (self.task.strip() and self.task_metric.strip()):
            raise ValueError(f"metric {self.metric} needs task (an lm-evaluation-harness task name) and task_metric")
        if self.metric not in HARNESS_METRICS and (self.task or self.task_metric != "acc"):
            raise ValueError(f"task and task_metric apply to harness metrics only, not to {self.metric}")
        if self.length < 0:
            raise ValueError(f"length must be >= 0 tokens (0 = the longest evaluated), got {self.length}")
        if self.length and self.metric not in RETRIEVAL_METRICS:
            raise ValueError(f"length applies to retrieval metrics only, not to {self.metric}")
        if self.scoring != "sum" and self.metric not in CLOZE_METRICS:
            raise ValueError(f"scoring = {self.scoring!r} applies to cloze metrics only ({sorted(CLOZE_METRICS)}), "
                             f"not to {self.metric}; remove it")
        return self

    @model_serializer(mode="wrap")
    def _fields_only_where_they_act(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)
        if self.metric not in RETRIEVAL_METRICS:  # dumps and stage keys of other criteria stay as they were
            data.pop("length", None)
        if self.scoring == "sum":  # the scoring gates had before it could be chosen: dumps and keys unchanged
            data.pop("scoring", None)
        return data

    @property
    def column(self) -> str:
        """The decision table's column of this criterion's metric: the metric; for a harness metric
        ``<metric>.<task>.<task_metric>``; for a retrieval metric ``<metric>@<length>`` (``<metric>@longest`` while
        ``length`` is 0: the table names the real length, see ``resolved``); for a cloze metric under a normalised
        scoring ``<metric>_<scoring>`` (``cloze_accuracy_per_token``)."""
        if self.metric in CLOZE_METRICS:
            return cloze_column(self.metric, self.scoring)
        if self.metric in HARNESS_METRICS:
            return f"{self.metric}.{self.harness_key}"
        if self.metric in RETRIEVAL_METRICS:
            return f"{self.metric}@{self.length or 'longest'}"
        return self.metric

    def resolved(self, lengths) -> "GateCriterion":
        """This criterion with ``length`` 0 replaced by the longest of ``lengths`` (prompt lengths in tokens that
        were evaluated); itself for other metrics.

        Raises:
            DataError: a retrieval criterion and no lengths, or a ``length`` that was not evaluated.
        """
        if self.metric not in RETRIEVAL_METRICS:
            return self
        found = sorted(int(n) for n in lengths)
        if not found:
            raise DataError(f"criterion {self.name}: no retrieval items were scored; {_CONTEXT_FIX}")
        if not self.length:
            return self.model_copy(update={"length": found[-1]})
        if self.length not in found:
            raise DataError(f"criterion {self.name}: no retrieval prompts of length {self.length}; evaluated "
                            f"lengths: {found} (set length to one of them, or 0 for the longest)")
        return self

    @property
    def key(self) -> str | int:
        """What selects this criterion's paired units besides the metric: the harness key of a harness metric, the
        prompt length of a retrieval metric, the scoring of a cloze metric; "" otherwise."""
        if self.metric in HARNESS_METRICS:
            return self.harness_key
        if self.metric in RETRIEVAL_METRICS:
            return self.length
        if self.metric in CLOZE_METRICS:
            return self.scoring
        return ""

    @property
    def harness_key(self) -> str:
        """``<task>.<task_metric>``: the key of ``CandidateEval.harness_correct`` this criterion reads."""
        return f"{self.task}.{self.task_metric}"


class GateConfig(Section):
    """The whole gate: every criterion must pass (``rule="all"``); ``select`` picks among passing candidates: the
    largest domain loss reduction, the smallest general loss rise, or the largest long-window loss reduction
    (``SELECTIONS``)."""

    criteria: list[GateCriterion]
    rule: Literal["all"] = "all"
    select: Literal["max_domain_loss_reduction", "min_general_loss_rise",
                    "max_long_loss_reduction"] = "max_domain_loss_reduction"
    cloze_items: str | list[str] = "configs/cloze/demo.jsonl"

    @field_validator("cloze_items")
    @classmethod
    def _some_cloze_file(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("give at least one cloze item file (a path or a list of paths)")
        return v

    @property
    def cloze_paths(self) -> list[str]:
        """The cloze item files (one path or several)."""
        return [self.cloze_items] if isinstance(self.cloze_items, str) else list(self.cloze_items)

    @field_validator("criteria")
    @classmethod
    def _criteria_non_empty_unique(cls, v: list[GateCriterion]) -> list[GateCriterion]:
        if not v:
            raise ValueError("declare at least one criterion")
        names = [c.name for c in v]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"criterion names must be unique, repeated: {dupes}")
        return v


def gate_hash(cfg: GateConfig) -> str:
    """Hex sha256 of the gate's canonical JSON: sorted keys, criteria sorted by (unique) name.

    Independent of key order and criterion order (rule "all" does not depend on either); any change to a
    threshold, op, metric, confidence, min_items, rule, select or item file changes it, as does a change to the task,
    task_metric or length of a criterion that uses them, or a cloze criterion's scoring (absent at ``sum``, so gates
    declared before scorings could be chosen keep their hash).
    """
    data = cfg.model_dump(mode="json")
    # The harness and retrieval fields enter only criteria that use them, so gates declared before they existed
    # keep their hash.
    criteria = [{k: v for k, v in c.items()
                 if (c["metric"] in HARNESS_METRICS or k not in ("task", "task_metric"))
                 and (c["metric"] in RETRIEVAL_METRICS or k != "length")}
                for c in data["criteria"]]
    data["criteria"] = sorted(criteria, key=lambda c: c["name"])
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
