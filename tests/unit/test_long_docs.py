"""Long-document streams for context extension: figures by hand, the concatenate construction, the supply check and
the held-out long windows."""

import json

import numpy as np
import pytest

from infra.errors import ConfigError, DataError
from tasks.cpt.long_docs import check_supply, join_documents, long_stream, long_windows
from tasks.train.data import TokenStream

EOS = 1


def make_stream(lengths, seed=0) -> TokenStream:
    """Documents of the given lengths, each ending in EOS, other tokens in [2, 64)."""
    rng = np.random.default_rng(seed)
    docs = [np.append(rng.integers(2, 64, n - 1), EOS) for n in lengths]
    offsets = np.cumsum([0, *lengths[:-1]]).astype(np.int64)
    return TokenStream(np.concatenate(docs).astype(np.uint16), offsets)


LENGTHS = [5, 12, 40, 9, 70, 3]  # 139 tokens; base 8 → long means > 9 tokens; target 32 → rows of 33


def test_natural_figures_by_hand():
    stream = make_stream(LENGTHS)
    ls = long_stream("books", stream, base_seq_len=8, target_seq_len=32, construction="natural")
    assert ls.stream is stream and ls.construction == "natural"
    r = ls.report
    assert (r["documents"], r["tokens"]) == (6, 139)
    assert (r["long_documents"], r["long_document_tokens"]) == (3, 12 + 40 + 70)  # 9 tokens fit a base row
    assert r["long_token_share"] == pytest.approx(122 / 139)
    # pieces of 33: 5 | 12 | 33 7 | 9 | 33 33 4 | 3; tokens at position >= 8 of their piece:
    assert r["beyond_window_tokens"] == 4 + 25 + 1 + 25 + 25
    assert r["beyond_window_share"] == pytest.approx(80 / 139)
    # best fit decreasing: three full rows, then 12+9+7+5 = 33, then 4+3
    assert (r["rows"], r["docs_cut"]) == (5, 2)
    assert r["padding_share"] == pytest.approx(1 - 139 / (5 * 33))
    json.dumps(r)  # JSON-able
    assert ls.members["n_docs"].tolist() == [1] * 6 and ls.members["tokens"].tolist() == LENGTHS
    assert ls.members["first_doc"].tolist() == list(range(6))


def test_concatenate_groups_members_and_label():
    stream = make_stream(LENGTHS)
    ls = long_stream("books", stream, base_seq_len=8, target_seq_len=32, construction="concatenate")
    assert ls.construction == "concatenated" and ls.report["construction"] == "concatenated"
    m = ls.members
    assert m["first_doc"].tolist() == [0, 3, 5] and m["n_docs"].tolist() == [3, 2, 1]
    assert m["tokens"].tolist() == [57, 79, 3] and m["long_doc"].tolist() == [0, 1, 2]
    assert set(m["source"]) == {"books"}
    assert ls.stream.doc_offsets.tolist() == [0, 57, 136]
    assert np.array_equal(ls.stream.tokens, stream.tokens)  # EOS between members kept
    r = ls.report
    assert (r["documents"], r["long_documents"], r["long_document_tokens"]) == (3, 2, 136)
    assert r["beyond_window_tokens"] == 25 + 16 + 25 + 25 + 5  # pieces 33 24 | 33 33 13 | 3
    again = long_stream("books", stream, base_seq_len=8, target_seq_len=32, construction="concatenate")
    assert again.report == r and again.members.equals(m)


def test_join_documents_greedy():
    assert join_documents(np.array([33, 1, 1]), 33).tolist() == [0, 1]
    assert join_documents(np.array([10, 10, 13, 40, 2]), 33).tolist() == [0, 3, 4]
    assert join_documents(np.array([], dtype=np.int64), 33).tolist() == []


def test_unknown_construction_and_lengths_refused():
    stream = make_stream(LENGTHS)
    with pytest.raises(ConfigError, match="construction"):
        long_stream("books", stream, base_seq_len=8, target_seq_len=32, construction="concatenated")
    with pytest.raises(ConfigError, match="target_seq_len"):
        long_stream("books", stream, base_seq_len=32, target_seq_len=32, construction="natural")


