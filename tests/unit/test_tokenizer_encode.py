"""Packing in parts: whatever the corpus's part sizes, the documents per call and the shard map (one worker or two
processes), the joined shards are the bytes that encoding each (source, split) at once and ``write_shard`` give,
removed documents are left out, and the report counts are those of encoding each document on its own;
``join_shards`` refuses parts that do not belong together."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from infra.errors import DataError
from infra.shard_map import process_map, sequential_map
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.encode import HELDOUT, REMOVED, TRAIN, pack_parts
from tasks.tokenizer.report import split_reports, tokenizer_reports
from tasks.tokenizer.fit import eos_id, fit_tokenizer, padded_vocab_size, tokenizer_hash
from tasks.train.shards import EOS_TOKEN, encode_documents, join_shards, read_shard, write_shard

SHARD_FILES = (".bin", ".idx.npy", ".json")


def documents(seed: int = 0) -> pd.DataFrame:
    """Documents of two sources and two splits, English and Chinese, one quoting the EOS string, one empty, one
    removed (split "removed": never packed)."""
    rng = np.random.default_rng(seed)
    words = ["the", "package", "installs", "软件包", "安装", "python", "asyncio", "subprocess", "of", "数据"]
    rows = []
    for i in range(23):
        text = " ".join(rng.choice(words, size=int(rng.integers(1, 40))))
        rows.append({"source": "a" if i % 3 else "b", "split": "train" if i % 4 else "heldout", "text": text,
                     "language": "zh" if i % 5 == 0 else "en"})
    rows[5]["text"] = f"a web page quoting {EOS_TOKEN} in its body"
    rows[7]["text"] = ""
    rows[9]["split"] = "removed"
    docs = pd.DataFrame(rows)
    return docs.assign(n_bytes=docs["text"].map(lambda t: len(t.encode("utf-8"))))


LABELS = {"train": TRAIN, "heldout": HELDOUT, "removed": REMOVED}


def kept_parts(docs: pd.DataFrame, folder: Path, sizes: list[int]) -> tuple[list[Path], list[Path], list[int]]:
    """``docs`` written as kept parts of the given sizes (repeated), with their labels, as the stage has them."""
    folder.mkdir(parents=True)
    parts, labels, rows, start = [], [], [], 0
    while start < len(docs):
        size = sizes[len(parts) % len(sizes)]
        part = docs.iloc[start:start + size]
        parts.append(folder / f"part-{len(parts):05d}.parquet")
        part.drop(columns=["split"]).to_parquet(parts[-1], index=False)
        labels.append(folder / f"labels-{len(labels):05d}.npy")
        np.save(labels[-1], part["split"].map(LABELS).to_numpy(np.uint8))
        rows.append(len(part))
        start += size
    return parts, labels, rows


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    docs = documents()
    tok = fit_tokenizer(docs["text"].tolist() * 3, TokenizerConfig(vocab_size=300))
    folder = tmp_path_factory.mktemp("tokenizer")
    tok.save(str(folder / "tokenizer.json"))
    return tok, folder / "tokenizer.json", shard_meta(tok), docs


def shard_meta(tok) -> dict:
    """The tokenizer artifact's facts that the shard headers carry."""
    return {"padded_vocab_size": padded_vocab_size(tok, 64), "eos_id": eos_id(tok),
            "tokenizer_hash": tokenizer_hash(tok), "manifest_hash": "m" * 64}


def serial_shards(tok, docs: pd.DataFrame, meta: dict, out: Path) -> None:
    """The shards as the tokenizer stage wrote them before packing in parts: one encode per (source, split)."""
    for (source, split), group in docs[docs["split"] != "removed"].groupby(["source", "split"], sort=True):
        tokens, offsets = encode_documents(tok, list(group["text"]))
        write_shard(out / "shards" / source / split, tokens, vocab_size=meta["padded_vocab_size"],
                    eos_id=meta["eos_id"], tokenizer_hash=meta["tokenizer_hash"], n_bytes=int(group["n_bytes"].sum()),
                    doc_offsets=offsets,
                    extra={"source": source, "split": split, "manifest_hash": meta["manifest_hash"]})


def assert_same_files(expected: Path, actual: Path) -> None:
    names = sorted(p.relative_to(expected) for p in expected.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(actual) for p in actual.rglob("*") if p.is_file())
    assert len(names) == 4 * len(SHARD_FILES)
    for name in names:
        assert (expected / name).read_bytes() == (actual / name).read_bytes(), name


def pack(tokenizer_path, meta, tok, docs, tmp_path, sizes, part_docs, shard_map, done=None):
    parts, labels, rows = kept_parts(docs, tmp_path / "kept", sizes)
    return pack_parts(parts, labels, rows, tokenizer_path=tokenizer_path, out=tmp_path / "parts",
                      work=tmp_path / "work", part_docs=part_docs, meta=meta, tokenizer_vocab=tok.get_vocab_size(),
                      shard_map=shard_map, advance=(done.append if done is not None else lambda n=1: None))


