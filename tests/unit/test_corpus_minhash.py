"""MinHash LSH against SPEC §7's reference table and brute-force oracles."""

import random

import numpy as np
import pytest

from infra.errors import ConfigError
from tasks.corpus.build import lsh_candidate_probability, lsh_threshold
from tasks.corpus.config import MinHashConfig
from tasks.corpus.minhash import MERSENNE_P, MinHasher, UnionFind, jaccard, lsh_candidates, near_duplicates

# SPEC §7: bands, rows, threshold (2 d.p.), P at s = 0.5, 0.6, 0.7, 0.8, 0.9 (3 d.p.)
SPEC_TABLE = [
    (16, 8, 0.71, [0.061, 0.237, 0.613, 0.947, 1.000]),
    (14, 8, 0.72, [0.053, 0.211, 0.565, 0.924, 1.000]),
    (32, 4, 0.42, [0.873, 0.988, 1.000, 1.000, 1.000]),
    (8, 16, 0.88, [0.000, 0.002, 0.026, 0.204, 0.806]),
]


@pytest.mark.parametrize("bands,rows,threshold,probs", SPEC_TABLE)
def test_lsh_reference_table(bands, rows, threshold, probs):
    assert round(lsh_threshold(bands, rows), 2) == threshold
    got = [round(lsh_candidate_probability(s, bands, rows), 3) for s in (0.5, 0.6, 0.7, 0.8, 0.9)]
    assert got == probs
    # SPEC §7: P at the threshold ≈ 0.63 (1 − 1/e for large b)
    assert lsh_candidate_probability(lsh_threshold(bands, rows), bands, rows) == pytest.approx(0.63, abs=0.03)


def test_signature_matches_big_integer_oracle():
    hasher = MinHasher(num_perm=16, seed=3)
    x = np.array([MERSENNE_P - 1, 12345, 2**31 - 2], dtype=np.int64)  # worst case: x close to p
    expected = [min((int(a) * int(v) + int(b)) % MERSENNE_P for v in x) for a, b in zip(hasher.a, hasher.b)]
    got = ((x[:, None] * hasher.a[None, :] + hasher.b[None, :]) % MERSENNE_P).min(axis=0)
    assert got.tolist() == expected
    assert hasher.signature(set()) is None


def test_signature_agreement_estimates_jaccard():
    rng = random.Random(0)
    hasher = MinHasher(num_perm=112, seed=0)
    errors = []
    for _ in range(30):
        base = {f"s{rng.randrange(5000)}" for _ in range(300)}
        other = {s for s in base if rng.random() < rng.uniform(0.3, 1.0)} | {f"t{rng.randrange(5000)}" for _ in range(40)}
        est = float(np.mean(hasher.signature(base) == hasher.signature(other)))
        errors.append(abs(est - len(base & other) / len(base | other)))
    assert np.mean(errors) < 0.06  # std of the estimate is sqrt(J(1-J)/112) <= 0.047


def _word_5gram_oracle(text):
    w = text.lower().split()
    return {tuple(w[i:i + 5]) for i in range(len(w) - 4)}


def test_edited_copy_is_found_and_verified_by_jaccard():
    rng = random.Random(1)
    words = [f"w{rng.randrange(10**6)}" for _ in range(400)]
    copy = list(words)
    copy[200] = "changed"
    other = [f"o{rng.randrange(10**6)}" for _ in range(400)]
    texts = [" ".join(words), " ".join(other), " ".join(copy)]
    found = near_duplicates(texts, [False] * 3, MinHashConfig())
    assert found.representative == [0, 1, 0]
    oracle = len(_word_5gram_oracle(texts[0]) & _word_5gram_oracle(texts[2])) / len(
        _word_5gram_oracle(texts[0]) | _word_5gram_oracle(texts[2]))
    assert found.jaccard_to_rep[2] == pytest.approx(oracle)
    assert oracle >= 0.8


def test_distinct_short_documents_never_match():
    texts = ["Hello world.", "Hello there world.", "Good morning", "", "  "]
    found = near_duplicates(texts, [False, False, False, False, True], MinHashConfig(shingle_size=5))
    assert found.representative == [0, 1, 2, 3, 4]
    assert found.num_candidates == 0


def test_lsh_candidates_skip_empty_signatures_and_pair_equal_bands():
    sig = np.arange(8, dtype=np.int64)
    assert lsh_candidates([sig, None, sig.copy(), sig + 100], bands=2, rows=4) == {(0, 2)}


def test_union_find_keeps_lowest_index():
    uf = UnionFind(5)
    for i, j in [(3, 4), (4, 1), (2, 3)]:
        uf.union(i, j)
    assert [uf.find(i) for i in range(5)] == [0, 1, 1, 1, 1]
    assert jaccard(set(), set()) == 0.0


@pytest.mark.parametrize("kwargs", [dict(bands=16, rows=8, num_perm=112), dict(jaccard_threshold=0.0),
                                    dict(jaccard_threshold=1.2)])
def test_minhash_config_rejects_bad_values(kwargs):
    with pytest.raises(ConfigError):
        MinHashConfig(**kwargs)
