"""Streaming reads in the sources stage: JSONL, Parquet and WARC inputs much larger than the reader's memory arrive
whole and in order, the documents file has bounded row groups, and inputs over ``max_file_bytes`` are rejected
instead of read whole.

The memory tests read in a fresh Python process and take its peak RSS (``VmHWM``, which counts what pyarrow
allocates outside Python too) minus its RSS once the reader's modules are imported. ``VmHWM`` belongs to the
process image; ``ru_maxrss`` would not do, since Linux carries the parent's peak over into a child started with
vfork and exec. The reader's own buffers and allocator pools come to some 45-75 MB whatever the input size, so
the inputs are 300 MB: a third of that leaves room for those buffers but not for any copy of the input.
"""

import io
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from infra.jsonl import jsonl_file_lines, jsonl_lines
from tasks.sources.config import SourceConfig
from tasks.sources.read import (DOC_COLUMNS, REJECT_SCHEMA, ROW_GROUP_BYTES, ROW_GROUP_ROWS, RowWriter, doc_schema,
                                read_small_source)

ROOT = Path(__file__).parents[2]
INPUT_BYTES = 300 * 10**6
PARAGRAPH = ("The ferry leaves the harbour at dawn, crosses the bay while the gulls follow its wake, and reaches the "
             "island before the market opens. ") * 24  # about 3 KB; the documents differ by their opening number


def text(i: int) -> str:
    return f"Document {i:08d}. {PARAGRAPH}"


CHILD = r"""
import json, sys
from pathlib import Path


def status_kib(field):
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(field + ":"))


from tasks.sources.config import SourceConfig
from tasks.sources.read import REJECT_SCHEMA, RowWriter, read_source

after_imports = status_kib("VmRSS")
out = Path(sys.argv[2])
with RowWriter(out / "rejects.parquet", REJECT_SCHEMA) as rejects:
    read = read_source(SourceConfig(name="big", kind="local", include=[sys.argv[1]]), out / "cache",
                       out / "docs.parquet", rejects)
grown = status_kib("VmHWM") - after_imports
print(json.dumps({"grown_bytes": grown * 1024, "num_docs": read.num_docs, "num_rejects": read.num_rejects}))
"""


@pytest.fixture
def big_dir(tmp_path):
    """A folder for one large input and its output, emptied afterwards (pytest keeps recent tmp folders)."""
    yield tmp_path
    for path in sorted(tmp_path.rglob("*"), reverse=True):
        if path.is_file():
            path.unlink()


def read_in_child(path: Path, out: Path) -> dict:
    """``read_source`` of ``path`` in a fresh process: its counts and how far its peak RSS grew (bytes)."""
    out.mkdir()
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def check_streamed(path: Path, out: Path, expected) -> int:
    """Read ``path`` in a child process: every document arrives in order, as ``expected(i)`` gives its
    (doc_id, url, content) for i = 0, 1, ...; memory stays below a third of the file; row groups are bounded.
    Returns the number of documents."""
    size = path.stat().st_size
    assert size >= INPUT_BYTES
    got = read_in_child(path, out)
    grown = got["grown_bytes"]
    assert grown < size / 3, f"reading {size / 1e6:.0f} MB grew the peak RSS by {grown / 1e6:.0f} MB"
    docs = pq.ParquetFile(out / "docs.parquet")
    assert docs.schema_arrow.names == DOC_COLUMNS and docs.num_row_groups > 1
    i = 0
    for g in range(docs.num_row_groups):
        group = docs.read_row_group(g, columns=["doc_id", "url", "content"])
        assert group.num_rows <= ROW_GROUP_ROWS
        assert pc.sum(pc.binary_length(group.column("content"))).as_py() <= ROW_GROUP_BYTES
        for row in zip(*(group.column(c).to_pylist() for c in ("doc_id", "url", "content"))):
            assert row == expected(i), f"document {i}: {row[0]}"
            i += 1
    assert (got["num_docs"], got["num_rejects"], docs.metadata.num_rows) == (i, 0, i)
    return i


def test_a_large_jsonl_file_is_read_line_by_line_in_bounded_memory(big_dir):
    path, n = big_dir / "big.jsonl", 0
    with open(path, "w", encoding="utf-8") as fh:
        while fh.tell() < INPUT_BYTES:
            fh.write("".join(json.dumps({"id": j, "text": text(j)}) + "\n" for j in range(n, n + 2000)))
            n += 2000
    assert check_streamed(path, big_dir / "out", lambda i: (f"big/big.jsonl#{i}", None, text(i))) == n


def test_a_large_parquet_file_is_read_batch_by_batch_in_bounded_memory(big_dir):
    path, n = big_dir / "big.parquet", 0
    schema = pa.schema([("id", pa.int64()), ("text", pa.large_string())])
    # uncompressed, so that the file is as large as its text; row groups of 5,000 rows (15 MB)
    with pq.ParquetWriter(path, schema, compression="none", use_dictionary=False) as writer:
        while n * len(text(0)) < INPUT_BYTES:
            writer.write_table(pa.table({"id": range(n, n + 5000), "text": [text(j) for j in range(n, n + 5000)]},
                                        schema=schema))
            n += 5000
    assert check_streamed(path, big_dir / "out", lambda i: (f"big/big.parquet#{i}", None, text(i))) == n


