"""Near-duplicate detection (docs/methods.md §7) against its reference table and brute-force oracles."""

import warnings
import random

import numpy as np
import pytest
from pydantic import ValidationError

from infra.errors import ConfigError
from tasks.corpus import minhash
from tasks.corpus.config import MinHashConfig
from tasks.corpus.minhash import (EMPTY, MERSENNE_P, band_keys, jaccard, jaccard_hashes,
                                  lsh_candidate_probability, lsh_threshold,
                                  oph_probes, permutations, s_curve, shingle_hash_sets, shingle_hash_table,
                                  shingle_hashes, shingles, signatures)

# docs/methods.md §7: bands, rows, threshold (2 d.p.), P at s = 0.5, 0.6, 0.7, 0.8, 0.9 (3 d.p.)
S_CURVE_TABLE = [
    (16, 8, 0.71, [0.061, 0.237, 0.613, 0.947, 1.000]),
    (14, 8, 0.72, [0.053, 0.211, 0.565, 0.924, 1.000]),
    (32, 4, 0.42, [0.873, 0.988, 1.000, 1.000, 1.000]),
    (8, 16, 0.88, [0.000, 0.002, 0.026, 0.204, 0.806]),
]
FAMILIES = ["oph", "universal"]
WORDS = ["alpha", "Beta", "gamma", "dé", "ÉTÉ", "x\x00", "中文", "a", "b", "hello", "world", "zz"]
SPACES = [" ", "  ", "\n", "\t", "\u3000", "\xa0", "\x1c", "\u2009", ""]


def _random_words(rng: random.Random, n: int, prefix: str = "w") -> list[str]:
    return [f"{prefix}{rng.randrange(10**6)}" for _ in range(n)]


def _messy_text(rng: random.Random) -> str:
    return "".join(rng.choice(WORDS) + rng.choice(SPACES) for _ in range(rng.randint(0, 30)))


def _oracle_shingles(text: str, size: int, by_chars: bool) -> set[str]:
    units = "".join(text.lower().split()) if by_chars else text.lower().split()
    if not units:
        return set()
    sep = "" if by_chars else " "
    if len(units) < size:
        return {sep.join(units)}
    return {sep.join(units[i:i + size]) for i in range(len(units) - size + 1)}


def _oracle_signature(text: str, by_chars: bool, cfg: MinHashConfig) -> list[int]:
    a, b = permutations(cfg.num_perm, cfg.seed)
    xs = [int(h) % MERSENNE_P for h in shingle_hashes(text, cfg.shingle_size, by_chars)]
    return [min((int(ai) * x + int(bi)) % MERSENNE_P for x in xs) for ai, bi in zip(a, b)]


def _fmix64(h: int) -> int:
    mask = (1 << 64) - 1
    h ^= h >> 33
    h = h * 0xC2B2AE3D27D4EB4F & mask
    h ^= h >> 29
    h = h * 0x165667B19E3779F9 & mask
    return h ^ h >> 32


def _oracle_oph(text: str, by_chars: bool, cfg: MinHashConfig) -> list[int]:
    """One-permutation hashing with optimal densification, one shingle and one bin at a time."""
    k, key = cfg.num_perm, int(minhash._oph_seed(cfg.seed))
    bins: dict[int, int] = {}
    for h in shingle_hashes(text, cfg.shingle_size, by_chars).tolist():
        g = _fmix64(h ^ key)
        i, v = (g >> 32) * k >> 32, (g & 0xFFFFFFFF) >> 1
        bins[i] = min(bins.get(i, v), v)
    probes = oph_probes(k, cfg.seed)
    return [bins[i] if i in bins else next(bins[int(j)] for j in probes[i] if int(j) in bins) for i in range(k)]


