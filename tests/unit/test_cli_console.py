"""The CLI's console: in a log file or pipe no line is wrapped (a long path stays whole), in a terminal rich's
defaults hold (flows/cli.py)."""

import io

from flows.cli import make_console


def test_a_log_file_gets_every_printed_line_whole():
    out = io.StringIO()
    console = make_console(False, file=out)
    path = "runs/artifacts/" + "x" * 200 + "/checkpoint"
    console.print(f"Artifacts:   {path} and then a sentence long enough to pass any width " * 2)
    assert out.getvalue().count("\n") == 1 and path in out.getvalue()
    assert console.width == 160  # tables are laid out wider than rich's 80 columns for a pipe


def test_a_terminal_keeps_richs_wrapping():
    out = io.StringIO()
    make_console(True, file=out, width=40).print("word " * 20)
    assert out.getvalue().count("\n") > 1
