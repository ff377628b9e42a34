"""``pretrain run`` on a config whose quality classifier narrows the corpus: the budget error is printed once, a
line per group over budget with a few short examples and the advice once, and the exit code is 2."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib

import pytest

from conftest import ROOT

pytestmark = pytest.mark.e2e


def test_the_budget_error_is_printed_once_and_readable(tmp_path):
    smoke = (ROOT / "configs" / "smoke.toml").read_text()
    examples = ('positive.sources = ["handbook_en", "handbook_zh", "fortunes_en", "fortunes_zh", "python_doc"]\n'
                "negative.junk = 20\n")
    assert examples in smoke
    config = tmp_path / "narrow.toml"  # the handbook alone against a sample of the rest
    config.write_text(smoke.replace(examples, 'positive.sources = ["handbook_en"]\nnegative.corpus_sample = true\n'))
    assert tomllib.loads(config.read_text())["corpus"]["quality_model"]["positive"] == {"sources": ["handbook_en"]}
    env = {**os.environ, "PRETRAIN_RUNS_DIR": str(tmp_path / "runs"), "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(config), "--until", "corpus"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    printed = proc.stdout + proc.stderr
    assert proc.returncode == 2, printed[-4000:]
    assert printed.count("expectation suite 'quality_model_budget' failed") == 1, printed[-8000:]
    message = proc.stdout[proc.stdout.index("error: DataError: expectation suite 'quality_model_budget'"):]
    lines = message.strip().splitlines()
    groups = [line for line in lines if re.match(r"  (source|language) '\w+': removed [\d,]+ of [\d,]+ scored "
                                                 r"documents \(\d+\.\d%\), budget \d+%$", line)]
    assert {"  source 'fortunes_zh'", "  language 'zh'"} <= {line.split(":")[0] for line in groups}
    assert max(len(line) for line in lines[:-1]) < 220 and len(message) < 6000
    assert message.count("accept_narrowing") == 1 and lines[-1].startswith("Review them.")