@pytest.mark.parametrize("bands,rows,threshold,probs", S_CURVE_TABLE)
def test_lsh_reference_table(bands, rows, threshold, probs):
    assert round(lsh_threshold(bands, rows), 2) == threshold
    got = [round(lsh_candidate_probability(s, bands, rows), 3) for s in (0.5, 0.6, 0.7, 0.8, 0.9)]
    assert got == probs
    assert [round(p, 3) for _, p in s_curve(bands, rows)] == probs
    # docs/methods.md §7: P at the threshold ≈ 0.63 (1 − 1/e for large b)
    assert lsh_candidate_probability(lsh_threshold(bands, rows), bands, rows) == pytest.approx(0.63, abs=0.03)


def test_shingles_match_the_plain_definition():
    rng = random.Random(0)
    for _ in range(300):
        text, by_chars, size = _messy_text(rng), rng.random() < 0.4, rng.choice([1, 2, 5])
        assert shingles(text, size, by_chars) == _oracle_shingles(text, size, by_chars)


def test_shingle_hashes_are_one_per_shingle_and_give_the_same_jaccard():
    rng = random.Random(1)
    for _ in range(200):
        a, b, by_chars, size = _messy_text(rng), _messy_text(rng), rng.random() < 0.4, rng.choice([1, 3, 5])
        ha, hb = shingle_hashes(a, size, by_chars), shingle_hashes(b, size, by_chars)
        assert ha.dtype == np.uint64 and np.all(np.diff(ha.astype(np.float64)) >= 0)
        assert len(ha) == len(shingles(a, size, by_chars))
        exact = jaccard(shingles(a, size, by_chars), shingles(b, size, by_chars))
        assert jaccard_hashes(ha, hb) == pytest.approx(exact)
    assert shingle_hashes("", 5, False).size == 0 and shingle_hashes(" \u3000\n", 5, True).size == 0


def test_table_lower_casing_matches_str_lower_with_whitespace_folded():
    rng = random.Random(14)
    units = ["A", "b", "É", "ΑΣ", "Σ", "İ", "ß", "Ǆ", "K", "ﬃ", "\U00010400", "😀", "中", "\ud800", " ", "\n", "\u3000",
             "\xa0", "\x1c", "\x85", "\u2028"]
    for trial in range(400):
        texts = ["".join(rng.choice(units) for _ in range(rng.randint(0, 10))) for _ in range(rng.randint(0, 4))]
        if trial % 2:  # batches without Σ and İ take the table path
            texts = [t.replace("Σ", "").replace("İ", "") for t in texts]
        cps, starts = minhash._code_points(texts)
        lows = [t.lower() for t in texts]
        assert starts.tolist() == np.cumsum([0] + [len(t) + 1 for t in lows]).tolist()
        expected = [0x20 if ch.isspace() else ord(ch) for ch in "\n".join(lows)]
        assert cps.tolist() == expected


def test_word_and_character_shingles_never_collide():
    text = "abcde fghij klmno pqrst"
    words, chars = shingle_hashes(text, 5, False), shingle_hashes(text.replace(" ", ""), 1, True)
    assert not np.any(words >> np.uint64(63)) and np.all(chars >> np.uint64(63))
    # "abcde" is both a one-word shingle of size 1 and a 5-character shingle: different hashes
    assert not set(shingle_hashes("abcde", 1, False).tolist()) & set(shingle_hashes("abcde", 5, True).tolist())


def test_batch_hash_sets_equal_single_ones():
    rng = random.Random(2)
    texts = [_messy_text(rng) for _ in range(40)] + ["", " ", ""]
    flags = [rng.random() < 0.5 for _ in texts]
    for text, flag, got in zip(texts, flags, shingle_hash_sets(texts, 3, flags)):
        assert np.array_equal(got, shingle_hashes(text, 3, flag))


@pytest.mark.parametrize("family,oracle", [("universal", _oracle_signature), ("oph", _oracle_oph)])
def test_signatures_match_the_plain_oracle(family, oracle):
    rng = random.Random(3)
    cfg = MinHashConfig(num_perm=24, bands=3, rows=8, family=family)
    texts = [" ".join(_random_words(rng, rng.randint(0, 40))) for _ in range(30)]
    texts += [_messy_text(rng) for _ in range(30)]
    flags = [i % 3 == 0 for i in range(len(texts))]
    sigs, has = signatures(texts, flags, cfg)
    assert sigs.shape == (60, 24) and sigs.dtype == np.uint32 and has.dtype == bool
    for text, flag, row, present in zip(texts, flags, sigs, has):
        assert present == bool(shingle_hashes(text, 5, flag).size)
        assert row.tolist() == (oracle(text, flag, cfg) if present else [int(EMPTY)] * 24)
        assert not present or row.max() < 2**31


