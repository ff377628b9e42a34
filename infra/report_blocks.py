"""The pieces a stage's summary and report sections are built from, and the formatting they share.

A report is a list of blocks (``Heading``, ``Text``, ``TableBlock``, ``Figure``) that the orchestration layer
renders as rich tables in the terminal, Markdown and HTML. The end-of-run console summary is a list of rich
renderables: strings with rich markup, and tables built by ``rich_table``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import pandas as pd
from rich.table import Table


@dataclass
class Heading:
    """A section heading (Markdown ``##``, a rule in the terminal)."""

    text: str


@dataclass
class Text:
    """A paragraph of Markdown (``**bold**`` and ``code`` spans; plain in the terminal)."""

    text: str


@dataclass
class TableBlock:
    """A titled table; floats are shown with four decimals (``fmt_value``)."""

    title: str
    frame: pd.DataFrame


@dataclass
class Figure:
    """A PNG file and its caption."""

    path: Path
    caption: str


Block = Union[Heading, Text, TableBlock, Figure]


def fmt_value(value: Any, floats: str) -> str:
    """One table cell: floats through the format string ``floats`` (scientific below 0.01 in magnitude), integers
    with thousands separators, anything else as ``str``."""
    if isinstance(value, float):
        return floats.format(value) if abs(value) >= 1e-2 or value == 0 else f"{value:.1e}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def rich_table(title: str, frame: pd.DataFrame, floats: str = "{:.3f}", overflow: str = "ellipsis",
               whole: tuple[str, ...] = (), width: int | None = None) -> Table:
    """``frame`` as a rich table titled ``title``: numeric columns right-aligned, cells through ``fmt_value``;
    ``overflow="fold"`` breaks a cell too long for its column onto the next line instead of cutting it, and the
    columns named in ``whole`` are as wide as their longest cell (names stay on one line while the others wrap)
    when together they fit in ``width`` characters (None: no limit), else they fold too."""
    table = Table(title=title, title_justify="left", show_lines=False)
    widest = {c: max([len(str(c))] + [len(str(v)) for v in frame[c]]) for c in frame.columns if c in whole}
    if width is not None and sum(widest.values()) + 3 * len(frame.columns) + 1 > width:
        widest = {}  # the whole columns alone would not fit: fold them like the rest
    for column in frame.columns:
        table.add_column(str(column), justify="right" if frame[column].dtype.kind in "if" else "left",
                         overflow=overflow, min_width=widest.get(column))
    for row in frame.itertuples(index=False):
        table.add_row(*[fmt_value(v, floats) for v in row])
    return table