def page(i: int) -> str:
    return f"<html><body><p>{text(i)}</p></body></html>"


def test_a_large_warc_file_is_read_record_by_record_in_bounded_memory(big_dir):
    path, n = big_dir / "big.warc", 0
    http = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
    with open(path, "wb") as fh:
        writer = WARCWriter(fh, gzip=False)
        while fh.tell() < INPUT_BYTES:
            writer.write_record(writer.create_warc_record(
                f"http://example.org/{n}", "response", payload=io.BytesIO(page(n).encode()), http_headers=http,
                warc_headers_dict={"WARC-Record-ID": f"<urn:n:{n}>"}))
            n += 1
    expected = lambda i: (f"big/big.warc#urn:n:{i}", f"http://example.org/{i}", page(i))  # noqa: E731
    assert check_streamed(path, big_dir / "out", expected) == n


def test_row_groups_end_at_the_row_or_byte_bound_and_a_larger_row_stands_alone(tmp_path):
    schema = pa.schema([("doc_id", pa.large_string()), ("content", pa.large_string())])
    sizes = [40, 40, 40, 10, 10, 10, 10, 10, 10, 250, 5, 5]
    with RowWriter(tmp_path / "rows.parquet", schema, max_rows=4, max_bytes=100) as writer:
        for i, size in enumerate(sizes):
            writer.add({"doc_id": str(i), "content": "x" * size}, size)
    assert writer.rows == len(sizes)
    written = pq.ParquetFile(tmp_path / "rows.parquet")
    groups = [written.read_row_group(g).column("doc_id").to_pylist() for g in range(written.num_row_groups)]
    # 40+40+40 > 100: the third row opens a group; 4 rows close one; 250 bytes form a group of their own
    assert groups == [["0", "1"], ["2", "3", "4", "5"], ["6", "7", "8"], ["9"], ["10", "11"]]
    with RowWriter(tmp_path / "empty.parquet", REJECT_SCHEMA):
        pass
    assert pq.read_table(tmp_path / "empty.parquet").schema == REJECT_SCHEMA


def test_doc_schema_keeps_null_columns_for_sources_without_urls_or_language():
    assert doc_schema().field("url").type == pa.large_string()
    plain = doc_schema(with_urls=False, with_language=False)
    assert plain.field("url").type == pa.null() and plain.field("language_hint").type == pa.null()
    assert plain.names == DOC_COLUMNS and plain.field("num_replaced").type == pa.int64()


def local(tmp_path, include, **kw):
    return SourceConfig(name="src", kind="local", include=[str(tmp_path / p) for p in include], **kw)


def test_inputs_over_max_file_bytes_are_rejected_not_read_whole(tmp_path):
    (tmp_path / "a.txt").write_text("small enough")
    (tmp_path / "b.txt").write_text("y" * 2000)
    (tmp_path / "c.html").write_text("<p>" + "z" * 2000 + "</p>")
    (tmp_path / "d.fortune").write_text("one\n%\n" + "w" * 2000 + "\n%\n")
    out = read_small_source(local(tmp_path, ["*.txt", "*.html"], max_file_bytes=1000), tmp_path)
    assert out.docs.doc_id.tolist() == ["src/a.txt"]
    assert out.rejects[["doc_id", "rule"]].values.tolist() == [["src/b.txt", "read.too_large"],
                                                                ["src/c.html", "read.too_large"]]
    assert out.rejects.detail.iloc[0] == "b.txt: 2,000 bytes, over max_file_bytes=1,000; split the file or raise " \
                                         "max_file_bytes"
    fortunes = read_small_source(local(tmp_path, ["*.fortune"], format="fortune", max_file_bytes=1000), tmp_path)
    assert fortunes.docs.empty and fortunes.rejects.rule.tolist() == ["read.too_large"]
    assert read_small_source(local(tmp_path, ["*.fortune"], format="fortune"), tmp_path).docs.content.tolist() == [
        "one", "w" * 2000]


def test_an_over_long_jsonl_line_is_one_reject_and_later_line_numbers_stay_right(tmp_path):
    lines = [json.dumps({"text": "first"}), json.dumps({"text": "x" * 5000}), "not json",
             json.dumps({"text": "after\u2028the long one"}, ensure_ascii=False)]
    (tmp_path / "a.jsonl").write_text("\r\n".join(lines) + "\r\n", encoding="utf-8", newline="")
    out = read_small_source(local(tmp_path, ["*.jsonl"], max_file_bytes=1000), tmp_path)
    assert out.docs.doc_id.tolist() == ["src/a.jsonl#0", "src/a.jsonl#3"]
    assert out.docs.content.tolist() == ["first", "after\u2028the long one"]
    assert out.rejects[["doc_id", "rule"]].values.tolist() == [["src/a.jsonl#1", "read.too_large"],
                                                                ["src/a.jsonl#2", "read.bad_json"]]
    assert out.rejects.detail.tolist() == ["a.jsonl line 2: 5,012 bytes, over max_file_bytes=1,000",
                                           "a.jsonl line 3: Expecting value at column 1"]


