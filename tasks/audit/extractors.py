"""Both HTML main-text extractors on the same pages (docs/methods.md §7 "Extraction and repair"): what each keeps,
what only one of them keeps, and how long each takes.

Per source, on a seeded sample of its HTML pages, every page goes through ``tasks.corpus.extract.EXTRACTORS`` (each
output tidied as the corpus build's extract stage tidies it), in the same process and the same run. A page's lines
are its output's distinct non-empty lines with whitespace collapsed and a leading list marker cut (trafilatura
writes "- ", resiliparse "• ": formatting, not content); the line overlap of extractor A is
Σ_pages |lines_A ∩ lines_B| / Σ_pages |lines_A|, the share of A's lines that B also kept on the same page.
Times are wall-clock seconds of the extractor calls alone (``time.perf_counter``), after one untimed call of each
extractor; the two take turns going first from page to page, so neither always runs on a warm cache.
"""

from __future__ import annotations

import math
import random
import re
import time
from dataclasses import dataclass

import pandas as pd

from tasks.corpus.extract import EXTRACTORS, one_line, tidy

COMPARISON_COLUMNS = ["source", "extractor", "other", "pages", "input_mb", "pages_without_text", "chars_kept",
                      "lines_kept", "lines_in_other", "line_overlap", "seconds", "seconds_per_mb"]
EXAMPLE_COLUMNS = ["source", "extractor", "doc_id", "line"]
EXAMPLE_CHARS = 200
_LIST_MARKER_RE = re.compile(r"^[-•*·◦▪‣]\s+")


@dataclass
class ExtractorComparison:
    """``table``: one row per extractor (``COMPARISON_COLUMNS``); ``examples``: lines only that extractor kept
    (``EXAMPLE_COLUMNS``, at most ``EXAMPLE_CHARS`` characters each)."""

    table: pd.DataFrame
    examples: pd.DataFrame


def sample_pages(docs: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    """Up to ``n`` HTML documents of ``docs`` (columns doc_id, content, content_type), drawn at random with
    ``seed`` and returned in their input order with columns doc_id, content."""
    html = docs[docs["content_type"] == "html"].reset_index(drop=True)
    chosen = sorted(random.Random(seed).sample(range(len(html)), min(n, len(html))))
    return html.iloc[chosen][["doc_id", "content"]].reset_index(drop=True)


def page_lines(text: str | None) -> set[str]:
    """Distinct non-empty lines of an extractor's tidied output, whitespace collapsed and a leading list marker
    cut; empty for None."""
    if not text:
        return set()
    return {line for line in (_LIST_MARKER_RE.sub("", one_line(raw)) for raw in text.split("\n")) if line}


def compare_extractors(pages: pd.DataFrame, source: str, examples: int = 5, seed: int = 0) -> ExtractorComparison:
    """Run every extractor of ``EXTRACTORS`` over ``pages`` (doc_id, content: decoded HTML) and compare them.

    Columns of the table: ``pages``; ``input_mb``, UTF-8 megabytes (10^6 bytes) of HTML; ``pages_without_text``,
    pages where the extractor returned nothing or only whitespace; ``chars_kept``, characters of tidied text;
    ``lines_kept`` and ``lines_in_other``, Σ over pages of its distinct lines and of those the other extractor also
    kept; ``line_overlap`` = lines_in_other / lines_kept (NaN without lines); ``seconds`` of extraction and
    ``seconds_per_mb`` = seconds / input_mb (NaN without input). ``examples`` lines per extractor that only it kept
    are drawn with ``seed``. No pages give an empty comparison.

    Raises:
        ValueError: ``EXTRACTORS`` does not hold exactly two extractors (the overlap is between a pair).
    """
    names = list(EXTRACTORS)
    if len(names) != 2:
        raise ValueError(f"the comparison needs two extractors, EXTRACTORS has {names}")
    if pages.empty:
        return ExtractorComparison(pd.DataFrame(columns=COMPARISON_COLUMNS), pd.DataFrame(columns=EXAMPLE_COLUMNS))
    contents = pages["content"].tolist()
    for name in names:  # untimed: first calls pay for imports and lazy set-up
        EXTRACTORS[name](contents[0])
    texts: dict[str, list[str]] = {name: [] for name in names}
    seconds = dict.fromkeys(names, 0.0)
    for i, html in enumerate(contents):
        for name in (names if i % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            text = EXTRACTORS[name](html)
            seconds[name] += time.perf_counter() - start
            texts[name].append(tidy(text) if isinstance(text, str) else "")
    lines = {name: [page_lines(t) for t in texts[name]] for name in names}
    input_mb = sum(len(html.encode("utf-8", "surrogatepass")) for html in contents) / 1e6
    rows, only = [], []
    rng = random.Random(seed)
    for name, other in ((names[0], names[1]), (names[1], names[0])):
        kept = sum(map(len, lines[name]))
        shared = sum(len(a & b) for a, b in zip(lines[name], lines[other]))
        rows.append(dict(source=source, extractor=name, other=other, pages=len(contents), input_mb=input_mb,
                         pages_without_text=sum(not t.strip() for t in texts[name]),
                         chars_kept=sum(map(len, texts[name])), lines_kept=kept, lines_in_other=shared,
                         line_overlap=shared / kept if kept else math.nan, seconds=seconds[name],
                         seconds_per_mb=seconds[name] / input_mb if input_mb else math.nan))
        own = [(doc_id, line) for doc_id, a, b in zip(pages["doc_id"], lines[name], lines[other])
               for line in sorted(a - b)]
        only += [dict(source=source, extractor=name, doc_id=doc_id, line=line[:EXAMPLE_CHARS])
                 for doc_id, line in (own[k] for k in sorted(rng.sample(range(len(own)), min(examples, len(own)))))]
    table = pd.DataFrame(rows, columns=COMPARISON_COLUMNS).astype(
        {"pages": "int64", "pages_without_text": "int64", "chars_kept": "int64", "lines_kept": "int64",
         "lines_in_other": "int64"})
    return ExtractorComparison(table, pd.DataFrame(only, columns=EXAMPLE_COLUMNS))
