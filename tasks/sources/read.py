"""Turn a source's files into a Parquet file of documents, with a reject row for every input that could not be one.

Formats (``SourceConfig.format``; ``auto`` picks by extension: .html/.htm → html, .warc/.warc.gz → warc,
.jsonl → jsonl, .parquet → parquet, anything else → text). A single file compressed with gzip, bzip2 or xz
(``.gz``, ``.bz2``, ``.xz`` after its own extension, e.g. ``data.jsonl.gz``) is decompressed by the standard
library's ``gzip``, ``bz2`` and ``lzma``, its format chosen by the extension before. Its stream is decompressed to
its end, so that the codec checks every checksum, before any of it is read (a JSONL file into an unnamed temporary
file under the source cache, ``_decompress``): damaged bytes decode to garbage before the checksum after them
fails, and a damaged stream does not say which of its lines are intact. A stream cut short (it ends before its
end-of-stream marker) keeps the JSONL lines before the cut, then one ``read.bad_compression`` reject row; any other
damage (a checksum mismatch, invalid data) makes the whole file that one row, and no document.

- html: one document per file, raw markup kept (``content_type="html"``) for the corpus extractor; decoded by
  BOM, UTF-8, declared charset, detection (``tasks.sources.encoding.decode_html``).
- warc: one HTML document per 2xx HTML ``response`` record (``tasks.sources.warc``), decoded as html with the HTTP
  header's charset; other records are counted in ``SourceRead.skipped``; a truncated or unparseable record ends
  its file with one reject row naming the file and the record's byte offset.
- text: one document per file, UTF-8 (a file that is not UTF-8 is rejected).
- fortune: BSD fortune files, one document per entry between lines that are exactly ``%``; ANSI colour escapes
  stripped; ``*.dat`` index files and symlinked duplicates (``*.u8``) skipped.
- jsonl: one document per line, text under ``text_field``; lines end at ``\n`` only (JSON Lines), so U+2028,
  U+2029 or U+0085 written raw inside a JSON string stay in their record (``infra.jsonl``). Each line is decoded
  as UTF-8 on its own: a line that is not UTF-8 is one reject row.
- parquet: one document per row of column ``text_field``.
- jsonl and parquet: with ``url_field`` set, the document's ``url`` is that key's or column's value when it is a
  URL (``is_url``); a blank string is kept as it is (no URL). A value that is neither (``"n/a"``, a number, a
  ``mailto:`` link) is written as null, so nothing downstream takes it for a URL, and it is counted in
  ``SourceRead.url_invalid`` and logged with examples (its document is read, not rejected). A Parquet file without
  the column raises, and so does a source none of whose JSONL records has the key (``SourceError`` naming the
  source, the field and the keys the records have).

Memory does not grow with the input (``read_source``). JSONL files are read one line at a time, Parquet files one
batch of rows at a time (``iter_batches``) and WARC files one record at a time; html, text and fortune files, a
JSONL line and a WARC page body are held whole, up to ``SourceConfig.max_file_bytes`` (a larger one is one
``read.too_large`` reject row; so is a Parquet value over it, refused once its batch is read). Documents and rejects go to Parquet files through ``RowWriter`` in row groups of
at most ``ROW_GROUP_ROWS`` rows and ``ROW_GROUP_BYTES`` bytes of text (a single larger document makes a row group
of its own), so the stages that read them batch by batch hold one row group at a time.

A local source's ``include`` may name a folder (every file under it, hidden ones too, recursively, in sorted
order; symlinked folders are not followed) and archives (``infra.archives.ARCHIVE_SUFFIXES``: .tar, .tar.gz/.tgz,
.tar.xz, .tar.bz2, .zip). An archive is unpacked by the safe extractor (``infra.archives``) into
``<cache_dir>/archives/<SHA-256 of its bytes>/`` once, and its members are read like files in sorted order, with
the format chosen per member; their relative path is ``<archive>!<member>`` (ids ``<source>/<archive>!<member>``,
then ``#<n>`` as for a file). Archives inside an archive are read as files; an archive without files is one
reject row (``read.empty_archive``). A matched file whose real path lies outside the folder it was matched in (a
symlink out of it) is one ``read.link_outside`` reject row and a warning, unless ``follow_symlinks`` reads it
(``local_files``).

Every document records how its bytes became text (``encoding``, ``encoding_from``: bom/declared/utf8/detected/
fallback) and the damage repaired: ``num_replaced`` (undecodable bytes and lone surrogates → U+FFFD) and
``num_nul_removed`` (NUL characters stripped). Each input unit (file, entry, line, row, WARC record) ends as one
document, one reject row (stage ``"read"``, with a rule and a detail naming the file) or a counted skip.
"""

import bz2
import glob
import gzip
import hashlib
import io
import ipaddress
import json
import logging
import lzma
import os
import re
import tempfile
import zlib
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from infra.archives import is_archive, unpack_cached
from infra.errors import SourceError
from infra.jsonl import jsonl_file_lines
from infra.runs import ensure_folder
from tasks.sources.config import SourceConfig
from tasks.sources.deb import DebPackage, DebRelease, fetch_deb
from tasks.sources.encoding import Decoded, Rejected, decode_html, scrub
from tasks.sources.warc import WarcPage, WarcProblem, is_warc, iter_warc

