"""Parallel packing: the kept corpus is encoded part by part by shard-map calls, then each (source, split) joined in
corpus order.

A call (:func:`encode_part`) runs wherever the ``[tokenizer.execution]`` engine puts it (this process, a local
worker process, a Ray node): it reads up to ``part_docs`` rows of one kept part of the corpus artifact
(``kept/part-NNNNN.parquet``) and their labels (:data:`TRAIN`, :data:`HELDOUT` or :data:`REMOVED`, one byte per row,
written by the stage), encodes the documents of each (source, split) with ``tokenizers``' ``encode_batch_fast`` as
:func:`tasks.train.shards.encode_documents` does (the tokenizer is read once per process) and writes one part shard
per (source, split). It also returns the counts the efficiency report is made of (characters, bytes, tokens and
words per language and source, ``tasks.tokenizer.report.document_counts``), taken from this encoding: no document
is encoded twice.

:func:`pack_parts` then joins the part shards of each (source, split), in call order, into the one shard that
encoding all its documents at once writes, byte for byte (:func:`tasks.train.shards.join_shards`), so every loader
downstream reads the same files whatever the part size, corpus part size, engine or worker count.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from infra.shard_map import ShardMap
from tasks.tokenizer.report import COUNT_COLUMNS, document_counts
from tasks.train.shards import encode_plain, join_shards, plain_tokenizer, shard_dtype, vocab_span, write_shard

PART_LABEL = "tokenizer-encode"
TRAIN, HELDOUT, REMOVED = 0, 1, 2  # a kept document's label: its split, or removed by the held-out decontamination
SPLITS = {TRAIN: "train", HELDOUT: "heldout"}
ENCODE_COLUMNS = ["source", "language", "text", "n_bytes"]

_TOKENIZERS: dict[tuple[str, int, int], tuple[Tokenizer, np.dtype]] = {}  # per process: a file is read once


def _tokenizer(path: str) -> tuple[Tokenizer, np.dtype]:
    """The plain copy (``tasks.train.shards.plain_tokenizer``) of the tokenizer at ``path`` and its ids' dtype."""
    stat = os.stat(path)
    key = (path, stat.st_mtime_ns, stat.st_size)
    if key not in _TOKENIZERS:
        _TOKENIZERS.clear()
        tok = Tokenizer.from_file(path)
        _TOKENIZERS[key] = plain_tokenizer(tok), shard_dtype(vocab_span(tok))
    return _TOKENIZERS[key]


def encode_part(tokenizer_path: str, part_path: str, labels_path: str, start: int, stop: int, out_dir: str,
                vocab_size: int, eos_id: int, tokenizer_hash: str) -> dict[str, Any]:
    """Encode rows ``start:stop`` of the kept part ``part_path`` (their labels in the ``.npy`` at ``labels_path``;
    removed documents skipped), each document followed by ``eos_id``, into one part shard per (source, split) under
    ``out_dir`` (``<out_dir>/<g>``, g counting the groups in (source, split) order; ids stored for ``vocab_size``).

    Returns:
        {"groups": [(source, split, n_tokens, n_docs, n_bytes, shard stem)], "counts": report counts per split,
        language and source (``COUNT_COLUMNS`` plus split, as records)}.

    Raises:
        DataError: an id or ``eos_id`` falls outside ``vocab_size``.
    """
    table = pq.read_table(part_path, columns=ENCODE_COLUMNS).slice(start, stop - start)
    labels = np.load(labels_path)[start:stop]
    sources = table.column("source").to_numpy(zero_copy_only=False).astype(str)
    tok, dtype = _tokenizer(tokenizer_path)
    groups, counts = [], []
    present = {(s, int(label)) for s, label in zip(sources, labels) if label != REMOVED}
    for g, (source, label) in enumerate(sorted(present, key=lambda k: (k[0], SPLITS[k[1]]))):
        rows = np.flatnonzero((sources == source) & (labels == label))
        texts = table.column("text").take(rows)
        python_texts = texts.to_pylist()
        tokens, offsets = encode_plain(tok, python_texts, eos_id=eos_id, dtype=dtype)
        stem = Path(out_dir) / f"{g:05d}"
        write_shard(stem, tokens, vocab_size=vocab_size, eos_id=eos_id, tokenizer_hash=tokenizer_hash, n_bytes=0,
                    doc_offsets=offsets)
        n_bytes = int(pc.sum(table.column("n_bytes").take(rows)).as_py() or 0)
        groups.append((source, SPLITS[label], int(len(tokens)), len(rows), n_bytes, str(stem)))
        doc_tokens = np.diff(np.append(offsets, len(tokens))) - 1  # the EOS is not the document's
        languages = table.column("language").take(rows).to_numpy(zero_copy_only=False).astype(str).tolist()
        part_counts = document_counts(python_texts, languages, [source] * len(rows), doc_tokens,
                                      n_chars=pc.utf8_length(texts).to_numpy(zero_copy_only=False),
                                      n_bytes=pc.binary_length(texts).to_numpy(zero_copy_only=False))
        counts += part_counts.assign(split=SPLITS[label]).to_dict("records")
    del table
    pa.default_memory_pool().release_unused()  # Arrow's allocator keeps freed memory otherwise
    return {"groups": groups, "counts": counts}


