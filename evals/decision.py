"""One record shape for every decision the platform makes before or after a run: the mixture, the peak LR, the
gate, the scaling forecast and the quality ablation (docs/methods.md §14).

A decision is declared (its rule fixed, hashed and timestamped) before the evidence behind it is computed, names
the DuckDB rows that are its evidence, carries the interval of the quantity that decides it, and says
``undetermined`` when that interval does not settle the rule, together with what the platform does then
(``fallback``) and what evidence would settle it (``resolve``).

    record = DecisionRecord.declare("mixture", rule="margin interval above 0", rule_config={...})
    ...  # train, score
    record = record.settle(choice="temp0.3", verdict="decided", estimate=0.055, low=0.031, high=0.078,
                           unit="bits/byte", evidence={"table": "mixture_trials", "artifact_key": key})
    (out / "decision.json").write_text(record.to_json())
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import pandas as pd

from infra.errors import DataError
from infra.json_safe import dumps

Kind = Literal["mixture", "peak_lr", "gate", "forecast", "lr_width_exponent", "quality_ablation"]
Verdict = Literal["decided", "undetermined"]
VERDICTS: tuple[str, ...] = ("decided", "undetermined")
DECISION_COLUMNS = ("kind", "declared_at", "decided_at", "rule", "rule_hash", "choice", "verdict", "estimate", "low",
                    "high", "unit", "confidence", "fallback", "resolve", "evidence", "n_units", "units",
                    "min_units", "used", "check", "declared_after_evidence")


def rule_hash(rule_config: Any) -> str:
    """Hex sha256 of ``rule_config``'s canonical JSON (sorted keys, no whitespace): the identity of a declared rule."""
    canonical = json.dumps(rule_config, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def utc_now() -> str:
    """The current UTC time, ISO 8601 with seconds (``2026-12-02T00:41:07+00:00``)."""
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


@dataclass(frozen=True)
class DecisionRecord:
    """A declared rule and, once settled, its outcome.

    Attributes:
        kind: what is decided (``mixture``, ``peak_lr``, ``lr_width_exponent``, ``gate``, ``forecast``,
            ``quality_ablation``).
        declared_at / decided_at: ISO-8601 UTC times the rule was fixed and the verdict reached.
        rule: the rule in words; ``rule_hash`` the sha256 of its configuration (:func:`rule_hash`).
        choice: what the platform goes on with (a mixture name, an LR as text, the kept candidate), under the
            fallback when undetermined.
        verdict: ``decided`` when the interval settles the rule, else ``undetermined``.
        estimate, low, high, unit, confidence: the deciding quantity, its interval and their unit (NaN: none).
        fallback: what the platform does when undetermined ("" when decided).
        resolve: what evidence would settle an undetermined decision ("" when decided).
        evidence: where the evidence lives: DuckDB table(s) and the keys selecting the rows.
        n_units, units, min_units: how many independent units the interval rests on (``n_units`` of ``units``, e.g.
            12 "documents", 3 "seeds", 8 "rungs") and the least it needs to decide (``evals.stats.MIN_UNITS``,
            from the coverage study in docs/methods.md §16); 0 / "" when not counted.
        used: the value actually used downstream when it differs from ``choice`` (the peak LR the main run trained
            at, say), else "".
        check: the verdict of a later check of the decision ("covered" / "missed" for a forecast), else "".
        declared_after_evidence: the rule was declared after evidence it judges already existed, so it is no
            predeclaration (docs/methods.md §11).
    """

    kind: str
    declared_at: str
    rule: str
    rule_hash: str
    decided_at: str = ""
    choice: str = ""
    verdict: str = ""
    estimate: float = math.nan
    low: float = math.nan
    high: float = math.nan
    unit: str = ""
    confidence: float = 0.95
    fallback: str = ""
    resolve: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    n_units: int = 0
    units: str = ""
    min_units: int = 0
    used: str = ""
    check: str = ""
    declared_after_evidence: bool = False

    @classmethod
    def declare(cls, kind: str, *, rule: str, rule_config: Any, declared_at: str | None = None) -> "DecisionRecord":
        """A record of ``kind`` whose rule is fixed now (or at ``declared_at``), before any evidence exists."""
        return cls(kind=kind, declared_at=declared_at or utc_now(), rule=rule, rule_hash=rule_hash(rule_config))

    def settle(self, *, choice: str, verdict: str, estimate: float = math.nan, low: float = math.nan,
               high: float = math.nan, unit: str = "", confidence: float = 0.95, fallback: str = "",
               resolve: str = "", evidence: dict[str, Any] | None = None, n_units: int = 0, units: str = "",
               min_units: int = 0) -> "DecisionRecord":
        """The record with its outcome.

        Raises:
            DataError: ``verdict`` not in ``VERDICTS``; an undetermined verdict without ``fallback`` and ``resolve``;
                an interval whose bounds are not ordered around the estimate; a ``decided`` verdict on fewer units
                than ``min_units``.
        """
        if verdict not in VERDICTS:
            raise DataError(f"decision verdict {verdict!r}: must be one of {VERDICTS}")
        if verdict == "undetermined" and not (fallback and resolve):
            raise DataError(f"an undetermined {self.kind} decision must say what it falls back to and what would "
                            "resolve it")
        if all(map(math.isfinite, (estimate, low, high))) and not low <= estimate <= high:
            raise DataError(f"{self.kind} interval [{low}, {high}] does not contain its estimate {estimate}")
        if verdict == "decided" and n_units < min_units:
            raise DataError(f"a {self.kind} decision on {n_units} {units} cannot be decided: it needs >= {min_units}")
        return replace(self, decided_at=utc_now(), choice=str(choice), verdict=verdict, estimate=float(estimate),
                       low=float(low), high=float(high), unit=unit, confidence=float(confidence),
                       fallback=fallback if verdict == "undetermined" else "",
                       resolve=resolve if verdict == "undetermined" else "", evidence=dict(evidence or {}),
                       n_units=int(n_units), units=units, min_units=int(min_units))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        """The record as JSON; a missing number (no interval) is ``null``, never a bare NaN."""
        return dumps(self.as_dict(), indent=2, default=str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DecisionRecord":
        """The record of ``as_dict``/``to_json`` output; ``null`` numbers read back as NaN."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for name in ("estimate", "low", "high", "confidence"):
            if fields.get(name, 0.0) is None:
                fields[name] = math.nan
        return cls(**fields)

    def row(self) -> dict[str, Any]:
        """One row of the DuckDB ``decisions`` table (``DECISION_COLUMNS``; ``evidence`` as JSON text)."""
        data = self.as_dict()
        data["evidence"] = json.dumps(data["evidence"], sort_keys=True, default=str)
        return {c: data[c] for c in DECISION_COLUMNS}

    def line(self, *, tail: bool = True) -> str:
        """One line for a console summary: kind, choice, verdict, the interval and (undetermined, with ``tail``)
        the fallback and what would resolve it."""
        interval = ""
        if all(map(math.isfinite, (self.estimate, self.low, self.high))):
            sign = "" if self.kind in ("forecast", "peak_lr") else "+"  # signs only where the quantity is a difference
            interval = (f" {self.estimate:{sign}.4g} [{self.low:{sign}.4g}, {self.high:{sign}.4g}] "
                        f"{self.unit}").rstrip()
        on = f" on {self.n_units:,} {self.units}" if self.units else ""
        used = f"; used downstream: {self.used}" if self.used else ""
        check = f"; checked: {self.check}" if self.check else ""
        late = " (declared after evidence)" if self.declared_after_evidence else ""
        rest = f"; {self.fallback}; to resolve: {self.resolve}" if tail and self.verdict == "undetermined" else ""
        return f"{self.kind}: {self.choice} — {self.verdict}{late}{interval}{on}{used}{check}{rest}"


def decisions_frame(records: list[DecisionRecord]) -> pd.DataFrame:
    """The DuckDB ``decisions`` rows of ``records`` (columns ``DECISION_COLUMNS``)."""
    return pd.DataFrame([r.row() for r in records], columns=list(DECISION_COLUMNS))
