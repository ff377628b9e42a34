"""Turn a source's files into a table of documents, with a reject row for every input that could not be one.

Formats (``SourceConfig.format``; ``auto`` picks by extension: .html/.htm → html, .warc/.warc.gz → warc,
.jsonl → jsonl, .parquet → parquet, anything else → text):

- html: one document per file, raw markup kept (``content_type="html"``) for the corpus extractor; decoded by
  BOM, UTF-8, declared charset, detection (``tasks.sources.encoding.decode_html``).
- warc: one HTML document per 2xx HTML ``response`` record (``tasks.sources.warc``), decoded as html with the HTTP
  header's charset; other records are counted in ``SourceDocs.skipped``; a truncated or unparseable record ends
  its file with one reject row naming the file and the record's byte offset.
- text: one document per file, UTF-8 (a file that is not UTF-8 is rejected).
- fortune: BSD fortune files, one document per entry between lines that are exactly ``%``; ANSI colour escapes
  stripped; ``*.dat`` index files and symlinked duplicates (``*.u8``) skipped.
- jsonl: one document per line, text under ``text_field``; lines end at ``\n`` only (JSON Lines), so U+2028,
  U+2029 or U+0085 written raw inside a JSON string stay in their record (``infra.jsonl``).
- parquet: one document per row of column ``text_field``.

A local source's ``include`` may name a folder (every file under it, hidden ones too, recursively, in sorted
order; symlinked folders are not followed) and archives (``infra.archives.ARCHIVE_SUFFIXES``: .tar, .tar.gz/.tgz,
.tar.xz, .tar.bz2, .zip). An archive is unpacked by the safe extractor (``infra.archives``) into
``<cache_dir>/archives/<SHA-256 of its bytes>/`` once, and its members are read like files in sorted order, with
the format chosen per member; their relative path is ``<archive>!<member>`` (ids ``<source>/<archive>!<member>``,
then ``#<n>`` as for a file). Archives inside an archive are read as files; an archive without files is one
reject row (``read.empty_archive``).

Every document records how its bytes became text (``encoding``, ``encoding_from``: bom/declared/utf8/detected/
fallback) and the damage repaired: ``num_replaced`` (undecodable bytes and lone surrogates → U+FFFD) and
``num_nul_removed`` (NUL characters stripped). Each input unit (file, entry, line, row, WARC record) ends as one
document, one reject row (stage ``"read"``, with a rule and a detail naming the file) or a counted skip.
"""

import glob
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from infra.archives import is_archive, unpack_cached
from infra.errors import SourceError
from infra.jsonl import jsonl_lines
from tasks.sources.config import SourceConfig
from tasks.sources.deb import DebRelease, fetch_deb
from tasks.sources.encoding import Decoded, Rejected, decode_html, scrub
from tasks.sources.warc import WarcPage, WarcProblem, is_warc, iter_warc

DOC_COLUMNS = ["doc_id", "source", "path", "url", "language_hint", "content", "content_type", "encoding",
               "encoding_from", "num_replaced", "num_nul_removed", "licence", "snapshot"]
REJECT_COLUMNS = ["doc_id", "source", "stage", "rule", "value", "threshold", "detail"]
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


@dataclass
class SourceDocs:
    """Documents of one source (``docs``, columns ``DOC_COLUMNS``) and the inputs rejected while reading
    (``rejects``, columns ``REJECT_COLUMNS``, stage ``"read"``). ``notes`` lists recoverable oddities;
    ``skipped`` counts input units that are not documents by kind (WARC ``not_response``, ``http_status``,
    ``not_html`` records)."""

    docs: pd.DataFrame
    rejects: pd.DataFrame
    snapshot: str
    licence: str
    notes: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)