def test_signature_block_is_exact_at_the_edges_of_the_range():
    """The float evaluation of (a·x + b) mod p is exact for x near p and for h = 0 and h = p − 1."""
    a, b = permutations(16, seed=5)
    a_i, b_i = int(a[0]), int(b[0])
    inv = pow(a_i, -1, MERSENNE_P)
    xs = [0, 1, MERSENNE_P - 1, MERSENNE_P - 2, 2**16, 2**16 - 1, 12345,
          (-b_i * inv) % MERSENNE_P,  # h_0(x) = 0
          ((MERSENNE_P - 1 - b_i) * inv) % MERSENNE_P]  # h_0(x) = p − 1
    xs += [random.Random(6).randrange(MERSENNE_P) for _ in range(500)]
    x = np.array(xs, dtype=np.uint64)
    got = minhash._minhash_rows(x, np.ones(len(xs), dtype=np.int64), minhash._coefficients(a, b))
    expected = [[(int(ai) * v + int(bi)) % MERSENNE_P for ai, bi in zip(a, b)] for v in xs]
    assert got.tolist() == expected
    assert got[7, 0] == 0 and got[8, 0] == MERSENNE_P - 1


@pytest.mark.parametrize("family", FAMILIES)
def test_signatures_do_not_depend_on_batches_chunks_or_blocks(monkeypatch, family):
    rng = random.Random(4)
    cfg = MinHashConfig(family=family)
    texts = [" ".join(_random_words(rng, rng.randint(0, 300))) for _ in range(50)]
    texts += [_messy_text(rng) for _ in range(20)]
    flags = [rng.random() < 0.3 for _ in texts]
    whole = signatures(texts, flags, cfg)
    cut = 23
    first, second = signatures(texts[:cut], flags[:cut], cfg), signatures(texts[cut:], flags[cut:], cfg)
    assert np.array_equal(whole.signatures, np.concatenate([first.signatures, second.signatures]))
    assert np.array_equal(whole.has_shingles, np.concatenate([first.has_shingles, second.has_shingles]))
    monkeypatch.setattr(minhash, "_CHUNK_CHARS", 500)
    monkeypatch.setattr(minhash, "_BLOCK", 37)
    monkeypatch.setattr(minhash, "_PIECE", 64)
    small = signatures(texts, flags, cfg)
    assert np.array_equal(whole.signatures, small.signatures)


@pytest.mark.parametrize("family", FAMILIES)
def test_signature_agreement_estimates_jaccard(family):
    rng = random.Random(0)
    cfg = MinHashConfig(family=family)
    errors = []
    for _ in range(40):
        base = _random_words(rng, 300)
        keep = rng.uniform(0.6, 1.0)
        other = [w if rng.random() < keep else f"t{rng.randrange(10**6)}" for w in base]
        a, b = " ".join(base), " ".join(other)
        sigs, _ = signatures([a, b], False, cfg)
        estimate = float(np.mean(sigs[0] == sigs[1]))
        errors.append(abs(estimate - jaccard(shingles(a, 5, False), shingles(b, 5, False))))
    assert np.mean(errors) < 0.06  # std of the estimate is sqrt(J(1-J)/112) <= 0.047
    assert max(errors) < 0.2


