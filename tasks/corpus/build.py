"""The corpus build, by shards: memory bounded by shard size, shards in parallel, a crash resumes (docs/methods.md §7).

Passes over a work directory (each shard's output is written under a temporary name and renamed when complete,
so a rerun skips finished shards and never reads a partial one):

1. ``split``: the raw documents are cut into input shards of ``execution.shard_docs`` documents, in corpus order.
2. ``filter`` (per shard, parallel): the per-document stages of :mod:`tasks.corpus.filters`, plus the document
   frequency of every line/paragraph (for boilerplate).
3. global: units in ``boilerplate.min_docs`` documents or more, summed over shards with DuckDB (out of core).
4. ``key`` (per shard, parallel): boilerplate cut, exact-dedup hash (xxh3-128 of the normal form), MinHash band
   keys (``bands`` × 8 bytes per document, not the whole signature), evaluation n-gram hits.
5. global: exact duplicates (first in corpus order kept), near duplicates (LSH on band keys per scope, exact Jaccard
   on shingle sets re-read only for candidate documents, leader clustering against kept documents), families
   (connected components of verified pairs, for document-aware held-out splits), decontamination.
6. ``write``: kept documents streamed shard by shard into one Parquet file.

Invariants: per source, documents in = kept + removed (one ledger row per removed document); the result does not
depend on the shard size or the number of workers.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from infra.atomic import atomic_dir
from infra.errors import DataError
from infra.memory import release_memory
from infra.shard_map import ShardMap, sequential_map
from tasks.corpus import minhash
from tasks.corpus.boilerplate import count_units, frequent_units, strip_units
from tasks.corpus.config import CorpusConfig
from evals.contamination import EvalIndex, EvalItem
from tasks.corpus.normalise import normal_form
from tasks.corpus.filters import (DOC_STEPS, FUNNEL_COLUMNS, INPUT_COLUMNS, REMOVAL_COLUMNS, Ledger,
                                  filter_documents, sanitise)
from tasks.corpus.quality import CHARACTER_LANGUAGES, Reason, cjk_count

__all__ = ["build_corpus", "curate", "CorpusResult", "CURATION_STEPS", "KEPT_COLUMNS"]

CURATION_STEPS = DOC_STEPS + ["boilerplate", "dedup_exact", "dedup_near", "decontam"]
KEPT_COLUMNS = ["doc_id", "source", "language", "lang_score", "text", "n_chars", "n_bytes", "n_words",
                "family_id", "pii_replacements", "lines_dropped", "fixes"]
HIT_COLUMNS = ["doc_id", "source", "ngram", "eval_set", "item_id", "common"]
_HIT_TYPES = {"doc_id": "string", "source": "string", "ngram": "string", "eval_set": "string", "item_id": "string",
              "common": "bool"}
ShardProgress = Callable[[str, int, int], None]


@dataclass
class CorpusResult:
    """Paths and summaries of a finished build (all files under ``out``).

    ``kept``: kept.parquet (``KEPT_COLUMNS``); ``removals``: removals.parquet (``REMOVAL_COLUMNS``, exactly one row per
    removed document); ``funnel``: funnel.parquet (docs and characters in/out per source and stage);
    ``boilerplate``: the frequent units cut; ``hits``: decontamination hits (``HIT_COLUMNS``); ``near``: near-dedup
    statistics per source.
    """

    out: Path
    near: dict[str, dict[str, Any]]
    boilerplate: pd.DataFrame

    @property
    def kept(self) -> pd.DataFrame:
        return pd.read_parquet(self.out / "kept.parquet")

    @property
    def removals(self) -> pd.DataFrame:
        return pd.read_parquet(self.out / "removals.parquet")

    @property
    def funnel(self) -> pd.DataFrame:
        return pd.read_parquet(self.out / "funnel.parquet")

    @property
    def hits(self) -> pd.DataFrame:
        return pd.read_parquet(self.out / "decontamination.parquet")


def build_corpus(docs: pd.DataFrame, cfg: CorpusConfig, *, eval_items: Sequence[EvalItem] = (),
                 out: Path | None = None, progress: ShardProgress | None = None) -> CorpusResult:
    """Curate an in-memory frame of documents (columns ``INPUT_COLUMNS``): the sharded build run sequentially.

    Outputs go to ``out`` (a new temporary directory when None). Document order decides which duplicate is kept.

    Raises:
        DataError: a required column is missing or ``doc_id`` values repeat.
    """
    out = Path(tempfile.mkdtemp(prefix="corpus-")) if out is None else out
    work = out / "_work"
    _split_frames([docs], work, cfg.execution.shard_docs)
    return curate(work, out, cfg, eval_items=eval_items, progress=progress)


def split_sources(files: Sequence[Path], work: Path, shard_docs: int) -> int:
    """Stream raw-document Parquet files (in order) into input shards of ``shard_docs`` rows; returns the count.

    Memory holds one batch at a time. Skipped when a previous run finished splitting (``in/_DONE``).
    """
    if (work / "in" / "_DONE").exists():
        return len(list((work / "in").glob("*.parquet")))
    # No pre-buffering or read-ahead threads: they hold several row groups at once, and memory must not grow
    # with the corpus.
    batches = (b.to_pandas() for f in files
               for b in pq.ParquetFile(f, pre_buffer=False).iter_batches(batch_size=shard_docs, columns=INPUT_COLUMNS,
                                                                          use_threads=False))
    return _split_frames(batches, work, shard_docs)


def _split_frames(frames, work: Path, shard_docs: int) -> int:
    shard_dir = work / "in"
    if shard_dir.exists():
        shutil.rmtree(shard_dir)
    shard_dir.mkdir(parents=True)
    seen: set[str] = set()
    buffer: pd.DataFrame | None = None
    n_shards = 0
    for frame in frames:
        _check_input(frame, seen)
        frame = sanitise(frame[INPUT_COLUMNS])
        buffer = frame if buffer is None or not len(buffer) else pd.concat([buffer, frame], ignore_index=True)
        while len(buffer) >= shard_docs:
            buffer.iloc[:shard_docs].to_parquet(shard_dir / f"{n_shards:05d}.parquet", index=False)
            # A copy, not a slice: a slice would keep every earlier batch's buffers alive.
            buffer, n_shards = buffer.iloc[shard_docs:].copy(), n_shards + 1
            release_memory()
    if buffer is not None and len(buffer):
        buffer.to_parquet(shard_dir / f"{n_shards:05d}.parquet", index=False)
        n_shards += 1
    (shard_dir / "_DONE").touch()
    return n_shards


def _check_input(docs: pd.DataFrame, seen: set[str]) -> None:
    missing = [c for c in INPUT_COLUMNS if c not in docs.columns]
    if missing:
        raise DataError(f"corpus input lacks columns {missing}; pass the sources stage's documents")
    ids = docs.doc_id.astype(str)
    repeated = ids[ids.duplicated() | ids.isin(seen)].unique()
    if len(repeated):
        raise DataError(f"doc_id values repeat (e.g. {list(repeated[:3])}); give each source a distinct name")
    seen.update(ids)


def curate(work: Path, out: Path, cfg: CorpusConfig, *, eval_items: Sequence[EvalItem] = (),
           shard_map: ShardMap = sequential_map, progress: ShardProgress | None = None) -> CorpusResult:
    """Passes 2–6 over the input shards in ``work/in``; writes kept/removals/funnel/boilerplate/decontamination
    Parquet files into ``out``. Finished shards of an earlier, interrupted call are reused."""
    shards = sorted((work / "in").glob("*.parquet"))
    cfg_json = cfg.model_dump_json()
    tick = progress or (lambda stage, done, total: None)
    tick("filter", 0, len(shards))
    shard_map(filter_shard, [dict(in_path=str(p), out_dir=str(work / "filtered" / p.stem), cfg_json=cfg_json)
                             for p in shards], "corpus-filter")
    tick("filter", len(shards), len(shards))
    frequent = _frequent(work, cfg)
    index = EvalIndex.build(eval_items, cfg.decontamination.ngram) if cfg.decontamination.enabled else EvalIndex(13)
    index.save(work / "eval_index.npz")
    tick("key", 0, len(shards))
    shard_map(key_shard, [dict(filtered_dir=str(work / "filtered" / p.stem), out_dir=str(work / "keyed" / p.stem),
                               cfg_json=cfg_json, work=str(work)) for p in shards], "corpus-key")
    tick("dedup", 0, 1)
    keyed = [work / "keyed" / p.stem for p in shards]
    decisions, near_stats = _decide(keyed, cfg, index)
    out.mkdir(parents=True, exist_ok=True)
    _write_outputs(work, shards, keyed, decisions, out)
    frequent.to_parquet(out / "boilerplate.parquet", index=False)
    tick("dedup", 1, 1)
    return CorpusResult(out=out, near=near_stats, boilerplate=frequent)


def _atomic_dir(out_dir: Path, write: Callable[[Path], None]) -> bool:
    """Write a shard's outputs into a temporary sibling and rename it into place; False when already done."""
    if out_dir.exists():
        return False
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # One writer per shard, so a killed attempt's temporary can go: the */units.parquet globs would read it.
    with atomic_dir(out_dir, clear_stale=True) as tmp:
        write(tmp)
    return True