@dataclass
class _Acc:
    """Rows gathered while reading; one ``doc`` or ``reject`` per input unit."""

    cfg: SourceConfig
    docs: list[dict] = field(default_factory=list)
    rejects: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)

    def doc(self, doc_id: str, rel: str, text: Decoded, content_type: str, url: str | None = None) -> None:
        self.docs.append(dict(doc_id=doc_id, source=self.cfg.name, path=rel, url=url, language_hint=self.cfg.language,
                              content=text.text, content_type=content_type, encoding=text.encoding,
                              encoding_from=text.decided_by, num_replaced=text.num_replaced,
                              num_nul_removed=text.num_nul_removed))

    def reject(self, doc_id: str, rule: str, detail: str) -> None:
        self.rejects.append(dict(doc_id=doc_id, source=self.cfg.name, stage="read", rule=rule,
                                 value=float("nan"), threshold=float("nan"), detail=detail))

    def full(self) -> bool:
        return self.cfg.max_docs is not None and len(self.docs) >= self.cfg.max_docs


def read_source(cfg: SourceConfig, cache_dir: Path, release: DebRelease | None = None) -> SourceDocs:
    """Read every file ``cfg.include`` matches into documents.

    ``snapshot`` is the package version (deb) or, for local files, "local-" + the first 12 hex digits of
    ``local_files_digest`` (the matched files' paths, sizes and bytes). Files are read in sorted relative-path
    order, so ``max_docs`` keeps a deterministic prefix. A Debian source fetches ``release`` when given (the one its
    artifact key names), else ``cfg.version`` or the candidate resolved now.

    Raises:
        SourceError: no file matches the patterns, a parquet file lacks ``text_field``, the package cannot
            be fetched (see ``fetch_deb``), or an archive is refused by the safe extractor or cannot be read (the
            message names the source, the archive and any refused member). Damaged content (bad bytes, bad JSON, broken
            Parquet or WARC files) never raises: it becomes reject rows.
        RunsFolderError: a file is in the way of the archive cache under ``cache_dir``.
    """
    if cfg.kind == "deb":
        pkg = fetch_deb(cfg.package, cache_dir, cfg.version, release=release)
        files = match_files(cfg.include, pkg.root)
        snapshot, licence = pkg.version, pkg.licence
    else:
        files = match_files(cfg.include, None)
        snapshot, licence = _local_snapshot(files), "unknown (local files)"
    acc = _Acc(cfg)
    for rel, path in files:
        if acc.full():
            break
        if cfg.kind == "local" and is_archive(path):
            _read_archive(acc, rel, path, Path(cache_dir) / "archives")
        else:
            _read_file(acc, rel, path)
    docs = pd.DataFrame(acc.docs[: cfg.max_docs], columns=DOC_COLUMNS[:-2])
    docs["licence"], docs["snapshot"] = licence, snapshot
    return SourceDocs(docs=docs[DOC_COLUMNS], rejects=pd.DataFrame(acc.rejects, columns=REJECT_COLUMNS),
                      snapshot=snapshot, licence=licence, notes=acc.notes, skipped=acc.skipped)


