"""The global passes as hash-partitioned tasks: the same ledger and kept documents for any partition count and shard
size, and the partition tasks' pairs equal to the DuckDB oracle's."""

import random

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tasks.corpus.build import build_corpus
from tasks.corpus.config import CorpusConfig
from tasks.corpus.near_dedup import bucket_pairs, candidate_pairs
from tests.unit.test_corpus_shards import WORDS, prose


def crawl(n: int, seed: int) -> pd.DataFrame:
    """Originals, then exact copies and near copies (one word changed) of random earlier documents, shuffled in,
    and one original with more near copies than a bucket links (``MAX_LINKS``)."""
    rng = random.Random(seed)
    rows = [dict(doc_id=f"o/{i}", source=("a", "b")[i % 2], content=prose(rng, 120)) for i in range(n)]
    for k in range(n // 2):
        base = rng.choice(rows)
        words = base["content"].split()
        if k % 3:
            words[rng.randrange(len(words))] = rng.choice(WORDS)
        rows.insert(rng.randrange(rows.index(base) + 1, len(rows) + 1),
                    dict(base, doc_id=f"c/{k}", content=" ".join(words)))
    hub = rows[3]["content"].split()
    for k in range(36):
        words = list(hub)
        words[k % len(words)] = "lighthouse"
        rows.append(dict(rows[3], doc_id=f"hub/{k}", content=" ".join(words)))
    return pd.DataFrame(rows).assign(language_hint="en", content_type="text")


def _build(docs: pd.DataFrame, tmp_path, scope: str, **execution) -> object:
    cfg = CorpusConfig(boilerplate={"min_docs": 50}, near_dedup={"scope": scope}, execution=execution)
    return build_corpus(docs, cfg, out=tmp_path / f"{scope}-{execution['shard_docs']}-{execution['partitions']}")


@pytest.mark.parametrize("scope", ["global", "source"])
def test_ledger_and_kept_ids_do_not_depend_on_partitions_or_shard_size(tmp_path, scope):
    docs = crawl(40, seed=7)
    reference = _build(docs, tmp_path, scope, shard_docs=10_000, partitions=1)
    removed = reference.removals.rule.value_counts()
    assert removed.get("dedup.exact", 0) > 3 and removed.get("dedup.near", 0) > 36
    for shard_docs, partitions in ((9, 3), (13, 16)):
        other = _build(docs, tmp_path, scope, shard_docs=shard_docs, partitions=partitions)
        for name in ("kept", "removals", "funnel", "hits"):
            pd.testing.assert_frame_equal(getattr(reference, name), getattr(other, name))
        assert other.near == reference.near


def test_bucket_pairs_equal_the_duckdb_candidate_pairs():
    rng = np.random.default_rng(0)
    for _ in range(40):
        n, bands, links = int(rng.integers(1, 200)), int(rng.integers(1, 5)), int(rng.integers(1, 6))
        pos = np.sort(rng.choice(10_000, n, replace=False)).astype(np.int64)
        grp = rng.integers(0, 3, n).astype(np.int64)
        keys = rng.integers(0, 6, (n, bands)).astype(np.uint64)
        with duckdb.connect() as con:
            con.register("k", pa.table({"pos": pos, "grp": grp, **{f"band_{b}": keys[:, b] for b in range(bands)}}))
            candidate_pairs(con, "k", bands, "p", links)
            found = con.execute("SELECT i, j FROM p ORDER BY i, j").fetchnumpy()
        expected = np.stack([found["i"], found["j"]], axis=1).astype(np.int64).reshape(-1, 2)
        got = bucket_pairs(np.repeat(np.arange(bands), n), np.tile(grp, bands), keys.T.reshape(-1),
                           np.tile(pos, bands), links)
        np.testing.assert_array_equal(got, expected)
