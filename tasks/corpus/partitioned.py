"""The corpus build's global passes over document keys, as hash-partitioned tasks (docs/methods.md §7).

Exact-duplicate groups and LSH candidate pairs are found by ``execution.partitions`` tasks on the build's engine,
none of which reads the whole corpus:

1. :func:`split_keys` (in the key pass, per shard): the shard's exact-dedup hashes written into one file per
   partition of the hash (``exact-PPPPP.parquet``), and its MinHash band keys into one file per partition of the
   band key (``bands-PPPPP.parquet``), under ``key_parts_p{P}/<shard>``.
2. :func:`exact_partition` (per partition): the partition's file of every shard; each exact-duplicate group keeps
   its first document in corpus order. Writes the duplicates ``(pos, first_pos)`` and the documents the quality
   classifier does not keep among the others (``quality_low``): O(removed documents).
3. :func:`candidate_partition` (per partition): the partition's band-key file of every shard, less the documents
   step 2 removed; each bucket (band, candidate group, key) lies wholly in one partition, so
   :func:`tasks.corpus.near_dedup.bucket_pairs` on it gives exactly the pairs of those buckets. Writes the pairs
   by the shard of their later document and the documents to shingle by shard: O(pairs).

A pair agreeing on bands of different partitions is found by each of them; the verify pass, which reads one
shard's pairs from every partition, keeps it once (:func:`shard_pairs`). The result therefore does not depend on
the partition count. A folder per partition count (``_p{P}``) keeps a resumed build with another count from
mixing the two.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from infra.atomic import atomic_dir
from infra.errors import DataError
from tasks.corpus import near_dedup

__all__ = ["candidate_partition", "exact_partition", "key_parts_folder", "read_shard_file", "shard_pairs", "shard_wanted",
           "split_keys"]

_EXACT_COLUMNS = ["row", "h_hi", "h_lo", "quality_keep"]


def key_parts_folder(work: Path | str, n_parts: int, kind: str = "key_parts") -> Path:
    """``work/<kind>_p<n_parts>``: the partition count names the folder."""
    return Path(work) / f"{kind}_p{n_parts}"


def split_keys(keys: pd.DataFrame, n_parts: int, bands: int, out: Path) -> bool:
    """Write one shard's keys (``tasks.corpus.build._keys`` columns) by partition into ``out``: ``exact-P.parquet``
    (row, h_hi, h_lo, quality_keep) of the documents with ``h_lo % n_parts == P``; ``bands-P.parquet`` (band,
    key, row, source, by_chars) of each band key ``key % n_parts == P`` of the documents with shingles. False when
    ``out`` already exists."""
    if out.exists():
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    parts = np.uint64(n_parts)
    exact_part = keys.h_lo.to_numpy(dtype=np.uint64) % parts
    has = keys.has_shingles.to_numpy(dtype=bool)
    band_keys = np.stack([keys[f"band_{b}"].to_numpy(dtype=np.uint64)[has] for b in range(bands)], axis=1) \
        if bands else np.zeros((int(has.sum()), 0), np.uint64)
    flat = pd.DataFrame({
        "band": np.repeat(np.arange(bands, dtype=np.int16)[None, :], len(band_keys), axis=0).reshape(-1),
        "key": band_keys.reshape(-1),
        "row": np.repeat(keys.row.to_numpy(dtype=np.int32)[has], bands),
        "source": np.repeat(keys.source.to_numpy(dtype=object)[has], bands),
        "by_chars": np.repeat(keys.by_chars.to_numpy(dtype=bool)[has], bands)})
    band_part = flat.key.to_numpy(dtype=np.uint64) % parts
    with atomic_dir(out, clear_stale=True) as tmp:
        for p in range(n_parts):
            keys.loc[exact_part == np.uint64(p), _EXACT_COLUMNS].to_parquet(tmp / f"exact-{p:05d}.parquet",
                                                                            index=False)
            flat[band_part == np.uint64(p)].to_parquet(tmp / f"bands-{p:05d}.parquet", index=False)
    return True


def _read_part(work: Path, names: Sequence[str], n_parts: int, kind: str, part: int,
               offsets: np.ndarray) -> pd.DataFrame:
    """Partition ``part``'s ``kind`` file of every shard, with each row's corpus position ``pos``."""
    folder = key_parts_folder(work, n_parts)
    frames = []
    for shard, name in enumerate(names):
        frame = read_shard_file(folder / name / f"{kind}-{part:05d}.parquet", part, name, folder / name,
                                "key parts")
        frames.append(frame.assign(pos=offsets[shard] + frame.row.to_numpy(dtype=np.int64)))
    if not frames:
        columns = _EXACT_COLUMNS if kind == "exact" else ["band", "key", "row", "source", "by_chars"]
        return pd.DataFrame({c: [] for c in columns + ["pos"]})
    return pd.concat(frames, ignore_index=True)


def read_shard_file(path: Path, part: int, shard: str, rebuilt: Path, by: str, **read: Any) -> pd.DataFrame:
    """``pd.read_parquet(path, **read)`` for partition ``part``, naming shard ``shard`` when the file is missing or
    unreadable: ``rebuilt`` is the shard's folder that the ``by`` pass writes again when it is removed.

    Raises:
        DataError: the file cannot be read (names the partition, the shard, the file and the fix).
    """
    try:
        return pd.read_parquet(path, **read)
    except Exception as err:
        raise DataError(f"partition {part} cannot read shard {shard}'s file {path} ({type(err).__name__}: "
                        f"{' '.join(str(err).split())[:300]}): remove {rebuilt} and run the same command again; "
                        f"the {by} pass writes it again") from err


def _open_partition(work: str, names: str, n_parts: int, kind: str, part: int,
                    out_dir: str) -> tuple[Path, pd.DataFrame, np.ndarray] | None:
    """A partition task's output folder, the rows of its partition and the shards' first positions, or None when
    an earlier attempt of the task finished it (its folder is published whole, so it exists only complete: a rerun
    resumes past it)."""
    out = Path(out_dir)
    if out.exists():
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    offsets = np.load(Path(work) / "offsets.npy")
    return out, _read_part(Path(work), names.split(",") if names else [], n_parts, kind, part, offsets), offsets


def exact_partition(work: str, names: str, part: int, n_parts: int, exact_dedup: bool, out_dir: str) -> bool:
    """Exact duplicates among the documents of hash partition ``part``: ``exact.parquet`` (pos, first_pos), each
    document whose normal form's hash an earlier document in corpus order has, with that first document; and
    ``quality_low.parquet`` (pos): the other documents the quality classifier does not keep. Both sorted by pos."""
    opened = _open_partition(work, names, n_parts, "exact", part, out_dir)
    if opened is None:
        return False
    out, frame, offsets = opened
    pos = frame.pos.to_numpy(dtype=np.int64)
    first = pos.copy()
    if exact_dedup and len(frame):
        h_hi, h_lo = frame.h_hi.to_numpy(dtype=np.uint64), frame.h_lo.to_numpy(dtype=np.uint64)
        order = np.lexsort((pos, h_lo, h_hi))
        new = np.ones(len(order), dtype=bool)
        new[1:] = (h_hi[order][1:] != h_hi[order][:-1]) | (h_lo[order][1:] != h_lo[order][:-1])
        first[order] = pos[order][np.maximum.accumulate(np.where(new, np.arange(len(order)), 0))]
    dup = first != pos
    low = ~frame.quality_keep.to_numpy(dtype=bool) & ~dup
    by_pos = np.argsort(pos, kind="stable")
    with atomic_dir(out, clear_stale=True) as tmp:
        pd.DataFrame({"pos": pos[by_pos][dup[by_pos]], "first_pos": first[by_pos][dup[by_pos]]}).to_parquet(
            tmp / "exact.parquet", index=False)
        pd.DataFrame({"pos": pos[by_pos][low[by_pos]]}).to_parquet(tmp / "quality_low.parquet", index=False)
    return True


def _removed_before(exact_dir: Path, n_parts: int) -> np.ndarray:
    """Sorted positions every exact partition removed (duplicates and quality_low): O(removed documents)."""
    parts = [pd.read_parquet(exact_dir / f"{p:05d}" / name, columns=["pos"]).pos.to_numpy(dtype=np.int64)
             for p in range(n_parts) for name in ("exact.parquet", "quality_low.parquet")]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)


def candidate_partition(work: str, names: str, part: int, n_parts: int, exact_dir: str, scope: str,
                        max_links: int, out_dir: str) -> bool:
    """LSH candidate pairs of the buckets in band-key partition ``part``
    (:func:`tasks.corpus.near_dedup.bucket_pairs`) among the documents that survive exact dedup and the quality
    classifier, grouped by source and shingling mode (scope "source") or by shingling mode (scope "global").
    Writes ``pairs-SSSSS.npy`` ((m, 2) int64 (i, j), i < j) by the shard of ``j``, ``wanted-SSSSS.npy`` (rows to
    shingle) by shard, and ``count.json`` (pairs before the merge across partitions)."""
    opened = _open_partition(work, names, n_parts, "bands", part, out_dir)
    if opened is None:
        return False
    out, frame, offsets = opened
    pos = frame.pos.to_numpy(dtype=np.int64)
    keep = ~np.isin(pos, _removed_before(Path(exact_dir), n_parts))
    frame, pos = frame[keep], pos[keep]
    grp = frame.by_chars.to_numpy(dtype=np.int64)
    if scope == "source" and len(frame):
        grp = grp + 2 * np.unique(frame.source.to_numpy(dtype=object), return_inverse=True)[1].reshape(-1)
    pairs = near_dedup.bucket_pairs(frame.band.to_numpy(), grp, frame.key.to_numpy(dtype=np.uint64), pos,
                                    max_links)
    with atomic_dir(out, clear_stale=True) as tmp:
        shard_j = np.searchsorted(offsets, pairs[:, 1], side="right") - 1
        for shard in np.unique(shard_j).tolist():
            np.save(tmp / f"pairs-{shard:05d}.npy", pairs[shard_j == shard])
        docs = np.unique(pairs)
        shard_d = np.searchsorted(offsets, docs, side="right") - 1
        for shard in np.unique(shard_d).tolist():
            np.save(tmp / f"wanted-{shard:05d}.npy", docs[shard_d == shard] - offsets[shard])
        (tmp / "count.json").write_text(json.dumps({"pairs": int(len(pairs))}))
    return True


def _shard_files(folder: Path, n_parts: int, name: str) -> list[np.ndarray]:
    paths = [folder / f"{p:05d}" / name for p in range(n_parts)]
    return [np.load(path) for path in paths if path.exists()]


def shard_pairs(folder: Path | str, n_parts: int, shard: int) -> np.ndarray:
    """The distinct candidate pairs ((m, 2) int64, sorted by (i, j)) whose later document is in ``shard``, from
    every partition of ``folder``."""
    found = _shard_files(Path(folder), n_parts, f"pairs-{shard:05d}.npy")
    return near_dedup.unique_pairs(np.concatenate(found)) if found else np.zeros((0, 2), np.int64)


def shard_wanted(folder: Path | str, n_parts: int, shard: int) -> np.ndarray:
    """The rows of ``shard`` in any candidate pair (ascending, unique), from every partition of ``folder``."""
    found = _shard_files(Path(folder), n_parts, f"wanted-{shard:05d}.npy")
    return np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)