DOC_COLUMNS = ["doc_id", "source", "path", "url", "language_hint", "content", "content_type", "encoding",
               "encoding_from", "num_replaced", "num_nul_removed", "licence", "snapshot"]
REJECT_COLUMNS = ["doc_id", "source", "stage", "rule", "value", "threshold", "detail"]
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# A host name once IDNA-encoded: LDH labels (underscores too: they occur in real hostnames) separated by dots.
_HOST_RE = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*$")
_MAX_FIELD_NAMES = 30  # keys of the records named in the error for a url_field no record has
URL_EXAMPLES = 3  # values that are not URLs quoted in the log line and in SourceRead

log = logging.getLogger(__name__)


# Row groups: other stages read the documents one row group at a time, so these bound their memory too.
ROW_GROUP_ROWS = 8192
ROW_GROUP_BYTES = 4 * 2**20  # UTF-8 bytes of text (content, or detail for rejects)
_PARQUET_BATCH_ROWS = 1024  # rows per batch read from a Parquet input
_PARQUET_BUFFER_BYTES = 1 << 20  # read buffer per Parquet column chunk, so a large chunk is not read at once
_STRING = pa.large_string()
REJECT_SCHEMA = pa.schema([("doc_id", _STRING), ("source", _STRING), ("stage", _STRING), ("rule", _STRING),
                           ("value", pa.float64()), ("threshold", pa.float64()), ("detail", _STRING)])
# Columns whose values are (nearly) all distinct: a dictionary would only cost memory until Parquet gives it up.
_DISTINCT_COLUMNS = frozenset({"doc_id", "url", "content", "detail"})


def doc_schema(with_urls: bool = True, with_language: bool = True) -> pa.Schema:
    """Arrow schema of a documents file (``DOC_COLUMNS``): text as ``large_string``, counts as ``int64``.

    ``url`` is typed ``null`` when the source holds no WARC file (``with_urls`` False) and ``language_hint`` when
    the source has no language, the types pandas infers for such all-null columns: the files read back with
    ``None`` in them as before, not NaN.
    """
    types = dict.fromkeys(DOC_COLUMNS, _STRING) | {"num_replaced": pa.int64(), "num_nul_removed": pa.int64()}
    if not with_urls:
        types["url"] = pa.null()
    if not with_language:
        types["language_hint"] = pa.null()
    return pa.schema(list(types.items()))


class RowWriter:
    """Rows appended one at a time to one Parquet file, flushed as a row group every ``max_rows`` rows or once
    the next row would take the text over ``max_bytes`` bytes; memory holds one row group at most.

    Use as a context manager (or call ``close``); the file is valid, with the schema and no rows, even when
    nothing was added. Leaving the context on an exception closes the file without the buffered rows.
    ``rows``: rows added so far.

    Raises:
        OSError: ``path`` cannot be written.
        pyarrow.ArrowException: a value does not fit its column's type (raised when its row group is written).
    """

    def __init__(self, path: Path, schema: pa.Schema, max_rows: int = ROW_GROUP_ROWS,
                 max_bytes: int = ROW_GROUP_BYTES) -> None:
        self.path, self.schema, self.max_rows, self.max_bytes = Path(path), schema, max_rows, max_bytes
        self.rows = 0
        self._columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        self._bytes = 0
        self._writer = pq.ParquetWriter(self.path, schema,
                                        use_dictionary=[n for n in schema.names if n not in _DISTINCT_COLUMNS])

    def add(self, row: dict[str, Any], num_bytes: int) -> None:
        """Append ``row`` (a value for every column); ``num_bytes``: the size of its text, for the flush rule."""
        if self._bytes and self._bytes + num_bytes > self.max_bytes:
            self.flush()
        for name, values in self._columns.items():
            values.append(row[name])
        self._bytes += num_bytes
        self.rows += 1
        if len(self._columns[self.schema.names[0]]) >= self.max_rows:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows as one row group (nothing when none are buffered)."""
        if not self._columns[self.schema.names[0]]:
            return
        table = pa.Table.from_pydict(self._columns, schema=self.schema)
        self._columns = {name: [] for name in self.schema.names}
        self._bytes = 0
        self._writer.write_table(table, row_group_size=table.num_rows)

    def close(self) -> None:
        """Flush and close the file."""
        if self._writer is not None:
            try:
                self.flush()
            finally:
                self._writer.close()
                self._writer = None

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, exc_type, *_) -> None:
        if exc_type is not None:  # the file is incomplete anyway; writing more could hide the error
            self._columns = {name: [] for name in self.schema.names}
        self.close()


def text_bytes(text: str) -> int:
    """UTF-8 size of ``text`` (without encoding it when it is ASCII)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", errors="surrogatepass"))


@dataclass
class SourceRead:
    """What ``read_source`` wrote for one source: ``docs_path`` (its documents file), ``num_docs``, ``num_rejects``
    (the rows it added to the rejects file), ``snapshot``, ``licence`` and ``skipped`` (input units that are not
    documents, counted by kind: WARC ``not_response``, ``http_status``, ``not_html`` records), ``url_invalid``
    (``url_field`` values that are not URLs, read as no URL) and up to ``URL_EXAMPLES`` of them, quoted."""

    docs_path: Path
    num_docs: int
    num_rejects: int
    snapshot: str
    licence: str
    skipped: dict[str, int] = field(default_factory=dict)
    url_invalid: int = 0
    url_invalid_examples: list[str] = field(default_factory=list)


