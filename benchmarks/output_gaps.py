"""What a command's redirected output looks like over time: the longest silence and any other library's lines.

    python benchmarks/output_gaps.py --log demo-output.tsv -- make demo

Runs the command with stdout and stderr to a pipe (not a terminal, as under ``nohup``, CI or a Prefect worker),
stamps every line with the seconds since the start, and reports:

- the longest gaps between two lines (a log reader sees nothing for that long), with the lines around each;
- lines in the format of another library's logger or of a Python warning (Prefect's ``HH:MM:SS.fff | LEVEL |``,
  Optuna's ``[I date]``, ``logging``'s default ``LEVEL:name:``, ``…Warning:``, tqdm bars), which the platform keeps
  in the run log unless ``--verbose`` (docs/cli.md, "What a run prints").

Exit status: the command's. ``--max-gap-s`` makes it 1 when the longest gap is longer (the command's own failure
wins).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

LIBRARY_LINE = re.compile(
    r"^\s*(\d\d:\d\d:\d\d\.\d+ \| [A-Z]+ +\||"  # Prefect's console handler
    r"\[[IWE] \d{4}-\d\d-\d\d|"  # Optuna's default handler
    r"(DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]+:|"  # logging.basicConfig's default format
    r"\S+:\d+: \w*Warning:|"  # warnings.showwarning
    r".*\d+%\|.*\| \d+/\d+ \[)")  # a tqdm bar


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--log", type=Path, help="write every line as '<seconds>\\t<line>' to this file")
    parser.add_argument("--top", type=int, default=5, help="longest gaps to show")
    parser.add_argument("--max-gap-s", type=float, help="exit 1 when a gap is longer than this many seconds")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    start = time.monotonic()
    stamped: list[tuple[float, str]] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                          bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            stamped.append((time.monotonic() - start, line.rstrip("\n")))
    end = time.monotonic() - start
    if args.log:
        args.log.write_text("".join(f"{t:.1f}\t{line}\n" for t, line in stamped))
    times = [0.0] + [t for t, _ in stamped] + [end]
    gaps = sorted(((times[i + 1] - times[i], i) for i in range(len(times) - 1)), reverse=True)
    print(f"command: {' '.join(command)}  exit {proc.returncode}  wall {end:.0f} s  lines {len(stamped)}")
    print(f"longest gaps between lines (s): {', '.join(f'{g:.1f}' for g, _ in gaps[:args.top])}")
    for gap, i in gaps[:args.top]:
        before = stamped[i - 1][1] if i > 0 else "(start)"
        after = stamped[i][1] if i < len(stamped) else "(end)"
        print(f"  {gap:7.1f} s after {before[:90]!r}\n            until {after[:90]!r}")
    library = [(t, line) for t, line in stamped if LIBRARY_LINE.match(line)]
    print(f"lines from other libraries' loggers or warnings: {len(library)}")
    for t, line in library[:20]:
        print(f"  {t:7.1f} {line[:150]}")
    if proc.returncode:
        return proc.returncode
    return 1 if args.max_gap_s is not None and gaps and gaps[0][0] > args.max_gap_s else 0


if __name__ == "__main__":
    sys.exit(main())
