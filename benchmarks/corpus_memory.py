"""Peak memory of the corpus build at 1×, 4× and 16× the demo corpus, as ratios and as bytes per document.

    python benchmarks/corpus_memory.py                         # whole demo corpus (fetched into --runs-dir)
    python benchmarks/corpus_memory.py --base-docs 3000        # a proportional sample as the 1× corpus

Each scale k replicates every document k times; copies get random word edits (rate ``--edit-rate``, text between
HTML tags only) so they are new documents to the filters and mostly not near duplicates. Each build runs in a fresh
child process with the demo config's ``[corpus]`` settings (shard size, ``workers`` shard processes, as in the
pipeline). The peak resident set size (ru_maxrss) of the main process, which holds the per-document
keys, and of the largest worker are reported with their ratios to the 1× build, and with a least-squares line of
peak RSS over documents at the scales run: its slope (bytes per document) is the growth a larger corpus pays, and
its intercept the fixed cost that a ratio divides by. For scale, the in-memory size (pandas, deep) of the
per-document keys themselves is printed in bytes per document.

Targets, on the slopes: the largest worker ≤ 16 bytes per document (its memory is bounded by the shard size, so it
should not grow with the corpus; at the default 16× build's 312,825 extra documents that is 5 MB, about the
noise of ru_maxrss); the main process ≤ 2 × the keys' own bytes per document (it holds the keys; a
second copy while they are concatenated is allowed, a third, or anything else per document, is not).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.real_text import WORD_RE, demo_documents, edited  # noqa: E402

WORKER_TARGET_BYTES = 16.0


def write_scaled(docs, scale: int, path: Path, rate: float, seed: int) -> int:
    """Write ``scale`` copies of ``docs`` (copy 0 unedited) to one Parquet file, one copy at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    vocab = sorted({w.lower() for t in docs.content.head(200) for w in WORD_RE.findall(t)})[:5000] or ["word"]
    writer = None
    for copy in range(scale):
        part = docs if copy == 0 else docs.assign(
            doc_id=docs.doc_id + f"#{copy}",
            content=[edited(c, t, rng, rate, vocab) for c, t in zip(docs.content, docs.content_type)])
        table = pa.Table.from_pandas(part, preserve_index=False)
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    writer.close()
    return len(docs) * scale


def measured(fn, kwargs: dict) -> float:
    """Run one shard call in a pool worker; return the worker's peak RSS so far in MB (workers are the forkserver's
    children, not ours, so RUSAGE_CHILDREN cannot see them)."""
    fn(**kwargs)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(parquet: str, out: str) -> None:
    """Build the corpus of one Parquet file with the configured shard workers; print seconds and peaks as JSON."""
    from flows.config import load_config
    from tasks.corpus.build import curate, split_sources

    from infra.shard_map import process_map

    cfg = load_config(ROOT / "configs" / "demo.toml").corpus
    pool_map = process_map(cfg.execution.workers, cfg.execution.recycle_after)
    worker_peaks = [0.0]

    def shard_map(fn, calls, label):
        peaks = pool_map(measured, [dict(fn=fn, kwargs=kw) for kw in calls], label)
        worker_peaks.extend(peaks)
        return peaks

    started = time.perf_counter()
    work = Path(out) / "_work"
    split_sources([Path(parquet)], work, cfg.execution.shard_docs)
    result = curate(work, Path(out), cfg, shard_map=shard_map)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the keys are read again below
    print(json.dumps({"seconds": seconds, "kept": len(result.kept), "peak_rss_mb": peak,
                      "worker_peak_rss_mb": max(worker_peaks), "key_bytes_per_doc": _key_bytes_per_doc(work)}))


def _key_bytes_per_doc(work: Path) -> float:
    """In-memory bytes per document of the keys the main process loads (every shard's keys.parquet)."""
    import pandas as pd

    total, n = 0, 0
    for path in sorted((work / "keyed").glob("*/keys.parquet")):
        keys = pd.read_parquet(path)
        keys["source"] = keys.source.astype("category")  # as the main process holds them
        total, n = total + int(keys.memory_usage(deep=True).sum()), n + len(keys)
    return total / max(n, 1)