@dataclass
class SourceDocs:
    """A whole source in memory (``read_small_source``): ``docs`` (columns ``DOC_COLUMNS``), ``rejects`` (columns
    ``REJECT_COLUMNS``, stage ``"read"``), ``snapshot``, ``licence`` and ``skipped`` as in ``SourceRead``."""

    docs: pd.DataFrame
    rejects: pd.DataFrame
    snapshot: str
    licence: str
    skipped: dict[str, int] = field(default_factory=dict)


@dataclass
class _Acc:
    """Where one source's rows go while it is read; one ``doc`` or ``reject`` per input unit."""

    cfg: SourceConfig
    docs: RowWriter
    rejects: RowWriter
    licence: str
    snapshot: str
    cache_dir: Path  # compressed JSONL files are decompressed into a temporary file here
    num_docs: int = 0
    num_rejects: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    # url_field: records read without the key, the keys they had (until one has it), values that are not URLs
    url_field_missing: int = 0
    url_field_seen: bool = False
    record_fields: dict[str, None] = field(default_factory=dict)
    url_invalid: int = 0
    url_invalid_examples: list[str] = field(default_factory=list)

    def doc(self, doc_id: str, rel: str, text: Decoded, content_type: str, url: str | None = None) -> None:
        self.docs.add(dict(doc_id=doc_id, source=self.cfg.name, path=rel, url=url, language_hint=self.cfg.language,
                           content=text.text, content_type=content_type, encoding=text.encoding,
                           encoding_from=text.decided_by, num_replaced=text.num_replaced,
                           num_nul_removed=text.num_nul_removed, licence=self.licence, snapshot=self.snapshot),
                      text_bytes(text.text))
        self.num_docs += 1

    def reject(self, doc_id: str, rule: str, detail: str) -> None:
        self.rejects.add(dict(doc_id=doc_id, source=self.cfg.name, stage="read", rule=rule,
                              value=float("nan"), threshold=float("nan"), detail=detail), text_bytes(detail))
        self.num_rejects += 1

    def full(self) -> bool:
        return self.cfg.max_docs is not None and self.num_docs >= self.cfg.max_docs

    def record_keys(self, record: dict) -> None:
        """Note whether a JSONL record that became a document has ``url_field`` (with any value, null too)."""
        if self.url_field_seen:
            return
        if self.cfg.url_field in record:
            self.url_field_seen = True
            return
        self.url_field_missing += 1
        for key in record:
            if len(self.record_fields) >= _MAX_FIELD_NAMES:
                break
            self.record_fields.setdefault(str(key))

    def url(self, value: Any) -> str | None:
        """A document's ``url`` from a ``url_field`` value: a URL (``is_url``) or a blank string as it is (lone
        surrogates replaced), None for null; any other value is None too and counted in ``url_invalid``."""
        if value is None:
            return None
        text = scrub(value).text if isinstance(value, str) else None
        if text is not None and (not text.strip() or is_url(text)):
            return text
        self.url_invalid += 1
        if len(self.url_invalid_examples) < URL_EXAMPLES:
            self.url_invalid_examples.append(repr(text if text is not None else value)[:80])
        return None

    def check_url_field(self) -> None:
        """Raise when ``url_field`` is set and no JSONL record read had it; log the values that are not URLs."""
        name, url_field = self.cfg.name, self.cfg.url_field
        if url_field and self.url_field_missing and not self.url_field_seen:
            fields = sorted(self.record_fields)
            more = " (and more)" if len(fields) >= _MAX_FIELD_NAMES else ""
            raise SourceError(f"source {name!r}: url_field={url_field!r} is in none of its "
                              f"{self.url_field_missing:,} records read; they have the fields {fields}{more}. Set "
                              "url_field to the key that holds each document's URL, or remove it")
        if self.url_invalid:
            log.warning("source %r: %d url_field %r value(s) are not URLs (e.g. %s); those documents are read "
                        "without a URL (url_invalid in sources.json)", name, self.url_invalid, url_field,
                        ", ".join(self.url_invalid_examples))


