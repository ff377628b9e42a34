"""benchmarks/output_gaps.py measures what it says: the longest silence of a command's redirected output and the
lines other libraries' loggers and Python warnings print."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import output_gaps  # noqa: E402

SCRIPT = """
import logging, sys, time, warnings
print("[1/2] sources: started", flush=True)
time.sleep(1.5)
print("12:00:01.123 | INFO    | prefect.flow_runs - Beginning flow run", flush=True)
logging.basicConfig()
logging.getLogger("optuna").warning("trial finished")
warnings.warn("deprecated")
print("[2/2] done", flush=True)
"""


def test_reports_the_longest_gap_and_each_library_line(tmp_path, capsys):
    log = tmp_path / "out.tsv"
    rc = output_gaps.main(["--log", str(log), "--max-gap-s", "1.0", "--", sys.executable, "-c", SCRIPT])
    out = capsys.readouterr().out
    assert rc == 1  # the 1.5 s silence is longer than --max-gap-s
    longest = float(out.split("longest gaps between lines (s): ")[1].split(",")[0])
    assert 1.5 <= longest < 10
    assert "after '[1/2] sources: started'" in out.split("longest gaps")[1].splitlines()[1]
    assert "lines from other libraries' loggers or warnings: 3" in out
    stamped = [line.split("\t", 1) for line in log.read_text().splitlines()]
    assert [line for _, line in stamped][0] == "[1/2] sources: started"
    assert [float(t) for t, _ in stamped] == sorted(float(t) for t, _ in stamped)


def test_a_quiet_regular_command_passes_and_its_failure_is_its_own(capsys):
    assert output_gaps.main(["--max-gap-s", "30", "--", sys.executable, "-c", "print('[1/1] ok')"]) == 0
    assert "lines from other libraries' loggers or warnings: 0" in capsys.readouterr().out
    assert output_gaps.main(["--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
