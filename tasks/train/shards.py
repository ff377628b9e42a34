"""Token shards: flat id arrays with EOS after every document, plus a JSON header and document offsets (docs/methods.md §8).

A shard ``<stem>`` is three files:
  - ``<stem>.bin``: raw ids, uint16 when the vocab has at most 65,536 entries, uint32 above (docs/methods.md §8);
  - ``<stem>.idx.npy``: int64 start position of each document in the .bin, shape (n_docs,);
  - ``<stem>.json``: header (dtype, vocab_size, eos_id, tokenizer_hash, n_tokens, n_docs, n_bytes, extra).
Each is written under a temporary name and renamed; the header goes last, so a shard without a header is incomplete.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from infra.atomic import atomic_file, atomic_write_bytes
from infra.errors import ConfigError, DataError

EOS_TOKEN = "<|endoftext|>"  # ends every document in a shard
UINT16_VOCAB_MAX = 65_536  # ids 0..65,535 fit in uint16 (docs/methods.md §8)
UINT32_VOCAB_MAX = 2**32
HEADER_KEYS = ("dtype", "vocab_size", "eos_id", "tokenizer_hash", "n_tokens", "n_docs", "n_bytes", "extra")


@dataclass(frozen=True)
class Shard:
    """A shard opened for reading: ``tokens`` (n_tokens,) memory-mapped read-only, ``doc_offsets`` (n_docs,) int64."""

    tokens: np.ndarray
    header: dict
    doc_offsets: np.ndarray

    def document(self, i: int) -> np.ndarray:
        """Ids of document ``i``, its trailing EOS included."""
        end = self.doc_offsets[i + 1] if i + 1 < len(self.doc_offsets) else len(self.tokens)
        return self.tokens[self.doc_offsets[i]:end]


def shard_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65,536), else uint32 (docs/methods.md §8).

    Raises:
        ConfigError: vocab_size is not in 1..2**32.
    """
    if not 0 < vocab_size <= UINT32_VOCAB_MAX:
        raise ConfigError(f"vocab_size must be in 1..{UINT32_VOCAB_MAX:,}, got {vocab_size:,}")
    return np.dtype(np.uint16 if vocab_size <= UINT16_VOCAB_MAX else np.uint32)


def vocab_span(tok: Tokenizer) -> int:
    """The ids a tokenizer can emit: its highest id + 1 (added tokens included), at least ``get_vocab_size()``; the
    rows an embedding needs and what :func:`shard_dtype` is picked from."""
    vocab = tok.get_vocab(with_added_tokens=True)
    return max(tok.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=-1) + 1)


def text_bytes(texts: Sequence[str]) -> int:
    """UTF-8 size of the texts in bytes: the ``n_bytes`` a shard header records (for bits-per-byte)."""
    return sum(len(t.encode("utf-8")) for t in texts)