def read_source(cfg: SourceConfig, cache_dir: Path, docs_path: Path, rejects: RowWriter,
                release: DebRelease | None = None, package: DebPackage | None = None) -> SourceRead:
    """Read every file ``cfg.include`` matches into documents, written to ``docs_path`` as Parquet (``DOC_COLUMNS``,
    ``doc_schema``, row groups as ``RowWriter``); reject rows go to ``rejects`` (a ``RowWriter`` with
    ``REJECT_SCHEMA``, which may be shared by several sources).

    Memory does not grow with the input: files are streamed (module docstring) and rows leave for the files one
    row group at a time. A compressed JSONL file is first decompressed into an unnamed temporary file under
    ``cache_dir`` (disk: its decompressed size, freed once it is read) and its lines read after the codec has
    checked the whole stream. Only the WARC file being read keeps a set of 8-byte digests of its record ids (to
    rename repeated ids), some 60 bytes per record.
    ``snapshot`` is the package version (deb) or, for local files, "local-" + the first 12 hex digits of
    ``local_files_digest`` (the matched files' paths, sizes and bytes). Files are read in sorted relative-path
    order, so ``max_docs`` keeps a deterministic prefix: reading stops at the ``max_docs``-th document, and the
    inputs after it give neither documents nor rejects. A Debian source fetches ``release`` when given (the one its
    artifact key names), else ``cfg.version`` or the candidate resolved now; ``package``, when given, is that release
    already fetched and unpacked (``fetch_deb``), read as it is.

    ``url_invalid`` counts the ``url_field`` values that are not URLs (module docstring), read as no URL.

    Raises:
        SourceError: no file matches the patterns, a parquet file lacks ``text_field`` (or a set ``url_field``), a
            set ``url_field`` is in none of the JSONL records read (the message names the source, the field and
            the records' keys), the package cannot be fetched (see ``fetch_deb``), or an archive is refused by the
            safe extractor or cannot be read (the message names the source, the archive and any refused member).
            Damaged content (bad bytes, bad JSON, broken Parquet or WARC files) and inputs over
            ``max_file_bytes`` never raise: they become reject rows.
        RunsFolderError: a file is in the way of ``cache_dir`` or of the archive cache under it.
    """
    if cfg.kind == "deb":
        pkg = package if package is not None else fetch_deb(cfg.package, cache_dir, cfg.version, release=release)
        files = match_files(cfg.include, pkg.root, cfg.name)
        snapshot, licence = pkg.version, pkg.licence
    else:
        files, links_out = local_files(cfg)
        snapshot, licence = _local_snapshot(files), "unknown (local files)"
    schema = doc_schema(with_urls=bool(cfg.url_field) or _may_hold_warc(cfg, files),
                        with_language=cfg.language is not None)
    with RowWriter(docs_path, schema) as docs:
        acc = _Acc(cfg, docs, rejects, licence, snapshot, Path(cache_dir))
        if cfg.kind == "local":
            _links_out(acc, links_out)
        for rel, path in files:
            if acc.full():
                break
            if cfg.kind == "local" and is_archive(path):
                _read_archive(acc, rel, path, Path(cache_dir) / "archives")
            else:
                _read_file(acc, rel, path)
        acc.check_url_field()
    return SourceRead(docs_path=Path(docs_path), num_docs=acc.num_docs, num_rejects=acc.num_rejects,
                      snapshot=snapshot, licence=licence, skipped=acc.skipped, url_invalid=acc.url_invalid,
                      url_invalid_examples=acc.url_invalid_examples)


def read_small_source(cfg: SourceConfig, cache_dir: Path, release: DebRelease | None = None) -> SourceDocs:
    """``read_source`` into a temporary folder, then the documents and rejects loaded whole: for sources small
    enough to hold in memory (audits, benchmarks, tests). Raises as ``read_source``."""
    with tempfile.TemporaryDirectory(prefix="source-") as tmp:
        with RowWriter(Path(tmp) / "rejects.parquet", REJECT_SCHEMA) as rejects:
            read = read_source(cfg, cache_dir, Path(tmp) / "docs.parquet", rejects, release=release)
        return SourceDocs(docs=pd.read_parquet(read.docs_path), rejects=pd.read_parquet(rejects.path),
                          snapshot=read.snapshot, licence=read.licence, skipped=read.skipped)


def _may_hold_warc(cfg: SourceConfig, files: list[tuple[str, Path]]) -> bool:
    """Whether a document of the source can have a URL: a WARC file, or an archive that may hold one."""
    if cfg.format != "auto":
        return cfg.format == "warc"
    return any(is_warc(path) or (cfg.kind == "local" and is_archive(path)) for _, path in files)


def match_files(patterns: list[str], root: Path | None, source: str | None = None) -> list[tuple[str, Path]]:
    """(relative path, path) of matched regular files, sorted, without symlinked duplicates.

    A pattern is a glob (``**`` allowed) or a folder without wildcards, which matches every file under it
    (recursively, hidden files included, symlinked folders not followed). Relative paths start below ``root``
    (deb), else below the pattern's part before its first wildcard (a folder pattern: the folder itself).
    ``source``, the source's name, starts the error.

    Raises:
        SourceError: nothing matches any pattern.
    """
    hits = []
    for pattern in patterns:
        base = root if root is not None else _glob_base(pattern)
        full = str(root / pattern) if root is not None else pattern
        if not glob.has_magic(pattern) and os.path.isdir(full):
            hits.extend((hit, base) for hit in _files_under(full))
        else:
            hits.extend((hit, base) for hit in glob.glob(full, recursive=True))
    files = _unique_files(hits)
    if not files:
        where = f" under {root}" if root is not None else ""
        named = f"source {source!r}: " if source is not None else ""
        raise SourceError(f"{named}no file matches include={patterns!r}{where}; check the patterns (globs, '**' "
                          "allowed, or a folder)")
    return files


@dataclass(frozen=True)
class LinkOut:
    """A matched file whose real path lies outside the folder it was matched in: ``rel`` and ``path`` as
    ``match_files`` gives them, ``folder`` that folder and ``target`` the real path."""

    rel: str
    path: Path
    folder: Path
    target: Path


