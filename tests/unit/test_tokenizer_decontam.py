"""Held-out decontamination: a training document quoting a held-out passage is removed with the reason."""

import numpy as np
import pandas as pd
import pytest

from tasks.train.heldout_overlap import REMOVAL_COLUMNS, decontaminate_train

PASSAGE = ("the backup script copies every database dump to the remote archive and then checks the checksum "
           "of each file before it deletes the local copy")


def test_training_document_sharing_a_passage_is_removed():
    kept = pd.DataFrame([
        dict(doc_id="a/1", source="a", split="heldout", text="Intro text. " + PASSAGE + " Closing words here."),
        dict(doc_id="a/2", source="a", split="train", text="Another page.\n" + PASSAGE.replace(" the remote", "\nthe remote")),
        dict(doc_id="b/1", source="b", split="train", text="An unrelated page about gardening and soil and seeds " * 3),
    ])
    clean, removals = decontaminate_train(kept, ngram=13, common_min_docs=50)
    assert clean["doc_id"].tolist() == ["a/1", "b/1"]
    row = removals.iloc[0]
    assert (row.doc_id, row.stage, row.rule) == ("a/2", "decontam_heldout", "decontam.heldout_overlap")
    assert "a/1" in row.detail


def test_turned_off_and_common_phrases_keep_everything():
    kept = pd.DataFrame([dict(doc_id=f"a/{i}", source="a", split="heldout" if i == 0 else "train", text=PASSAGE)
                         for i in range(4)])
    assert len(decontaminate_train(kept, ngram=0, common_min_docs=50)[0]) == 4
    clean, removals = decontaminate_train(kept, ngram=13, common_min_docs=3)
    assert len(clean) == 4 and removals.empty


def test_the_index_lookup_is_np_isin_over_the_sorted_n_grams():
    import numpy as np

    from evals.contamination import _member

    rng = np.random.default_rng(0)
    grams = np.unique(rng.integers(0, 2**64 - 1, 5000, dtype=np.uint64))
    values = np.concatenate([rng.choice(grams, 300), rng.integers(0, 2**64 - 1, 300, dtype=np.uint64),
                             np.array([0, 2**64 - 1, grams[0], grams[-1]], dtype=np.uint64)])
    np.testing.assert_array_equal(_member(values, grams), np.isin(values, grams))


def _reference(kept, ngram, common_min_docs):
    """The decontamination one document at a time through ``evals.contamination.EvalIndex`` (how it was first
    written): the vectorised passes must remove the same documents with the same ledger rows."""
    from evals.contamination import EvalIndex, EvalItem

    heldout = kept[kept["split"] == "heldout"]
    index = EvalIndex.build((EvalItem(f"heldout:{s}", d, t) for d, s, t in
                             zip(heldout["doc_id"], heldout["source"], heldout["text"])), ngram)
    train = kept[kept["split"] == "train"]
    hits = [(d, n, h) for d, t in zip(train["doc_id"], train["text"]) for n, h in index.hits(t)]
    table = pd.DataFrame(hits, columns=["doc_id", "length", "hash"])
    table = table[(table.groupby(["length", "hash"])["doc_id"].transform("nunique") < common_min_docs).to_numpy()]
    source_of = dict(zip(train["doc_id"], train["source"]))
    rows = []
    for doc_id, mine in table.groupby("doc_id", sort=False):
        text, item = index.describe(int(mine["length"].iloc[0]), int(mine["hash"].iloc[0]))
        rows.append(dict(doc_id=doc_id, source=source_of[doc_id], stage="decontam_heldout",
                         rule="decontam.heldout_overlap", value=float(len(mine)), threshold=1.0,
                         detail=f"shares {ngram}-gram {text!r} with held-out document {item.item_id} "
                                f"({len(mine)} n-grams)"))
    return pd.DataFrame(rows, columns=REMOVAL_COLUMNS)


