"""Tokenizer stage speed, side by side in one run: packing against raw encoding, and fitting on pathological text.

    python benchmarks/tokenizer.py                 # 6,000 documents
    python benchmarks/tokenizer.py --docs 20000
    python benchmarks/tokenizer.py --scale --docs 10000 100000 [--before DIR] [--corpus recombined]  # (4) only

(4) with ``--scale``: the whole stage (``tasks.tokenizer.stage.run``, engine sequential, so all its work and
    memory are in one process) on a corpus artifact of each ``--docs`` size (kept parts of 2,000 documents, three
    sources, English and Chinese, near-duplicate families from the text's normal form, default
    ``[tokenizer]`` settings with vocab 4,096), each in a fresh child process. Reported per size: the stage's
    peak RSS (``VmHWM``, imports included) and how far its resident memory rose above where it stood when the
    stage started (sampled every 5 ms), its CPU seconds (user + system, every thread) and each phase's share (the
    stage's progress bars),
    and the CPU of a plain ``tokenizers`` ``encode_batch`` of the same kept texts with the fitted tokenizer
    (batches of 1,024, one thread as in the pipeline: ``TOKENIZERS_PARALLELISM=false``). Then the slope of the
    peak RSS in bytes per document between the two sizes, and the stage's CPU ÷ the plain encode (target ≤ 1.5).
    ``--before DIR`` runs the same measurements on the stage code of another checkout (e.g. ``git archive`` of
    an older commit unpacked in DIR) in the same run, side by side; ``--before-docs`` gives its sizes (default
    the same as ``--docs``). ``--corpus`` picks the documents (:func:`scale_corpus`).

Documents: plain English and Chinese text recombined from the smoke fixtures (``curation_chain.make_documents``).

(1) Packing throughput. (a) raw: the encode call packing makes, ``Tokenizer.encode_batch_fast`` (no character
    offsets) on the same tokenizer copy, in the same batches of 1,024, ids left in the Encoding objects;
    (b) ``tasks.train.shards.encode_documents``: that encoding plus the ids lists, EOS joins, document offsets
    and the uint16/uint32 token array; (c) (b) plus writing the shard files; for reference, (a') ``encode_batch``,
    which also computes offsets. Each is timed ``--rounds`` times, alternating, and each side's best round counts.
    Reported: tokens per second, seconds per token, and packing's own cost per token, (b − a) / tokens.
    Target: (b) ≥ 0.9 × (a) in tokens per second.
(2) Fitting with junk. The BPE fit (vocab 4,096) on the clean documents against the same documents plus one
    100,000-character run of one letter, one 50,000-digit number and a 100,000-character base64 blob, with our
    pre-tokenizer (overlong runs capped) and, for comparison, with the same pre-tokenizer minus the cap. Each fit
    runs in a fresh child process, which reports its seconds, peak RSS and the longest vocabulary entry.
    Target: with the cap, time and memory near those of clean text.
(3) Packing policies: share of documents cut and padding share under ``concat`` and ``best_fit`` at T = 256 and 1,024.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def documents(n: int) -> list[str]:
    from curation_chain import make_documents

    return make_documents(n, seed=0)


def junk() -> list[str]:
    blob = base64.b64encode(os.urandom(75_000)).decode()  # 100,000 characters
    return ["a" * 100_000, "".join(str(i % 10) for i in range(50_000)), blob]


def fit_child(spec: str) -> None:
    """Fit in this (fresh) process and print seconds and peak RSS as JSON."""
    from tasks.tokenizer.config import TokenizerConfig
    from tasks.tokenizer.fit import fit_tokenizer

    n, with_junk, capped = json.loads(spec)
    texts = documents(n) + (junk() if with_junk else [])
    started = time.perf_counter()
    if capped:
        tok = fit_tokenizer(texts, TokenizerConfig(vocab_size=4096))
    else:  # the same pre-tokenizer without the cap (tokenizers' own defaults)
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False)])
        tok.train_from_iterator(texts, trainers.BpeTrainer(
            vocab_size=4096, special_tokens=TokenizerConfig().special_tokens,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    print(json.dumps({"seconds": time.perf_counter() - started,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "longest_entry": max(map(len, tok.get_vocab()))}))


def _fit(n: int, with_junk: bool, capped: bool = True) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--fit-child", json.dumps([n, with_junk, capped])],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def packing_throughput(texts: list[str], rounds: int) -> None:
    from tasks.tokenizer.config import TokenizerConfig
    from tasks.tokenizer.fit import fit_tokenizer
    from tasks.train.shards import encode_documents, write_shard

    tok = fit_tokenizer(texts[:2000], TokenizerConfig(vocab_size=4096))
    plain = type(tok).from_str(tok.to_str())
    plain.encode_special_tokens = True

    def raw() -> int:  # the call encode_documents makes, without the packing around it
        n = 0
        for start in range(0, len(texts), 1024):
            n += sum(len(e) for e in plain.encode_batch_fast(texts[start:start + 1024], add_special_tokens=False))
        return n + len(texts)  # count the EOS the packed side adds, so both sides count the same tokens

    def raw_offsets() -> int:
        n = 0
        for start in range(0, len(texts), 1024):
            n += sum(len(e) for e in plain.encode_batch(texts[start:start + 1024], add_special_tokens=False))
        return n + len(texts)

    def pack() -> int:
        tokens, _ = encode_documents(tok, texts)
        return len(tokens)

    def pack_and_write() -> int:
        tokens, offsets = encode_documents(tok, texts)
        with tempfile.TemporaryDirectory() as tmp:
            write_shard(Path(tmp) / "s", tokens, vocab_size=tok.get_vocab_size(), eos_id=0, tokenizer_hash="x",
                        n_bytes=1, doc_offsets=offsets)
        return len(tokens)

    sides = {"(a) raw encode_batch_fast": raw, "(b) encode_documents": pack,
             "(c) encode_documents + write": pack_and_write, "(a') encode_batch (offsets)": raw_offsets}
    best = {name: float("inf") for name in sides}
    counts = {}
    for _ in range(rounds):
        for name, fn in sides.items():
            started = time.perf_counter()
            counts[name] = fn()
            best[name] = min(best[name], time.perf_counter() - started)
    assert len(set(counts.values())) == 1, f"token counts differ: {counts}"
    raw_name, pack_name = "(a) raw encode_batch_fast", "(b) encode_documents"
    n_tokens = counts[raw_name]
    print(f"(1) packing throughput, {len(texts):,} documents, {n_tokens:,} tokens, best of {rounds}:")
    for name in sides:
        print(f"    {name:<29} {n_tokens / best[name] / 1e6:6.2f} M tokens/s  "
              f"{best[name] / n_tokens * 1e9:6.0f} ns per token   ratio to (a) {best[raw_name] / best[name]:.2f}")
    ratio = best[raw_name] / best[pack_name]
    overhead = (best[pack_name] - best[raw_name]) / n_tokens
    print(f"    packing's own cost {overhead * 1e9:.0f} ns per token; (b) / (a) = {ratio:.2f} (target ≥ 0.90): "
          f"{'PASS' if ratio >= 0.9 else 'FAIL'}")


SCALE_PART_DOCS = 2000  # documents per kept part (the corpus's default shard_docs)
SCALE_SOURCES = ("handbook", "web", "wiki")


def scale_corpus(folder: Path, n: int, kind: str = "shuffled") -> int:
    """A corpus artifact of ``n`` documents at ``folder`` (kept parts + manifest); returns its text bytes.

    ``recombined``: :func:`documents` as they are (a few hundred fixture paragraphs recombined, so nearly every
    training document shares 13-grams with held-out ones and the decontamination removes most of them);
    ``shuffled``: the words of each paragraph shuffled, seeded by the document's normal form (copies stay copies,
    in one family), so documents share few 13-grams, as real text does, and almost every document is packed."""
    import hashlib

    import pandas as pd
    from curation_chain import normal_form

    texts = documents(n)
    if kind == "shuffled":
        import random

        def shuffled(text: str) -> str:
            rng = random.Random(hashlib.sha1(normal_form(text).encode()).digest())
            paragraphs = []
            for paragraph in text.split("\n\n"):
                words = paragraph.split(" ")
                rng.shuffle(words)
                paragraphs.append(" ".join(words))
            return "\n\n".join(paragraphs)

        texts = [shuffled(t) for t in texts]
    rows = []
    for i, text in enumerate(texts):
        source = SCALE_SOURCES[i % len(SCALE_SOURCES)]
        family = hashlib.sha1(normal_form(text).encode()).hexdigest()[:16]  # exact copies share a family
        language = "zh" if any("\u4e00" <= ch <= "\u9fff" for ch in text[:200]) else "en"
        rows.append(dict(doc_id=f"{source}/{i}", source=source, language=language, text=text, n_chars=len(text),
                         n_bytes=len(text.encode()), family_id=family))
    (folder / "kept").mkdir(parents=True)
    for p, start in enumerate(range(0, n, SCALE_PART_DOCS)):
        pd.DataFrame(rows[start:start + SCALE_PART_DOCS]).to_parquet(folder / "kept" / f"part-{p:05d}.parquet",
                                                                     index=False)
    (folder / "manifest.json").write_text(json.dumps({"manifest_hash": "0" * 64}))
    return sum(r["n_bytes"] for r in rows)


def _cpu() -> float:
    self, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return self.ru_utime + self.ru_stime + children.ru_utime + children.ru_stime


def _hwm() -> int:
    """Peak resident bytes of this process since its exec (``VmHWM``; ``ru_maxrss`` would also count the memory
    of the parent it was forked from)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def stage_child(spec: str) -> None:
    """Run the tokenizer stage on the corpus at ``spec``'s path in this (fresh) process; print JSON figures."""
    from infra.runs import RunsLayout
    from infra.stage import ProgressReporter, StageContext
    from tasks.tokenizer.config import TokenizerConfig
    from tasks.tokenizer.stage import run

    corpus, work = map(Path, json.loads(spec))

    growth: dict[str, int] = {}

    class Timed(ProgressReporter):
        from contextlib import contextmanager

        @contextmanager
        def task(self, description, total):
            started, first = _cpu(), len(sampled)
            try:
                yield lambda n=1: None
            finally:
                name = description.split(" (")[0].split(",")[0].removeprefix("tokenizer: ")
                phases[name] = phases.get(name, 0.0) + _cpu() - started
                growth[name] = max(growth.get(name, 0), max(sampled[first:] + [rss()]) - rss_before)

        def say(self, line):
            pass

    out = work / "artifacts" / "tokenizer" / "k"
    out.mkdir(parents=True)
    ctx = StageContext(out=out, inputs={"corpus": corpus}, layout=RunsLayout(work), key="k", experiment="bench",
                       progress=Timed())
    import threading

    page = os.sysconf("SC_PAGE_SIZE")
    phases: dict[str, float] = {}

    def rss() -> int:  # resident bytes now
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    sampled, stop = [rss()], threading.Event()
    rss_before = sampled[0]

    def sample() -> None:
        while not stop.wait(0.005):
            sampled.append(rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started, wall = _cpu(), time.perf_counter()
    summary = run(ctx, TokenizerConfig(vocab_size=4096))
    cpu, wall = _cpu() - started, time.perf_counter() - wall
    stop.set()
    sampler.join()
    print(json.dumps({"cpu": cpu, "wall": wall, "phases": phases, "rss_start": rss_before,
                      "growth": max(sampled) - rss_before, "phase_growth": growth, "peak_rss": _hwm(),
                      "tokenizer": str(out / "tokenizer.json"), "removed": summary["decontaminated_train_docs"],
                      "packed_tokens": sum(summary["tokens"].values())}))


def plain_child(spec: str) -> None:
    """CPU of a plain ``encode_batch`` of every kept text of the corpus at ``spec``'s path with ``tokenizer``."""
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    corpus, tokenizer = json.loads(spec)
    tok = Tokenizer.from_file(tokenizer)
    texts = []
    for part in sorted((Path(corpus) / "kept").glob("part-*.parquet")):
        texts += pq.read_table(part, columns=["text"]).column("text").to_pylist()
    started, n_tokens = _cpu(), 0
    for start in range(0, len(texts), 1024):
        n_tokens += sum(len(e.ids) for e in tok.encode_batch(texts[start:start + 1024], add_special_tokens=False))
    print(json.dumps({"cpu": _cpu() - started, "tokens": n_tokens}))


def _child(root: Path, mode: str, spec: list) -> dict:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tokenizer.py"), mode, json.dumps(spec),
                           "--root", str(root)], capture_output=True, text=True, cwd=root, env=env)
    if proc.returncode:
        sys.exit(f"{mode} in {root} failed:\n{proc.stderr[-5000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def scale(sizes: list[int], before: Path | None, before_sizes: list[int], kind: str) -> None:
    """(4): the stage's peak RSS at each size, the slope per document, and its CPU against a plain encode."""
    runs = [("after", ROOT, sizes)] + ([("before", before, before_sizes)] if before else [])
    print(f"(4) stage at scale, {kind} corpus (engine sequential; CPU = user + system of every thread):")
    with tempfile.TemporaryDirectory() as tmp:
        corpora = {}
        for n in sorted({n for _, _, ns in runs for n in ns}):
            corpora[n] = (Path(tmp) / f"corpus-{n}", scale_corpus(Path(tmp) / f"corpus-{n}", n, kind))
        for label, root, ns in runs:
            peaks, growth = {}, {}
            for n in ns:
                corpus, n_bytes = corpora[n]
                work = Path(tmp) / f"runs-{label}-{n}"
                stage = _child(root, "--stage-child", [str(corpus), str(work)])
                plain = _child(ROOT, "--plain-child", [str(corpus), stage["tokenizer"]])
                peaks[n], growth[n] = stage["peak_rss"], stage["growth"]
                shares = ", ".join(f"{k} {v / stage['cpu']:.0%}" for k, v in
                                   sorted(stage["phases"].items(), key=lambda kv: -kv[1]))
                print(f"    {label:<6} {n:>7,} docs ({n_bytes / 1e6:5.1f} MB text): peak RSS "
                      f"{stage['peak_rss'] / 2**20:5.0f} MiB, {stage['growth'] / 2**20:5.0f} MiB above the "
                      f"{stage['rss_start'] / 2**20:.0f} MiB at the stage's start; CPU "
                      f"{stage['cpu']:7.1f} s (wall {stage['wall']:.1f} s), plain encode_batch {plain['cpu']:.1f} s "
                      f"({plain['tokens']:,} tokens): ratio {stage['cpu'] / plain['cpu']:.2f} (target ≤ 1.5)")
                rises = ", ".join(f"{k} {v / 2**20:.0f}" for k, v in stage["phase_growth"].items())
                print(f"           phases (CPU): {shares}; {stage['removed']:,} training documents removed by the "
                      f"decontamination, {stage['packed_tokens']:,} tokens packed")
                print(f"           memory above the start at each phase's peak, MiB: {rises}")
                shutil.rmtree(work, ignore_errors=True)
            if len(peaks) >= 2:
                lo, hi = min(peaks), max(peaks)
                print(f"    {label:<6} slope {lo:,} → {hi:,} docs: peak RSS "
                      f"{(peaks[hi] - peaks[lo]) / (hi - lo):,.0f} bytes per document, growth above the start "
                      f"{(growth[hi] - growth[lo]) / (hi - lo):,.0f} bytes per document")


def packing_policies(texts: list[str]) -> None:
    from tasks.tokenizer.config import TokenizerConfig
    from tasks.tokenizer.fit import fit_tokenizer
    from tasks.train.packing import POLICIES, plan_rows
    from tasks.train.shards import encode_documents

    tok = fit_tokenizer(texts[:2000], TokenizerConfig(vocab_size=4096))
    tokens, offsets = encode_documents(tok, texts)
    plan_rows(offsets[:10], int(offsets[10]), 8, "best_fit")  # compile the numba kernel outside the timing
    print("(3) packing policies:")
    for seq_len in (256, 1024):
        for policy in POLICIES:
            started = time.perf_counter()
            plan = plan_rows(offsets, len(tokens), seq_len, policy)
            took = time.perf_counter() - started
            print(f"    T={seq_len:<5} {policy:<9} rows {plan.n_rows:>7,}  documents cut {plan.cut_share:6.1%}  "
                  f"padding {plan.padding_share:5.1%}  planned in {took * 1e3:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, nargs="+", default=[6000],
                        help="documents (with --scale: two or more sizes)")
    parser.add_argument("--scale", action="store_true", help="run (4) only: the stage's memory and CPU at scale")
    parser.add_argument("--before", type=Path, help="with --scale: also measure the stage code of this checkout")
    parser.add_argument("--before-docs", type=int, nargs="+", help="with --before: its sizes (default --docs)")
    parser.add_argument("--corpus", choices=("shuffled", "recombined"), default="shuffled",
                        help="with --scale: the corpus (see scale_corpus)")
    parser.add_argument("--stage-child", help=argparse.SUPPRESS)
    parser.add_argument("--plain-child", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of each packing side")
    parser.add_argument("--fit-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.root:  # a child measuring the code of another checkout
        sys.path.insert(0, args.root)
    if args.fit_child:
        fit_child(args.fit_child)
        return
    if args.stage_child:
        stage_child(args.stage_child)
        return
    if args.plain_child:
        plain_child(args.plain_child)
        return
    if args.scale:
        scale(args.docs, args.before, args.before_docs or args.docs, args.corpus)
        return
    texts = documents(args.docs[0])
    packing_throughput(texts, args.rounds)
    print("(2) BPE fit, clean text vs clean text + junk:")
    for capped in (True, False):
        clean, dirty = _fit(args.docs[0], False, capped), _fit(args.docs[0], True, capped)
        print(f"    {'capped (ours)' if capped else 'uncapped':<14} {clean['seconds']:5.1f} s vs {dirty['seconds']:5.1f} s "
              f"(ratio {dirty['seconds'] / clean['seconds']:.2f}); peak RSS {clean['peak_rss_mb']:.0f} vs "
              f"{dirty['peak_rss_mb']:.0f} MB (ratio {dirty['peak_rss_mb'] / clean['peak_rss_mb']:.2f}); "
              f"longest vocab entry {clean['longest_entry']} vs {dirty['longest_entry']} symbols")
    packing_policies(texts)


if __name__ == "__main__":
    main()