def local_files(cfg: SourceConfig) -> tuple[list[tuple[str, Path]], list[LinkOut]]:
    """(files a ``local`` source reads, links out of their folder): ``match_files`` of ``cfg.include``, and the
    matched files whose real path lies outside the folder they were matched in, which are left out of the files
    read unless ``cfg.follow_symlinks``.

    Raises:
        SourceError: as ``match_files``.
    """
    files = match_files(cfg.include, None, cfg.name)
    links = [link for link in (_link_out(rel, path) for rel, path in files) if link is not None]
    if cfg.follow_symlinks or not links:
        return files, links
    skipped = {link.path for link in links}
    return [(rel, path) for rel, path in files if path not in skipped], links


def _link_out(rel: str, path: Path) -> LinkOut | None:
    """A ``LinkOut`` when ``path`` (matched as ``rel`` below its folder) resolves outside that folder, else None."""
    folder = Path(os.path.normpath(os.path.join(path, *[os.pardir] * len(Path(rel).parts))))
    target = Path(os.path.realpath(path))
    return None if target.is_relative_to(os.path.realpath(folder)) else LinkOut(rel, path, folder, target)


def _links_out(acc: _Acc, links: list[LinkOut]) -> None:
    """One warning per link out of its folder; when they are not followed, one ``read.link_outside`` row each."""
    follow = acc.cfg.follow_symlinks
    for link in links:
        log.warning("source %r: %s is a link to %s, outside %s; %s", acc.cfg.name, link.path, link.target,
                    link.folder, "read (follow_symlinks = true)" if follow else
                    "not read (read.link_outside; follow_symlinks = true reads it)")
        if not follow:
            acc.reject(f"{acc.cfg.name}/{link.rel}", "read.link_outside",
                       f"{link.rel}: a link to {link.target}, outside {link.folder}; not read (set follow_symlinks "
                       "= true to read it)")


def _unique_files(hits: list[tuple[str, Path]]) -> list[tuple[str, Path]]:
    """(path relative to its base, path) of the regular files among ``(hit, base)`` pairs, sorted, one per file."""
    seen: dict[str, tuple[bool, str, Path]] = {}
    for hit, base in hits:
        path = Path(hit)
        if path.is_file():
            # Several names for one file (fortune "x.u8 -> x"): keep the real file, else the first name.
            candidate = (path.is_symlink(), os.path.relpath(hit, base), path)
            real = os.path.realpath(hit)
            seen[real] = min(seen.get(real, candidate), candidate)
    return sorted((rel, path) for _, rel, path in seen.values())


def _files_under(folder: str | Path) -> list[str]:
    """Every file below ``folder`` (symlinks to files included; symlinked folders not entered, so no cycles)."""
    found = []
    for parent, _, names in os.walk(folder, followlinks=False):
        found.extend(os.path.join(parent, name) for name in names)
    return sorted(found)


def _read_archive(acc: _Acc, rel: str, path: Path, cache_dir: Path) -> None:
    """Members of one archive, unpacked once into ``cache_dir`` (``unpack_cached``), as files ``<rel>!<member>``."""
    try:
        root = unpack_cached(path, cache_dir)
    except SourceError as err:
        raise SourceError(f"source {acc.cfg.name!r}: {err}; repack the archive (without any such member) or remove "
                          "it from include") from err
    members = _unique_files([(hit, root) for hit in _files_under(root)])  # sorted, symlinked duplicates dropped
    if not members:  # an input file that gives no document still gets its row
        acc.reject(f"{acc.cfg.name}/{rel}", "read.empty_archive", f"{rel}: the archive holds no file")
    for member_rel, member in members:
        if acc.full():
            return
        _read_file(acc, f"{rel}!{member_rel}", member)


def _glob_base(pattern: str) -> Path:
    """The directory part of ``pattern`` before its first wildcard; relative paths in ids are taken from it."""
    fixed: list[str] = []
    for part in Path(pattern).parts:
        if glob.has_magic(part):
            break
        fixed.append(part)
    base = Path(*fixed) if fixed else Path(".")
    return base if base.is_dir() else base.parent


def local_files_digest(files: list[tuple[str, Path]]) -> str:
    """sha256[:16] over each matched file's relative path, size and SHA256 of its bytes: what a local source holds.
    Metadata such as mtimes is left out, so a fresh checkout gives the same digest and edited bytes never do."""
    rows = []
    for rel, path in files:
        with open(path, "rb") as fh:
            rows.append((rel, path.stat().st_size, hashlib.file_digest(fh, "sha256").hexdigest()))
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def _local_snapshot(files: list[tuple[str, Path]]) -> str:
    return "local-" + local_files_digest(files)[:12]


# Readers over an open compressed file; each reads to the end of the last stream (gzip members, bzip2 and xz
# streams may be concatenated) and checks every checksum on the way.
_CODECS = {".gz": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"), ".bz2": bz2.BZ2File, ".xz": lzma.LZMAFile}
# How each codec reports damage: gzip a BadGzipFile (an OSError, e.g. a CRC mismatch) or, inside a deflate block, a
# zlib.error (not an OSError: "invalid distance too far back", "invalid block type"); bz2 an OSError ("Invalid data
# stream"); xz an LZMAError; a stream cut short an EOFError.
_STREAM_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)
_DECOMPRESS_CHUNK = 1 << 16  # small enough that a codec error loses little of what was decoded before it