def match_files(patterns: list[str], root: Path | None) -> list[tuple[str, Path]]:
    """(relative path, path) of matched regular files, sorted, without symlinked duplicates.

    A pattern is a glob (``**`` allowed) or a folder without wildcards, which matches every file under it
    (recursively, hidden files included, symlinked folders not followed). Relative paths start below ``root``
    (deb), else below the pattern's part before its first wildcard (a folder pattern: the folder itself).

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
        raise SourceError(f"no file matches include={patterns!r}{where}; check the patterns (globs, '**' allowed, "
                          "or a folder)")
    return files


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


def _format_of(cfg: SourceConfig, path: Path) -> str:
    if cfg.format != "auto":
        return cfg.format
    if is_warc(path):
        return "warc"
    ext = path.suffix.lower()
    return {".html": "html", ".htm": "html", ".jsonl": "jsonl", ".parquet": "parquet"}.get(ext, "text")


def _read_file(acc: _Acc, rel: str, path: Path) -> None:
    fmt = _format_of(acc.cfg, path)
    doc_id = f"{acc.cfg.name}/{rel}"
    if fmt == "html":
        _add_html(acc, doc_id, rel, decode_html(path.read_bytes()))
    elif fmt == "warc":
        _read_warc(acc, rel, path)
    elif fmt == "parquet":
        _read_parquet(acc, rel, path)
    elif fmt == "fortune" and path.suffix == ".dat":
        return  # strfile index, binary
    else:
        text = _decode_utf8(path.read_bytes(), acc, doc_id, rel)
        if text is None:
            return
        {"text": _read_text, "fortune": _read_fortunes, "jsonl": _read_jsonl}[fmt](acc, rel, text)


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
    seen: set[str] = set()
    for item in iter_warc(path):
        if isinstance(item, WarcProblem):
            acc.reject(f"{acc.cfg.name}/{rel}@{item.offset}", item.rule, f"{rel}: {item.detail}")
        elif isinstance(item, WarcPage):
            key = item.record_id or item.url or f"@{item.offset}"
            key = key if key not in seen else f"{key}@{item.offset}"  # ids repeat only in malformed files
            seen.add(key)
            _add_html(acc, f"{acc.cfg.name}/{rel}#{key}", rel, decode_html(item.body, item.http_content_type),
                      item.url)
            if acc.full():
                return
        else:
            acc.skipped[f"warc.{item.kind}"] = acc.skipped.get(f"warc.{item.kind}", 0) + 1


def _read_text(acc: _Acc, rel: str, text: str) -> None:
    acc.doc(f"{acc.cfg.name}/{rel}", rel, scrub(text), "text")


def _read_fortunes(acc: _Acc, rel: str, text: str) -> None:
    entries = [e.strip("\n") for e in re.split(r"^%\r?$\n?", strip_ansi(text), flags=re.MULTILINE)]
    if entries and not entries[-1].strip():
        entries.pop()  # the piece after the closing '%' is a file-format artefact, not an entry
    # a blank entry between two '%' lines is still a document: the corpus stage removes it with a reason
    for i, entry in enumerate(entries):
        acc.doc(f"{acc.cfg.name}/{rel}#{i}", rel, scrub(entry), "text")


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences, including ones left broken or nested in the source (fortunes-zh has
    ``\x1b[;\x1b[34;1mm``, which becomes a new sequence once the inner one is removed)."""
    while True:
        stripped = _ANSI_RE.sub("", text)
        if stripped == text:
            return stripped.replace("\x1b", "")
        text = stripped


def _read_jsonl(acc: _Acc, rel: str, text: str) -> None:
    field_name = acc.cfg.text_field
    for line_no, line in jsonl_lines(text):
        doc_id = f"{acc.cfg.name}/{rel}#{line_no - 1}"
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            acc.reject(doc_id, "read.bad_json", f"{rel} line {line_no}: {e.msg} at column {e.colno}")
            continue
        value = record.get(field_name) if isinstance(record, dict) else None
        if not isinstance(value, str):
            acc.reject(doc_id, "read.missing_field", f"{rel} line {line_no}: no string field {field_name!r}")
            continue
        acc.doc(doc_id, rel, scrub(value), "text")  # JSON "\ud800" escapes give lone surrogates


def _read_parquet(acc: _Acc, rel: str, path: Path) -> None:
    """Rows of column ``text_field``. A missing column raises (every file of the source would need the same
    fix); a file that is not Parquet at all is one reject row."""
    try:
        columns = pq.read_schema(path).names
    except (pa.ArrowException, OSError) as e:
        acc.reject(f"{acc.cfg.name}/{rel}", "read.bad_parquet", f"{rel}: not a readable Parquet file ({e})")
        return
    if acc.cfg.text_field not in columns:
        raise SourceError(f"{path}: no column text_field={acc.cfg.text_field!r}; it has {columns}; set text_field")
    try:
        values = pq.read_table(path, columns=[acc.cfg.text_field]).column(0).to_pylist()
    except (pa.ArrowException, OSError) as e:
        acc.reject(f"{acc.cfg.name}/{rel}", "read.bad_parquet",
                   f"{rel}: column {acc.cfg.text_field!r} unreadable ({e})")
        return
    for i, value in enumerate(values):
        doc_id = f"{acc.cfg.name}/{rel}#{i}"
        if isinstance(value, str):
            acc.doc(doc_id, rel, scrub(value), "text")
        else:
            acc.reject(doc_id, "read.missing_field",
                       f"{rel} row {i}: {acc.cfg.text_field!r} is {type(value).__name__}")