def encode_documents(tok: Tokenizer, texts: Sequence[str], *, batch_size: int = 1024,
                     eos_id: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Encode documents and join them with EOS (docs/methods.md §8 packing): ``eos_id``, or the id of
    ``<|endoftext|>`` when None (a pretrained tokenizer passes its own, ``tasks.train.pretrained_tokenizer``).

    Special-token strings inside a document (say a web page quoting "<|endoftext|>") are encoded as plain text, so
    EOS ids appear only at document ends. Uses ``encode_batch_fast`` (no character offsets: packing never needs
    them), and builds the array without a Python object per token beyond the ids lists the binding returns.

    Returns:
        tokens: (n_tokens,) ids in ``shard_dtype(vocab_span(tok))``, each document followed by EOS;
        doc_offsets: (n_docs,) int64 start of each document in ``tokens``.

    Raises:
        DataError: no ``eos_id`` was given and the tokenizer has no ``<|endoftext|>``.
    """
    eos = tok.token_to_id(EOS_TOKEN) if eos_id is None else eos_id
    if eos is None:
        raise DataError(f"tokenizer has no {EOS_TOKEN!r}: refit it with that token first in special_tokens")
    return encode_plain(plain_tokenizer(tok), texts, eos_id=eos, dtype=shard_dtype(vocab_span(tok)),
                        batch_size=batch_size)


def plain_tokenizer(tok: Tokenizer) -> Tokenizer:
    """A copy of ``tok`` (the caller's settings left alone) that encodes special-token strings as plain text, with no
    truncation or padding (a released tokenizer.json may carry them): shards keep whole documents."""
    plain = Tokenizer.from_str(tok.to_str())
    plain.encode_special_tokens = True
    plain.no_truncation()
    plain.no_padding()
    return plain


def encode_plain(plain: Tokenizer, texts: Sequence[str], *, eos_id: int, dtype: np.dtype,
                 batch_size: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """:func:`encode_documents` with a tokenizer already made by :func:`plain_tokenizer` and the ids' ``dtype``."""
    parts, lengths = [], []
    for start in range(0, len(texts), batch_size):
        ids = [enc.ids for enc in plain.encode_batch_fast(list(texts[start:start + batch_size]),
                                                          add_special_tokens=False)]
        n = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        body = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(n.sum()))
        parts.append(np.insert(body, np.cumsum(n), eos_id))  # EOS after each document
        lengths.append(n + 1)
    n_docs = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype)
    doc_offsets = np.concatenate([[0], np.cumsum(n_docs)[:-1]]).astype(np.int64) if len(n_docs) else n_docs
    return tokens, doc_offsets


def write_shard(path: Path, tokens: np.ndarray, *, vocab_size: int, eos_id: int, tokenizer_hash: str, n_bytes: int,
                doc_offsets: np.ndarray, extra: dict | None = None) -> Path:
    """Write ``tokens`` (n_tokens,) and ``doc_offsets`` (n_docs,) as a shard at ``path`` (suffix replaced).

    ``vocab_size`` picks the dtype (:func:`shard_dtype`): pass the padded model vocab or the tokenizer's, both work.
    ``n_bytes`` is the UTF-8 size of the documents' text (:func:`text_bytes`).

    Returns:
        the ``.bin`` path.

    Raises:
        DataError: an id or eos_id is outside 0..vocab_size-1, or doc_offsets are not increasing positions in tokens.
    """
    dtype = shard_dtype(vocab_size)
    tokens, doc_offsets = np.asarray(tokens), np.asarray(doc_offsets)
    _check_ids(tokens, eos_id, vocab_size)
    _check_offsets(doc_offsets, len(tokens))
    header = dict(dtype=dtype.name, vocab_size=int(vocab_size), eos_id=int(eos_id), tokenizer_hash=tokenizer_hash,
                  n_tokens=int(len(tokens)), n_docs=int(len(doc_offsets)), n_bytes=int(n_bytes), extra=extra or {})
    bin_path, idx_path, header_path = _paths(path)
    bin_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(bin_path) as f:
        tokens.astype(dtype, copy=False).tofile(f)
    with atomic_file(idx_path) as f:
        np.save(f, doc_offsets.astype(np.int64), allow_pickle=False)
    atomic_write_bytes(header_path, json.dumps(header, indent=2, sort_keys=True).encode("utf-8"))
    return bin_path


