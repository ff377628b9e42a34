"""The normal form exact dedup and boilerplate detection hash (docs/methods.md §7): lower-cased, whitespace runs
collapsed. The build (``tasks.corpus.build``) hashes it with xxh3-128 and keeps the first occurrence."""

import re

_SPACE_RE = re.compile(r"\s+")


def normal_form(text: str) -> str:
    """Lower-cased text with every whitespace run collapsed to one space, stripped."""
    return _SPACE_RE.sub(" ", text.lower()).strip()