def filter_shard(in_path: str, out_dir: str, cfg_json: str) -> bool:
    """Pass 2 on one shard: per-document stages; writes survivors, removals, funnel and unit counts."""
    cfg = CorpusConfig.model_validate_json(cfg_json)

    def write(tmp: Path) -> None:
        ledger = Ledger()
        survivors = filter_documents(pd.read_parquet(in_path), cfg, ledger)
        survivors.to_parquet(tmp / "survivors.parquet", index=False)
        removals, funnel = ledger.frames()
        removals.to_parquet(tmp / "removals.parquet", index=False)
        funnel.to_parquet(tmp / "funnel.parquet", index=False)
        occurrences, examples = count_units(survivors.text if cfg.boilerplate.enabled else [],
                                            cfg.boilerplate.min_chars)
        occurrences.to_parquet(tmp / "units.parquet", index=False)
        examples.to_parquet(tmp / "unit_examples.parquet", index=False)

    return _atomic_dir(Path(out_dir), write)


def _frequent(work: Path, cfg: CorpusConfig) -> pd.DataFrame:
    """Units in ``min_docs`` or more distinct documents over all shards, counted by DuckDB out of core."""
    path = work / "frequent_units.parquet"
    if not cfg.boilerplate.enabled or not list((work / "filtered").glob("*/units.parquet")):
        frame = frequent_units(*count_units([], cfg.boilerplate.min_chars), cfg.boilerplate.min_docs)
    else:
        with duckdb.connect() as con:
            frame = con.execute(
                "WITH counts AS (SELECT unit_hash, count(DISTINCT doc_hash)::BIGINT AS n_docs "
                "  FROM read_parquet(?) GROUP BY unit_hash HAVING count(DISTINCT doc_hash) >= ?), "
                "examples AS (SELECT unit_hash, first(example) AS example FROM read_parquet(?) "
                "  WHERE unit_hash IN (SELECT unit_hash FROM counts) GROUP BY unit_hash) "
                "SELECT c.unit_hash, c.n_docs, e.example FROM counts c JOIN examples e USING (unit_hash) "
                "ORDER BY n_docs DESC, unit_hash",
                [str(work / "filtered" / "*" / "units.parquet"), cfg.boilerplate.min_docs,
                 str(work / "filtered" / "*" / "unit_examples.parquet")]).df()
        frame = frame.astype({"unit_hash": "uint64"})
    frame.to_parquet(path, index=False)
    return frame


