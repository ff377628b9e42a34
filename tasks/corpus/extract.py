"""Cheap first stages: main-text extraction from HTML, Unicode repair, whitespace normalisation (docs/methods.md §7).

Extraction is trafilatura's main-content extractor (navigation, footers and sidebars dropped); repair is ftfy,
which undoes UTF-8 read as cp1252 ("â€", "Ã", "Â" mojibake) and similar damage.
"""

import logging
import re
from concurrent.futures import ProcessPoolExecutor

import ftfy
import trafilatura

# Keep curly quotes, full-width CJK punctuation and ligatures as written: they are not damage.
_FTFY = ftfy.TextFixerConfig(uncurl_quotes=False, fix_character_width=False, fix_latin_ligatures=False,
                             explain=True)
_SPACE_RE = re.compile(r"\s+")
_BLANK_LINES_RE = re.compile(r"\n{3,}")
logging.getLogger("trafilatura").setLevel(logging.ERROR)  # it logs every empty page at WARNING


def extract_html(html: str) -> str | None:
    """Main text of an HTML page, paragraphs separated by newlines; None when nothing usable is found."""
    text = trafilatura.extract(html, include_comments=False, include_tables=True, include_images=False,
                               deduplicate=False, favor_recall=True, fast=True)
    return text or None


def extract_many(pages: list[str], workers: int = 1) -> list[str | None]:
    """``extract_html`` over ``pages`` in order, with a process pool when ``workers > 1``."""
    if workers <= 1 or len(pages) < 2 * workers:
        return [extract_html(p) for p in pages]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(extract_html, pages, chunksize=max(1, len(pages) // (8 * workers))))


def repair(text: str) -> tuple[str, str]:
    """Fix mis-decoded Unicode with ftfy; returns (text, fix names joined by ",", or "" when unchanged)."""
    if text.isascii():  # mojibake needs non-ASCII characters; skipping saves most of the stage's time
        return text, ""
    fixed, explanation = ftfy.fix_and_explain(text, config=_FTFY)
    if fixed == text or not explanation:
        return fixed, ""
    return fixed, ",".join(dict.fromkeys(f"{op}:{name}" for op, name in explanation))


def tidy(text: str) -> str:
    """Strip trailing spaces per line and squeeze runs of blank lines to one (keeps paragraph structure)."""
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return _BLANK_LINES_RE.sub("\n\n", "\n".join(lines)).strip()


def one_line(text: str) -> str:
    """Whitespace collapsed to single spaces: the form language ID and exact dedup see."""
    return _SPACE_RE.sub(" ", text).strip()
