"""`--help` reads as a command line's help should: flags without a value type, docstring paragraphs reflowed to
the terminal, every argument explained (flows/cli.py)."""

from typer.testing import CliRunner

from flows.cli import app


def _help(*command: str) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.output


def test_flags_take_no_value():
    lines = [line for line in _help("run").splitlines() if line.strip().startswith(("--dry-run", "-v, --verbose"))]
    assert len(lines) == 2 and not any("<bool>" in line for line in lines)


def test_docstring_paragraphs_are_reflowed_not_broken_where_the_source_is():
    text = _help("serve")
    paragraph = text[text.index("Without PREFECT_API_URL"):text.index("Arguments:")].strip().splitlines()
    assert len(paragraph) > 2 and all(len(line) >= 60 for line in paragraph[:-1]), paragraph


def test_every_config_argument_says_what_it_is():
    for command in (("gate", "show"), ("gate", "declare"), ("fetch",)):
        line = next(line for line in _help(*command).splitlines() if line.strip().startswith("config"))
        assert "TOML" in line, command

