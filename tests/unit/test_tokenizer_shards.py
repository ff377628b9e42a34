"""Shards: dtype by vocab size, lossless round trip, refusal of mismatched or incomplete shards (docs/methods.md §8)."""

import json

import numpy as np
import pytest

from infra.errors import ConfigError, DataError
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.fit import eos_id, fit_tokenizer, tokenizer_hash
from tasks.train.shards import encode_documents, read_shard, shard_dtype, text_bytes, write_shard

DOCS = ["Hello world 2024.", "你好，世界！", "", "quoting <|endoftext|> inside a page", "emoji 🎉 end"]


@pytest.fixture(scope="module")
def tok():
    corpus = ["hello world and the quoting of pages"] * 20 + ["你好世界中文文本"] * 20
    return fit_tokenizer(corpus, TokenizerConfig(vocab_size=300))


@pytest.mark.parametrize(("vocab_size", "dtype"), [
    (1, np.uint16), (4096, np.uint16), (65_536, np.uint16), (65_537, np.uint32), (152_064, np.uint32),
])
def test_dtype_boundary(vocab_size, dtype):
    assert shard_dtype(vocab_size) == np.dtype(dtype)


@pytest.mark.parametrize("vocab_size", [0, -5, 2**32 + 1])
def test_dtype_rejects_impossible_vocab(vocab_size):
    with pytest.raises(ConfigError):
        shard_dtype(vocab_size)


def _write(path, tokens, vocab_size, **kw):
    args = dict(vocab_size=vocab_size, eos_id=0, tokenizer_hash="h" * 64, n_bytes=7,
                doc_offsets=np.array([0], dtype=np.int64))
    return write_shard(path, np.asarray(tokens), **{**args, **kw})


def test_ids_above_uint16_round_trip_in_uint32(tmp_path):
    ids = np.array([0, 65_535, 65_536, 99_999, 0], dtype=np.int64)
    bin_path = _write(tmp_path / "big", ids, vocab_size=100_000)
    assert bin_path.stat().st_size == 4 * len(ids)
    shard = read_shard(bin_path)
    assert shard.header["dtype"] == "uint32"
    assert shard.tokens.tolist() == ids.tolist()


def test_largest_uint16_id_round_trips(tmp_path):
    _write(tmp_path / "edge", [65_535, 0], vocab_size=65_536)
    shard = read_shard(tmp_path / "edge")
    assert shard.tokens.dtype == np.uint16
    assert shard.tokens.tolist() == [65_535, 0]


def test_id_outside_vocab_refused(tmp_path):
    with pytest.raises(DataError, match="outside"):
        _write(tmp_path / "bad", [5, 300], vocab_size=300)


def test_documents_round_trip_through_shard(tmp_path, tok):
    tokens, offsets = encode_documents(tok, DOCS, batch_size=2)
    assert offsets.dtype == np.int64 and len(offsets) == len(DOCS)
    write_shard(tmp_path / "s0", tokens, vocab_size=tok.get_vocab_size(), eos_id=eos_id(tok),
                tokenizer_hash=tokenizer_hash(tok), n_bytes=text_bytes(DOCS), doc_offsets=offsets,
                extra={"split": "train"})
    shard = read_shard(tmp_path / "s0.json", expected_tokenizer_hash=tokenizer_hash(tok))
    assert shard.header["n_docs"] == len(DOCS)
    assert shard.header["n_bytes"] == len("".join(DOCS).encode("utf-8"))
    assert shard.header["extra"] == {"split": "train"}
    for i, doc in enumerate(DOCS):
        ids = shard.document(i).tolist()
        assert ids[-1] == eos_id(tok)
        plain = tok.decode(ids[:-1], skip_special_tokens=False)
        assert plain == doc


def test_eos_only_at_document_ends(tok):
    tokens, offsets = encode_documents(tok, DOCS)
    eos_positions = np.flatnonzero(tokens == eos_id(tok))
    assert eos_positions.tolist() == [*(offsets[1:] - 1).tolist(), len(tokens) - 1]


def test_wrong_tokenizer_hash_refused(tmp_path):
    _write(tmp_path / "s", [1, 0], vocab_size=300)
    with pytest.raises(DataError, match="tokenized with"):
        read_shard(tmp_path / "s", expected_tokenizer_hash="0" * 64)


def test_truncated_bin_refused(tmp_path):
    bin_path = _write(tmp_path / "s", [1, 2, 3, 0], vocab_size=300)
    bin_path.write_bytes(bin_path.read_bytes()[:-2])
    with pytest.raises(DataError, match="truncated"):
        read_shard(bin_path)


def test_header_claiming_other_dtype_refused(tmp_path):
    _write(tmp_path / "s", [1, 2, 3, 0], vocab_size=300)
    header_path = tmp_path / "s.json"
    header = json.loads(header_path.read_text())
    header_path.write_text(json.dumps({**header, "vocab_size": 100_000, "dtype": "uint32"}))
    with pytest.raises(DataError):
        read_shard(tmp_path / "s")


def test_missing_header_means_incomplete(tmp_path):
    _write(tmp_path / "s", [1, 0], vocab_size=300)
    (tmp_path / "s.json").unlink()
    with pytest.raises(DataError, match="incomplete"):
        read_shard(tmp_path / "s.bin")


def test_write_leaves_only_the_three_files(tmp_path):
    _write(tmp_path / "s", [1, 0], vocab_size=300)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.bin", "s.idx.npy", "s.json"]


def _suite_frame(path):
    from tasks.train.shards import shard_facts

    import pandas as pd
    return pd.DataFrame([{"source": "web", "split": "train", **shard_facts(path)}])


def test_boundary_suite_passes_a_good_shard(tmp_path, tok):
    from infra.expectations import check_shards

    tokens, offsets = encode_documents(tok, DOCS)
    write_shard(tmp_path / "s", tokens, vocab_size=tok.get_vocab_size(), eos_id=eos_id(tok),
                tokenizer_hash=tokenizer_hash(tok), n_bytes=text_bytes(DOCS), doc_offsets=offsets)
    assert check_shards(_suite_frame(tmp_path / "s"), tok.get_vocab_size()).success


def test_boundary_suite_catches_an_id_beyond_the_vocab_and_a_short_file(tmp_path):
    from infra.expectations import check_shards

    _write(tmp_path / "s", [5, 9, 0], vocab_size=10)
    raw = np.fromfile(tmp_path / "s.bin", dtype=np.uint16)
    raw[1] = 12  # corrupted on disk after writing: beyond the vocab
    raw.tofile(tmp_path / "s.bin")
    with pytest.raises(DataError, match="expect_column_pair_values_a_to_be_greater_than_b"):
        check_shards(_suite_frame(tmp_path / "s"), 10)
    raw[:2].tofile(tmp_path / "s.bin")  # truncated: the header still says 3 tokens
    with pytest.raises(DataError, match="expect_column_pair_values_to_be_equal"):
        check_shards(_suite_frame(tmp_path / "s"), 10)
