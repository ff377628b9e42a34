"""Damaged compressed files: each codec's damage ends its file with exactly one ``read.bad_compression`` row, after
the last line read, and never fails the source."""

import bz2
import gzip
import json
import lzma
import random
import zlib

import pytest

from tasks.sources.config import SourceConfig
from tasks.sources.read import read_small_source

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "λόγος", "数据"]
LINES = [" ".join(random.Random(i).choice(WORDS) for _ in range(12)) + f" {i}" for i in range(3000)]
BODY = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in LINES).encode()
CODECS = {".gz": lambda d: gzip.compress(d, mtime=0), ".bz2": lambda d: bz2.compress(d, 1), ".xz": lzma.compress}


def _flip_mid_stream(data: bytes, count: int = 16) -> bytes:
    damaged = bytearray(data)
    for i in range(len(data) // 2, len(data) // 2 + count):
        damaged[i] ^= 0xFF
    return bytes(damaged)


def _read(tmp_path, name):
    cfg = SourceConfig(name="src", kind="local", include=[str(tmp_path / name)])
    return read_small_source(cfg, tmp_path / "cache")


def _line(doc_id: str) -> int:
    return int(doc_id.rsplit("#", 1)[1])


@pytest.mark.parametrize("suffix", list(CODECS))
def test_flipped_bytes_mid_stream_end_a_jsonl_file_with_one_bad_compression_row_after_its_last_line(tmp_path, suffix):
    name = f"d.jsonl{suffix}"
    (tmp_path / name).write_bytes(_flip_mid_stream(CODECS[suffix](BODY)))
    out = _read(tmp_path, name)
    bad = out.rejects[out.rejects.rule == "read.bad_compression"]
    assert len(bad) == 1, out.rejects.rule.value_counts()
    # Lines decoded before the damage was detected are read (damaged ones as rejects); the row comes after them.
    last = max([_line(i) + 1 for i in out.docs.doc_id] + [_line(i) + 1 for i in out.rejects.doc_id
                                                          if i not in set(bad.doc_id)] + [0])
    assert _line(bad.doc_id.iloc[0]) == last
    assert f"cannot decompress after line {last} " in bad.detail.iloc[0]
    assert 0 < len(out.docs) < len(LINES)


@pytest.mark.parametrize("suffix", list(CODECS))
def test_flipped_bytes_mid_stream_make_a_whole_file_one_bad_compression_row(tmp_path, suffix):
    name = f"d.txt{suffix}"
    (tmp_path / name).write_bytes(_flip_mid_stream(CODECS[suffix](BODY)))
    out = _read(tmp_path, name)
    assert out.docs.empty
    assert out.rejects.rule.tolist() == ["read.bad_compression"]
    assert out.rejects.doc_id.tolist() == [f"src/{name}"] and "cannot decompress" in out.rejects.detail.iloc[0]


def _gzip_damaged_inside_deflate(lines_before: int) -> bytes:
    """A gzip stream whose deflate data is overwritten with 16 0xFF bytes where a block starts, after
    ``lines_before`` lines (a full flush byte-aligns it): inflate fails with a ``zlib.error``, not an OSError."""
    head = BODY.split(b"\n", lines_before)
    packer = zlib.compressobj(wbits=31)  # 31: gzip header and trailer
    good = packer.compress(b"\n".join(head[:lines_before]) + b"\n") + packer.flush(zlib.Z_FULL_FLUSH)
    rest = packer.compress(head[lines_before]) + packer.flush()
    return good + b"\xff" * 16 + rest[16:]


@pytest.mark.parametrize("name", ["d.jsonl.gz", "d.txt.gz"])
def test_a_zlib_error_inside_a_deflate_block_is_a_bad_compression_row(tmp_path, name):
    data = _gzip_damaged_inside_deflate(2000)
    with pytest.raises(zlib.error):  # what the reader meets: not an OSError
        gzip.decompress(data)
    (tmp_path / name).write_bytes(data)
    out = _read(tmp_path, name)
    assert out.rejects.rule.tolist() == ["read.bad_compression"]
    if name.endswith(".txt.gz"):
        assert out.docs.empty and out.rejects.doc_id.tolist() == [f"src/{name}"]
        return
    read = len(out.docs)  # the lines decoded before inflate met the damage, all intact
    assert 0 < read <= 2000 and out.docs.content.tolist() == LINES[:read]
    assert out.rejects.doc_id.tolist() == [f"src/{name}#{read}"]
    assert f"after line {read} (" in out.rejects.detail.iloc[0] and "block type" in out.rejects.detail.iloc[0]
