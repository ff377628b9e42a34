"""CPT-stream decontamination in token 13-grams, and the replay sampler's two policies."""

import numpy as np
import pytest

from evals.cloze import ClozeItem
from evals.heldout import HeldoutLoss, keep_windows
from infra.errors import ConfigError, DataError
from tasks.cpt.eval_overlap import cloze_hits, ngram_hashes, training_ngrams, window_hits
from tasks.train.data import MixtureSampler


def test_shared_13_grams_are_found_and_12_are_not():
    rng = np.random.default_rng(0)
    train = rng.integers(0, 50_000, 5_000)
    grams = training_ngrams([train])
    assert len(grams) == len(train) - 12  # random ids: every 13-gram distinct
    clean = rng.integers(0, 50_000, (3, 65))
    dirty = clean.copy()
    dirty[1, 20:33] = train[100:113]  # one shared 13-gram
    dirty[2, 40:52] = train[200:212]  # a shared 12-gram only
    assert window_hits(clean, grams).tolist() == [0, 0, 0]
    assert window_hits(dirty, grams).tolist() == [0, 1, 0]
    assert len(ngram_hashes(np.arange(12))) == 0


def test_cloze_items_are_checked_on_context_plus_correct_continuation():
    vocab = {w: i for i, w in enumerate("a b c d e f g h i j k l m n o p q r s t".split())}
    encode = lambda text: [vocab[w] for w in text.split()]  # noqa: E731
    train = training_ngrams([np.array(encode("a b c d e f g h i j k l m n"))])
    items = [ClozeItem("in", "general", "a b c d e f g h i j k l", [" m", " t"], 0),
             ClozeItem("wrong-option", "general", "a b c d e f g h i j k l", [" t", " m"], 0),
             ClozeItem("out", "general", "t s r q p o n m l k j i", [" h", " a"], 0)]
    assert cloze_hits(items, encode, train).tolist() == [1, 0, 0]


def test_dropping_windows_keeps_the_sums_consistent():
    loss = HeldoutLoss(2.0, 8.0, 4, np.array([1.0, 3.0, 2.0, 2.0]), np.array([1, 1, 1, 1]))
    kept = keep_windows(loss, np.array([True, False, True, True]))
    assert (kept.sum_nats, kept.n_tokens, kept.loss_nats) == (5.0, 3, pytest.approx(5 / 3))
    with pytest.raises(DataError, match="keep at least one"):
        keep_windows(loss, np.zeros(4, bool))


def test_bernoulli_replay_holds_the_share_in_expectation_and_resumes():
    data = {"domain": np.arange(20_000) % 500, "general": np.arange(20_000) % 400}
    make = lambda: MixtureSampler(data, {"domain": 0.7, "general": 0.3}, seq_len=8, batch_size=10, seed=3,  # noqa: E731
                                  sampling="bernoulli")
    sampler = make()
    counts = [sum(s == "general" for s in sampler.next_batch().sources) for _ in range(300)]
    assert len(set(counts)) > 2  # varies per batch, unlike exact apportioning
    assert sampler.realised_fractions()["general"] == pytest.approx(0.3, abs=0.02)
    state = sampler.state_dict()
    after = [sampler.next_batch().x for _ in range(3)]
    resumed = make()
    resumed.load_state_dict(state)
    assert all((a == b).all() for a, b in zip(after, (resumed.next_batch().x for _ in range(3))))
    exact = MixtureSampler(data, {"domain": 0.7, "general": 0.3}, seq_len=8, batch_size=10, seed=3)
    with pytest.raises(DataError, match="sampling"):
        exact.load_state_dict(state)
    with pytest.raises(ConfigError, match="bernoulli"):
        MixtureSampler(data, {"domain": 0.7, "general": 0.3}, seq_len=8, batch_size=10, seed=3, sampling="poisson")
