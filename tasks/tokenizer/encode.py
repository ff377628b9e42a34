"""Parallel packing: each (source, split) is encoded in parts of documents by shard-map calls, then joined in order.

A call (:func:`encode_part`) runs wherever the ``[tokenizer.execution]`` engine puts it (this process, a local
worker process, a Ray node): it loads ``tokenizer.json``, reads its documents from a Parquet file written for it,
and writes a part shard with :func:`tasks.train.shards.write_shard`. :func:`pack_shards` then joins the parts
into the one shard per (source, split) that encoding all its documents at once writes, byte for byte
(:func:`tasks.train.shards.join_shards`), so every loader downstream reads the same files whatever the part size,
engine or worker count.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import pandas as pd
from tokenizers import Tokenizer

from infra.shard_map import ShardMap
from tasks.train.shards import encode_documents, join_shards, shard_dtype, write_shard

PART_LABEL = "tokenizer-encode"


def encode_part(tokenizer_path: str, docs_path: str, out_stem: str, vocab_size: int, eos_id: int,
                tokenizer_hash: str) -> dict[str, int]:
    """Encode the ``text`` column of the Parquet file ``docs_path`` with the tokenizer at ``tokenizer_path``, each
    document followed by ``eos_id``, and write the part shard ``out_stem`` (``encode_documents`` then
    ``write_shard``, ids stored for ``vocab_size``).

    Returns:
        {"n_tokens", "n_docs"} of the part.

    Raises:
        DataError: an id or ``eos_id`` falls outside ``vocab_size``.
    """
    tok = Tokenizer.from_file(tokenizer_path)
    texts = pd.read_parquet(docs_path, columns=["text"])["text"].tolist()
    tokens, offsets = encode_documents(tok, texts, eos_id=eos_id)
    write_shard(Path(out_stem), tokens, vocab_size=vocab_size, eos_id=eos_id, tokenizer_hash=tokenizer_hash,
                n_bytes=0, doc_offsets=offsets)
    return {"n_tokens": int(len(tokens)), "n_docs": int(len(offsets))}


def pack_shards(groups: list[tuple[tuple[str, str], pd.DataFrame]], *, tokenizer_path: Path, out: Path,
                work: Path, part_docs: int, meta: dict[str, Any], tokenizer_vocab: int, shard_map: ShardMap,
                advance: Callable[[int], None] = lambda n=1: None) -> pd.DataFrame:
    """Encode every (source, split) group into ``out/shards/<source>/<split>`` through ``shard_map``.

    Args:
        groups: ((source, split), documents with ``text`` and ``n_bytes``), in shard order.
        tokenizer_path: the fitted ``tokenizer.json`` (every call loads it; on a cluster, on a shared filesystem).
        work: scratch folder for the parts' documents and part shards; emptied first, removed at the end.
        part_docs: documents per call.
        meta: ``padded_vocab_size``, ``eos_id``, ``tokenizer_hash``, ``manifest_hash`` of the tokenizer artifact.
        tokenizer_vocab: the tokenizer's own vocabulary size (the ``dtype`` column, as the ids were encoded).
        advance: called with 1 after each join (the shard map reports each finished call itself).

    Returns:
        one header row per shard: source, split, n_tokens, n_docs, n_bytes, vocab_size, dtype.

    Raises:
        DataError: as :func:`encode_part` and :func:`tasks.train.shards.join_shards`.
    """
    shutil.rmtree(work, ignore_errors=True)  # a killed attempt's parts are never joined into this one
    calls, owners = [], []
    for g, ((source, split), docs) in enumerate(groups):
        folder = work / f"{g:05d}"
        folder.mkdir(parents=True)
        for p, start in enumerate(range(0, len(docs), part_docs)):
            docs_path = folder / f"docs-{p:05d}.parquet"
            docs.iloc[start:start + part_docs][["text"]].to_parquet(docs_path, index=False)
            calls.append(dict(tokenizer_path=str(tokenizer_path), docs_path=str(docs_path),
                              out_stem=str(folder / f"part-{p:05d}"), vocab_size=meta["padded_vocab_size"],
                              eos_id=meta["eos_id"], tokenizer_hash=meta["tokenizer_hash"]))
            owners.append(g)
    counts = shard_map(encode_part, calls, PART_LABEL)
    rows = []
    for g, ((source, split), docs) in enumerate(groups):
        parts = [Path(call["out_stem"]) for call, owner in zip(calls, owners) if owner == g]
        n_bytes = int(docs["n_bytes"].sum())
        join_shards(out / "shards" / source / split, parts, n_bytes=n_bytes,
                    extra={"source": source, "split": split, "manifest_hash": meta["manifest_hash"]})
        n_tokens = sum(c["n_tokens"] for c, owner in zip(counts, owners) if owner == g)
        rows.append({"source": source, "split": split, "n_tokens": int(n_tokens), "n_docs": len(docs),
                     "n_bytes": n_bytes, "vocab_size": meta["padded_vocab_size"],
                     "dtype": shard_dtype(tokenizer_vocab).name})
        advance(1)
    shutil.rmtree(work, ignore_errors=True)
    return pd.DataFrame(rows)
