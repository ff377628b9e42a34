"""Tables of the terminal report, the run summary and ``gate show`` never cut a header, name, number or verdict
(``infra.report_blocks.rich_table``), and cells say ``-`` and yes/no rather than nan, None and 1/0
(``fmt_value``)."""

import io
import re
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
from rich.cells import cell_len
from rich.console import Console

from flows.report import Report, print_report
from infra.report_blocks import TableBlock, fmt_value, piece_text, rich_table

CANDIDATES = ["replay0.1_lr0.0003_domain_heavy", "replay0.3_lr0.0001_domain_light", "base"]
SOURCES = ["fortunes_en", "fortunes_zh", "debian_policy_manual"]


def _wide_frame() -> pd.DataFrame:
    """A frame wider than a terminal: long headers, long names, numbers and verdicts."""
    rows = []
    for i, (name, source) in enumerate(zip(CANDIDATES, SOURCES)):
        rows.append({"candidate": name, "source": source, "width_d_model": 64 * (i + 1), "n_params_non_embedding":
                     123_456 * (i + 1), "tokens_seen": 9_876_543 * (i + 1), "bits_per_byte": 1.2345 + i,
                     "delta_bpb_vs_branch_point": -0.0123 * i, "delta_bpb_vs_main_mixture": 0.5 + i,
                     "general rise (nats)": f"+0.01{i} [-0.020, +0.040]", "decision": "undetermined" if i else "pass"})
    return pd.DataFrame(rows)


def _render(renderable, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, record=True)
    console.print(renderable)
    return console.export_text()


def _column_streams(text: str) -> list[str]:
    """Each table column's text, top to bottom, whitespace removed: a cell folded over several lines is one
    contiguous run of its column's stream."""
    streams: dict[int, str] = defaultdict(str)
    for line in text.splitlines():
        if "│" in line or "┃" in line:
            for i, segment in enumerate(re.split("[│┃]", line)):
                streams[i] += "".join(segment.split())
    return list(streams.values())


def assert_whole(text: str, values: list[str], width: int) -> None:
    assert "…" not in text
    for line in text.splitlines():
        assert cell_len(line.rstrip()) <= width, line
        if line[:1] in "┏┃┡│└":  # a table line keeps its right border
            assert line.rstrip()[-1] in "┓┃┩│┘┤", line
    streams = _column_streams(text)
    for value in values:
        assert any("".join(value.split()) in s for s in streams), value


def _cells(frame: pd.DataFrame) -> list[str]:
    return [str(c) for c in frame.columns] + [fmt_value(v, "{:.3f}") for row in frame.itertuples(index=False)
                                              for v in row]


@pytest.mark.parametrize("width", [160, 100, 60, 40])
def test_no_header_or_cell_is_cut_at_any_width(width):
    frame = _wide_frame()
    assert_whole(_render(rich_table("Decay branches", frame), width), _cells(frame), width)


@pytest.mark.parametrize("width", [100, 60])
def test_the_terminal_report_keeps_every_cell(width):
    frame = _wide_frame()
    console = Console(file=io.StringIO(), width=width, record=True)
    print_report(Report("demo", [], [TableBlock("Per source", frame)]), console)
    assert_whole(console.export_text(), _cells(frame), width)


def test_similar_names_stay_distinct():
    text = _render(rich_table("Sources", _wide_frame()), 160)
    assert "fortunes_en" in text and "fortunes_zh" in text


def test_missing_values_booleans_and_pieces_read_as_words():
    assert fmt_value(float("nan"), "{:.3f}") == "-"
    assert fmt_value(None, "{:.3f}") == "-"
    assert fmt_value(np.float64("nan"), "{:.3f}") == "-"
    assert fmt_value(np.bool_(True), "{:.3f}") == "yes" and fmt_value(False, "{:.3f}") == "no"
    assert fmt_value(np.int64(12345), "{:.3f}") == "12,345"
    assert fmt_value(np.array(["软", "\\xe8\\xbd", "\\xaf", "包"]), "{:.3f}") == "软 · <e8 bd> · <af> · 包"
    assert piece_text("件\\xe5") == "件<e5>"


def test_a_table_of_missing_values_shows_dashes():
    frame = pd.DataFrame({"branch": ["main-decay"], "delta_bpb_vs_main_mixture": [float("nan")],
                          "fitted_optimum": [None], "in_training": [True]})
    text = _render(rich_table("t", frame), 100)
    assert "nan" not in text and "None" not in text and "True" not in text
    assert text.count(" - ") == 2 and "yes" in text
