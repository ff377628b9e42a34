"""What one stage's artifact hands to the stages after it: the file names, and readers of the files another
stage reads. Stage packages import each other never; they meet here and in the training library."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

KEPT = "kept.parquet"            # corpus: the kept documents
MANIFEST = "manifest.json"       # corpus: per-source counts, rules applied, the manifest hash
CHOICE = "choice.json"           # mixture: the chosen mixture and why
BEST = "best.json"               # sweep: the best peak LR (per width) and the evidence
CANDIDATES = "candidates.json"   # cpt: every candidate's settings and checkpoint


def load_kept(path: Path) -> pd.DataFrame:
    """The kept documents of the corpus artifact at ``path``."""
    return pd.read_parquet(Path(path) / KEPT)


def manifest_hash(path: Path) -> str:
    """The manifest hash of the corpus artifact at ``path`` (travels into tokenizer shards, checkpoints and
    evaluations)."""
    return json.loads((Path(path) / MANIFEST).read_text())["manifest_hash"]


def recorded_manifest_hash(tokenizer: Any = None, checkpoints: Sequence[Path] = ()) -> str | None:
    """The corpus manifest hash a result was computed from: the one the tokenizer artifact ``tokenizer`` packed
    its shards from (``tokenizer.meta.json``), else the first one recorded by a checkpoint directory of
    ``checkpoints`` (``state.json`` ``extra``), else None (artifacts written before the hash travelled)."""
    meta = Path(tokenizer.path) / "tokenizer.meta.json" if tokenizer is not None else None
    if meta is not None and meta.exists() and (found := json.loads(meta.read_text()).get("manifest_hash")):
        return found
    for directory in checkpoints:
        state = Path(directory) / "state.json"
        if state.exists() and (found := json.loads(state.read_text()).get("extra", {}).get("manifest_hash")):
            return found
    return None


def load_choice(path: Path) -> dict[str, Any]:
    """The mixture decision of the mixture artifact at ``path``: ``name``, ``weights`` (source → weight), ..."""
    return json.loads((Path(path) / CHOICE).read_text())


def load_best(path: Path) -> dict[str, Any]:
    """The sweep result of the sweep artifact at ``path``: ``best_lr``, ``best_value`` (nats/token), ..."""
    return json.loads((Path(path) / BEST).read_text())


def load_candidates(path: Path) -> dict[str, dict]:
    """The CPT candidates of the CPT artifact at ``path``, by name."""
    return json.loads((Path(path) / CANDIDATES).read_text())


def nearest_width_lr(best: dict[str, Any], width: int) -> dict[str, Any]:
    """The sweep's entry (``best.json`` ``widths[]``: d_model, best_lr, study_name) at the swept width nearest
    ``width`` by ratio; a record without per-width entries is one entry of unknown width."""
    import math

    widths = best.get("widths") or [{"d_model": None, "best_lr": best["best_lr"], "study_name": best["study_name"]}]
    return min(widths, key=lambda w: abs(math.log(width / w["d_model"])) if w["d_model"] else 0.0)