def _by_chars(languages: Sequence[str]) -> list[bool]:
    return [lang in CHARACTER_LANGUAGES for lang in languages]


def key_shard(filtered_dir: str, out_dir: str, cfg_json: str, work: str) -> bool:
    """Pass 4 on one shard: boilerplate cut, exact hash, MinHash band keys and evaluation n-gram hits."""
    cfg = CorpusConfig.model_validate_json(cfg_json)
    frequent = set(pd.read_parquet(Path(work) / "frequent_units.parquet").unit_hash.astype("uint64").tolist())
    index = EvalIndex.load(Path(work) / "eval_index.npz")

    def write(tmp: Path) -> None:
        docs = pd.read_parquet(Path(filtered_dir) / "survivors.parquet")
        texts, n_cut = strip_units(docs.text.tolist(), frequent, cfg.boilerplate.min_chars)
        before = docs
        docs = docs.assign(text=texts, lines_dropped=docs.lines_dropped + np.asarray(n_cut, dtype=np.int64))
        ledger = Ledger()
        emptied = [not t.strip() for t in texts]
        for doc_id, source, cut, empty in zip(docs.doc_id, docs.source, n_cut, emptied):
            if empty:
                ledger.remove(doc_id, source, "boilerplate", Reason(
                    "dedup.boilerplate", float(cut), float(cfg.boilerplate.min_docs),
                    f"all {cut} lines are boilerplate found in >= {cfg.boilerplate.min_docs} documents"))
        docs = docs.loc[~np.array(emptied, dtype=bool)].reset_index(drop=True)
        ledger.count("boilerplate", before, docs)
        docs.to_parquet(tmp / "docs.parquet", index=False)
        removals, funnel = ledger.frames()
        removals.to_parquet(tmp / "removals.parquet", index=False)
        funnel.to_parquet(tmp / "funnel.parquet", index=False)
        _keys(docs, cfg).to_parquet(tmp / "keys.parquet", index=False)
        hits = [(doc_id, length, h) for doc_id, text in zip(docs.doc_id, docs.text) for length, h in index.hits(text)]
        pd.DataFrame(hits, columns=["doc_id", "length", "hash"]).astype(
            {"length": "int64", "hash": "uint64"}).to_parquet(tmp / "hits.parquet", index=False)

    return _atomic_dir(Path(out_dir), write)


