"""Quality-classifier scoring beside the heuristic rules, on the same documents, on one core, in one run.

    python benchmarks/quality_model.py                 # 2,000 documents from the smoke sources
    python benchmarks/quality_model.py --docs 6000 --rounds 3
    python benchmarks/quality_model.py --model runs/artifacts/quality_model/<key>/model/quality_model.skops

The documents are the smoke configuration's sources (Debian handbook pages in English and Chinese, fortunes, Python
library pages), read by the sources stage's reader and repeated under new ids up to ``--docs``. Both sides run the
code the corpus build runs:

* rules: ``tasks.corpus.filters.filter_documents`` with the smoke config's ``[corpus]`` section: URL rules,
  sanitise, HTML extraction, Unicode repair, language ID, the Gopher/Chinese/C4 rules and PII, ledger included;
* classifier: ``TrainedModel.score`` on the rules' survivors (the call the build's key pass makes per shard,
  through ``tasks.corpus.build._quality``), with a naive Bayes trained here under the smoke config's settings on
  the first ``max_examples`` survivors against generated junk pages (``quality_stage.generate_junk``): the same
  model kind and features as the quality_model stage's, not its seeded sample of examples; or ``--model``.

The process is pinned to one CPU and each side is timed ``--rounds`` times, alternately, after a warm-up; the best
round counts. Reported: documents per second, microseconds per document and per kilobyte of text (slopes), and the
ratio of the classifier's cost per document to the rules'.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def smoke_documents(n: int) -> tuple[pd.DataFrame, object]:
    """``n`` raw documents from the smoke sources (repeated under new ids), and the smoke experiment config."""
    from flows.config import load_config
    from tasks.sources.read import read_small_source

    os.chdir(ROOT)  # the smoke config's globs are relative to the repository
    cfg = load_config(ROOT / "configs" / "smoke.toml")
    frames = [read_small_source(src, ROOT / "runs" / "source-cache").docs for src in cfg.sources.values()]
    base = pd.concat(frames, ignore_index=True)
    reps = -(-n // len(base))
    docs = pd.concat([base.assign(doc_id=base.doc_id + f"#{r}") for r in range(reps)], ignore_index=True).head(n)
    return docs.reset_index(drop=True), cfg


def trained_model(cfg, survivors: pd.DataFrame, path: str | None):
    from tasks.corpus.quality_model import load_model, train
    from tasks.corpus.quality_stage import generate_junk

    if path:
        return load_model(Path(path))
    qm = cfg.corpus.quality_model
    return train(survivors.text.tolist()[: qm.max_examples], generate_junk(survivors, qm.negative.junk, qm.seed), qm)


def best(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=None, help="a saved classifier (.skops, fastText .bin) instead")
    args = parser.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core: docs/s per core

    from tasks.corpus.filters import Ledger, filter_documents, sanitise

    docs, cfg = smoke_documents(args.docs)
    docs = sanitise(docs)
    survivors = filter_documents(docs.head(200), cfg.corpus, Ledger())  # warm-up: imports, lid.176, extractor
    survivors = filter_documents(docs, cfg.corpus, Ledger())
    model = trained_model(cfg, survivors, args.model)
    texts = survivors.text.tolist()
    model.score(texts[:50])  # warm-up
    rules_s = classifier_s = float("inf")
    for _ in range(args.rounds):  # alternately, so drifts of a shared machine hit both sides
        rules_s = min(rules_s, best(lambda: filter_documents(docs, cfg.corpus, Ledger()), 1))
        classifier_s = min(classifier_s, best(lambda: model.score(texts), 1))
    raw_kb = sum(len(str(c).encode()) for c in docs.content) / 1e3
    text_kb = sum(len(t.encode()) for t in texts) / 1e3
    rows = [("rules (filter_documents)", len(docs), rules_s, raw_kb),
            (f"classifier ({model.kind}) score", len(texts), classifier_s, text_kb)]
    print(f"{len(docs):,} documents in ({raw_kb:,.0f} kB raw), {len(texts):,} survive the rules "
          f"({text_kb:,.0f} kB of text); best of {args.rounds} rounds, one core")
    print(f"{'side':34} {'docs':>7} {'seconds':>8} {'docs/s':>9} {'us/doc':>9} {'us/kB':>8}")
    for name, n, seconds, kb in rows:
        print(f"{name:34} {n:>7,} {seconds:>8.3f} {n / seconds:>9,.0f} {1e6 * seconds / n:>9.1f} "
              f"{1e6 * seconds / kb:>8.1f}")
    per_doc_rules, per_doc_classifier = rules_s / len(docs), classifier_s / max(len(texts), 1)
    print(f"classifier cost per scored document / rules' cost per input document: "
          f"{per_doc_classifier / per_doc_rules:.3f} (throughput ratio {per_doc_rules / per_doc_classifier:.1f}x)")


if __name__ == "__main__":
    main()
