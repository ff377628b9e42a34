"""Source configs, Debian fetching errors and the file readers (fortune, JSONL, Parquet, HTML, WARC, text)."""

import gzip
import hashlib
import io
import json
import os
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from warcio.recordloader import ArcWarcRecord
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from infra.errors import ConfigError, SourceError
from tasks.sources.config import SourceConfig
from tasks.sources.deb import fetch_deb, licence_summary
from tasks.sources.read import DOC_COLUMNS, REJECT_COLUMNS, read_small_source

REAL_FORTUNES = Path("/tmp/debs/x/usr/share/games/fortunes")


def local(tmp_path, include, **kw):
    return SourceConfig(name="src", kind="local", include=[str(tmp_path / p) for p in include], **kw)


@pytest.mark.parametrize("package", ["Debian-Handbook", "a", "foo bar", "-x", "x;rm"])
def test_bad_package_names_are_rejected(package):
    with pytest.raises(ConfigError, match="package"):
        SourceConfig(name="s", kind="deb", package=package, include=["*"])


def test_config_checks_name_and_kind():
    assert SourceConfig(name="py_doc", kind="deb", package="python3.11-doc", include=["x"]).format == "auto"
    with pytest.raises(ConfigError, match="name"):
        SourceConfig(name="Bad-Name", kind="local", include=["x"])
    with pytest.raises(ConfigError, match="package"):
        SourceConfig(name="s", kind="deb", include=["x"])
    with pytest.raises(ConfigError, match="follow_symlinks is only for kind='local'"):
        SourceConfig(name="s", kind="deb", package="fortunes", include=["x"], follow_symlinks=True)


def test_missing_apt_raises_source_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SourceError, match="local"):
        fetch_deb("fortunes", tmp_path)


def test_fortunes_split_strip_ansi_and_skip_index_and_symlinks(tmp_path):
    (tmp_path / "poems").write_text("\x1b[32m床前明月光\x1b[m\n疑是地上霜\n%\nSecond one\n%\n%\nThird\n", encoding="utf-8")
    (tmp_path / "poems.dat").write_bytes(b"\x00\x00\x00\x02\xff")
    os.symlink("poems", tmp_path / "poems.u8")
    out = read_small_source(local(tmp_path, ["*"], format="fortune", language="zh"), tmp_path)
    # the blank entry between '%%' stays a document (removed later as empty, with a reason)
    assert out.docs.content.tolist() == ["床前明月光\n疑是地上霜", "Second one", "", "Third"]
    assert out.docs.doc_id.tolist() == ["src/poems#0", "src/poems#1", "src/poems#2", "src/poems#3"]
    assert list(out.docs.columns) == DOC_COLUMNS and (out.docs.language_hint == "zh").all()
    assert out.snapshot.startswith("local-") and out.rejects.empty


