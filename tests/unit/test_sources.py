"""Source configs, Debian fetching errors and the file readers (fortune, JSONL, Parquet, HTML, text)."""

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infra.errors import ConfigError, SourceError
from tasks.sources.config import SourceConfig
from tasks.sources.deb import fetch_deb, licence_summary
from tasks.sources.read import DOC_COLUMNS, REJECT_COLUMNS, read_source

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


def test_missing_apt_raises_source_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SourceError, match="local"):
        fetch_deb("fortunes", tmp_path)


def test_fortunes_split_strip_ansi_and_skip_index_and_symlinks(tmp_path):
    (tmp_path / "poems").write_text("\x1b[32m床前明月光\x1b[m\n疑是地上霜\n%\nSecond one\n%\n%\nThird\n", encoding="utf-8")
    (tmp_path / "poems.dat").write_bytes(b"\x00\x00\x00\x02\xff")
    os.symlink("poems", tmp_path / "poems.u8")
    out = read_source(local(tmp_path, ["*"], format="fortune", language="zh"), tmp_path)
    # the blank entry between '%%' stays a document (removed later as empty, with a reason)
    assert out.docs.content.tolist() == ["床前明月光\n疑是地上霜", "Second one", "", "Third"]
    assert out.docs.doc_id.tolist() == ["src/poems#0", "src/poems#1", "src/poems#2", "src/poems#3"]
    assert list(out.docs.columns) == DOC_COLUMNS and (out.docs.language_hint == "zh").all()
    assert out.snapshot.startswith("local-") and out.rejects.empty


def test_jsonl_bad_lines_become_rejects(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "one"}\nnot json\n\n{"body": "x"}\n{"text": "two"}\n')
    out = read_source(local(tmp_path, ["*.jsonl"]), tmp_path)
    assert out.docs.content.tolist() == ["one", "two"]
    assert list(out.rejects.columns) == REJECT_COLUMNS
    assert out.rejects.rule.tolist() == ["read.bad_json", "read.missing_field"]
    assert out.rejects.doc_id.tolist() == ["src/a.jsonl#1", "src/a.jsonl#3"] and (out.rejects.stage == "read").all()


def test_parquet_reads_column_and_names_missing_one(tmp_path):
    pq.write_table(pa.table({"body": ["x", None, "y"], "id": [1, 2, 3]}), tmp_path / "d.parquet")
    with pytest.raises(SourceError, match=r"d\.parquet.*'body'"):
        read_source(local(tmp_path, ["*.parquet"]), tmp_path)
    out = read_source(local(tmp_path, ["*.parquet"], text_field="body"), tmp_path)
    assert out.docs.content.tolist() == ["x", "y"] and out.rejects.doc_id.tolist() == ["src/d.parquet#1"]


def test_html_charset_text_files_max_docs_and_undecodable(tmp_path):
    (tmp_path / "a.html").write_bytes('<meta charset="iso-8859-1"><p>café</p>'.encode("latin-1"))
    (tmp_path / "b.txt").write_text("plain", encoding="utf-8")
    (tmp_path / "c.txt").write_bytes(b"bad \xff byte")
    out = read_source(local(tmp_path, ["*"]), tmp_path)
    assert out.docs.content_type.tolist() == ["html", "text"]
    assert "café" in out.docs.content.iloc[0]
    assert out.rejects.rule.tolist() == ["read.undecodable"]
    assert len(read_source(local(tmp_path, ["*"], max_docs=1), tmp_path).docs) == 1


def test_no_match_names_patterns(tmp_path):
    with pytest.raises(SourceError, match="nothing-here"):
        read_source(local(tmp_path, ["nothing-here/*.html"]), tmp_path)


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
    out = read_source(cfg, Path("/tmp"))
    assert len(out.docs) > 1000 and out.rejects.empty
    assert not out.docs.content.str.contains("\x1b").any()
    assert out.docs.doc_id.is_unique and out.docs.content.str.contains("[\u4e00-\u9fff]").mean() > 0.95
