"""What one stage's artifact hands to the stages after it: the file names, and readers of the files another
stage reads. Stage packages import each other never; they meet here and in the training library."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

KEPT_DIR = "kept"                # corpus: the kept documents, ordered parts kept/part-NNNNN.parquet
REMOVALS_DIR = "removals"        # corpus: the removal ledger, ordered parts removals/part-NNNNN.parquet
READ_REJECTS = "rejects.parquet"  # corpus: in removals/, the documents the sources stage could not read (first)
MANIFEST = "manifest.json"       # corpus: per-source counts, rules applied, the manifest hash
CHOICE = "choice.json"           # mixture: the chosen mixture and why
BEST = "best.json"               # sweep: the best peak LR (per width) and the evidence
CANDIDATES = "candidates.json"   # cpt: every candidate's settings and checkpoint


def kept_files(path: Path) -> list[Path]:
    """The parts of the corpus artifact at ``path`` holding its kept documents, in corpus order (one per input shard
    of the build; their concatenation is the kept corpus).

    Raises:
        DataError: the artifact has no ``kept/`` parts (not a corpus artifact, or one written before parts).
    """
    return _parts(Path(path) / KEPT_DIR, "kept documents")


def removal_files(path: Path) -> list[Path]:
    """The parts of the removal ledger of the corpus artifact at ``path``: the read rejects first (when any), then
    the build's removals in corpus order; exactly one row per removed document in all.

    Raises:
        DataError: the artifact has no ``removals/`` parts.
    """
    folder = Path(path) / REMOVALS_DIR
    parts = _parts(folder, "removal ledger")
    rejects = folder / READ_REJECTS
    return ([rejects] if rejects.is_file() else []) + parts


def _parts(folder: Path, what: str) -> list[Path]:
    from infra.errors import DataError

    parts = sorted(folder.glob("part-*.parquet"))
    if not parts:
        raise DataError(f"{folder}: no parts of the {what} (part-NNNNN.parquet); is this a corpus artifact? "
                        "Rebuild it with `pretrain run CONFIG --refresh corpus`")
    return parts


def _concat(files: Sequence[Path], columns: Sequence[str] | None) -> pd.DataFrame:
    frames = [pd.read_parquet(f, columns=list(columns) if columns is not None else None) for f in files]
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def load_kept(path: Path, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """The kept documents of the corpus artifact at ``path`` as one frame (``columns``: only these). A corpus
    larger than memory is read part by part with ``iter_kept`` instead."""
    return _concat(kept_files(path), columns)


def iter_kept(path: Path, columns: Sequence[str] | None = None, batch_rows: int = 65_536) -> Iterator[pd.DataFrame]:
    """The kept documents of the corpus artifact at ``path`` in corpus order, at most ``batch_rows`` rows at a time:
    memory bounded by the batch, not the corpus."""
    for part in kept_files(path):
        for batch in pq.ParquetFile(part).iter_batches(batch_size=batch_rows,
                                                       columns=list(columns) if columns is not None else None):
            yield batch.to_pandas()


def load_removals(path: Path, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """The removal ledger of the corpus artifact at ``path`` as one frame (see ``removal_files``)."""
    files = removal_files(path)
    if columns is None:  # read rejects may lack optional columns: the build's schema decides
        columns = pq.ParquetFile(files[-1]).schema_arrow.names
    return _concat(files, columns)


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