def _folder_with_a_link_out(tmp_path):
    """docs/ with a text file and a link to a file outside docs/ (a key beside it), and a link that stays inside."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("A document inside the folder.")
    (tmp_path / "secret.key").write_text("PRIVATE KEY 1234")
    os.symlink(tmp_path / "secret.key", tmp_path / "docs" / "b.txt")
    os.symlink("a.txt", tmp_path / "docs" / "c.txt")
    return tmp_path / "secret.key"


def test_a_link_out_of_a_local_folder_is_skipped_with_a_reject_row_and_a_warning(tmp_path, caplog):
    target = _folder_with_a_link_out(tmp_path)
    for include in (["docs"], ["docs/*.txt"]):
        caplog.clear()
        out = read_small_source(local(tmp_path, include), tmp_path)
        assert out.docs.doc_id.tolist() == ["src/a.txt"]  # c.txt is a second name of a.txt, inside
        assert out.rejects[["doc_id", "rule"]].values.tolist() == [["src/b.txt", "read.link_outside"]]
        assert str(target) in out.rejects.detail.iloc[0] and "follow_symlinks = true" in out.rejects.detail.iloc[0]
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and str(tmp_path / "docs" / "b.txt") in warnings[0] and str(target) in warnings[0]


def test_follow_symlinks_reads_a_link_out_of_the_folder_and_warns(tmp_path, caplog):
    target = _folder_with_a_link_out(tmp_path)
    out = read_small_source(local(tmp_path, ["docs"], follow_symlinks=True), tmp_path)
    assert out.docs.content.tolist() == ["A document inside the folder.", "PRIVATE KEY 1234"] and out.rejects.empty
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and str(tmp_path / "docs" / "b.txt") in warnings[0] and str(target) in warnings[0]


def test_jsonl_bad_lines_become_rejects(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "one"}\nnot json\n\n{"body": "x"}\n{"text": "two"}\n')
    out = read_small_source(local(tmp_path, ["*.jsonl"]), tmp_path)
    assert out.docs.content.tolist() == ["one", "two"]
    assert list(out.rejects.columns) == REJECT_COLUMNS
    assert out.rejects.rule.tolist() == ["read.bad_json", "read.missing_field"]
    assert out.rejects.doc_id.tolist() == ["src/a.jsonl#1", "src/a.jsonl#3"] and (out.rejects.stage == "read").all()


@pytest.mark.parametrize("suffix, opener", [(".gz", "gzip"), (".bz2", "bz2"), (".xz", "lzma")])
def test_compressed_single_files_are_read_as_the_format_before_the_suffix(tmp_path, suffix, opener):
    import importlib

    module = importlib.import_module(opener)
    lines = "".join(json.dumps({"text": f"record {i} " + "é" * i}) + "\n" for i in range(50))
    with module.open(tmp_path / f"a.jsonl{suffix}", "wb") as fh:
        fh.write(lines.encode())
    with module.open(tmp_path / f"b.txt{suffix}", "wb") as fh:
        fh.write("plain text, compressed".encode())
    out = read_small_source(local(tmp_path, [f"*{suffix}"]), tmp_path)
    assert out.docs.content.tolist() == [f"record {i} " + "é" * i for i in range(50)] + ["plain text, compressed"]
    assert out.docs.doc_id.tolist()[0] == f"src/a.jsonl{suffix}#0" and out.docs.doc_id.tolist()[-1] == f"src/b.txt{suffix}"
    assert out.rejects.empty


def test_a_damaged_or_misnamed_compressed_file_is_a_reject_naming_where_it_broke(tmp_path):
    import gzip

    data = gzip.compress("".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(2000)).encode())
    (tmp_path / "cut.jsonl.gz").write_bytes(data[: len(data) // 2])
    (tmp_path / "fake.txt.gz").write_bytes(b"not gzip at all")
    (tmp_path / "unnamed.jsonl").write_bytes(gzip.compress(b'{"text": "hidden"}\n'))
    out = read_small_source(local(tmp_path, ["*.gz", "*.jsonl"]), tmp_path)
    rows = dict(zip(out.rejects.rule + ":" + out.rejects.doc_id.str.split("#").str[0], out.rejects.detail))
    cut = rows["read.bad_compression:src/cut.jsonl.gz"]
    assert "cannot decompress after line" in cut and "the lines before it were read" in cut
    n_read = int(cut.split("after line ")[1].split(" ")[0])
    assert 0 < n_read < 2000 and (out.docs.doc_id.str.startswith("src/cut.jsonl.gz#")).sum() == n_read
    assert "cannot decompress" in rows["read.bad_compression:src/fake.txt.gz"]
    assert "starts like gzip data: name it .gz" in rows["read.undecodable:src/unnamed.jsonl"]


def test_jsonl_records_split_at_newline_only_keep_raw_line_separators_inside_strings(tmp_path):
    import json

    # Valid JSON (ensure_ascii=False writes U+2028/U+2029/U+0085 raw); str.splitlines would cut these records.
    texts = ["first\u2028line", "second\u2029para", "third\x85next"]
    body = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts)
    (tmp_path / "a.jsonl").write_text(body + "not json\r\n" + json.dumps({"text": "crlf"}) + "\r\n",
                                      encoding="utf-8", newline="")
    out = read_small_source(local(tmp_path, ["*.jsonl"]), tmp_path)
    assert out.docs.content.tolist() == texts + ["crlf"]
    assert out.docs.doc_id.tolist() == ["src/a.jsonl#0", "src/a.jsonl#1", "src/a.jsonl#2", "src/a.jsonl#4"]
    assert out.rejects.doc_id.tolist() == ["src/a.jsonl#3"]
    assert out.rejects.detail.iloc[0].startswith("a.jsonl line 4: ")


def test_parquet_reads_column_and_names_missing_one(tmp_path):
    pq.write_table(pa.table({"body": ["x", None, "y"], "id": [1, 2, 3]}), tmp_path / "d.parquet")
    with pytest.raises(SourceError, match=r"d\.parquet.*'body'"):
        read_small_source(local(tmp_path, ["*.parquet"]), tmp_path)
    out = read_small_source(local(tmp_path, ["*.parquet"], text_field="body"), tmp_path)
    assert out.docs.content.tolist() == ["x", "y"] and out.rejects.doc_id.tolist() == ["src/d.parquet#1"]


def test_html_charset_text_files_max_docs_and_undecodable(tmp_path):
    (tmp_path / "a.html").write_bytes('<meta charset="iso-8859-1"><p>café</p>'.encode("latin-1"))
    (tmp_path / "b.txt").write_text("plain", encoding="utf-8")
    (tmp_path / "c.txt").write_bytes(b"bad \xff byte")
    out = read_small_source(local(tmp_path, ["*"]), tmp_path)
    assert out.docs.content_type.tolist() == ["html", "text"]
    assert "café" in out.docs.content.iloc[0]
    assert out.docs[["encoding", "encoding_from"]].values.tolist() == [["cp1252", "declared"], ["utf-8", "utf8"]]
    assert out.rejects.rule.tolist() == ["read.undecodable"] and out.rejects.detail.iloc[0].startswith("c.txt:")
    assert len(read_small_source(local(tmp_path, ["*"], max_docs=1), tmp_path).docs) == 1


def test_no_match_names_patterns(tmp_path):
    with pytest.raises(SourceError, match="nothing-here"):
        read_small_source(local(tmp_path, ["nothing-here/*.html"]), tmp_path)


def test_licence_summary(tmp_path):
    mr = tmp_path / "mr"
    mr.write_text("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\nFiles: *\n"
                  "License: GPL-2.0+ or CC-BY-SA-3.0\n\nLicense: GPL-2.0+\n text\n\nLicense: GPL-2.0+\n")
    plain = tmp_path / "plain"
    plain.write_text("\nThis package was put together by someone.\nMore.\n")
    assert licence_summary(mr) == "GPL-2.0+ or CC-BY-SA-3.0, GPL-2.0+"
    assert licence_summary(plain) == "This package was put together by someone."
    assert licence_summary(tmp_path / "missing").startswith("unknown")


@pytest.mark.skipif(not (REAL_FORTUNES / "tang300").is_file(), reason="unpacked fortunes-zh not present")
def test_real_fortunes_zh_package():
    cfg = SourceConfig(name="fortunes_zh", kind="local", format="fortune", language="zh",
                       include=[str(REAL_FORTUNES / f) for f in ("chinese", "song100", "tang300")])
    out = read_small_source(cfg, Path("/tmp"))
    assert len(out.docs) > 1000 and out.rejects.empty
    assert not out.docs.content.str.contains("\x1b").any()
    assert out.docs.doc_id.is_unique and out.docs.content.str.contains("[\u4e00-\u9fff]").mean() > 0.95


def response(url: str, body: bytes, content_type: str = "text/html; charset=utf-8", status: str = "200 OK",
             extra: list[tuple[str, str]] = ()) -> tuple[str, str, bytes, StatusAndHeaders]:
    return ("response", url, body, StatusAndHeaders(status, [("Content-Type", content_type), *extra],
                                                    protocol="HTTP/1.1"))


def write_warc(path: Path, records: list[tuple], compress: bool) -> list[int]:
    """Write records (kind, url, payload, http headers or None) with warcio; returns each record's byte offset
    (warcinfo first)."""
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=compress)
    offsets = [0]
    writer.write_record(writer.create_warcinfo_record(path.name, {"software": "test"}))
    for kind, url, payload, http in records:
        offsets.append(buf.tell())
        writer.write_record(writer.create_warc_record(url, kind, payload=io.BytesIO(payload), http_headers=http))
    path.write_bytes(buf.getvalue())
    return offsets


RU_PAGE = "<html><body><p>Привет, мир! Это страница в кодировке windows-1251.</p></body></html>"
WARC_RECORDS = [
    response("http://a.example/", b"<html><body><p>First page.</p></body></html>"),
    ("request", "http://a.example/", b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n", None),
    response("http://b.example/", RU_PAGE.encode("cp1251"), "text/html; charset=windows-1251"),
    response("http://c.example/x.png", b"\x89PNG\r\n", "image/png"),
    response("http://d.example/missing", b"<html><p>Not found</p></html>", status="404 Not Found"),
    response("http://e.example/", gzip.compress(b"<html><body><p>Gzipped body.</p></body></html>"),
             extra=[("Content-Encoding", "gzip")]),
    ("metadata", "http://e.example/", b"fetchTimeMs: 12\r\n", None),
]


@pytest.mark.parametrize("name, fmt", [("crawl.warc.gz", "auto"), ("crawl.warc", "auto"), ("crawl.bin", "warc")])
def test_warc_html_responses_become_html_documents(tmp_path, name, fmt):
    write_warc(tmp_path / name, WARC_RECORDS, compress=name.endswith(".gz"))
    out = read_small_source(local(tmp_path, [name], format=fmt, language="en"), tmp_path)
    docs = out.docs
    assert docs.url.tolist() == ["http://a.example/", "http://b.example/", "http://e.example/"]
    assert (docs.content_type == "html").all() and docs.doc_id.str.match(rf"src/{name}#urn:uuid:[0-9a-f-]+$").all()
    assert "Привет, мир!" in docs.content.iloc[1]  # charset from the HTTP header, no <meta> in the page
    assert docs[["encoding", "encoding_from"]].iloc[1].tolist() == ["cp1251", "declared"]
    assert "Gzipped body." in docs.content.iloc[2]  # Content-Encoding undone
    assert out.rejects.empty and list(docs.columns) == DOC_COLUMNS
    assert out.skipped == {"warc.not_response": 3, "warc.not_html": 1, "warc.http_status": 1}
    assert len(docs) + len(out.rejects) + sum(out.skipped.values()) == len(WARC_RECORDS) + 1  # + warcinfo


@pytest.mark.parametrize("compress", [False, True])
def test_truncated_warc_record_rejects_the_rest_of_the_file_with_its_offset(tmp_path, compress):
    name = "cut.warc.gz" if compress else "cut.warc"
    offsets = write_warc(tmp_path / name, WARC_RECORDS, compress)
    cut = offsets[3] + (offsets[4] - offsets[3]) // 2  # halfway through the windows-1251 page
    (tmp_path / name).write_bytes((tmp_path / name).read_bytes()[:cut])
    (tmp_path / "whole.warc").write_bytes(b"")  # an empty file is an empty crawl, not an error
    out = read_small_source(local(tmp_path, ["*.warc*"]), tmp_path)
    assert out.docs.url.tolist() == ["http://a.example/"]
    assert out.rejects.rule.tolist() == ["read.warc_truncated"]
    assert out.rejects.doc_id.tolist() == [f"src/{name}@{offsets[3]}"]
    assert out.rejects.detail.iloc[0].startswith(f"{name}: record at byte offset {offsets[3]:,} is truncated")


def test_unreadable_warc_and_undecodable_bodies_are_rejects(tmp_path, monkeypatch):
    (tmp_path / "fake.warc").write_text("<html>not a WARC file</html>")
    # warcio hands over a body it cannot gunzip as it is; the decoder then rejects the bytes as binary
    broken_gzip = response("http://x.example/", b"\x1f\x8bnot gzip", extra=[("Content-Encoding", "gzip")])
    write_warc(tmp_path / "mixed.warc", [broken_gzip, WARC_RECORDS[0]], compress=False)
    out = read_small_source(local(tmp_path, ["*.warc"]), tmp_path)
    assert out.rejects.rule.tolist() == ["read.warc_broken", "read.binary"]
    assert out.rejects.detail.iloc[0].startswith("fake.warc: record at byte offset 0 is truncated or damaged")
    assert "Unknown archive format" in out.rejects.detail.iloc[0]
    assert out.docs.url.tolist() == ["http://a.example/"]  # the record after the bad body is still read

    def fail(self):
        raise zlib.error("invalid stored block lengths")

    monkeypatch.setattr(ArcWarcRecord, "content_stream", fail)
    out = read_small_source(local(tmp_path, ["mixed.warc"]), tmp_path)
    assert out.rejects.rule.tolist() == ["read.warc_bad_record"] * 2 and out.docs.empty
    assert out.rejects.detail.iloc[0].startswith("mixed.warc: record at byte offset ")
    assert "invalid stored block lengths" in out.rejects.detail.iloc[0]


def test_warc_reading_stops_at_max_docs(tmp_path):
    write_warc(tmp_path / "a.warc.gz", WARC_RECORDS, compress=True)
    assert read_small_source(local(tmp_path, ["*.warc.gz"], max_docs=2), tmp_path).docs.url.tolist() == [
        "http://a.example/", "http://b.example/"]


def test_source_language_must_be_a_lid176_label():
    from infra.errors import ConfigError
    from tasks.sources.config import SourceConfig

    with pytest.raises(ConfigError, match="not a lid.176 label"):
        SourceConfig(name="s", kind="local", include=["x/*.txt"], language="klingon")


def test_a_bare_folder_in_include_reads_every_file_under_it_sorted(tmp_path):
    (tmp_path / "docs" / "b" / "deep").mkdir(parents=True)
    (tmp_path / "docs" / "b" / "deep" / "z.txt").write_text("deep")
    (tmp_path / "docs" / "a.txt").write_text("top")
    (tmp_path / "docs" / ".hidden").write_text("hidden")
    out = read_small_source(local(tmp_path, ["docs"]), tmp_path)
    assert out.docs.doc_id.tolist() == ["src/.hidden", "src/a.txt", "src/b/deep/z.txt"]
    assert out.docs.content.tolist() == ["hidden", "top", "deep"]
    assert read_small_source(local(tmp_path, ["docs/"]), tmp_path).docs.doc_id.tolist() == out.docs.doc_id.tolist()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match=r"^source 'src': no file matches include=\['.*/empty'\]"):
        read_small_source(local(tmp_path, ["empty"]), tmp_path)


def _write_archives(tmp_path):
    import json
    import tarfile
    import zipfile

    members = {"notes/b.txt": b"second note", "notes/a.txt": b"first note",
               "data/rows.jsonl": (json.dumps({"text": "row zero"}) + "\n" + json.dumps({"text": "row one"}) + "\n"
                                   ).encode()}
    for name, mode in (("pack.tar", "w"), ("pack.tar.gz", "w:gz"), ("pack.tgz", "w:gz"), ("pack.tar.xz", "w:xz")):
        with tarfile.open(tmp_path / "in" / name, mode) as tar:
            for member, data in members.items():
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with zipfile.ZipFile(tmp_path / "in" / "pack.zip", "w") as z:
        for member, data in members.items():
            z.writestr(member, data)


@pytest.mark.parametrize("name", ["pack.tar", "pack.tar.gz", "pack.tgz", "pack.tar.xz", "pack.zip"])
def test_archives_in_include_are_unpacked_into_the_cache_and_read_like_files(tmp_path, name):
    (tmp_path / "in").mkdir()
    _write_archives(tmp_path)
    cache = tmp_path / "cache"
    out = read_small_source(local(tmp_path, [f"in/{name}"]), cache)
    assert out.docs.doc_id.tolist() == [f"src/{name}!data/rows.jsonl#0", f"src/{name}!data/rows.jsonl#1",
                                        f"src/{name}!notes/a.txt", f"src/{name}!notes/b.txt"]
    assert out.docs.content.tolist() == ["row zero", "row one", "first note", "second note"]
    assert out.docs.path.tolist()[2] == f"{name}!notes/a.txt" and out.rejects.empty
    digest = hashlib.sha256((tmp_path / "in" / name).read_bytes()).hexdigest()
    assert (cache / "archives" / digest / "notes" / "a.txt").read_bytes() == b"first note"
    again = read_small_source(local(tmp_path, [f"in/{name}"]), cache)  # unpacked once, read again from the cache
    assert again.docs.equals(out.docs)
    assert sorted(p.name for p in (cache / "archives").iterdir()) == [digest]


def test_a_refused_or_damaged_archive_is_a_source_error_naming_the_source(tmp_path):
    import tarfile
    import zipfile

    (tmp_path / "in").mkdir()
    with tarfile.open(tmp_path / "in" / "evil.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("../../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(SourceError, match=r"source 'src': .*evil\.tar\.gz: member '\.\./\.\./escape\.txt' would be "
                                          r"written outside"):
        read_small_source(local(tmp_path, ["in/evil.tar.gz"]), tmp_path / "cache")
    (tmp_path / "in" / "evil.tar.gz").unlink()
    (tmp_path / "in" / "junk.zip").write_bytes(b"not a zip at all")
    with pytest.raises(SourceError, match=r"source 'src': .*junk\.zip: not a readable zip archive"):
        read_small_source(local(tmp_path, ["in/*"]), tmp_path / "cache")
    assert not (tmp_path / "escape.txt").exists() and not any((tmp_path / "cache" / "archives").iterdir())
    (tmp_path / "in" / "junk.zip").unlink()
    with zipfile.ZipFile(tmp_path / "in" / "empty.zip", "w") as z:
        z.writestr("only/a/folder/", "")
    out = read_small_source(local(tmp_path, ["in"]), tmp_path / "cache")
    assert out.docs.empty and out.rejects[["doc_id", "rule"]].values.tolist() == [["src/empty.zip", "read.empty_archive"]]


def test_the_sources_key_changes_with_archive_content_and_covers_folders(tmp_path):
    import zipfile

    from tasks.sources.definition import key_sources

    (tmp_path / "in").mkdir()
    archive = tmp_path / "in" / "a.zip"

    def key(content: str) -> str:
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("x.txt", content)
        os.utime(archive, ns=(1_000_000_000, 1_000_000_000))  # same mtime and size each time
        cfg = type("Cfg", (), {"sources": {"src": local(tmp_path, ["in"])}})
        return key_sources(cfg)["sources"]["src"]["files"]

    assert key("aaaa") != key("bbbb")


def test_a_local_snapshot_names_the_bytes_not_the_mtimes(tmp_path):
    """Same key, same content: the snapshot column of a local source must not change with a fresh checkout."""
    (tmp_path / "a.txt").write_text("one document\n", encoding="utf-8")
    first = read_small_source(local(tmp_path, ["*.txt"], format="text"), tmp_path).snapshot
    os.utime(tmp_path / "a.txt", (1_000_000, 1_000_000))
    assert read_small_source(local(tmp_path, ["*.txt"], format="text"), tmp_path).snapshot == first
    (tmp_path / "a.txt").write_text("one documenT\n", encoding="utf-8")
    os.utime(tmp_path / "a.txt", (1_000_000, 1_000_000))
    assert read_small_source(local(tmp_path, ["*.txt"], format="text"), tmp_path).snapshot != first
