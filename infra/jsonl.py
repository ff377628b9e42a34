"""Lines of a JSON Lines text, split the way the format defines them.

JSON Lines (https://jsonlines.org) ends every record with ``\\n``; a ``\\r`` before it is allowed and dropped.
``str.splitlines`` would also break at U+2028, U+2029, U+0085, ``\\v``, ``\\f`` and ``\\x1c``-``\\x1e``, which
JSON allows raw inside strings (``json.dumps(..., ensure_ascii=False)`` writes U+2028 unescaped), so a valid
record would be cut into pieces that are each bad JSON.
"""

from __future__ import annotations

from collections.abc import Iterator


def jsonl_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(line number from 1, line)`` for each ``\\n``-terminated line of ``text``, without its ``\\r\\n``/``\\n``.

    A final line without ``\\n`` is yielded too; the empty piece after a closing ``\\n`` is not.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, 1):
        yield number, line.removesuffix("\r")
