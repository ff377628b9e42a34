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
        line = next(line for line in _help(*command).splitlines() if line.strip().startswith("CONFIG"))
        assert "TOML" in line, command



def test_options_name_their_value_not_a_python_type():
    text = _help("run")
    assert "<str>" not in text and "<list[str]>" not in text and "<int>" not in text
    assert "--runs-dir DIR" in text and "--refresh STAGE" in text and "(repeatable)" in text
    for command in [("run",), ("serve",), ("audit",), ("eval",), ("generate",), ("lsh-design",), ("gate", "show")]:
        flags = [line.split("  ")[1] for line in _help(*command).split("Options:")[1].splitlines()
                 if line.startswith("  -")]
        assert flags and not any("<" in flag for flag in flags), command


def test_usage_names_arguments_without_braces():
    assert "run [OPTIONS] CONFIG\n" in _help("run")
    assert "{" not in _help("export").splitlines()[0]


def test_until_lists_every_stage():
    from flows.registry import stage_names

    text = " ".join(_help("run").split())
    for name in stage_names():
        assert name in text.split("stop after this stage:")[1], name


def test_commands_have_whole_one_line_descriptions():
    text = _help()
    commands = text.split("Commands:")[1].strip().splitlines()
    assert "..." not in text.split("Commands:")[1]
    assert all(line.split(maxsplit=1)[1][0].isupper() for line in commands if line.startswith("  ") and
               not line.startswith("    ")), commands
    assert "show" in _help("gate").split("Commands:")[0]


def test_h_is_help_and_version_prints_the_installed_version():
    from importlib.metadata import version

    assert CliRunner().invoke(app, ["-h"]).output == _help()
    assert CliRunner().invoke(app, ["run", "-h"]).exit_code == 0
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"pretrain {version('pretrain')}"


def test_a_misspelt_stage_fails_before_the_config_is_read(monkeypatch, tmp_path):
    """--until and --refresh names are checked before the config's imports: a typo fails with the did-you-mean,
    exit 2, and nothing is read or created."""
    import flows.cli as cli

    def never(path):
        raise AssertionError("the config was read before the stage names were checked")

    monkeypatch.setattr(cli, "load_config", never)
    for args in (["--until", "tokenzier"], ["--refresh", "corpsu"], ["--until", "corpus", "--refresh", "main"]):
        result = CliRunner().invoke(cli.app, ["run", "configs/smoke.toml", "--runs-dir", str(tmp_path / "runs"),
                                              *args])
        assert result.exit_code == 2, result.output
        assert result.output.startswith("error: ConfigError: --"), result.output
    assert "did you mean 'tokenizer'" in CliRunner().invoke(
        cli.app, ["run", "configs/smoke.toml", "--until", "tokenzier"]).output
    assert not (tmp_path / "runs").exists()