def test_check_supply_refuses_with_figures_and_passes_when_enough():
    short = long_stream("chat", make_stream([5, 6, 9, 12]), base_seq_len=8, target_seq_len=32,
                        construction="natural")
    books = long_stream("books", make_stream(LENGTHS), base_seq_len=8, target_seq_len=32, construction="natural")
    with pytest.raises(DataError) as err:
        check_supply([books, short], min_long_token_share=0.5, base_seq_len=8, target_seq_len=32)
    msg = str(err.value)
    assert "chat (natural): 4 documents, 1 longer than 9 tokens; 12 of 32 tokens in them (37.5%)" in msg
    assert "[refused]" in msg and "books (natural): 6 documents, 3 longer" in msg and "[ok]" in msg
    assert 'construction = "concatenate"' in msg and "other long_sources" in msg
    check_supply([books], min_long_token_share=0.5, base_seq_len=8, target_seq_len=32)
    # no share asked for, yet no token past the base window: refused too
    with pytest.raises(DataError, match="0 tokens at position"):
        none_beyond = long_stream("x", make_stream([5, 9]), base_seq_len=9, target_seq_len=32,
                                  construction="natural")
        check_supply([none_beyond], min_long_token_share=0.0, base_seq_len=9, target_seq_len=32)
    with pytest.raises(ConfigError, match="built for"):
        check_supply([books], min_long_token_share=0.5, base_seq_len=16, target_seq_len=32)


def test_check_supply_concatenated_asks_for_other_sources():
    tiny = long_stream("tiny", make_stream([5, 4]), base_seq_len=8, target_seq_len=32, construction="concatenate")
    with pytest.raises(DataError) as err:
        check_supply([tiny], min_long_token_share=0.5, base_seq_len=8, target_seq_len=32)
    assert "tiny (concatenated)" in str(err.value) and "other long_sources are needed" in str(err.value)


HELDOUT = [20, 5, 17, 30, 16, 40]  # target 16 → windows of 17: documents 0, 2, 3, 5 qualify


def test_long_windows_natural_one_per_long_document():
    stream = make_stream(HELDOUT, seed=3)
    lw = long_windows("books", stream, target_seq_len=16, max_windows=32, construction="natural")
    assert lw.docs.tolist() == [0, 2, 3, 5] and lw.windows.shape == (4, 17) and lw.windows.dtype == np.int64
    for d, window in zip(lw.docs, lw.windows):
        start = stream.doc_offsets[d]
        assert np.array_equal(window, stream.tokens[start:start + 17])
    assert lw.construction == "natural" and lw.source == "books"
    assert lw.members["first_doc"].tolist() == [0, 2, 3, 5]


def test_long_windows_spread_selection_is_deterministic():
    stream = make_stream([20] * 10, seed=4)
    lw = long_windows("books", stream, target_seq_len=16, max_windows=3, construction="natural")
    assert lw.docs.tolist() == [0, 3, 6]
    again = long_windows("books", stream, target_seq_len=16, max_windows=3, construction="natural")
    assert np.array_equal(lw.windows, again.windows)


def test_long_windows_concatenate_uses_first_member():
    stream = make_stream([5, 6, 9, 12, 3, 20, 2], seed=5)  # groups ≥ 17: [0, 1, 2] 20, [3, 4, 5] 35, [6] 2
    lw = long_windows("chat", stream, target_seq_len=16, max_windows=8, construction="concatenate")
    assert lw.docs.tolist() == [0, 3] and lw.construction == "concatenated"
    assert np.array_equal(lw.windows[1], stream.tokens[20:37])
    assert lw.members["n_docs"].tolist() == [3, 3]


def test_long_windows_too_few_raise_with_figures():
    stream = make_stream([20, 5, 9], seed=6)
    with pytest.raises(DataError, match=r"1 of 3 documents reach target_seq_len \+ 1 = 17 tokens \(longest 20\)"):
        long_windows("books", stream, target_seq_len=16, max_windows=8, construction="natural")