def read_shard(path: Path, *, expected_tokenizer_hash: str | None = None) -> Shard:
    """Open the shard at ``path`` (any of its three paths, or the stem) with tokens memory-mapped read-only.

    Raises:
        DataError: the header is missing (incomplete write) or malformed, the .bin size disagrees with
            n_tokens × itemsize, the offsets disagree with n_docs, or the tokenizer hash differs from the expected one.
    """
    bin_path, idx_path, header_path = _paths(path)
    header = _read_header(header_path)
    if expected_tokenizer_hash is not None and header["tokenizer_hash"] != expected_tokenizer_hash:
        raise DataError(f"{bin_path} was tokenized with {header['tokenizer_hash'][:12]}…, expected "
                        f"{expected_tokenizer_hash[:12]}…: re-tokenize with the current tokenizer")
    dtype = np.dtype(header["dtype"])
    expected_size = header["n_tokens"] * dtype.itemsize
    actual_size = bin_path.stat().st_size if bin_path.exists() else None
    if actual_size != expected_size:
        raise DataError(f"{bin_path} has {actual_size} bytes, header says {header['n_tokens']:,} × {dtype.name} "
                        f"= {expected_size:,}: the shard is truncated or mismatched, rewrite it")
    doc_offsets = np.load(idx_path, allow_pickle=False)
    if len(doc_offsets) != header["n_docs"]:
        raise DataError(f"{idx_path} has {len(doc_offsets)} offsets, header says n_docs={header['n_docs']}")
    return Shard(tokens=_map_tokens(bin_path, dtype, header["n_tokens"]), header=header, doc_offsets=doc_offsets)


def _paths(path: Path) -> tuple[Path, Path, Path]:
    path = Path(path)
    stem = path.with_name(path.name.removesuffix(".idx.npy")) if path.name.endswith(".idx.npy") else path
    return stem.with_suffix(".bin"), stem.with_suffix(".idx.npy"), stem.with_suffix(".json")


def _check_ids(tokens: np.ndarray, eos_id: int, vocab_size: int) -> None:
    if tokens.ndim != 1 or (len(tokens) and not np.issubdtype(tokens.dtype, np.integer)):
        raise DataError(f"tokens must be a 1-D integer array (n_tokens,), got {tokens.dtype} {tokens.shape}")
    if not 0 <= eos_id < vocab_size:
        raise DataError(f"eos_id={eos_id} is outside 0..{vocab_size - 1}")
    if len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise DataError(f"token ids span {int(tokens.min())}..{int(tokens.max())}, outside 0..{vocab_size - 1}: "
                        "pass the tokenizer's vocab_size")


def _check_offsets(doc_offsets: np.ndarray, n_tokens: int) -> None:
    if doc_offsets.ndim != 1 or (len(doc_offsets) and not np.issubdtype(doc_offsets.dtype, np.integer)):
        raise DataError(f"doc_offsets must be a 1-D integer array, got {doc_offsets.dtype} {doc_offsets.shape}")
    if len(doc_offsets) and (doc_offsets[0] < 0 or doc_offsets[-1] >= n_tokens or np.any(np.diff(doc_offsets) <= 0)):
        raise DataError(f"doc_offsets must increase strictly within 0..{n_tokens - 1}")