def part_calls(parts: list[Path], labels: list[Path], part_rows: list[int], part_docs: int,
               work: Path) -> list[dict[str, Any]]:
    """The :func:`encode_part` calls (without the tokenizer's arguments) of a kept corpus: each part cut into rows
    of at most ``part_docs``, in corpus order."""
    calls = []
    for p, (part, label, n) in enumerate(zip(parts, labels, part_rows)):
        for start in range(0, n, part_docs):
            calls.append(dict(part_path=str(part), labels_path=str(label), start=start,
                              stop=min(start + part_docs, n), out_dir=str(work / f"{p:05d}-{start:09d}")))
    return calls


def pack_parts(parts: list[Path], labels: list[Path], part_rows: list[int], *, tokenizer_path: Path, out: Path,
               work: Path, part_docs: int, meta: dict[str, Any], tokenizer_vocab: int, shard_map: ShardMap,
               advance: Callable[[int], None] = lambda n=1: None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Encode every (source, split) of the kept corpus into ``out/shards/<source>/<split>`` through ``shard_map``.

    Args:
        parts: the kept parts, in corpus order; ``labels``: the ``.npy`` labels of each (:data:`TRAIN`,
            :data:`HELDOUT`, :data:`REMOVED` per row); ``part_rows``: the rows of each.
        tokenizer_path: the fitted ``tokenizer.json`` (every call loads it; on a cluster, on a shared filesystem).
        work: scratch folder for the part shards; emptied first, removed at the end.
        part_docs: documents per call at most (a call never spans two kept parts).
        meta: ``padded_vocab_size``, ``eos_id``, ``tokenizer_hash``, ``manifest_hash`` of the tokenizer artifact.
        tokenizer_vocab: the tokenizer's own vocabulary size (the ``dtype`` column, as the ids were encoded).
        advance: called with 1 after each join (the shard map reports each finished call itself).

    Returns:
        (one header row per shard: source, split, n_tokens, n_docs, n_bytes, vocab_size, dtype, in (source,
        split) order; the report counts summed per split, language and source: ``COUNT_COLUMNS`` plus split).

    Raises:
        DataError: as :func:`encode_part` and :func:`tasks.train.shards.join_shards`.
    """
    shutil.rmtree(work, ignore_errors=True)  # a killed attempt's parts are never joined into this one
    calls = [dict(call, tokenizer_path=str(tokenizer_path), vocab_size=meta["padded_vocab_size"],
                  eos_id=meta["eos_id"], tokenizer_hash=meta["tokenizer_hash"])
             for call in part_calls(parts, labels, part_rows, part_docs, work)]
    results = shard_map(encode_part, calls, PART_LABEL)
    by_group: dict[tuple[str, str], list] = {}
    for result in results:
        for source, split, n_tokens, n_docs, n_bytes, stem in result["groups"]:
            by_group.setdefault((source, split), []).append((n_tokens, n_docs, n_bytes, Path(stem)))
    rows = []
    for (source, split), pieces in sorted(by_group.items()):
        n_bytes = sum(p[2] for p in pieces)
        join_shards(out / "shards" / source / split, [p[3] for p in pieces], n_bytes=n_bytes,
                    extra={"source": source, "split": split, "manifest_hash": meta["manifest_hash"]})
        rows.append({"source": source, "split": split, "n_tokens": sum(p[0] for p in pieces),
                     "n_docs": sum(p[1] for p in pieces), "n_bytes": n_bytes, "vocab_size": meta["padded_vocab_size"],
                     "dtype": shard_dtype(tokenizer_vocab).name})
        advance(1)
    shutil.rmtree(work, ignore_errors=True)
    counts = pd.DataFrame([c for r in results for c in r["counts"]], columns=[*COUNT_COLUMNS, "split"])
    counts = counts.groupby(["split", "language", "source", "unit"], sort=True, as_index=False)[
        ["n_docs", "n_chars", "n_bytes", "n_tokens", "n_words"]].sum()
    return pd.DataFrame(rows), counts