def _estimate_errors(family: str, seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    """Signed errors (share of equal values − exact Jaccard) over 400 random pairs, and each pair's union size.

    Texts have 1–400 words, so from one shingle (far fewer than k = 112) to about 400; the target Jaccard u is
    uniform on [0, 1]: each word is kept with probability p, (2u/(1 + u))^(1/5), so that p^5/(2 − p^5) ≈ u.
    """
    rng = random.Random(seed)
    texts, exact, union = [], [], []
    for _ in range(400):
        base = _random_words(rng, rng.choice([rng.randint(1, 12), rng.randint(13, 120), rng.randint(121, 400)]))
        u = rng.random()
        keep = (2 * u / (1 + u)) ** 0.2
        other = [w if rng.random() < keep else f"t{rng.randrange(10**6)}" for w in base]
        texts += [" ".join(base), " ".join(other)]
        a, b = shingles(texts[-2], 5, False), shingles(texts[-1], 5, False)
        exact.append(jaccard(a, b))
        union.append(len(a | b))
    sigs, _ = signatures(texts, False, MinHashConfig(family=family))
    return np.mean(sigs[0::2] == sigs[1::2], axis=1) - np.array(exact), np.array(union)


def test_one_permutation_hashing_estimates_jaccard_as_well_as_the_universal_family():
    (oph, union), (universal, _) = _estimate_errors("oph"), _estimate_errors("universal")
    large = union >= 112
    assert 100 < large.sum() < 300
    # Unbiased (Shrivastava 2017): the mean of 400 errors of std <= 0.05 has a std near 0.0025.
    assert abs(oph.mean()) < 0.01 and abs(oph[large].mean()) < 0.01
    # Sets with at least k shingles: bins sample without replacement, no noisier than k permutations.
    assert np.abs(oph[large]).mean() < 1.1 * np.abs(universal[large]).mean()
    # Sparse sets: densified bins copy a few values, so the estimate is coarser, yet comparable overall.
    assert np.abs(oph).mean() < min(0.03, 1.35 * np.abs(universal).mean())
    assert np.abs(oph[large]).max() < 0.2 and np.abs(oph).max() < 0.4


def test_one_permutation_hashing_densifies_every_bin_from_a_non_empty_one():
    rng = random.Random(12)
    cfg = MinHashConfig()
    texts = [" ".join(_random_words(rng, n)) for n in (1, 2, 5, 6, 30, 120, 500)]
    sigs, has = signatures(texts, False, cfg)
    assert has.all() and sigs.max() < 2**31
    assert len(set(sigs[0].tolist())) == 1  # one shingle: every bin copies its value
    for text, row in zip(texts, sigs):
        assert set(row.tolist()) <= set(_oracle_oph(text, False, cfg))  # copies only, no invented values
    probes = oph_probes(112, 0)
    assert probes.shape == (112, 5 * 112 - 1) and probes.min() == 0 and probes.max() == 111
    assert all(set(probes[i].tolist()) == set(range(112)) - {i} | set(probes[i, :448].tolist()) for i in (0, 57))
    assert not np.array_equal(probes, oph_probes(112, 1))


@pytest.mark.parametrize("family", FAMILIES)
def test_identical_texts_get_identical_signatures_anywhere_in_a_batch(family):
    rng = random.Random(13)
    cfg = MinHashConfig(family=family)
    text, short = " ".join(_random_words(rng, 200)), "three words only"
    texts = [text, short] + [" ".join(_random_words(rng, rng.randint(1, 300))) for _ in range(20)] + [short, text]
    sigs, _ = signatures(texts, False, cfg)
    assert np.array_equal(sigs[0], sigs[-1]) and np.array_equal(sigs[1], sigs[-2])
    assert np.array_equal(sigs[0], signatures([text], False, cfg).signatures[0])
    other = signatures([text], False, MinHashConfig(family=family, seed=1)).signatures[0]
    assert np.mean(other == sigs[0]) < 0.1  # the seed draws another hash function


def test_band_keys_agree_exactly_when_the_band_rows_do():
    sigs = np.array([[1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9, 9], [9, 9, 9, 4, 5, 6], [1, 2, 3, 1, 2, 3]], dtype=np.uint32)
    keys = band_keys(sigs, bands=2, rows=3)
    assert keys.shape == (4, 2) and keys.dtype == np.uint64
    assert keys[0, 0] == keys[1, 0] == keys[3, 0] and keys[0, 1] == keys[2, 1]
    assert keys[0, 0] != keys[2, 0] and keys[0, 1] != keys[1, 1]
    assert keys[3, 0] != keys[3, 1]  # same rows in another band: another key
    with pytest.raises(ValueError, match="bands\\*rows"):
        band_keys(sigs, bands=3, rows=3)


@pytest.mark.parametrize("bands, rows", [(14, 8), (8, 7), (3, 1), (1, 5)])
def test_compiled_band_keys_match_the_numpy_reference_bit_for_bit(monkeypatch, bands, rows):
    pytest.importorskip("numba")
    rng = np.random.default_rng(2)
    sigs = rng.integers(0, 2**32, size=(300, bands * rows + 3), dtype=np.uint32)
    sigs[:5] = EMPTY
    monkeypatch.setattr(minhash, "USE_NUMBA", True)
    fast = band_keys(sigs, bands, rows)
    monkeypatch.setattr(minhash, "USE_NUMBA", False)
    ref = band_keys(sigs, bands, rows)
    assert fast.dtype == ref.dtype == np.uint64 and fast.shape == (300, bands)
    np.testing.assert_array_equal(fast, ref)
    np.testing.assert_array_equal(band_keys(sigs.astype(np.int64), bands, rows), ref)  # another dtype: numpy path


def test_shingle_hash_table_holds_each_texts_set_in_text_order():
    rng = random.Random(6)
    texts = ["", "中文文本没有空格", "a b c d e f g", "   "] + [_messy_text(rng) for _ in range(30)]
    for flags in (False, True, [i % 3 == 1 for i in range(len(texts))]):
        starts, table = shingle_hash_table(texts, 3, flags)
        assert starts.dtype == np.int64 and table.dtype == np.uint64 and starts[0] == 0 and starts[-1] == len(table)
        one = [flags] * len(texts) if isinstance(flags, bool) else flags
        for k, (text, flag) in enumerate(zip(texts, one)):
            np.testing.assert_array_equal(table[starts[k]:starts[k + 1]], shingle_hashes(text, 3, flag))


@pytest.mark.parametrize("kwargs", [dict(bands=16, rows=8, num_perm=112), dict(jaccard_threshold=0.0),
                                    dict(jaccard_threshold=1.2), dict(max_removal_share=1.5),
                                    dict(max_removal_share=-0.1), dict(rows=0)])
def test_minhash_config_rejects_bad_values(kwargs):
    with pytest.raises(ConfigError):
        MinHashConfig(**kwargs)


def test_minhash_config_defaults_and_scope():
    cfg = MinHashConfig()
    assert (cfg.enabled, cfg.family, cfg.num_perm, cfg.bands, cfg.rows, cfg.scope, cfg.max_removal_share) == (
        True, "oph", 112, 14, 8, "source", 0.5)
    with pytest.raises(ValidationError):
        MinHashConfig(scope="snapshot")
    with pytest.raises(ValidationError):
        MinHashConfig(family="sha1")


def _kernel_texts() -> list[str]:
    """Empty and blank texts, one word, fewer words than the shingle size, unicode (Σ, İ, astral, whitespace of
    every kind), CJK, and long documents."""
    rng = random.Random(11)
    texts = ["", " ", "\n\t\u3000", "one", "Two Words", "a b c d", "Σίσυφος ΟΔΟΣ İstanbul 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 déjà vu",
             "中文文本没有空格也能按字符分片", "日本語", "x" * 3, "\u3000中 文\u3000"]
    texts += [_messy_text(rng) for _ in range(150)]
    texts += [" ".join(_random_words(rng, 20_000)), "中文" * 30_000, "w " * 5_000]
    return texts


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("size", [1, 3, 5])
def test_compiled_kernels_match_the_numpy_reference_bit_for_bit(monkeypatch, family, size):
    pytest.importorskip("numba")
    texts = _kernel_texts()
    cfg = MinHashConfig(family=family, shingle_size=size, num_perm=64, bands=8, rows=8)
    for flags in (False, True, [i % 3 == 0 for i in range(len(texts))]):
        monkeypatch.setattr(minhash, "USE_NUMBA", True)
        assert minhash._kernels() is not None
        fast = signatures(texts, flags, cfg)
        fast_sets = shingle_hash_sets(texts, size, flags)
        monkeypatch.setattr(minhash, "USE_NUMBA", False)
        assert minhash._kernels() is None
        ref = signatures(texts, flags, cfg)
        ref_sets = shingle_hash_sets(texts, size, flags)
        assert fast.signatures.dtype == ref.signatures.dtype == np.uint32
        np.testing.assert_array_equal(fast.signatures, ref.signatures)
        np.testing.assert_array_equal(fast.has_shingles, ref.has_shingles)
        assert len(fast_sets) == len(ref_sets)
        for a, b in zip(fast_sets, ref_sets):
            assert a.dtype == b.dtype == np.uint64
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("by_chars", [False, True])
def test_compiled_shingle_hashes_match_the_numpy_reference_with_repeats_and_order(monkeypatch, by_chars):
    pytest.importorskip("numba")
    texts = _kernel_texts()
    monkeypatch.setattr(minhash, "USE_NUMBA", True)
    fast = minhash._batch_shingle_hashes(texts, 5, by_chars)
    single = [shingle_hashes(t, 5, by_chars) for t in texts[:40]]
    monkeypatch.setattr(minhash, "USE_NUMBA", False)
    ref = minhash._batch_shingle_hashes(texts, 5, by_chars)
    for a, b in zip(fast, ref):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    for t, h in zip(texts[:40], single):
        np.testing.assert_array_equal(h, shingle_hashes(t, 5, by_chars))


def test_near_dedup_with_unused_permutations_or_an_unreachable_threshold_warns_at_load():
    from infra.errors import ConfigWarning

    with pytest.warns(ConfigWarning, match=r"bands×rows = 10×8 = 80 of num_perm=112: 32 signature values"):
        MinHashConfig(bands=10, rows=8)
    # (1/14)^(1/8) = 0.719; 1 - (1 - 0.55^8)^14 = 0.111 (Leskovec, Rajaraman & Ullman, ch. 3)
    curve = r"jaccard_threshold=0\.55 .* \(1/14\)\^\(1/8\) = 0\.719: .* = 0\.111"
    with pytest.warns(ConfigWarning, match=curve) as got:
        cfg = MinHashConfig(jaccard_threshold=0.55)
    assert "bands=28, rows=4" in str(got[0].message)  # a split of the 112 values that reaches 0.55
    figures = cfg.lsh_figures()
    assert figures["unused_permutations"] == 0
    assert figures["implied_threshold"] == pytest.approx((1 / 14) ** (1 / 8))
    assert figures["candidate_probability_at_threshold"] == pytest.approx(1 - (1 - 0.55**8) ** 14)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        MinHashConfig()  # 14 × 8 of 112 at 0.8: P = 0.924
        MinHashConfig(enabled=False, bands=10, rows=8, jaccard_threshold=0.3)  # nothing computed: nothing to say


def test_manifest_records_the_lsh_figures_and_warnings():
    from types import SimpleNamespace

    import pandas as pd

    from tasks.corpus.config import CorpusConfig
    from tasks.corpus.stage import build_manifest

    with pytest.warns(UserWarning):
        cfg = CorpusConfig(near_dedup=MinHashConfig(bands=10, rows=8, jaccard_threshold=0.6))
    empty = pd.DataFrame()
    result = SimpleNamespace(funnel=empty, hits=empty, near={}, boilerplate_units=0)
    near = build_manifest({}, empty, empty, empty, empty, result, cfg, [])["near_dedup"]
    assert near["unused_permutations"] == 32
    assert near["implied_threshold"] == pytest.approx(0.1 ** (1 / 8))
    assert near["candidate_probability_at_threshold"] == pytest.approx(1 - (1 - 0.6**8) ** 10)
    assert len(near["warnings"]) == 2 and "32 signature values" in near["warnings"][0]