@pytest.mark.parametrize("sizes, part_docs", [([23], 1), ([23], 5), ([23], 1000), ([1], 1000), ([4, 1, 9], 2),
                                              ([7], 3)])
def test_parts_join_into_the_serial_shards_byte_for_byte(fitted, tmp_path, sizes, part_docs):
    tok, tokenizer_path, meta, docs = fitted
    serial_shards(tok, docs, meta, tmp_path / "serial")
    done = []
    headers, _ = pack(tokenizer_path, meta, tok, docs, tmp_path, sizes, part_docs, sequential_map, done)
    assert_same_files(tmp_path / "serial" / "shards", tmp_path / "parts" / "shards")
    assert not (tmp_path / "work").exists()
    assert len(done) == 4
    shard = read_shard(tmp_path / "parts" / "shards" / "a" / "train")
    row = headers.set_index(["source", "split"]).loc[("a", "train")]
    assert (row["n_tokens"], row["n_docs"], row["dtype"]) == (shard.header["n_tokens"], shard.header["n_docs"],
                                                              "uint16")
    assert list(zip(headers["source"], headers["split"])) == sorted(zip(headers["source"], headers["split"]))


@pytest.mark.parametrize("sizes, part_docs", [([23], 3), ([5, 2], 4)])
def test_parts_encoded_by_one_or_two_worker_processes_join_into_the_same_bytes(fitted, tmp_path, sizes, part_docs):
    tok, tokenizer_path, meta, docs = fitted
    serial_shards(tok, docs, meta, tmp_path / "serial")
    for workers in (1, 2):
        pack(tokenizer_path, meta, tok, docs, tmp_path / f"w{workers}", sizes, part_docs, process_map(workers))
        assert_same_files(tmp_path / "serial" / "shards", tmp_path / f"w{workers}" / "parts" / "shards")


def test_report_counts_come_from_the_packing_encode(fitted, tmp_path):
    """The efficiency report summed from the encoded parts is the one encoding every document again gives."""
    tok, tokenizer_path, meta, docs = fitted
    _, counts = pack(tokenizer_path, meta, tok, docs, tmp_path, [4, 7], 3, sequential_map)
    kept = docs[docs["split"] != "removed"]
    expected = pd.concat([tokenizer_reports(tok, part).assign(split=split)
                          for split, part in kept.groupby("split", sort=True)])
    pd.testing.assert_frame_equal(split_reports(counts).reset_index(drop=True), expected.reset_index(drop=True))


def test_join_matches_write_shard_for_uint32_ids(tmp_path):
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 50, size=40)
    tokens = rng.integers(0, 70_000, size=int(lengths.sum())).astype(np.uint32)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    header = dict(vocab_size=70_000, eos_id=1, tokenizer_hash="h")
    write_shard(tmp_path / "whole" / "s", tokens, n_bytes=99, doc_offsets=offsets, extra={"k": 1}, **header)
    parts = []
    for p, (a, b) in enumerate([(0, 1), (1, 17), (17, 40)]):  # documents a..b-1
        start, end = offsets[a], offsets[b] if b < len(offsets) else len(tokens)
        parts.append(write_shard(tmp_path / "parts" / f"p{p}", tokens[start:end], n_bytes=0,
                                 doc_offsets=offsets[a:b] - start, **header))
    join_shards(tmp_path / "joined" / "s", parts, n_bytes=99, extra={"k": 1}, chunk_bytes=64)
    for suffix in SHARD_FILES:
        assert (tmp_path / "whole" / f"s{suffix}").read_bytes() == (tmp_path / "joined" / f"s{suffix}").read_bytes()


def test_join_refuses_parts_of_another_tokenizer_or_none(tmp_path):
    one = write_shard(tmp_path / "p0", np.array([5, 0]), vocab_size=64, eos_id=0, tokenizer_hash="x", n_bytes=0,
                      doc_offsets=np.array([0]))
    other = write_shard(tmp_path / "p1", np.array([6, 0]), vocab_size=64, eos_id=0, tokenizer_hash="y", n_bytes=0,
                        doc_offsets=np.array([0]))
    with pytest.raises(DataError, match=r"differs from .* in \['tokenizer_hash'\]"):
        join_shards(tmp_path / "joined", [one, other], n_bytes=0)
    with pytest.raises(DataError, match="no part shards"):
        join_shards(tmp_path / "joined", [], n_bytes=0)
    (tmp_path / "p1.json").unlink()
    with pytest.raises(DataError, match="incomplete"):
        join_shards(tmp_path / "joined", [one, other], n_bytes=0)
    assert not (tmp_path / "joined.json").exists()
