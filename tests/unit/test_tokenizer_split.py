"""Held-out split: whole families on one side, deterministic, per-source minimums (docs/methods.md §10)."""

import logging
import os
import subprocess
import sys

import pandas as pd
import pytest

from infra.errors import DataError
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.split import assign_splits, split_summary


def _kept(n_families: int = 400, sources=("web", "wiki", "code")) -> pd.DataFrame:
    rows = []
    for f in range(n_families):
        for copy in range(1 + f % 4):  # families of 1..4 near-duplicates
            rows.append(dict(doc_id=f"d{f}-{copy}", source=sources[f % len(sources)], family_id=f"fam{f}"))
    return pd.DataFrame(rows)


def test_families_never_straddle_the_split():
    kept = _kept()
    splits = assign_splits(kept, TokenizerConfig())
    assert set(splits) == {"train", "heldout"}
    assert (splits.groupby(kept["family_id"]).nunique() == 1).all()


def test_heldout_share_of_families_near_fraction():
    kept = _kept(n_families=3000)
    splits = assign_splits(kept, TokenizerConfig(heldout_fraction=0.1))
    family_side = splits.groupby(kept["family_id"]).first()
    assert 0.08 < (family_side == "heldout").mean() < 0.12


def test_same_seed_same_split_regardless_of_row_order():
    kept = _kept()
    first = assign_splits(kept, TokenizerConfig(seed=3))
    shuffled = kept.sample(frac=1.0, random_state=1)
    again = assign_splits(shuffled, TokenizerConfig(seed=3))
    assert again.reindex(first.index).equals(first)
    assert not assign_splits(kept, TokenizerConfig(seed=4)).equals(first)


def test_split_does_not_depend_on_python_hash_salt():
    code = (
        "from tests.unit.test_tokenizer_split import _kept;"
        "from tasks.tokenizer.split import assign_splits;"
        "from tasks.tokenizer.config import TokenizerConfig;"
        "print(''.join('h' if s == 'heldout' else 't' for s in assign_splits(_kept(), TokenizerConfig())))"
    )
    outputs = set()
    for salt in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": salt}
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                             cwd=os.path.join(os.path.dirname(__file__), "..", ".."))
        outputs.add(run.stdout.strip())
    assert len(outputs) == 1


def test_every_source_gets_heldout_and_train_docs():
    kept = _kept(n_families=12, sources=("a", "b", "c", "d", "e", "f"))  # 2 families per source
    cfg = TokenizerConfig(heldout_fraction=0.01, min_heldout_docs=1)
    splits = assign_splits(kept, cfg)
    per_source = splits.groupby(kept["source"]).value_counts().unstack(fill_value=0)
    assert (per_source["heldout"] >= 1).all()
    assert (per_source["train"] >= 1).all()


def test_source_mostly_heldout_keeps_a_train_family():
    kept = _kept(n_families=4, sources=("only",))
    splits = assign_splits(kept, TokenizerConfig(heldout_fraction=0.99))
    assert (splits == "train").any()


def test_single_family_source_goes_to_train_and_is_reported(caplog):
    kept = pd.concat([_kept(), pd.DataFrame([dict(doc_id="solo", source="tiny", family_id="lonely")])],
                     ignore_index=True)
    cfg = TokenizerConfig(heldout_fraction=0.5)
    with caplog.at_level(logging.WARNING):
        splits = assign_splits(kept, cfg)
    assert splits[kept["source"] == "tiny"].eq("train").all()
    assert "tiny" in caplog.text
    summary = split_summary(kept, splits, cfg).set_index("source")
    assert summary.loc["tiny", "n_heldout_docs"] == 0
    assert "single family" in summary.loc["tiny", "note"]
    assert summary.loc["web", "note"] == ""


def test_missing_family_column_refused():
    with pytest.raises(DataError, match="family_id"):
        assign_splits(pd.DataFrame(dict(doc_id=["a"], source=["s"])), TokenizerConfig())


def _reference_splits(kept: pd.DataFrame, cfg: TokenizerConfig) -> list[str]:
    """The split one family at a time over the whole frame (how it was first written)."""
    from tasks.tokenizer.split import family_score

    families = kept["family_id"].astype(str)
    scores, heldout = {}, set()
    for source, rows in kept.assign(family_id=families).groupby("source", sort=True):
        docs_per_family = rows["family_id"].value_counts()
        for family in docs_per_family.index:
            if family not in scores:
                scores[family] = family_score(family, cfg.seed)
                if scores[family] < cfg.heldout_fraction:
                    heldout.add(family)
        by_score = sorted(docs_per_family.index, key=scores.__getitem__)
        if len(by_score) == 1:
            heldout.discard(by_score[0])
            continue
        if all(f in heldout for f in by_score):
            heldout.discard(by_score[-1])
        n_heldout = sum(int(docs_per_family[f]) for f in by_score if f in heldout)
        train = [f for f in by_score if f not in heldout]
        while n_heldout < cfg.min_heldout_docs and len(train) > 1:
            moved = train.pop(0)
            heldout.add(moved)
            n_heldout += int(docs_per_family[moved])
    return ["heldout" if f in heldout else "train" for f in families]


def _random_kept(seed: int) -> pd.DataFrame:
    import random

    rng = random.Random(seed)
    n_sources, n_families = rng.randrange(1, 6), rng.randrange(1, 60)
    return pd.DataFrame([dict(doc_id=f"d{i}", source=f"s{rng.randrange(n_sources)}",  # families may span sources
                              family_id=f"f{rng.randrange(n_families)}") for i in range(rng.randrange(1, 200))])


@pytest.mark.parametrize("seed", range(40))
def test_the_split_is_the_one_family_at_a_time_rule(seed):
    kept = _random_kept(seed)
    cfg = TokenizerConfig(heldout_fraction=[0.05, 0.1, 0.5, 0.9][seed % 4],
                          min_heldout_docs=[0, 1, 5, 20][seed // 4 % 4], seed=seed % 3)
    assert list(assign_splits(kept, cfg)) == _reference_splits(kept, cfg)


@pytest.mark.parametrize("part_rows", [1, 7, 1000])
def test_counting_families_part_by_part_gives_the_same_split(part_rows):
    """The stage's streaming split: documents per (source, family) counted part by part and summed, then the
    labels of each part from its family keys."""
    import numpy as np

    from tasks.tokenizer.split import family_keys, heldout_families, labels, pair_counts

    kept = _kept(n_families=300)
    cfg = TokenizerConfig(heldout_fraction=0.05, min_heldout_docs=8)
    names = sorted(kept["source"].unique())
    counted = []
    for start in range(0, len(kept), part_rows):
        part = kept.iloc[start:start + part_rows]
        counted.append(pair_counts(part["source"].map(names.index).to_numpy(np.int32),
                                   family_keys(part["family_id"], cfg.seed)))
    codes, keys, n_docs = pair_counts(*(np.concatenate(column) for column in zip(*counted)))
    heldout = heldout_families(pd.DataFrame({"source": pd.Categorical.from_codes(codes, categories=names),
                                             "key": keys, "n_docs": n_docs}), cfg)
    streamed = np.concatenate([labels(family_keys(kept["family_id"].iloc[s:s + part_rows], cfg.seed), heldout)
                               for s in range(0, len(kept), part_rows)])
    assert list(np.where(streamed, "heldout", "train")) == list(assign_splits(kept, cfg))
