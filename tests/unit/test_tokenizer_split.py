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