def _keys(docs: pd.DataFrame, cfg: CorpusConfig) -> pd.DataFrame:
    """Per document: exact-dedup hash halves, characters, and the MinHash band keys (uint64 per band)."""
    digests = [xxhash.xxh3_128_intdigest(normal_form(t).encode("utf-8")) for t in docs.text]
    nd = cfg.near_dedup
    frame = pd.DataFrame({
        "doc_id": docs.doc_id, "source": docs.source, "n_chars": np.array([len(t) for t in docs.text], dtype=np.int64),
        "h_hi": np.array([d >> 64 for d in digests], dtype=np.uint64),
        "h_lo": np.array([d & (2**64 - 1) for d in digests], dtype=np.uint64),
        "by_chars": _by_chars(docs.language.tolist()),
    })
    if nd.enabled and len(docs):
        sigs, has = minhash.signatures(docs.text.tolist(), frame.by_chars.to_numpy(), nd)
        keys = minhash.band_keys(sigs, nd.bands, nd.rows)
    else:
        has = np.zeros(len(docs), dtype=bool)
        keys = np.zeros((len(docs), nd.bands), dtype=np.uint64)
    frame["has_shingles"] = has
    for band in range(nd.bands):
        frame[f"band_{band}"] = keys[:, band]
    return frame


@dataclass
class _Decisions:
    """Global decisions, by position in the concatenated keys (shard order, then row): ``removed`` maps a position
    to its removal row (doc_id, source, stage, rule, value, threshold, detail); ``family`` (n,) int64 holds the
    position of each document's family root; ``ids`` the doc_id of every position."""

    removed: dict[int, dict[str, Any]]
    family: np.ndarray
    ids: np.ndarray
    shard_start: np.ndarray
    hits: pd.DataFrame
    funnel: list[dict[str, Any]]