def test_a_parquet_value_over_max_file_bytes_is_one_reject_and_the_rows_after_it_are_read(tmp_path):
    # "é" is two UTF-8 bytes: 600 characters are 1,200 bytes, over the limit; 1,000 ASCII characters are not
    pq.write_table(pa.table({"text": ["first", "é" * 600, "x" * 1000, "last"]}), tmp_path / "a.parquet")
    out = read_small_source(local(tmp_path, ["*.parquet"], max_file_bytes=1000), tmp_path)
    assert out.docs.doc_id.tolist() == ["src/a.parquet#0", "src/a.parquet#2", "src/a.parquet#3"]
    assert out.rejects[["doc_id", "rule", "detail"]].values.tolist() == [
        ["src/a.parquet#1", "read.too_large", "a.parquet row 1: 1,200 bytes, over max_file_bytes=1,000"]]


def test_a_jsonl_line_that_is_not_utf8_is_one_reject_and_a_bom_opens_the_file(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "one"}\n{"text": "bad \xff"}\n{"text": "three"}')
    out = read_small_source(local(tmp_path, ["*.jsonl"]), tmp_path)
    assert out.docs.content.tolist() == ["one", "three"]
    assert out.rejects[["doc_id", "rule", "detail"]].values.tolist() == [
        ["src/a.jsonl#1", "read.undecodable", "a.jsonl line 2: not UTF-8 at byte 14 of the line: invalid start byte"]]


@pytest.mark.parametrize("text_", ["", "\n", "a\nb", "a\r\nb\r\n", "x\u2028y\n\u0085\n\n  \nz\u2029", "\r\n\r"])
def test_jsonl_file_lines_split_bytes_as_jsonl_lines_splits_text(text_):
    got = list(jsonl_file_lines(io.BytesIO(text_.encode("utf-8")), 1000))
    assert [(n, raw.decode("utf-8"), size) for n, raw, size in got] == [
        (n, line, len(line.encode("utf-8"))) for n, line in jsonl_lines(text_)]


def test_a_warc_page_over_max_file_bytes_is_one_reject_and_the_next_page_is_read(tmp_path):
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=True)
    http = StatusAndHeaders("200 OK", [("Content-Type", "text/html")], protocol="HTTP/1.1")
    offsets = []
    for url, body in [("http://a.example/", b"<p>" + b"big " * 600 + b"</p>"), ("http://b.example/", b"<p>ok</p>")]:
        offsets.append(buf.tell())
        writer.write_record(writer.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=http))
    (tmp_path / "a.warc.gz").write_bytes(buf.getvalue())
    out = read_small_source(local(tmp_path, ["*.warc.gz"], max_file_bytes=1000), tmp_path)
    assert out.docs.url.tolist() == ["http://b.example/"]
    assert out.rejects[["doc_id", "rule"]].values.tolist() == [[f"src/a.warc.gz@{offsets[0]}", "read.too_large"]]
    assert out.rejects.detail.iloc[0].startswith(f"a.warc.gz: record at byte offset {offsets[0]:,}: the HTML body is "
                                                 "over max_file_bytes=1,000 bytes")


def test_reading_stops_at_max_docs(tmp_path):
    lines = [json.dumps({"text": f"doc {i}"}) if i % 2 == 0 else "bad" for i in range(10)]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "b.jsonl").write_text("bad\n")
    out = read_small_source(local(tmp_path, ["*.jsonl"], max_docs=3), tmp_path)
    # lines 0, 2, 4 are the three documents; the bad lines after the third are not read, nor is b.jsonl
    assert out.docs.content.tolist() == ["doc 0", "doc 2", "doc 4"]
    assert out.rejects.doc_id.tolist() == ["src/a.jsonl#1", "src/a.jsonl#3"]


def test_a_parquet_file_damaged_in_a_later_row_group_keeps_the_rows_before_it(tmp_path):
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(3000)]}), tmp_path / "a.parquet", row_group_size=1000)
    start = pq.ParquetFile(tmp_path / "a.parquet").metadata.row_group(2).column(0).data_page_offset
    damaged = bytearray((tmp_path / "a.parquet").read_bytes())
    damaged[start:start + 30] = b"\xff" * 30  # the page header of the third row group
    (tmp_path / "a.parquet").write_bytes(bytes(damaged))
    out = read_small_source(local(tmp_path, ["*.parquet"]), tmp_path)
    assert out.docs.content.tolist() == [f"row {i}" for i in range(2000)]
    assert out.rejects[["doc_id", "rule"]].values.tolist() == [["src/a.parquet", "read.bad_parquet"]]
    assert out.rejects.detail.iloc[0].startswith("a.parquet: column 'text' unreadable (")
    assert out.rejects.detail.iloc[0].endswith("; rows from 2,000 on are not read")
