"""The README a new user reads first: its pipeline diagram names every registered stage, in order, each with a line
of its own; its links lead to files of the repository; and its test command is the one CI runs."""

import re
from pathlib import Path

from flows.registry import stage_names

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_pipeline_diagram_names_every_stage_in_order():
    section = README.split("\n## The pipeline\n", 1)[1].split("\n## ", 1)[0]
    diagram = re.search(r"```\n(.*?)```", section, re.S).group(1)
    chain, described = diagram.split("\n\n", 1)
    assert tuple(re.findall(r"[a-z_]+", chain)) == stage_names()
    assert tuple(re.findall(r"^ ([a-z_]+) ", described, re.M)) == stage_names()


def test_every_relative_link_of_the_readme_leads_to_a_file():
    targets = [t.split("#", 1)[0] for t in re.findall(r"\]\(([^)\s]+)\)", README) if "://" not in t]
    assert targets and not [t for t in targets if not (ROOT / t).is_file()]


def test_the_test_command_is_the_one_ci_runs():
    assert "```\nmake test\n```" in README
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("make test")
