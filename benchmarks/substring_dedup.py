"""Cost of one partition of exact-substring dedup (``tasks.corpus.substring.repeated_spans``): time and peak memory
against the partition's size, in one command.

    python benchmarks/substring_dedup.py                  # 2, 8 and 32 MB partitions
    python benchmarks/substring_dedup.py --sizes-mb 1 4 --min-len 100

Input: synthetic English-like documents (≈ 2 KB each, words drawn from a Zipf-weighted vocabulary of 5,000 made-up
words, seeded), where one document in ten also carries a copy of a paragraph of an earlier one, so the repeat
path (grouping, merging, alignment) does real work. Each size runs in a fresh child process that reads the
documents from a file, so one size's allocations do not hide another's. Peak memory is the child's resident-set
high-water mark during the call minus its resident set just before (the peak is reset through
``/proc/self/clear_refs`` where Linux allows, else ``ru_maxrss`` is used): the suffix and LCP arrays are ctypes
buffers that ``tracemalloc`` would not see.

Reported per size: wall and CPU seconds, seconds per MB, peak bytes per input byte, spans and bytes cut; and the
slopes between the smallest and largest size: the log-log exponent of wall and CPU time (1 means linear; wall time
on a shared machine also carries the other load, CPU time does not), and the marginal seconds per MB and peak bytes
per input byte (the cost of one more byte, without the fixed part).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MB = 2**20


def make_corpus(n_bytes: int, seed: int = 0) -> list[bytes]:
    """Documents totalling about ``n_bytes`` UTF-8 bytes; one in ten repeats a paragraph of an earlier one."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    weights = [1.0 / (r + 1) for r in range(len(vocab))]
    docs, total, paragraphs = [], 0, []
    while total < n_bytes:
        paras = []
        for _ in range(4):
            words = rng.choices(vocab, weights, k=80)
            paras.append(" ".join(words).capitalize() + ".")
        if paragraphs and rng.random() < 0.1:
            paras.insert(rng.randint(0, len(paras)), rng.choice(paragraphs))
        paragraphs.extend(paras[:1])
        doc = "\n\n".join(paras).encode("utf-8")
        docs.append(doc)
        total += len(doc)
    return docs


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def child(path: str, lengths_path: str, min_len: int) -> None:
    """Run one measurement (in a fresh process) and print its figures as JSON."""
    import numpy as np

    from tasks.corpus.substring import repeated_spans

    data = Path(path).read_bytes()
    ends = np.cumsum(json.loads(Path(lengths_path).read_text()))
    texts = [data[a:b] for a, b in zip(np.concatenate([[0], ends[:-1]]), ends)]
    repeated_spans([b"warm up the import and the library " * 4], 8)
    before = _rss_bytes()
    reset = _reset_hwm()
    start, cpu = time.perf_counter(), time.process_time()
    cuts = repeated_spans(texts, min_len)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = _hwm_bytes() - before
    print(json.dumps({"bytes": len(data), "seconds": seconds, "cpu_seconds": cpu, "peak_bytes": peak,
                      "hwm_reset": reset,
                      "spans": len(cuts), "bytes_cut": int((cuts.end - cuts.start).sum())}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[2, 8, 32])
    parser.add_argument("--min-len", type=int, default=200, help="repeat window in bytes (the config default)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes_mb:
            docs = make_corpus(int(size * MB))
            data, lengths = Path(tmp) / "data.bin", Path(tmp) / "lengths.json"
            data.write_bytes(b"".join(docs))
            lengths.write_text(json.dumps([len(d) for d in docs]))
            out = subprocess.run([sys.executable, __file__, "--child", str(data), str(lengths), str(args.min_len)],
                                 check=True, capture_output=True, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            row["docs"] = len(docs)
            rows.append(row)
            mb = row["bytes"] / MB
            print(f"{mb:7.2f} MB  {row['docs']:6d} docs  {row['seconds']:7.3f} s  {row['seconds'] / mb:6.3f} s/MB  "
                  f"(CPU {row['cpu_seconds'] / mb:6.3f} s/MB)  "
                  f"peak {row['peak_bytes'] / row['bytes']:5.2f} B/B  spans {row['spans']}  "
                  f"cut {row['bytes_cut'] / row['bytes']:.2%}" + ("" if row["hwm_reset"] else "  (ru_maxrss)"))
    lo, hi = rows[0], rows[-1]
    if len(rows) > 1 and hi["bytes"] > lo["bytes"]:
        ratio = math.log(hi["bytes"] / lo["bytes"])
        exponent = math.log(hi["seconds"] / lo["seconds"]) / ratio
        cpu_exponent = math.log(hi["cpu_seconds"] / lo["cpu_seconds"]) / ratio
        extra_mb = (hi["bytes"] - lo["bytes"]) / MB
        marginal_s = (hi["seconds"] - lo["seconds"]) / extra_mb
        marginal_cpu = (hi["cpu_seconds"] - lo["cpu_seconds"]) / extra_mb
        marginal_b = (hi["peak_bytes"] - lo["peak_bytes"]) / (hi["bytes"] - lo["bytes"])
        print(f"slopes {lo['bytes'] / MB:.0f} → {hi['bytes'] / MB:.0f} MB: wall ∝ size^{exponent:.2f} "
              f"({marginal_s:.3f} s per extra MB), CPU ∝ size^{cpu_exponent:.2f} "
              f"({marginal_cpu:.3f} s per extra MB), "
              f"{marginal_b:.2f} peak bytes per extra input byte")
    print(json.dumps({"min_len": args.min_len, "rows": rows}))


if __name__ == "__main__":
    main()