def _decide(keyed: list[Path], cfg: CorpusConfig, index: EvalIndex) -> tuple[_Decisions, dict[str, dict[str, Any]]]:
    if not keyed:
        return _Decisions({}, np.zeros(0, np.int64), np.zeros(0, object), np.zeros(1, np.int64),
                          pd.DataFrame(columns=HIT_COLUMNS), []), {}
    frames = [pd.read_parquet(d / "keys.parquet").assign(shard=i) for i, d in enumerate(keyed)]
    shard_start = np.concatenate([[0], np.cumsum([len(f) for f in frames])]).astype(np.int64)
    keys = pd.concat(frames, ignore_index=True)
    del frames
    release_memory()
    keys["source"] = keys.source.astype("category")  # a few sources: codes instead of one string per document
    keys["row"] = keys.groupby("shard").cumcount()
    removed: dict[int, dict[str, Any]] = {}
    funnel: list[dict[str, Any]] = []
    alive = np.ones(len(keys), dtype=bool)
    ids, sources = keys.doc_id.to_numpy(), keys.source.astype(str).to_numpy()

    def remove(i: int, **row: Any) -> None:
        removed[i] = dict(doc_id=ids[i], source=sources[i], **row)

    def count(stage: str, before: np.ndarray, after: np.ndarray) -> None:
        for source in sorted(keys.source.unique()):
            mine = (keys.source == source).to_numpy()
            funnel.append(dict(source=source, stage=stage, docs_in=int((before & mine).sum()),
                               docs_out=int((after & mine).sum()), chars_in=int(keys.n_chars[before & mine].sum()),
                               chars_out=int(keys.n_chars[after & mine].sum())))

    def still_alive() -> np.ndarray:
        gone = np.zeros(len(keys), dtype=bool)
        gone[list(removed)] = True
        return alive & ~gone

    # Exact duplicates: the first document in corpus order with the same normal form is kept.
    before = alive.copy()
    if cfg.exact_dedup and len(keys):
        first = keys.groupby(["h_hi", "h_lo"], sort=False).cumcount() > 0
        first_id = keys.groupby(["h_hi", "h_lo"], sort=False).doc_id.transform("first")
        for i in np.flatnonzero(first.to_numpy()):
            remove(int(i), stage="dedup_exact", rule="dedup.exact", value=1.0, threshold=np.nan,
                   detail=f"exact duplicate of {first_id.iat[i]}")
        alive &= ~first.to_numpy()
    count("dedup_exact", before, alive)

    before = alive.copy()
    family = np.arange(len(keys), dtype=np.int64)
    near_stats: dict[str, dict[str, Any]] = {}
    if cfg.near_dedup.enabled and len(keys):
        family, near_stats = _near(keys, keyed, alive, cfg, remove)
        alive = still_alive()
    count("dedup_near", before, alive)

    before = alive.copy()
    hits = _decontaminate(keys, keyed, alive, cfg, index, remove)
    alive = still_alive()
    count("decontam", before, alive)
    return _Decisions(removed, family, ids, shard_start, hits, funnel), near_stats


def _near(keys: pd.DataFrame, keyed: list[Path], alive: np.ndarray, cfg: CorpusConfig,
          remove: Callable[..., None]) -> tuple[np.ndarray, dict[str, dict[str, Any]]]:
    """Near duplicates among ``alive`` documents; returns each document's family root position (its family's first
    member in corpus order) and per-source statistics."""
    nd = cfg.near_dedup
    idx = np.flatnonzero(alive & keys.has_shingles.to_numpy())
    bands = keys[[f"band_{b}" for b in range(nd.bands)]].to_numpy(dtype=np.uint64)[idx]
    groups = None
    if nd.scope == "source":
        groups = pd.factorize(keys.source.to_numpy()[idx])[0]
    # Character- and word-shingled documents never match: separate groups.
    by_chars = keys.by_chars.to_numpy()[idx].astype(np.int64)
    groups = by_chars if groups is None else groups * 2 + by_chars
    pairs = minhash.lsh_candidate_pairs(bands, np.ones(len(idx), dtype=bool), groups)
    pairs = idx[pairs] if len(pairs) else np.empty((0, 2), dtype=np.int64)
    shingle_sets = _shingle_sets(keys, keyed, np.unique(pairs), nd)
    # Pairs stay in numpy (one float per pair): a dict of tuples would cost ~200 bytes a pair at crawl scale.
    sims = np.fromiter((minhash.jaccard_hashes(shingle_sets[i], shingle_sets[j]) for i, j in pairs.tolist()),
                       dtype=np.float64, count=len(pairs))
    del shingle_sets
    ok = sims >= nd.jaccard_threshold
    verified, verified_sims = pairs[ok], sims[ok]
    order = np.lexsort((verified[:, 0], verified[:, 1]))  # by later document, then by earlier
    verified, verified_sims = verified[order], verified_sims[order]
    # Leader clustering in corpus order: a document is removed only when it matches a document that is kept,
    # so chains (A~B~C with A far from C) never remove C on B's account.
    removed_near: dict[int, tuple[int, float]] = {}
    for (i, j), sim in zip(verified.tolist(), verified_sims.tolist()):
        if j not in removed_near and i not in removed_near:
            removed_near[j] = (i, sim)
    ids = keys.doc_id.to_numpy()
    for j, (i, sim) in removed_near.items():
        remove(j, stage="dedup_near", rule="dedup.near", value=sim, threshold=nd.jaccard_threshold,
               detail=f"near duplicate of {ids[i]} (Jaccard {sim:.3f})")
    family = _families(len(keys), verified.tolist())
    removed_near = {j: i for j, (i, _) in removed_near.items()}
    return family, _near_stats(keys, alive, removed_near, verified, len(pairs), nd.max_removal_share)