def _overlapping(seed: int, n: int = 300):
    """Documents recombined from a few passages and short word runs, so held-out and training documents share
    n-grams of every length from 8 words up, some common, some not; a few quote the batch separator's letter."""
    import random

    rng = random.Random(seed)
    words = PASSAGE.split() + ["Ǆemal", "ǅ", "naïve", "软件包", "x_1", "ΣΑΣ"]
    rows = []
    for i in range(n):
        k = rng.choice([0, 3, 8, 9, 12, 13, 30, 60])
        text = " ".join(rng.choice(words) if rng.random() < 0.3 else PASSAGE.split()[j % 24] for j in
                        range(rng.randrange(0, 5), rng.randrange(0, 5) + k))
        rows.append(dict(doc_id=f"s{i % 3}/{i}", source=f"s{i % 3}", text=text,
                         split="heldout" if rng.random() < 0.2 else "train"))
    return pd.DataFrame(rows)


@pytest.mark.parametrize("seed, common", [(0, 50), (1, 3), (2, 2), (3, 10)])
def test_vectorised_decontamination_removes_what_the_per_document_lookup_removes(seed, common):
    kept = _overlapping(seed)
    clean, removals = decontaminate_train(kept, ngram=13, common_min_docs=common)
    expected = _reference(kept, 13, common)
    assert len(expected)  # the case is not empty
    pd.testing.assert_frame_equal(removals.reset_index(drop=True), expected.reset_index(drop=True))
    assert set(clean["doc_id"]) == set(kept["doc_id"]) - set(expected["doc_id"])


def test_batch_windows_are_the_per_document_window_hashes():
    from evals.contamination import tokens, window_hashes
    from tasks.train.heldout_overlap import windows, word_hashes

    texts = list(_overlapping(4, 60)["text"]) + ["", "ǅ", "Ǆ ǅ ǆ", "one two"]
    words = word_hashes(texts)
    for t, text in enumerate(texts):
        expected = tokens(text)
        assert words.counts[t] == len(expected)
        for n in (1, 2, 8, 13):
            hashes, owner = windows(words, n, np.array([t]))
            np.testing.assert_array_equal(hashes, window_hashes(expected, n))
            assert (owner == t).all()


def test_the_stage_passes_per_part_remove_what_one_frame_removes(tmp_path):
    """The stage's part-by-part index, lookups and count of common n-grams (any part sizes) give the ledger of
    ``decontaminate_train`` on the whole corpus."""
    import json

    from infra.runs import RunsLayout
    from infra.stage import StageContext
    from tasks.tokenizer.config import TokenizerConfig
    from tasks.tokenizer.stage import run

    kept = _overlapping(5, 400).assign(family_id=lambda f: f["doc_id"], language="en")
    kept = kept.assign(n_bytes=kept["text"].str.len())
    cfg = TokenizerConfig(vocab_size=300, sample_max_chars=5000, heldout_fraction=0.2, min_heldout_docs=2,
                          decontam_common_docs=4)
    corpus = tmp_path / "corpus"
    (corpus / "kept").mkdir(parents=True)
    (corpus / "manifest.json").write_text(json.dumps({"manifest_hash": "0" * 64}))
    for p, start in enumerate(range(0, len(kept), 37)):
        kept.drop(columns=["split"]).iloc[start:start + 37].to_parquet(corpus / "kept" / f"part-{p:05d}.parquet")
    out = tmp_path / "artifacts" / "tokenizer" / "k"
    out.mkdir(parents=True)
    run(StageContext(out=out, inputs={"corpus": corpus}, layout=RunsLayout(tmp_path), key="k", experiment="t"), cfg)
    splits = pd.read_parquet(out / "splits.parquet")
    removals = pd.read_parquet(out / "removals.parquet")
    assert len(removals)
    whole = kept.drop(columns=["split"]).merge(pd.concat([splits, removals.assign(split="train")])[["doc_id", "split"]],
                                               on="doc_id")
    _, expected = decontaminate_train(whole, ngram=13, common_min_docs=4)
    pd.testing.assert_frame_equal(removals, expected.reset_index(drop=True))
