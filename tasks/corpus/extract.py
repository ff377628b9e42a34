"""Cheap first stages: main-text extraction from HTML, Unicode repair, whitespace normalisation (docs/methods.md §7).

Extraction drops navigation, footers and sidebars with one of two main-content extractors, chosen by
``[corpus] extractor``: trafilatura (Barbaresi 2021; the default), or resiliparse's rule-based HTML2Text on its
Lexbor DOM (Bevendorff et al. 2018), about ten times faster on the smoke fixtures' pages (``pretrain audit``
measures both). Repair is ftfy, which undoes UTF-8 read as cp1252 ("â€", "Ã", "Â" mojibake) and similar damage.
"""

import logging
import re
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import ftfy
import trafilatura
from resiliparse.extract.html2text import extract_plain_text
from resiliparse.parse.html import HTMLParserException, HTMLTree

# Keep curly quotes, full-width CJK punctuation and ligatures as written: they are not damage.
_FTFY = ftfy.TextFixerConfig(uncurl_quotes=False, fix_character_width=False, fix_latin_ligatures=False,
                             explain=True)
_SPACE_RE = re.compile(r"\s+")
# The ASCII characters one of ftfy's fixes acts on: "&" (HTML entities), "\r" (line breaks), ESC (terminal
# escapes) and the other C0 controls but \t \n \f, and DEL (ftfy.chardata.CONTROL_CHARS). ftfy leaves an ASCII
# text without any of them as it is, so ``repair`` skips it there: the same result, most of the stage's time saved.
_ASCII_FIXABLE_RE = re.compile(r"[&\r\x00-\x08\x0b\x0e-\x1f\x7f]")
_BLANK_LINES_RE = re.compile(r"\n{3,}")
logging.getLogger("trafilatura").setLevel(logging.ERROR)  # it logs every empty page at WARNING


def extract_trafilatura(html: str) -> str | None:
    """trafilatura's main text of an HTML page, paragraphs separated by newlines; None when nothing usable is found."""
    text = trafilatura.extract(html, include_comments=False, include_tables=True, include_images=False,
                               deduplicate=False, favor_recall=True, fast=True)
    return text or None


def extract_resiliparse(html: str) -> str | None:
    """resiliparse's main text of an HTML page (``extract_plain_text(main_content=True)`` on an ``HTMLTree``),
    block elements on their own lines; None when nothing is found or the page cannot be parsed.

    Comment sections and image alt texts are left out, as with ``extract_trafilatura``."""
    try:
        tree = HTMLTree.parse(html)
        text = extract_plain_text(tree, main_content=True, preserve_formatting=True, alt_texts=False,
                                  comments=False)
    except HTMLParserException:
        return None
    return text or None


EXTRACTORS: dict[str, Callable[[str], str | None]] = {"trafilatura": extract_trafilatura,
                                                      "resiliparse": extract_resiliparse}


def extract_html(html: str, extractor: str = "trafilatura") -> str | None:
    """Main text of an HTML page with ``extractor`` (a key of ``EXTRACTORS``); None when nothing usable is found.

    Raises:
        KeyError: ``extractor`` is not one of ``EXTRACTORS``.
    """
    return EXTRACTORS[extractor](html)


def extract_many(pages: list[str], workers: int = 1, extractor: str = "trafilatura") -> list[str | None]:
    """``extract_html`` with ``extractor`` over ``pages`` in order, with a process pool when ``workers > 1``."""
    extract = EXTRACTORS[extractor]
    if workers <= 1 or len(pages) < 2 * workers:
        return [extract(p) for p in pages]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(extract, pages, chunksize=max(1, len(pages) // (8 * workers))))


def repair(text: str) -> tuple[str, str]:
    """Fix mis-decoded Unicode with ftfy, and remove control characters and terminal escapes, in every document
    alike; returns (text, fix names joined by ",", or "" when unchanged)."""
    if text.isascii() and not _ASCII_FIXABLE_RE.search(text):
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