def _codec(path: Path):
    """The reader for a .gz/.bz2/.xz file (``_CODECS``), None for any other (WARC files are warcio's)."""
    return None if is_warc(path) else _CODECS.get(path.suffix.lower())


@dataclass(frozen=True)
class _Damage:
    """How a compressed stream failed: ``error`` (what the codec raised), ``cut`` (the stream ends before its
    end-of-stream marker, an EOFError: what was decoded before is intact), ``offset`` (compressed bytes read when
    the codec raised), ``size`` (the compressed file's bytes) and ``lines`` (complete lines decoded before)."""

    error: BaseException
    cut: bool
    offset: int
    size: int
    lines: int

    def corrupt_detail(self, rel: str) -> str:
        return (f"{rel}: cannot decompress: {type(self.error).__name__}: {self.error} (detected at compressed byte "
                f"{self.offset:,} of {self.size:,}, after {self.lines:,} lines decoded); none of the file is kept, "
                "as the codec cannot tell which of the lines decoded before are intact")


def _decompress(path: Path, out: BinaryIO, limit: int | None = None) -> _Damage | None:
    """Decompress the .gz/.bz2/.xz file ``path`` into ``out`` to the end of its stream (or until more than ``limit``
    bytes are written), so that the codec checks its checksums (gzip: a CRC-32 per member, bzip2: a CRC per block and
    per stream, xz: a check per block) before anything decoded is used.

    Returns None when the stream is intact (or longer than ``limit``), else the damage. When the stream is cut
    short, ``out`` ends after the last complete line decoded before the cut.

    Raises:
        OSError: ``path`` cannot be opened, or ``out`` cannot be written.
    """
    written = lines = line_end = 0
    with open(path, "rb") as raw, _codec(path)(raw) as fh:
        while want := _DECOMPRESS_CHUNK if limit is None else min(_DECOMPRESS_CHUNK, limit + 1 - written):
            try:  # read1: one step of the codec, so what it decoded before an error is counted
                chunk = fh.read1(want)
            except _STREAM_ERRORS as e:
                cut = isinstance(e, EOFError)
                if cut:
                    out.seek(line_end)
                    out.truncate()
                return _Damage(e, cut, raw.tell(), os.fstat(raw.fileno()).st_size, lines)
            if not chunk:
                break
            if (end := chunk.rfind(b"\n")) >= 0:
                lines += chunk.count(b"\n")
                line_end = written + end + 1
            written += out.write(chunk)
    return None


def _format_of(cfg: SourceConfig, path: Path) -> str:
    if cfg.format != "auto":
        return cfg.format
    if is_warc(path):
        return "warc"
    name = Path(path.stem) if path.suffix.lower() in _CODECS else path
    ext = name.suffix.lower()
    return {".html": "html", ".htm": "html", ".jsonl": "jsonl", ".parquet": "parquet"}.get(ext, "text")


def _read_file(acc: _Acc, rel: str, path: Path) -> None:
    fmt = _format_of(acc.cfg, path)
    doc_id = f"{acc.cfg.name}/{rel}"
    if fmt == "warc":
        _read_warc(acc, rel, path)
    elif fmt == "parquet":
        _read_parquet(acc, rel, path)
    elif fmt == "jsonl":
        _read_jsonl(acc, rel, path)
    elif fmt == "fortune" and path.suffix == ".dat":
        return  # strfile index, binary
    else:
        raw = _read_whole(acc, doc_id, rel, path)
        if raw is None:
            return
        if fmt == "html":
            _add_html(acc, doc_id, rel, decode_html(raw))
            return
        text = _decode_utf8(raw, acc, doc_id, rel)
        if text is not None:
            {"text": _read_text, "fortune": _read_fortunes}[fmt](acc, rel, text)


def _read_whole(acc: _Acc, doc_id: str, rel: str, path: Path) -> bytes | None:
    """The file's bytes, decompressed and checked (``_decompress``) if compressed; None after a reject row when it
    has more than ``max_file_bytes`` (``read.too_large``) or its stream is damaged (``read.bad_compression``: the
    file is one piece, so a stream cut short keeps nothing either)."""
    limit = acc.cfg.max_file_bytes
    compressed = _codec(path) is not None
    if compressed:
        with io.BytesIO() as buffer:
            damage = _decompress(path, buffer, limit)
            raw = buffer.getvalue()
        if damage is not None and damage.cut:
            acc.reject(doc_id, "read.bad_compression", f"{rel}: cannot decompress ({damage.error}); the file is "
                                                       "read as one piece, so none of it is kept")
            return None
        if damage is not None:
            acc.reject(doc_id, "read.bad_compression", damage.corrupt_detail(rel))
            return None
    else:
        with open(path, "rb") as fh:
            raw = fh.read(limit + 1)  # never more than the limit in memory, even if the file grows meanwhile
    if len(raw) > limit:
        size = "over that once decompressed" if compressed else f"{path.stat().st_size:,} bytes"
        acc.reject(doc_id, "read.too_large", f"{rel}: {size}, over max_file_bytes={limit:,}; "
                                             "split the file or raise max_file_bytes")
        return None
    return raw


def _decode_utf8(raw: bytes, acc: _Acc, doc_id: str, rel: str) -> str | None:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        acc.reject(doc_id, "read.undecodable", f"{rel}: not UTF-8 at byte {e.start}: {e.reason}")
        return None


