"""Tokenizer stage speed, side by side in one run: packing against raw encoding, and fitting on pathological text.

    python benchmarks/tokenizer.py                 # 6,000 documents
    python benchmarks/tokenizer.py --docs 20000

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
    parser.add_argument("--docs", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of each packing side")
    parser.add_argument("--fit-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fit_child:
        fit_child(args.fit_child)
        return
    texts = documents(args.docs)
    packing_throughput(texts, args.rounds)
    print("(2) BPE fit, clean text vs clean text + junk:")
    for capped in (True, False):
        clean, dirty = _fit(args.docs, False, capped), _fit(args.docs, True, capped)
        print(f"    {'capped (ours)' if capped else 'uncapped':<14} {clean['seconds']:5.1f} s vs {dirty['seconds']:5.1f} s "
              f"(ratio {dirty['seconds'] / clean['seconds']:.2f}); peak RSS {clean['peak_rss_mb']:.0f} vs "
              f"{dirty['peak_rss_mb']:.0f} MB (ratio {dirty['peak_rss_mb'] / clean['peak_rss_mb']:.2f}); "
              f"longest vocab entry {clean['longest_entry']} vs {dirty['longest_entry']} symbols")
    packing_policies(texts)


if __name__ == "__main__":
    main()
