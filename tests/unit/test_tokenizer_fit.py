"""Fitted byte-level BPE obeys docs/methods.md §8: digits split, specials atomic, lossless on any Unicode, padded vocab."""

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from infra.errors import ConfigError, DataError
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.fit import (check_tokenizer, eos_id, fit_tokenizer, padded_vocab_size, sample_texts,
                                 tokenizer_hash)

SPECIALS = TokenizerConfig().special_tokens
ZH = "我们今天在北京学习语言模型的训练方法数据质量非常重要中文分词很难"
EN = "the cat sat on a mat and the dog ran to big red houses while people read books about".split()


def mixed_corpus(n_lines: int = 300, seed: int = 0) -> list[str]:
    """English, Chinese and numbers, with many repeated multi-digit strings that BPE would love to merge."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        lines.append(" ".join(rng.choice(EN) for _ in range(10)) + f" in 1999 and 2024, {rng.randint(0, 10**6)} times")
        lines.append("".join(rng.choice(ZH) for _ in range(24)) + f"{rng.randint(1900, 2100)}年12345")
    return lines


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return fit_tokenizer(mixed_corpus(), TokenizerConfig(vocab_size=700))


def _token_text(tok: Tokenizer, token_id: int) -> str:
    # Oracle independent of the module under test: the ByteLevel decoder applied to one entry.
    return tok.decoder.decode([tok.id_to_token(token_id)])


def test_no_vocab_entry_holds_two_digits(tok):
    special_ids = {tok.token_to_id(s) for s in SPECIALS}
    for token_id in range(tok.get_vocab_size()):
        if token_id in special_ids:
            continue
        text = _token_text(tok, token_id)
        assert sum(ch in "0123456789" for ch in text) <= 1, text


@pytest.mark.parametrize("number", ["12345", "2024", "1999", "000"])
def test_numbers_encode_one_token_per_digit(tok, number):
    assert tok.encode(number).tokens == list(number)


def test_chinese_is_merged_not_left_as_bytes(tok):
    # Guards the pre-tokenizer order: ByteLevel before Digits would cut multi-byte characters apart.
    assert len(tok.encode("我们").ids) < len("我们".encode())


@pytest.mark.parametrize("special", SPECIALS)
@pytest.mark.parametrize("template", ["你好{}", "{}你好", "中文{}中文", "x{}12"])
def test_special_token_is_one_id_next_to_text(tok, special, template):
    text = template.format(special)
    ids = tok.encode(text).ids
    special_id = tok.token_to_id(special)
    assert ids.count(special_id) == 1
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_specials_reserved_first_and_eos_is_zero(tok):
    assert [tok.token_to_id(s) for s in SPECIALS] == list(range(len(SPECIALS)))
    assert eos_id(tok) == tok.token_to_id("<|endoftext|>") == 0


@pytest.mark.parametrize("text", [
    "Hello, world!  \n\ttabs",
    "从未见过的字：龘靐齉 and 🎉👩‍👩‍👧 emoji",
    "مرحبا بالعالم ، שלום",
    "e\u0301 combining, \x00 NUL, \r\n CRLF, \ufeff BOM",
    "  leading and trailing spaces  ",
    "",
])
def test_decode_inverts_encode(tok, text):
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


def test_every_byte_encodes(tok):
    text = bytes(range(256)).decode("latin-1")
    assert tok.decode(tok.encode(text).ids) == text
    assert tok.token_to_id("<unk>") is None


def test_vocab_within_target(tok):
    assert 256 + len(SPECIALS) < tok.get_vocab_size() <= 700


@pytest.mark.parametrize("multiple", [64, 128])
def test_padded_vocab_is_next_multiple(tok, multiple):
    padded = padded_vocab_size(tok, multiple)
    assert padded % multiple == 0
    assert tok.get_vocab_size() <= padded < tok.get_vocab_size() + multiple


def test_padded_vocab_rejects_nonpositive_multiple(tok):
    with pytest.raises(ConfigError):
        padded_vocab_size(tok, 0)


def test_hash_survives_save_load_and_changes_with_content(tok):
    reloaded = Tokenizer.from_str(tok.to_str(pretty=True))
    assert tokenizer_hash(reloaded) == tokenizer_hash(tok)
    other = fit_tokenizer(mixed_corpus(seed=1, n_lines=50), TokenizerConfig(vocab_size=500))
    assert tokenizer_hash(other) != tokenizer_hash(tok)
    assert len(tokenizer_hash(tok)) == 64


def test_check_rejects_tokenizer_that_merges_digits():
    merging = Tokenizer(models.BPE())
    merging.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    merging.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    merging.train_from_iterator(["12345 2024 2024 12345"] * 50, trainer)
    with pytest.raises(DataError, match="digit"):
        check_tokenizer(merging, SPECIALS)


def test_eos_missing_is_refused():
    bare = Tokenizer(models.BPE())
    with pytest.raises(DataError, match="endoftext"):
        eos_id(bare)


class TestSampleTexts:
    SOURCES = {"en": ["a" * 100] * 50, "zh": ["中" * 100] * 50, "tiny": ["t" * 10] * 3}

    def test_chars_follow_weights_and_cap(self):
        texts, drawn = sample_texts(self.SOURCES, {"en": 3.0, "zh": 1.0}, max_chars=2000, seed=0)
        assert drawn == {"en": 1500, "zh": 500}
        assert sum(len(t) for t in texts) == 2000
        assert sum(t.count("中") for t in texts) == 500

    def test_small_source_is_taken_once_not_repeated(self):
        _, drawn = sample_texts(self.SOURCES, {"en": 1.0, "tiny": 1.0}, max_chars=1000, seed=0)
        assert drawn == {"en": 500, "tiny": 30}

    def test_seeded_and_deterministic(self):
        docs = {"en": [f"doc {i} " * 5 for i in range(200)]}
        first = sample_texts(docs, {"en": 1.0}, max_chars=500, seed=7)
        assert sample_texts(docs, {"en": 1.0}, max_chars=500, seed=7) == first
        assert sample_texts(docs, {"en": 1.0}, max_chars=500, seed=8).texts != first.texts

    def test_zero_weight_source_is_skipped(self):
        _, drawn = sample_texts(self.SOURCES, {"en": 1.0, "zh": 0.0}, max_chars=300, seed=0)
        assert drawn == {"en": 300}

    @pytest.mark.parametrize("seed", range(30))
    def test_the_plan_from_lengths_draws_what_a_pass_over_the_texts_draws(self, seed):
        """``sample_plan`` sees only lengths; the texts it names are those a seeded walk over the documents
        takes (each source in name order, whole documents in a permutation until the budget, the last cut)."""
        import numpy as np

        rng = random.Random(seed)
        texts = {f"s{j}": ["x" * rng.randrange(0, 50) + str(i) for i in range(rng.randrange(1, 30))]
                 for j in range(rng.randrange(1, 4))}
        weights = {s: rng.choice([0.0, 1.0, 2.5]) for s in texts} | {"s0": 1.0}
        max_chars = rng.choice([0, 1, 7, 50, 400, 10**6])
        generator, expected, drawn = np.random.default_rng(seed), [], {}
        budgets = {s: int(max_chars * w / sum(weights.values())) for s, w in weights.items() if w > 0}
        for source in sorted(budgets):
            left, taken = budgets[source], []
            for i in generator.permutation(len(texts[source])):
                if left <= 0:
                    break
                taken.append(texts[source][i][:left])
                left -= len(taken[-1])
            expected += taken
            drawn[source] = sum(map(len, taken))
        assert sample_texts(texts, weights, max_chars, seed) == (expected, drawn)

    @pytest.mark.parametrize("weights", [{"en": -1.0}, {"en": 0.0}, {"missing": 1.0}])
    def test_bad_weights_refused(self, weights):
        with pytest.raises(ConfigError):
            sample_texts(self.SOURCES, weights, max_chars=300, seed=0)


@pytest.mark.parametrize("blob", ["a" * 100_000, "7" * 50_000, "QUJD" * 20_000, " " * 10_000])
def test_overlong_runs_are_capped_before_bpe(tok, blob):
    cap = TokenizerConfig().max_pretoken_chars
    pieces = tok.pre_tokenizer.pre_tokenize_str(f"see {blob} end")
    assert max(len(piece) for piece, _ in pieces) <= cap
    assert tok.decode(tok.encode(blob).ids) == blob  # capping loses nothing


def test_ordinary_words_are_not_cut_by_the_cap(tok):
    word = "internationalisation" * 3  # 60 characters, under the 64 cap
    assert [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(word)] == [word]


def test_fit_on_pathological_text_keeps_the_vocabulary_useful():
    # Giant runs are cut into capped pieces that repeat, so they cannot crowd ordinary merges out of the vocab.
    clean = mixed_corpus(200)
    junk = ["x" * 100_000, "9" * 50_000, "QUJD" * 25_000]
    cfg = TokenizerConfig(vocab_size=700)
    with_junk = fit_tokenizer(clean + junk, cfg)
    longest = max(len(t) for t in with_junk.get_vocab())
    assert longest <= cfg.max_pretoken_chars
    text = " ".join(clean[:20])
    assert len(with_junk.encode(text).ids) <= 1.1 * len(fit_tokenizer(clean, cfg).encode(text).ids)


def test_check_rejects_uncapped_pre_tokenizer(tok):
    loose = Tokenizer.from_str(tok.to_str())
    loose.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    with pytest.raises(DataError, match="cap"):
        check_tokenizer(loose, SPECIALS, max_pretoken_chars=64)


class TestFitWeights:
    def test_natural_weights_follow_training_characters(self):
        from tasks.tokenizer.stage import fit_weights
        assert fit_weights(TokenizerConfig(), {"b": 300, "a": 100}) == {"a": 0.25, "b": 0.75}

    def test_declared_weights_are_normalised_and_zeros_dropped(self):
        from tasks.tokenizer.stage import fit_weights
        cfg = TokenizerConfig(fit_weights={"a": 2.0, "b": 6.0, "c": 0.0})
        assert fit_weights(cfg, {"a": 10, "b": 10, "c": 10}) == {"a": 0.25, "b": 0.75}

    def test_weighted_source_without_training_text_is_refused(self):
        from tasks.tokenizer.stage import fit_weights
        with pytest.raises(ConfigError, match="no training documents"):
            fit_weights(TokenizerConfig(fit_weights={"a": 1.0, "zz": 1.0}), {"a": 10})

    @pytest.mark.parametrize("weights", [{"a": -1.0}, {"a": 0.0}, {"a": float("nan")}])
    def test_bad_declared_weights_are_config_errors(self, weights):
        with pytest.raises(Exception, match="fit_weights"):
            TokenizerConfig(fit_weights=weights)
