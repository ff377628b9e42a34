"""Damaged compressed files. A stream is checked to its end before any of it is read: damage the codec reports
(a checksum mismatch, invalid data) makes the whole file exactly one ``read.bad_compression`` row and no document,
since gzip and bzip2 decode damaged bytes to garbage before a checksum fails; a stream cut short keeps the lines
before the cut, then that row. Neither ever fails the source."""

import bz2
import gzip
import json
import lzma
import random
import re
import zlib

import pytest

from tasks.sources.config import SourceConfig
from tasks.sources.read import read_small_source

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "λόγος", "数据"]
LINES = [" ".join(random.Random(i).choice(WORDS) for _ in range(12)) + f" {i}" for i in range(3000)]
BODY = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in LINES).encode()
CODECS = {".gz": lambda d: gzip.compress(d, mtime=0), ".bz2": lambda d: bz2.compress(d, 1), ".xz": lzma.compress}
# What each codec raises on the flipped bytes below (bz2: OSError "Invalid data stream").
CORRUPT_ERRORS = {".gz": "BadGzipFile", ".bz2": "OSError", ".xz": "LZMAError"}
CORRUPT_DETAIL = re.compile(r"^(?P<name>\S+): cannot decompress: (?P<error>\w+): .+ \(detected at compressed byte "
                            r"(?P<offset>[\d,]+) of (?P<size>[\d,]+), after (?P<lines>[\d,]+) lines decoded\); none of "
                            r"the file is kept, as the codec cannot tell which of the lines decoded before are intact$")


def _flip_mid_stream(data: bytes, count: int = 16) -> bytes:
    damaged = bytearray(data)
    for i in range(len(data) // 2, len(data) // 2 + count):
        damaged[i] ^= 0xFF
    return bytes(damaged)


def _read(tmp_path, name):
    cfg = SourceConfig(name="src", kind="local", include=[str(tmp_path / name)])
    return read_small_source(cfg, tmp_path / "cache")


def _corrupt_detail(out, name: str, size: int) -> re.Match:
    """The one row of a file rejected whole for damage, checked; its detail parsed."""
    assert out.docs.empty and (out.rejects.rule != "read.bad_json").all()
    assert out.rejects.rule.tolist() == ["read.bad_compression"] and out.rejects.doc_id.tolist() == [f"src/{name}"]
    detail = CORRUPT_DETAIL.match(out.rejects.detail.iloc[0])
    assert detail, out.rejects.detail.iloc[0]
    assert detail["name"] == name and int(detail["size"].replace(",", "")) == size
    assert 0 < int(detail["offset"].replace(",", "")) <= size
    return detail


@pytest.mark.parametrize("fmt", ["jsonl", "txt"])
@pytest.mark.parametrize("suffix", list(CODECS))
def test_flipped_bytes_mid_stream_make_the_whole_file_one_bad_compression_row_and_no_document(tmp_path, suffix, fmt):
    name, data = f"d.{fmt}{suffix}", _flip_mid_stream(CODECS[suffix](BODY))
    (tmp_path / name).write_bytes(data)
    detail = _corrupt_detail(_read(tmp_path, name), name, len(data))
    assert detail["error"] == CORRUPT_ERRORS[suffix]
    assert int(detail["lines"].replace(",", "")) > 0  # decoded before the codec noticed, yet none kept


@pytest.mark.parametrize("suffix", list(CODECS))
def test_a_stream_cut_short_keeps_the_lines_before_the_cut_then_one_bad_compression_row(tmp_path, suffix):
    data = CODECS[suffix](BODY * 4)
    (tmp_path / f"d.jsonl{suffix}").write_bytes(data[:len(data) // 2])
    (tmp_path / f"d.txt{suffix}").write_bytes(data[:len(data) // 2])
    jsonl, txt = _read(tmp_path, f"d.jsonl{suffix}"), _read(tmp_path, f"d.txt{suffix}")
    read = len(jsonl.docs)
    assert 0 < read < 4 * len(LINES) and jsonl.docs.content.tolist() == (LINES * 4)[:read]
    assert jsonl.rejects.rule.tolist() == ["read.bad_compression"]
    assert jsonl.rejects.doc_id.tolist() == [f"src/d.jsonl{suffix}#{read}"]
    assert jsonl.rejects.detail.iloc[0].startswith(f"d.jsonl{suffix}: cannot decompress after line {read} (")
    assert jsonl.rejects.detail.iloc[0].endswith("; the lines before it were read")
    # a text file is one document: a cut one is not kept
    assert txt.docs.empty and txt.rejects.rule.tolist() == ["read.bad_compression"]
    assert txt.rejects.detail.iloc[0].endswith("the file is read as one piece, so none of it is kept")


@pytest.mark.parametrize("suffix", list(CODECS))
def test_concatenated_intact_streams_are_read_whole(tmp_path, suffix):
    half = len(BODY) // 2
    cut = BODY.index(b"\n", half) + 1
    (tmp_path / f"d.jsonl{suffix}").write_bytes(CODECS[suffix](BODY[:cut]) + CODECS[suffix](BODY[cut:]))
    out = _read(tmp_path, f"d.jsonl{suffix}")
    assert out.docs.content.tolist() == LINES and out.rejects.empty


def _gzip_damaged_inside_deflate(lines_before: int) -> bytes:
    """A gzip stream whose deflate data is overwritten with 16 0xFF bytes where a block starts, after
    ``lines_before`` lines (a full flush byte-aligns it): inflate fails with a ``zlib.error``, not an OSError."""
    head = BODY.split(b"\n", lines_before)
    packer = zlib.compressobj(wbits=31)  # 31: gzip header and trailer
    good = packer.compress(b"\n".join(head[:lines_before]) + b"\n") + packer.flush(zlib.Z_FULL_FLUSH)
    rest = packer.compress(head[lines_before]) + packer.flush()
    return good + b"\xff" * 16 + rest[16:]


@pytest.mark.parametrize("name", ["d.jsonl.gz", "d.txt.gz"])
def test_a_zlib_error_inside_a_deflate_block_rejects_the_whole_file(tmp_path, name):
    data = _gzip_damaged_inside_deflate(2000)
    with pytest.raises(zlib.error):  # what the reader meets: not an OSError
        gzip.decompress(data)
    (tmp_path / name).write_bytes(data)
    detail = _corrupt_detail(_read(tmp_path, name), name, len(data))
    assert detail["error"] == "error" and "block type" in detail.string
    assert int(detail["lines"].replace(",", "")) <= 2000
