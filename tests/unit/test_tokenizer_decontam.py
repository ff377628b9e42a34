"""Held-out decontamination: a training document quoting a held-out passage is removed with the reason."""

import pandas as pd

from tasks.train.heldout_overlap import decontaminate_train

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