def _read_header(header_path: Path) -> dict:
    if not header_path.exists():
        raise DataError(f"{header_path} is missing: the shard is incomplete (the header is written last); rewrite it")
    try:
        header = json.loads(header_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{header_path} is not valid JSON ({err}): rewrite the shard") from err
    missing = [k for k in HEADER_KEYS if k not in header]
    if missing:
        raise DataError(f"{header_path} lacks {missing}: rewrite the shard")
    if header["dtype"] != shard_dtype(header["vocab_size"]).name:
        raise DataError(f"{header_path}: dtype {header['dtype']} does not match vocab_size {header['vocab_size']:,}")
    return header


def _map_tokens(bin_path: Path, dtype: np.dtype, n_tokens: int) -> np.ndarray:
    if n_tokens == 0:  # mmap cannot map an empty file
        return np.empty(0, dtype=dtype)
    return np.memmap(bin_path, dtype=dtype, mode="r", shape=(n_tokens,))


def shard_facts(path: Path) -> dict:
    """What the files of the shard at ``path`` actually hold, read without trusting the header's counts: the
    header fields, plus tokens_in_file (.bin size ÷ itemsize), offsets_in_file, max_token_id and eos_count.

    For the stage-boundary suite (:func:`infra.expectations.check_shards`), which compares them with the header.

    Raises:
        DataError: the header is missing or malformed.
    """
    bin_path, idx_path, header_path = _paths(path)
    header = _read_header(header_path)
    dtype = np.dtype(header["dtype"])
    size = bin_path.stat().st_size if bin_path.exists() else 0
    tokens = np.memmap(bin_path, dtype=dtype, mode="r", shape=(size // dtype.itemsize,)) if size else np.zeros(0, dtype)
    offsets = np.load(idx_path, allow_pickle=False) if idx_path.exists() else np.zeros(0, np.int64)
    return {**{k: header[k] for k in ("dtype", "vocab_size", "eos_id", "n_tokens", "n_docs", "n_bytes")},
            "tokens_in_file": len(tokens), "offsets_in_file": len(offsets),
            "max_token_id": int(tokens.max()) if len(tokens) else -1,
            "eos_count": int(np.count_nonzero(tokens == header["eos_id"]))}


def join_shards(path: Path, parts: Sequence[Path], *, n_bytes: int, extra: dict | None = None,
                chunk_bytes: int = 1 << 24) -> Path:
    """Write the shards ``parts`` end to end as one shard at ``path``, streaming.

    The result is the shard :func:`write_shard` writes for the parts' tokens concatenated in order and their
    document offsets shifted by the tokens before each part, byte for byte: the ``.bin`` is copied in chunks of
    ``chunk_bytes``, the offsets part by part, so memory is bounded by one part's offsets (n_docs × 8 bytes), not the
    shard. The ids were checked when each part was written; the parts' own ``n_bytes`` and ``extra`` are ignored.

    Args:
        path: the joined shard (suffix replaced, as for :func:`write_shard`).
        parts: part shards (any of their paths or the stem), in document order; at least one.
        n_bytes: UTF-8 size of all the documents' text (:func:`text_bytes`).
        extra: the joined header's ``extra``.

    Returns:
        the ``.bin`` path.

    Raises:
        DataError: no parts, a part is incomplete or truncated (:func:`read_shard`), or the parts disagree on
            dtype, vocab_size, eos_id or tokenizer_hash.
    """
    if not parts:
        raise DataError(f"no part shards to join into {path}")
    headers = [read_shard(p).header for p in parts]
    same = ("dtype", "vocab_size", "eos_id", "tokenizer_hash")
    first = headers[0]
    for part, header in zip(parts, headers):
        differ = [k for k in same if header[k] != first[k]]
        if differ:
            raise DataError(f"part shard {part} differs from {parts[0]} in {differ}: re-encode every part with one "
                            "tokenizer and vocab_size")
    n_tokens = sum(h["n_tokens"] for h in headers)
    n_docs = sum(h["n_docs"] for h in headers)
    bin_path, idx_path, header_path = _paths(path)
    bin_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(bin_path) as f:
        for part in parts:
            with open(_paths(part)[0], "rb") as src:
                while chunk := src.read(chunk_bytes):
                    f.write(chunk)
    with atomic_file(idx_path) as f:
        # The header np.save writes for an (n_docs,) int64 array, then the data as np.save writes it.
        np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.int64)),
                                                 "fortran_order": False, "shape": (n_docs,)})
        before = 0
        for part, header in zip(parts, headers):
            offsets = np.load(_paths(part)[1], allow_pickle=False).astype(np.int64, copy=False)
            (offsets + before).tofile(f)
            before += header["n_tokens"]
    joined = dict(dtype=first["dtype"], vocab_size=first["vocab_size"], eos_id=first["eos_id"],
                  tokenizer_hash=first["tokenizer_hash"], n_tokens=int(n_tokens), n_docs=int(n_docs),
                  n_bytes=int(n_bytes), extra=extra or {})
    atomic_write_bytes(header_path, json.dumps(joined, indent=2, sort_keys=True).encode("utf-8"))
    return bin_path
