"""Real documents for the corpus benchmarks, and the word edits that turn them into new documents.

Two origins, in the raw-document schema of the sources stage (``doc_id, source, language_hint, content,
content_type`` among others):

* ``demo``: the demo config's sources, read from the Debian packages fetched into ``<runs_dir>/cache/sources``
  (``pretrain fetch configs/demo.toml`` puts them there; 20,855 documents).
* ``fixtures``: the smoke config's sources, the small offline slice under ``tests/fixtures/smoke`` that CI and a
  fresh clone have (944 documents).

``auto`` takes the demo corpus when every one of its packages is unpacked in the runs folder, else the fixtures.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT_RE = re.compile(r">([^<]+)<")
WORD_RE = re.compile(r"[A-Za-z]{3,}")
ORIGINS = ("auto", "demo", "fixtures")


def _edit(text: str, rng: random.Random, rate: float, vocab: list[str]) -> str:
    return WORD_RE.sub(lambda m: rng.choice(vocab) if rng.random() < rate else m.group(0), text)


def edited(content: str, content_type: str, rng: random.Random, rate: float, vocab: list[str]) -> str:
    """``content`` with words replaced at ``rate``; in HTML only text between tags is touched."""
    if content_type == "html":
        return TEXT_RE.sub(lambda m: ">" + _edit(m.group(1), rng, rate, vocab) + "<", content)
    return _edit(content, rng, rate, vocab)


def _sample(docs, base_docs: int | None):
    """A proportional prefix of every source, ``base_docs`` documents in all (all of them when None)."""
    import pandas as pd

    if base_docs and base_docs < len(docs):
        share = base_docs / len(docs)
        docs = pd.concat([g.iloc[:max(1, round(len(g) * share))] for _, g in docs.groupby("source", sort=False)])
    return docs.reset_index(drop=True)


def _read_config_sources(config: Path, cache: Path):
    import pandas as pd

    import tasks.sources.read as read
    from flows.config import load_config
    from tasks.sources.deb import fetch_deb

    # read_small_source where the project streams sources to files; read_source in checkouts from before that
    # (corpus_scale --code measures those too).
    reader = getattr(read, "read_small_source", None) or read.read_source
    cfg = load_config(config)
    frames = []
    for src in cfg.sources.values():
        if src.kind == "deb":
            fetch_deb(src.package, cache)
        frames.append(reader(src, cache).docs)
    return pd.concat(frames, ignore_index=True)


def demo_documents(runs_dir: Path, base_docs: int | None = None):
    """The demo config's documents (fetching its Debian packages into ``runs_dir`` when missing), or a
    proportional sample of ``base_docs`` of them."""
    return _sample(_read_config_sources(ROOT / "configs" / "demo.toml", runs_dir / "cache" / "sources"), base_docs)


def fixture_documents(base_docs: int | None = None):
    """The smoke config's documents, read from ``tests/fixtures/smoke`` (offline)."""
    cwd = os.getcwd()
    os.chdir(ROOT)  # the smoke config's include patterns are relative to the repository root
    try:
        docs = _read_config_sources(ROOT / "configs" / "smoke.toml", ROOT / "runs" / "cache" / "sources")
    finally:
        os.chdir(cwd)
    return _sample(docs, base_docs)


def demo_fetched(runs_dir: Path) -> bool:
    """True when every Debian package of the demo config is unpacked under ``runs_dir/cache/sources``."""
    import tomllib

    raw = tomllib.loads((ROOT / "configs" / "demo.toml").read_text(encoding="utf-8"))
    packages = {s["package"] for s in raw.get("sources", {}).values() if s.get("kind") == "deb"}
    unpacked = runs_dir / "cache" / "sources" / "unpacked"
    return bool(packages) and all(any(unpacked.glob(f"{p}_*")) for p in packages)


def real_documents(origin: str, runs_dir: Path, base_docs: int | None = None):
    """(documents, the origin used): ``origin`` is one of ``ORIGINS``.

    Raises:
        ValueError: ``origin`` is not one of ``ORIGINS``.
    """
    if origin not in ORIGINS:
        raise ValueError(f"text origin {origin!r}: use one of {', '.join(ORIGINS)}")
    if origin == "auto":
        origin = "demo" if demo_fetched(runs_dir) else "fixtures"
    docs = demo_documents(runs_dir, base_docs) if origin == "demo" else fixture_documents(base_docs)
    return docs, origin