def fit(docs: list[int], peaks_mb: list[float]) -> tuple[float, float, float]:
    """Least-squares line of peak RSS over documents: (bytes per document, intercept MB, largest residual MB)."""
    import numpy as np

    x, y = np.asarray(docs, float), np.asarray(peaks_mb, float) * 2**20
    slope, intercept = np.polyfit(x, y, 1) if len(x) > 1 else (float("nan"), y[0])
    residual = float(np.abs(y - (slope * x + intercept)).max()) if len(x) > 1 else 0.0
    return float(slope), float(intercept) / 2**20, residual / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--base-docs", type=int, default=None, help="sample this many demo documents as 1×")
    parser.add_argument("--edit-rate", type=float, default=0.3)
    parser.add_argument("--runs-dir", type=Path, default=Path(os.environ.get("PRETRAIN_RUNS_DIR", "runs")))
    parser.add_argument("--child", nargs=2, metavar=("PARQUET", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    docs = demo_documents(args.runs_dir, args.base_docs)
    print(f"1× corpus: {len(docs):,} documents, {docs.content.str.len().sum() / 1e6:.1f} M characters")
    rows = []
    with tempfile.TemporaryDirectory(prefix="corpus-mem-") as tmp:
        for scale in args.scales:
            path = Path(tmp) / f"x{scale}.parquet"
            n = write_scaled(docs, scale, path, args.edit_rate, seed=scale)
            proc = subprocess.run([sys.executable, __file__, "--child", str(path), str(Path(tmp) / f"out{scale}")],
                                  capture_output=True, text=True, cwd=ROOT)
            if proc.returncode:
                sys.exit(f"scale {scale} failed:\n{proc.stderr[-3000:]}")
            stats = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append((scale, n, stats))
            path.unlink()
    base = rows[0][2]["peak_rss_mb"]
    base_worker = rows[0][2]["worker_peak_rss_mb"]
    print(f"{'scale':>5} {'docs':>9} {'kept':>9} {'seconds':>8} {'docs/s':>7} {'main peak MB':>12} {'ratio':>6} "
          f"{'worker peak MB':>14} {'ratio':>6}")
    for scale, n, s in rows:
        print(f"{scale:>4}× {n:>9,} {s['kept']:>9,} {s['seconds']:>8.1f} {n / s['seconds']:>7.0f} "
              f"{s['peak_rss_mb']:>12.0f} {s['peak_rss_mb'] / base:>6.2f} "
              f"{s['worker_peak_rss_mb']:>14.0f} {s['worker_peak_rss_mb'] / base_worker:>6.2f}")
    docs_run = [n for _, n, _ in rows]
    key_bytes = rows[-1][2]["key_bytes_per_doc"]
    targets = {"main process": 2 * key_bytes, "largest worker": WORKER_TARGET_BYTES}
    print(f"keys held by the main process: {key_bytes:,.0f} bytes per document (in memory, {rows[-1][0]}× build)")
    verdicts = []
    for label, column in (("main process", "peak_rss_mb"), ("largest worker", "worker_peak_rss_mb")):
        slope, intercept, residual = fit(docs_run, [s[column] for _, _, s in rows])
        ok = slope <= targets[label]
        verdicts.append(ok)
        print(f"{label:<15} peak RSS ≈ {intercept:,.0f} MB + {slope:,.0f} bytes per document (fit over "
              f"{len(rows)} builds, largest residual {residual:.0f} MB); slope target ≤ {targets[label]:,.0f} "
              f"bytes per document: {'PASS' if ok else 'FAIL'}")
    worst = max(max(s["peak_rss_mb"] / base, s["worker_peak_rss_mb"] / base_worker) for _, _, s in rows)
    print(f"largest peak / 1× peak (main process or any worker) = {worst:.2f}; slopes: "
          f"{'PASS' if all(verdicts) else 'FAIL'}")


if __name__ == "__main__":
    main()
