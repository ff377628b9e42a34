"""The pieces a stage's summary and report sections are built from, and the formatting they share.

A report is a list of blocks (``Heading``, ``Text``, ``TableBlock``, ``Figure``) that the orchestration layer
renders as rich tables in the terminal (``FrameTable``: never a cut cell), Markdown and HTML. The end-of-run console summary is a list of rich
renderables: strings with rich markup, and tables built by ``rich_table``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
import re
from typing import Any, Union

import numpy as np
import pandas as pd
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text as RichText


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


def fmt_value(value: Any, floats: str = "{:.3f}") -> str:
    """One table cell: a missing value (None, NaN) as ``-``, a boolean as yes/no, floats through the format string
    ``floats`` (scientific below 0.01 in magnitude), integers with thousands separators, a list (a token's pieces)
    as its items joined by `` · `` with escaped bytes shown as ``<e8 bd>`` (``piece_text``), anything else as
    ``str``."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return " · ".join(piece_text(str(v)) for v in value)
    if value is None or (isinstance(value, (float, np.floating)) and value != value) or value is pd.NA \
            or value is pd.NaT:
        return "-"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        return floats.format(value) if abs(value) >= 1e-2 or value == 0 else f"{value:.1e}"
    return f"{value:,}" if isinstance(value, (int, np.integer)) else str(value)


_ESCAPED_BYTES = re.compile(r"(?:\\x[0-9a-fA-F]{2})+")


def piece_text(piece: str) -> str:
    """A token's text with its bytes that are only part of a character (escaped ``\\xe8\\xbd`` by
    ``tasks.tokenizer.report``) shown as ``<e8 bd>``; a piece that is whole characters is unchanged."""
    return _ESCAPED_BYTES.sub(lambda m: "<" + " ".join(m.group()[i + 2:i + 4] for i in range(0, len(m.group()), 4))
                              + ">", piece)


def rich_table(title: str, frame: pd.DataFrame, floats: str = "{:.3f}") -> "FrameTable":
    """``frame`` as a table titled ``title`` that fits the width it is printed at without cutting a cell:
    numeric columns right-aligned, cells through ``fmt_value`` (``FrameTable`` says how it fits)."""
    header = [str(c) for c in frame.columns]
    rows = [[fmt_value(v, floats) for v in row] for row in frame.itertuples(index=False)]
    return FrameTable(title, header, rows, [frame[c].dtype.kind in "iuf" for c in frame.columns])


def _longest_word(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


class FrameTable:
    """A rich renderable table that never cuts a header or cell. At the width it is printed at, it is one table
    with every column as wide as its longest cell when that fits; else each column at least as wide as its longest
    word (a name or number stays on one line) and longer text folds onto the next line; else the columns are split
    across several tables, each repeating the leading text columns that name the row; else (a narrow terminal)
    one record per row, a ``field value`` pair a line, when that takes fewer lines than the split."""

    HEADER_FOLD = 12  # a header longer than this (and than its cells' words) may fold: it does not widen a column

    def __init__(self, title: str, header: list[str], rows: list[list[str]], numeric: list[bool]) -> None:
        self.title, self.header, self.rows, self.numeric = title, header, rows, numeric
        cells = list(zip(header, *rows)) if header else []
        self.natural = [max(cell_len(c) for c in column) for column in cells]
        self.least = [min(nat, max(max((_longest_word(c) for c in column[1:]), default=0),
                                   min(_longest_word(column[0]), self.HEADER_FOLD)))
                      for nat, column in zip(self.natural, cells)]

    @property
    def row_count(self) -> int:
        return len(self.rows)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from self.tables(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        full = sum(self.natural) + 3 * len(self.header) + 1
        return Measurement(min(full, options.max_width), min(max(full, cell_len(self.title)), options.max_width))

    def tables(self, width: int) -> list[Table]:
        """The rich tables that show every cell whole within ``width`` columns."""
        every = list(range(len(self.header)))
        if self._fits(every, self.natural, width):
            return [self._table(self.title, every, None)]
        if self._fits(every, self.least, width):
            return [self._table(self.title, every, self._widths(every, width))]
        groups = self._groups(width)
        # Many narrow tables read worse than records: split only when it takes fewer lines (5 a table's frame).
        if groups is None or len(groups) * (len(self.rows) + 5) > len(self.rows) * len(self.header):
            return [self._records(width)]
        return [self._table(self.title if i == 0 else f"{self.title} (continued, {i + 1} of {len(groups)})", group,
                            self._widths(group, width)) for i, group in enumerate(groups)]

    @staticmethod
    def _fits(columns: list[int], widths: list[int], width: int) -> bool:
        return sum(widths[c] for c in columns) + 3 * len(columns) + 1 <= width  # padding 1 + border 1 each side

    def _widths(self, columns: list[int], width: int) -> list[int]:
        """Each column's least width, the room left handed out one character at a time to the columns that would
        use it."""
        widths = [self.least[c] for c in columns]
        room = width - sum(widths) - 3 * len(columns) - 1
        while room > 0 and any(w < self.natural[c] for w, c in zip(widths, columns)):
            for i, c in enumerate(columns):
                if room > 0 and widths[i] < self.natural[c]:
                    widths[i], room = widths[i] + 1, room - 1
        return widths

    def _groups(self, width: int) -> list[list[int]] | None:
        """The columns in tables of the leading text columns (the row's name, in at most 3/5 of the width) plus as
        many others as fit; None when a name and one other column do not fit."""
        keys = [0]
        while len(keys) < len(self.header) - 1 and not self.numeric[len(keys)] \
                and self._fits(keys + [len(keys)], self.least, 3 * width // 5):
            keys.append(len(keys))
        groups: list[list[int]] = []
        for column in range(len(keys), len(self.header)):
            if groups and self._fits(groups[-1] + [column], self.least, width):
                groups[-1].append(column)
            elif self._fits(keys + [column], self.least, width):
                groups.append(keys + [column])
            else:
                return None
        return groups or None

    def _table(self, title: str, columns: list[int], widths: list[int] | None) -> Table:
        table = Table(title=title, title_justify="left", show_lines=False)
        for i, c in enumerate(columns):
            table.add_column(RichText(self.header[c]), justify="right" if self.numeric[c] else "left",
                             overflow="fold", width=None if widths is None else widths[i])
        for row in self.rows:
            table.add_row(*[RichText(row[c]) for c in columns])
        return table

    def _records(self, width: int) -> Table:
        """One record per row: a ``field value`` line per column, a rule between rows; both fold."""
        field = max(1, min(max(cell_len(h) for h in self.header), (width - 7) // 2))
        table = Table(title=self.title, title_justify="left", show_header=False)
        table.add_column(overflow="fold", width=field, style="bold")
        table.add_column(overflow="fold", width=max(1, width - 7 - field))
        for row in self.rows:
            for i, (name, cell) in enumerate(zip(self.header, row)):
                table.add_row(RichText(name), RichText(cell), end_section=i == len(row) - 1)
        return table