def _shingle_sets(keys: pd.DataFrame, keyed: list[Path], positions: np.ndarray, nd) -> dict[int, np.ndarray]:
    """Shingle sets of the candidate documents only, read back shard by shard, as sorted 64-bit shingle hashes
    (8 bytes a shingle, so memory stays small even when most documents are candidates)."""
    sets: dict[int, np.ndarray] = {}
    wanted = keys.iloc[positions] if len(positions) else keys.iloc[:0]
    for shard, rows in wanted.groupby("shard"):
        texts = pd.read_parquet(keyed[shard] / "docs.parquet", columns=["text"]).text
        hashed = minhash.shingle_hash_sets([texts.iat[r] for r in rows.row], nd.shingle_size, rows.by_chars.to_numpy())
        sets.update(zip(rows.index.tolist(), hashed))
        del texts
        release_memory()
    return sets


def _families(n: int, verified: list[tuple[int, int]]) -> np.ndarray:
    """Connected components of verified pairs (union-find): (n,) int64 root position, the lowest in the component."""
    parent = list(range(n))  # a list: element access from Python is several times faster than on an ndarray

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in verified:
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    return np.array([find(i) for i in range(n)], dtype=np.int64)


def _near_stats(keys: pd.DataFrame, alive: np.ndarray, removed_near: dict[int, int], verified, n_candidates: int,
                warn_share: float) -> dict[str, dict[str, Any]]:
    stats = {}
    leader_of = pd.Series(removed_near, dtype="int64")
    for source in sorted(keys.source.unique()):
        mine = (keys.source == source).to_numpy()
        n_in = int((alive & mine).sum())
        gone = [j for j in removed_near if mine[j]]
        sizes = leader_of[leader_of.index.isin(gone)].value_counts() + 1 if gone else pd.Series(dtype="int64")
        share = len(gone) / n_in if n_in else 0.0
        stats[source] = {"docs_in": n_in, "removed": len(gone), "removal_share": share,
                         "clusters": int(len(sizes)), "largest_cluster": int(sizes.max()) if len(sizes) else 1,
                         "warning": (f"near dedup removed {share:.1%} of {source}, above {warn_share:.0%}"
                                     if share > warn_share else "")}
    stats["_all"] = {"candidate_pairs": int(n_candidates), "verified_pairs": len(verified)}
    return stats


def _decontaminate(keys: pd.DataFrame, keyed: list[Path], alive: np.ndarray, cfg: CorpusConfig, index: EvalIndex,
                   remove: Callable[..., None]) -> pd.DataFrame:
    """Remove surviving documents sharing a non-common evaluation n-gram; returns every hit (``HIT_COLUMNS``)."""
    dc = cfg.decontamination
    hits = pd.concat([pd.read_parquet(d / "hits.parquet") for d in keyed], ignore_index=True) if keyed else None
    if hits is None or not len(hits) or not dc.enabled:
        return pd.DataFrame(columns=HIT_COLUMNS)
    hits = hits[hits.doc_id.isin(set(keys.doc_id[alive]))]
    docs_per_gram = hits.groupby(["length", "hash"]).doc_id.transform("nunique")
    hits = hits.assign(common=docs_per_gram >= dc.common_min_docs)
    position = pd.Series(np.arange(len(keys)), index=keys.doc_id)
    source_of = dict(zip(keys.doc_id[alive], keys.source[alive].astype(str)))
    rows = []
    for doc_id, length, h, common in zip(hits.doc_id, hits.length, hits.hash, hits.common):
        text, item = index.describe(int(length), int(h))
        rows.append(dict(doc_id=doc_id, source=source_of[doc_id], ngram=text, eval_set=item.set_name,
                         item_id=item.item_id, common=bool(common)))
    table = pd.DataFrame(rows, columns=HIT_COLUMNS)
    for doc_id, mine in table[~table.common].groupby("doc_id", sort=False):
        first = mine.iloc[0]
        remove(int(position[doc_id]), stage="decontam", rule="decontam.ngram_overlap", value=float(len(mine)),
               threshold=1.0, detail=f"shares {dc.ngram}-gram {first.ngram!r} with {first.eval_set} item "
                                     f"{first.item_id} ({len(mine)} hits)")
    return table