def _add_html(acc: _Acc, doc_id: str, rel: str, decoded: Decoded | Rejected, url: str | None = None) -> None:
    if isinstance(decoded, Rejected):
        acc.reject(doc_id, decoded.rule, f"{rel}: {decoded.detail}")
    else:
        acc.doc(doc_id, rel, decoded, "html", url)


def _read_warc(acc: _Acc, rel: str, path: Path) -> None:
    """HTML responses of one WARC file; ids are the WARC-Record-ID, else the URL, else the byte offset."""
    seen: set[bytes] = set()  # 8-byte digests of the ids given so far: a fixed size per record, whatever the id
    for item in iter_warc(path, acc.cfg.max_file_bytes):
        if isinstance(item, WarcProblem):
            acc.reject(f"{acc.cfg.name}/{rel}@{item.offset}", item.rule, f"{rel}: {item.detail}")
        elif isinstance(item, WarcPage):
            key = item.record_id or item.url or f"@{item.offset}"
            if _id_digest(key) in seen:  # ids repeat only in malformed files
                key = f"{key}@{item.offset}"
            seen.add(_id_digest(key))
            _add_html(acc, f"{acc.cfg.name}/{rel}#{key}", rel, decode_html(item.body, item.http_content_type),
                      item.url)
            if acc.full():
                return
        else:
            acc.skipped[f"warc.{item.kind}"] = acc.skipped.get(f"warc.{item.kind}", 0) + 1


def _id_digest(key: str) -> bytes:
    return hashlib.blake2b(key.encode("utf-8", errors="surrogatepass"), digest_size=8).digest()


def _read_text(acc: _Acc, rel: str, text: str) -> None:
    acc.doc(f"{acc.cfg.name}/{rel}", rel, scrub(text), "text")


