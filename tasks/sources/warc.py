"""HTML pages out of WARC files (ISO 28500; Common Crawl ``*.warc.gz``), read with warcio.

Only ``response`` records whose HTTP status is 2xx and whose ``Content-Type`` is HTML become pages; every other
record is skipped and counted by kind. HTTP transfer and content encodings (chunked, gzip, ...) are undone;
the page bytes are decoded later with the HTTP header's charset (``tasks.sources.encoding``).

Offsets are byte offsets of a record's start in the file as stored (for ``.warc.gz``, in the compressed file,
as Common Crawl's index gives them). A damaged file never raises: iteration stops at the first record that is
shorter than its ``Content-Length`` or that warcio cannot parse, and reports that record's offset.

The file is streamed: warcio reads it through a small buffer, one record at a time, and a record's bytes are
released before the next one is read. Only a page body is held whole, and only up to ``max_body_bytes``; the
content of every other record is read and dropped in 64 KiB pieces.
"""

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from warcio.archiveiterator import ArchiveIterator

HTML_TYPES = ("text/html", "application/xhtml+xml")
_CHUNK_BYTES = 1 << 16


class WarcPage(NamedTuple):
    """One HTML response: record offset, ``WARC-Record-ID`` (``urn:uuid:...``, or None), target URL (or None),
    HTTP ``Content-Type`` header value and the page bytes."""

    offset: int
    record_id: str | None
    url: str | None
    http_content_type: str | None
    body: bytes


class WarcSkip(NamedTuple):
    """A record that is not an HTML page; ``kind`` is ``not_response``, ``http_status`` or ``not_html``."""

    kind: str


class WarcProblem(NamedTuple):
    """A record that could not be read. ``rule`` ``read.warc_bad_record`` (a body that cannot be decoded) and
    ``read.too_large`` (a page body over the limit) lose that record only;
    ``read.warc_truncated`` (the file ends inside the record) and ``read.warc_broken`` (warcio cannot parse it:
    truncated headers, damaged bytes, not a WARC file) end the file: records from ``offset`` on are not read."""

    offset: int
    rule: str
    detail: str


def is_warc(path: Path) -> bool:
    """True for ``*.warc`` and ``*.warc.gz`` file names (any case)."""
    return path.name.lower().endswith((".warc", ".warc.gz"))


def iter_warc(path: Path, max_body_bytes: int | None = None) -> Iterator[WarcPage | WarcSkip | WarcProblem]:
    """Pages, skips and problems of one WARC file in file order; a ``WarcProblem`` other than
    ``read.warc_bad_record`` and ``read.too_large`` is the last item. A page whose decoded HTTP body is longer
    than ``max_body_bytes`` (None: no limit) is a ``read.too_large`` problem, read no further than the limit.
    Never raises for damaged content (only ``OSError`` opening ``path``)."""
    with open(path, "rb") as fh:
        archive = ArchiveIterator(fh)
        records = iter(archive)
        end = 0  # where the last complete record ended: everything before it was read
        while True:
            try:
                record = next(records, None)
                if record is None:
                    break
                item, missing = _item(record, max_body_bytes), _drain(record.raw_stream)
                offset, length = archive.get_record_offset(), archive.get_record_length()
            except Exception as e:  # noqa: BLE001 — warcio raises many types on damaged bytes; reported below
                message = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")[:300]
                yield WarcProblem(end, "read.warc_broken", f"record at byte offset {end:,} is truncated or damaged "
                                  f"({type(e).__name__}: {message}); it and any records after it are not read")
                return
            problem = _short(record, offset, missing)
            if problem is not None:
                yield problem
                return
            end = offset + length
            if isinstance(item, WarcProblem):
                item = WarcProblem(offset, item.rule, f"record at byte offset {offset:,}: {item.detail}")
            yield item if isinstance(item, WarcSkip) else item._replace(offset=offset)
        problem = _trailing_bytes(fh, end, os.path.getsize(path))
        if problem is not None:
            yield problem


def _short(record, offset: int, missing: int) -> WarcProblem | None:
    """A problem when the record lacks its Content-Length header or some of the bytes it announces."""
    if record.length is None:  # mandatory (ISO 28500 §5.1): the headers themselves were cut off
        return WarcProblem(offset, "read.warc_truncated",
                           f"record at byte offset {offset:,} has no Content-Length header: the file ends inside "
                           "its headers or is not a WARC file; it is not read")
    if missing:
        return WarcProblem(offset, "read.warc_truncated",
                           f"record at byte offset {offset:,} is truncated: {missing:,} of its {record.length:,} "
                           "content bytes are missing; it and any records after it are not read")
    return None


def _item(record, max_body_bytes: int | None) -> WarcPage | WarcSkip | WarcProblem:
    """The record as a page (offset 0, set by the caller), a skip, or a per-record problem."""
    if record.rec_type != "response" or record.http_headers is None:
        return WarcSkip("not_response")
    http = record.http_headers
    content_type = http.get_header("Content-Type")
    if not (http.get_statuscode() or "").startswith("2"):
        return WarcSkip("http_status")
    if (content_type or "").split(";")[0].strip().lower() not in HTML_TYPES:
        return WarcSkip("not_html")
    try:
        body = _read_at_most(record.content_stream(), max_body_bytes)
    except Exception as e:  # noqa: BLE001 — a bad gzip/brotli/chunked body loses this page, not the file
        return WarcProblem(0, "read.warc_bad_record", f"HTTP body not decodable ({type(e).__name__}: {e})")
    if body is None:
        return WarcProblem(0, "read.too_large", f"the HTML body is over max_file_bytes={max_body_bytes:,} bytes; "
                                                "the page is not read (raise max_file_bytes to keep it)")
    record_id = (record.rec_headers.get_header("WARC-Record-ID") or "").strip("<> ") or None
    return WarcPage(0, record_id, record.rec_headers.get_header("WARC-Target-URI"), content_type, body)


def _read_at_most(stream, limit: int | None) -> bytes | None:
    """All of ``stream``, or None once it gives more than ``limit`` bytes (then at most ``limit + 1`` are read)."""
    if limit is None:
        return stream.read()
    pieces, size = [], 0
    while size <= limit and (piece := stream.read(min(_CHUNK_BYTES, limit + 1 - size))):
        pieces.append(piece)
        size += len(piece)
    return b"".join(pieces) if size <= limit else None


def _drain(stream) -> int:
    """Read the rest of a record's content; returns how many of its ``Content-Length`` bytes were missing.

    warcio does not report a short record: its length-limited reader stops at end of file with ``limit`` > 0
    (no ``limit`` when the record has no ``Content-Length``).
    """
    while stream.read(_CHUNK_BYTES):
        pass
    return getattr(stream, "limit", 0)


def _trailing_bytes(fh, end: int, size: int) -> WarcProblem | None:
    """A problem when non-blank bytes follow the last complete record (a record cut inside its headers, which
    warcio takes for the end of the file). The blank lines that separate uncompressed records are skipped."""
    fh.seek(end)
    while chunk := fh.read(_CHUNK_BYTES):
        blank = len(chunk) - len(chunk.lstrip(b"\r\n"))
        if blank < len(chunk):
            start = end + blank
            return WarcProblem(start, "read.warc_truncated",
                               f"record at byte offset {start:,} is truncated: the file ends {size - start:,} bytes "
                               "into it, before a complete record; it is not read")
        end += len(chunk)
    return None
