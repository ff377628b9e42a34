"""LSH banding design: the (bands b, rows r) layouts that meet detection and admission constraints with the fewest
hashes (docs/methods.md §7, "Near dedup: MinHash + LSH").

A pair of Jaccard similarity s becomes a candidate under b bands of r rows with probability
P(s) = 1 − (1 − s^r)^b (Broder 1997, "On the resemblance and containment of documents"; Leskovec, Rajaraman &
Ullman, "Mining of Massive Datasets", ch. 3, §3.4). Given

    detect: every pair at Jaccard ≥ s1 becomes a candidate with probability ≥ p1,
    admit:  every pair at Jaccard ≤ s2 becomes a candidate with probability ≤ p2,

the search lists every layout with b·r ≤ ``max_hashes`` that meets both, fewest hashes first.

    from tasks.corpus.lsh_design import LshConstraints, design_layouts
    design_layouts(LshConstraints(s1=0.8, p1=0.95, s2=0.5, p2=0.05))[0]   # 21 bands × 9 rows, 189 hashes

    pretrain lsh-design --s1 0.8 --p1 0.95 --s2 0.5 --p2 0.05 [--max-hashes 1024] [--top 10]
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import Field, model_validator

from infra.errors import ConfigError
from infra.section import Section
from tasks.corpus.config import lsh_candidate_probability, lsh_threshold

DEFAULT_MAX_HASHES = 1024
_LAYOUT_RE = re.compile(r"^\s*(\d+)\s*[x×]\s*(\d+)\s*$")
LAYOUT_COLUMNS = ["bands", "rows", "hashes", "p_at_s1", "p_at_s2", "threshold", "margin", "meets"]


class LshConstraints(Section):
    """Detection and admission constraints on the LSH S-curve.

    Fields: ``s1``, ``p1``: pairs at Jaccard ≥ s1 become candidates with probability ≥ p1; ``s2``, ``p2``: pairs at
    Jaccard ≤ s2 become candidates with probability ≤ p2; ``max_hashes``: the budget on b·r (the MinHash
    ``num_perm`` a layout needs). Requires 0 ≤ s2 < s1 ≤ 1 and 0 ≤ p2 < p1 ≤ 1 (P is increasing in s, so a
    layout can only pass when the detected similarity and probability lie above the admitted ones).

    Raises:
        ConfigError: a bound is outside [0, 1], or s2 ≥ s1, or p2 ≥ p1, or max_hashes < 1.
    """

    s1: float
    p1: float
    s2: float
    p2: float
    max_hashes: int = Field(default=DEFAULT_MAX_HASHES)

    @model_validator(mode="after")
    def _check(self) -> "LshConstraints":
        for name in ("s1", "p1", "s2", "p2"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"lsh design {name}={getattr(self, name)} must lie in [0, 1]")
        if self.s2 >= self.s1:
            raise ConfigError(f"lsh design s2={self.s2} must be below s1={self.s1}: pairs at Jaccard <= s2 are the "
                              "ones to keep out, pairs at Jaccard >= s1 the ones to detect")
        if self.p2 >= self.p1:
            raise ConfigError(f"lsh design p2={self.p2} must be below p1={self.p1}: P(s) is increasing in s, so "
                              "P(s1) >= p1 and P(s2) <= p2 need p2 < p1")
        if self.max_hashes < 1:
            raise ConfigError(f"lsh design max_hashes={self.max_hashes} must be >= 1 (the budget on bands x rows)")
        return self

    @classmethod
    def parse(cls, text: str, max_hashes: int | None = None) -> "LshConstraints":
        """Constraints from ``"s1=0.8,p1=0.95,s2=0.5,p2=0.05"`` (optionally ``max_hashes=512``).

        Raises:
            ConfigError: a part is not ``name=number``, a name is unknown or missing, or a value is out of range.
        """
        values: dict[str, Any] = {}
        for part in (p for p in text.split(",") if p.strip()):
            name, eq, value = part.partition("=")
            name = name.strip()
            if not eq or name not in cls.model_fields:
                raise ConfigError(f"lsh design {text!r}: {part.strip()!r} is not one of s1=, p1=, s2=, p2=, "
                                  "max_hashes=; write e.g. 's1=0.8,p1=0.95,s2=0.5,p2=0.05'")
            try:
                values[name] = int(value) if name == "max_hashes" else float(value)
            except ValueError:
                raise ConfigError(f"lsh design {text!r}: {name}={value.strip()!r} is not a number") from None
        missing = [n for n in ("s1", "p1", "s2", "p2") if n not in values]
        if missing:
            raise ConfigError(f"lsh design {text!r}: missing {missing}; write e.g. 's1=0.8,p1=0.95,s2=0.5,p2=0.05'")
        if max_hashes is not None:
            values["max_hashes"] = max_hashes
        return cls(**values)


@dataclass(frozen=True)
class LshLayout:
    """One banding and its figures under a set of constraints.

    ``hashes`` = bands·rows; ``p_at_s1``, ``p_at_s2``: P(s1), P(s2); ``threshold``: (1/bands)^(1/rows), where the
    S-curve rises steepest; ``margin``: min(P(s1) − p1, p2 − P(s2)), the slack of the tighter constraint
    (negative when one fails); ``meets``: margin ≥ 0.
    """

    bands: int
    rows: int
    hashes: int
    p_at_s1: float
    p_at_s2: float
    threshold: float
    margin: float
    meets: bool

    @property
    def name(self) -> str:
        """``"<bands>x<rows>"``, the form :func:`parse_layout` reads."""
        return f"{self.bands}x{self.rows}"

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


class NoLayoutError(ConfigError):
    """No layout within the hash budget meets the constraints; the message gives the best achievable one."""


def evaluate_layout(bands: int, rows: int, constraints: LshConstraints) -> LshLayout:
    """``bands`` × ``rows`` under ``constraints``: P(s1), P(s2), threshold and margin (see :class:`LshLayout`)."""
    p1 = lsh_candidate_probability(constraints.s1, bands, rows)
    p2 = lsh_candidate_probability(constraints.s2, bands, rows)
    margin = min(p1 - constraints.p1, constraints.p2 - p2)
    return LshLayout(bands, rows, bands * rows, p1, p2, lsh_threshold(bands, rows), margin, margin >= 0.0)


def all_layouts(constraints: LshConstraints, max_hashes: int | None = None) -> list[LshLayout]:
    """Every (bands, rows) with bands·rows ≤ ``max_hashes`` (default ``constraints.max_hashes``), evaluated."""
    budget = constraints.max_hashes if max_hashes is None else max_hashes
    return [evaluate_layout(b, r, constraints) for r in range(1, budget + 1) for b in range(1, budget // r + 1)]


def _order(layout: LshLayout) -> tuple[int, float, int]:
    return layout.hashes, -layout.margin, layout.bands


def design_layouts(constraints: LshConstraints, limit: int | None = None) -> list[LshLayout]:
    """The layouts within ``constraints.max_hashes`` that meet ``constraints``, sorted by hashes (fewest first),
    then by margin (largest first), then by bands; the first ``limit`` of them (all when None).

    The constraints are checked at the endpoints only, P(s1) ≥ p1 and P(s2) ≤ p2, and that is sufficient: for
    s in [0, 1], P(s) = 1 − (1 − s^r)^b is increasing in s (s^r increases, so 1 − s^r decreases, and so does its
    b-th power), so P(s) ≥ P(s1) ≥ p1 for every s ≥ s1 and P(s) ≤ P(s2) ≤ p2 for every s ≤ s2. The search is
    exhaustive over r = 1..max_hashes and b = 1..⌊max_hashes/r⌋ (about max_hashes·ln(max_hashes) layouts).

    Raises:
        NoLayoutError: no layout within the budget meets the constraints; the message names the best achievable
            layout (largest margin) with its P(s1) and P(s2), and the fewest hashes that would meet them when a
            budget up to 16 times larger has one.
    """
    layouts = all_layouts(constraints)
    meeting = sorted((lay for lay in layouts if lay.meets), key=_order)
    if not meeting:
        raise NoLayoutError(_no_layout_message(constraints, layouts))
    return meeting if limit is None else meeting[:limit]


def _no_layout_message(constraints: LshConstraints, layouts: list[LshLayout]) -> str:
    c = constraints
    best = max(layouts, key=lambda lay: (lay.margin, -lay.hashes))
    larger = [lay for lay in all_layouts(c, min(16 * c.max_hashes, 65_536)) if lay.meets]
    needed = (f"; the fewest hashes that meet them: {min(larger, key=_order).name} = "
              f"{min(larger, key=_order).hashes} (raise max_hashes)" if larger else
              f"; none within {min(16 * c.max_hashes, 65_536)} hashes either: widen the gap between s2 and s1 or "
              "relax p1/p2")
    return (f"no LSH layout with bands x rows <= {c.max_hashes} gives P({c.s1:g}) >= {c.p1:g} and "
            f"P({c.s2:g}) <= {c.p2:g}; best achievable: {best.name} ({best.hashes} hashes) with "
            f"P({c.s1:g}) = {best.p_at_s1:.4f}, P({c.s2:g}) = {best.p_at_s2:.4f}{needed}")


def parse_layout(text: str) -> tuple[int, int]:
    """(bands, rows) of ``"20x10"`` (bands × rows; ``×`` is accepted too).

    Raises:
        ConfigError: not ``<bands>x<rows>`` with both at least 1.
    """
    match = _LAYOUT_RE.match(text)
    if not match or min(int(match[1]), int(match[2])) < 1:
        raise ConfigError(f"LSH layout {text!r} is not <bands>x<rows> with both >= 1; write e.g. '14x8' "
                          "(14 bands of 8 rows)")
    return int(match[1]), int(match[2])