def _read_fortunes(acc: _Acc, rel: str, text: str) -> None:
    entries = [e.strip("\n") for e in re.split(r"^%\r?$\n?", strip_ansi(text), flags=re.MULTILINE)]
    if entries and not entries[-1].strip():
        entries.pop()  # the piece after the closing '%' is a file-format artefact, not an entry
    # a blank entry between two '%' lines is still a document: the corpus stage removes it with a reason
    for i, entry in enumerate(entries):
        if acc.full():
            return
        acc.doc(f"{acc.cfg.name}/{rel}#{i}", rel, scrub(entry), "text")


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences, including ones left broken or nested in the source (fortunes-zh has
    ``\x1b[;\x1b[34;1mm``, which becomes a new sequence once the inner one is removed)."""
    while True:
        stripped = _ANSI_RE.sub("", text)
        if stripped == text:
            return stripped.replace("\x1b", "")
        text = stripped


def _read_jsonl(acc: _Acc, rel: str, path: Path) -> None:
    """One document per line, read one line at a time (``infra.jsonl.jsonl_file_lines``); ids ``#<line - 1>``.

    A compressed file is decompressed into an unnamed temporary file first (``_decompress``): when its stream is
    damaged, the file is one ``read.bad_compression`` row (id: the file's) and no document; when it is cut short,
    the lines before the cut are read, then that row (id: the next line's)."""
    if _codec(path) is None:
        with open(path, "rb") as fh:
            _jsonl_lines(acc, rel, fh)
        return
    # Decompressing once to disk costs less than a checking pass and a reading pass through the codec, and memory
    # stays bounded; the file has no name, so nothing is left behind even if the process dies.
    with tempfile.TemporaryFile(dir=ensure_folder(acc.cache_dir), prefix="decompressed-") as spool:
        damage = _decompress(path, spool)
        if damage is not None and not damage.cut:
            acc.reject(f"{acc.cfg.name}/{rel}", "read.bad_compression", damage.corrupt_detail(rel))
            return
        spool.seek(0)
        line_no = _jsonl_lines(acc, rel, spool)
    if damage is not None and line_no is not None:
        acc.reject(f"{acc.cfg.name}/{rel}#{line_no}", "read.bad_compression",
                   f"{rel}: cannot decompress after line {line_no} ({damage.error}); the lines before it were read")


def _jsonl_lines(acc: _Acc, rel: str, fh: BinaryIO) -> int | None:
    """Each line of ``fh`` as a document or a reject row; the number of lines read, None when the source filled."""
    field_name, limit = acc.cfg.text_field, acc.cfg.max_file_bytes
    line_no = 0
    for line_no, raw, num_bytes in jsonl_file_lines(fh, limit):
        if not _jsonl_line(acc, rel, field_name, limit, line_no, raw, num_bytes):
            return None
    return line_no


def _jsonl_line(acc: _Acc, rel: str, field_name: str, limit: int, line_no: int, raw: bytes | None,
                num_bytes: int) -> bool:
    """One JSONL line as a document or a reject row; False when the source is full (stop reading)."""
    if acc.full():
        return False
    doc_id = f"{acc.cfg.name}/{rel}#{line_no - 1}"
    if raw is None:
        acc.reject(doc_id, "read.too_large", f"{rel} line {line_no}: {num_bytes:,} bytes, over max_file_bytes={limit:,}")
        return True
    try:
        line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")  # a BOM can only open the file
    except UnicodeDecodeError as e:
        hint = ("; the file starts like gzip data: name it .gz" if line_no == 1 and raw[:2] == b"\x1f\x8b" else "")
        acc.reject(doc_id, "read.undecodable",
                   f"{rel} line {line_no}: not UTF-8 at byte {e.start} of the line: {e.reason}{hint}")
        return True
    if not line.strip():
        return True
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        acc.reject(doc_id, "read.bad_json", f"{rel} line {line_no}: {e.msg} at column {e.colno}")
        return True
    value = record.get(field_name) if isinstance(record, dict) else None
    if not isinstance(value, str):
        acc.reject(doc_id, "read.missing_field", f"{rel} line {line_no}: no string field {field_name!r}")
        return True
    url = None
    if acc.cfg.url_field:
        acc.record_keys(record)
        url = acc.url(record.get(acc.cfg.url_field))
    acc.doc(doc_id, rel, scrub(value), "text", url)  # JSON "\ud800" escapes give lone surrogates
    return True


def is_url(text: str) -> bool:
    """Whether ``text`` is a URL with a host the corpus URL rules can read (``tasks.corpus.urls.url_host``).

    Parsed by ``urllib.parse.urlsplit``: either ``scheme://host...`` whose host is an IP address or a host name,
    or, without a scheme, a value that reads host first (``example.com/page``, ``www.example.com``) whose host has
    at least two labels and a last label with a letter. A host name is valid when its IDNA (2003) ASCII form, with
    percent-escapes and a trailing dot removed, is dot-separated letters, digits, ``-`` and ``_``. Not URLs:
    ``"n/a"``, ``"3.14"``, ``"mailto:a@b.example"``, ``"javascript:void(0)"``, ``"http:///path"``,
    ``"http://two words.example/"``.
    """
    value = text.strip()
    try:
        parts = urlsplit(value)
        host_first = not parts.netloc and (not parts.scheme or "." in parts.scheme)
        if host_first:
            parts = urlsplit("//" + value)
        host = parts.hostname
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return False
    host = unquote(host or "").rstrip(".")
    if not host:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    try:
        ascii_host = host.encode("idna").decode("ascii").lower()
    except UnicodeError:  # an empty or over-long label
        return False
    if not _HOST_RE.match(ascii_host):
        return False
    labels = ascii_host.split(".")
    return not host_first or (len(labels) >= 2 and any(c.isalpha() for c in labels[-1]))


def _read_parquet(acc: _Acc, rel: str, path: Path) -> None:
    """Rows of column ``text_field``, one batch at a time. A missing column raises (every file of the source would
    need the same fix); a file that is not Parquet at all is one reject row, and so is a file that breaks while
    read (the rows before the break stay documents). A value of more than ``max_file_bytes`` UTF-8 bytes is one
    ``read.too_large`` row, as an over-long JSONL line is."""
    try:
        parquet = pq.ParquetFile(path, pre_buffer=False, buffer_size=_PARQUET_BUFFER_BYTES)
        columns = parquet.schema_arrow.names
    except (pa.ArrowException, OSError) as e:
        acc.reject(f"{acc.cfg.name}/{rel}", "read.bad_parquet", f"{rel}: not a readable Parquet file ({e})")
        return
    with parquet:
        if acc.cfg.text_field not in columns:
            raise SourceError(f"{path}: no column text_field={acc.cfg.text_field!r}; it has {columns}; set text_field")
        url_field = acc.cfg.url_field
        if url_field and url_field not in columns:
            raise SourceError(f"source {acc.cfg.name!r}: {path}: no column url_field={url_field!r}; it has {columns}; "
                              "set url_field or remove it")
        acc.url_field_seen = acc.url_field_seen or bool(url_field)
        read = list(dict.fromkeys([acc.cfg.text_field, *([url_field] if url_field else [])]))
        i = 0
        try:
            # row group by row group, so that a damaged one loses no row of the group before it
            batches = (batch for group in range(parquet.num_row_groups)
                       for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, row_groups=[group],
                                                         columns=read, use_threads=False))
            for batch in batches:
                urls = batch.column(url_field).to_pylist() if url_field else repeat(None)
                for value, url in zip(batch.column(acc.cfg.text_field).to_pylist(), urls):
                    if acc.full():
                        return
                    doc_id = f"{acc.cfg.name}/{rel}#{i}"
                    num_bytes = text_bytes(value) if isinstance(value, str) else 0
                    if num_bytes > acc.cfg.max_file_bytes:
                        acc.reject(doc_id, "read.too_large", f"{rel} row {i}: {num_bytes:,} bytes, over "
                                                             f"max_file_bytes={acc.cfg.max_file_bytes:,}")
                    elif isinstance(value, str):
                        acc.doc(doc_id, rel, scrub(value), "text", acc.url(url) if url_field else None)
                    else:
                        acc.reject(doc_id, "read.missing_field",
                                   f"{rel} row {i}: {acc.cfg.text_field!r} is {type(value).__name__}")
                    i += 1
        except (pa.ArrowException, OSError) as e:
            rest = f"; rows from {i:,} on are not read" if i else ""
            acc.reject(f"{acc.cfg.name}/{rel}", "read.bad_parquet",
                       f"{rel}: column {acc.cfg.text_field!r} unreadable ({e}){rest}")
