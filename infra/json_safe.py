"""JSON without bare NaN or Infinity: the standard rejects both, and DuckDB, jq and browsers refuse such files.

    finite_json({"low": float("nan")})   # {"low": None}
    dumps(record, indent=2)              # json.dumps(finite_json(record), allow_nan=False, ...)

A missing number is written as ``null``; the record that holds it says why in its own words (a ``reason`` field).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np


def finite_json(value: Any) -> Any:
    """``value`` with every non-finite float (Python or NumPy, at any depth of dicts, lists and tuples) replaced by
    None, and NumPy scalars by Python ones."""
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`finite_json` (``value``) with ``allow_nan=False``; other keywords pass through.

    Raises:
        ValueError: a non-finite number survived (only possible through a ``default`` hook that returns one).
    """
    return json.dumps(finite_json(value), allow_nan=False, **kwargs)
