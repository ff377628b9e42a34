"""Lines of a JSON Lines text, split the way the format defines them.

JSON Lines (https://jsonlines.org) ends every record with ``\\n``; a ``\\r`` before it is allowed and dropped.
``str.splitlines`` would also break at U+2028, U+2029, U+0085, ``\\v``, ``\\f`` and ``\\x1c``-``\\x1e``, which
JSON allows raw inside strings (``json.dumps(..., ensure_ascii=False)`` writes U+2028 unescaped), so a valid
record would be cut into pieces that are each bad JSON. In UTF-8 the byte ``0x0A`` only ever encodes ``\\n``
(every byte of a multi-byte character is ``>= 0x80``), so splitting the bytes at ``\\n`` splits the text the same
way and a file can be read one line at a time (``jsonl_file_lines``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

_SKIP_BYTES = 1 << 20  # piece size when dropping the rest of an over-long line


class JsonlLine(NamedTuple):
    """One line of a binary JSON Lines stream: ``number`` (from 1), ``raw`` (its bytes without ``\\r\\n``/``\\n``;
    None when longer than the limit, then dropped unread) and ``num_bytes`` (its length without the line end)."""

    number: int
    raw: bytes | None
    num_bytes: int


def jsonl_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(line number from 1, line)`` for each ``\\n``-terminated line of ``text``, without its ``\\r\\n``/``\\n``.

    A final line without ``\\n`` is yielded too; the empty piece after a closing ``\\n`` is not.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, 1):
        yield number, line.removesuffix("\r")


def jsonl_file_lines(fh: BinaryIO, max_line_bytes: int) -> Iterator[JsonlLine]:
    """The lines of binary stream ``fh`` as ``jsonl_lines`` splits its decoded text, one line in memory at a time.

    Memory stays below about ``max_line_bytes`` whatever the stream's size: a line longer than that is read and
    dropped in 1 MiB pieces and yielded with ``raw=None``, so the caller can reject it by number.
    """
    number = 0
    while line := fh.readline(max_line_bytes + 2):  # room for the content, "\r" and "\n"
        number += 1
        size = len(line)
        if not line.endswith(b"\n") and size == max_line_bytes + 2:  # the line goes on: drop the rest
            while not line.endswith(b"\n") and (line := fh.readline(_SKIP_BYTES)):
                size += len(line)
            yield JsonlLine(number, None, size - _ending(line))
            continue
        raw = line.removesuffix(b"\n").removesuffix(b"\r")
        yield JsonlLine(number, raw if len(raw) <= max_line_bytes else None, len(raw))


def _ending(last_piece: bytes) -> int:
    """Bytes of the line end (``\\r\\n``, ``\\n`` or none) at the end of a line's last piece."""
    return 2 if last_piece.endswith(b"\r\n") else 1 if last_piece.endswith(b"\n") else 0