def _write_outputs(work: Path, shards: list[Path], keyed: list[Path], decisions: _Decisions, out: Path) -> None:
    """kept.parquet and removals.parquet streamed shard by shard; the funnel gathered from every pass."""
    funnels = []
    with _ParquetStream(out / "kept.parquet", _KEPT_SCHEMA) as kept_out, \
            _ParquetStream(out / "removals.parquet", _REMOVAL_SCHEMA) as removals_out:
        for n, (shard, kdir) in enumerate(zip(shards, keyed)):
            fdir = work / "filtered" / shard.stem
            for part in (pd.read_parquet(fdir / "removals.parquet"), pd.read_parquet(kdir / "removals.parquet")):
                removals_out.write(part.astype({"value": "float64", "threshold": "float64"}))
            funnels += [pd.read_parquet(fdir / "funnel.parquet"), pd.read_parquet(kdir / "funnel.parquet")]
            docs = pd.read_parquet(kdir / "docs.parquet")
            lo = decisions.shard_start[n]
            here = np.arange(lo, lo + len(docs))
            keep = np.array([p not in decisions.removed for p in here.tolist()], dtype=bool)
            family_ids = decisions.ids[decisions.family[here[keep]]]
            kept_out.write(_kept_frame(docs[keep].reset_index(drop=True), family_ids))
            del docs
            release_memory()
        removals_out.write(pd.DataFrame(list(decisions.removed.values()), columns=REMOVAL_COLUMNS).astype(
            {"value": "float64", "threshold": "float64"}))
    funnel = pd.concat([*funnels, pd.DataFrame(decisions.funnel, columns=FUNNEL_COLUMNS)], ignore_index=True)
    funnel = funnel.groupby(["source", "stage"], sort=False, as_index=False).sum()
    order = {stage: i for i, stage in enumerate(CURATION_STEPS)}
    funnel = funnel.sort_values(["source", "stage"], key=lambda s: s.map(order) if s.name == "stage" else s)
    funnel.reset_index(drop=True).to_parquet(out / "funnel.parquet", index=False)
    # Typed even when empty, so the DuckDB table gets real column types rather than NULL.
    decisions.hits.astype(_HIT_TYPES).to_parquet(out / "decontamination.parquet", index=False)


class _ParquetStream:
    """Appends frames to one Parquet file with a fixed schema; an empty file with that schema when none came."""

    def __init__(self, path: Path, schema: pa.Schema):
        self.path, self.schema = path, schema
        self.writer = pq.ParquetWriter(path, schema)

    def write(self, frame: pd.DataFrame) -> None:
        if len(frame):
            self.writer.write_table(pa.Table.from_pandas(frame, schema=self.schema, preserve_index=False))

    def __enter__(self) -> "_ParquetStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.writer.close()


_REMOVAL_SCHEMA = pa.schema([("doc_id", pa.string()), ("source", pa.string()), ("stage", pa.string()),
                             ("rule", pa.string()), ("value", pa.float64()), ("threshold", pa.float64()),
                             ("detail", pa.string())])
_KEPT_SCHEMA = pa.schema([("doc_id", pa.string()), ("source", pa.string()), ("language", pa.string()),
                          ("lang_score", pa.float64()), ("text", pa.string()), ("n_chars", pa.int64()),
                          ("n_bytes", pa.int64()), ("n_words", pa.int64()), ("family_id", pa.string()),
                          ("pii_replacements", pa.int64()), ("lines_dropped", pa.int64()), ("fixes", pa.string())])


def _kept_frame(docs: pd.DataFrame, family_ids: np.ndarray) -> pd.DataFrame:
    by_chars = _by_chars(docs.language.tolist())
    return docs.assign(
        n_chars=np.array([len(t) for t in docs.text], dtype=np.int64),
        n_bytes=[len(t.encode("utf-8")) for t in docs.text],
        n_words=[_count_words(t, c) for t, c in zip(docs.text, by_chars)],
        lang_score=docs.lang_score.astype(float),
        family_id=family_ids,
    )[KEPT_COLUMNS]


def _count_words(text: str, by_chars: bool) -> int:
    """Whitespace tokens; for character languages each CJK ideograph counts as a word."""
    if not by_chars:
        return len(text.split())
    return cjk_count(text) + sum(1 for tok in text.split() if cjk_count(tok) == 0)
