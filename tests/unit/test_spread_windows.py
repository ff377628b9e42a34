"""The CPT gate's held-out windows spread over documents (``evals.heldout.spread_windows``): the stride-T grid,
round-robin across documents, the same budget as the first ``max_tokens``, and the loss on them."""

import numpy as np
import pytest
import torch

from evals.heldout import (documents_at, heldout_loss, heldout_windows, spread_windows, window_documents,
                           windows_at)
from infra.errors import DataError
from models.config import ModelConfig
from models.decoder import Decoder

SEQ_LEN = 16
# A synthetic split of long and short documents: the first two hold 20 grid windows between them.
LENGTHS = [170, 150, 40, 17, 90, 33, 60, 8, 120, 64]
OFFSETS = np.concatenate([[0], np.cumsum(LENGTHS)[:-1]]).astype(np.int64)
N_TOKENS = int(sum(LENGTHS))


def test_windows_sit_on_the_grid_do_not_overlap_and_keep_the_budget():
    for budget in (17, 100, 161, 300, 481):
        starts = spread_windows(OFFSETS, N_TOKENS, SEQ_LEN, budget)
        assert starts.dtype == np.int64
        assert len(starts) == (budget - 1) // SEQ_LEN  # as many windows as the first ``budget`` tokens hold
        assert (starts % SEQ_LEN == 0).all()  # the grid of heldout_windows: no token predicted twice
        assert (np.diff(starts) >= SEQ_LEN).all()  # stream order, no overlap
        assert starts.max() + SEQ_LEN + 1 <= N_TOKENS


def test_round_robin_takes_each_documents_kth_window_before_any_k_plus_first():
    grid = np.arange((N_TOKENS - 1) // SEQ_LEN) * SEQ_LEN
    grid_docs = documents_at(OFFSETS, grid)
    docs = np.unique(grid_docs)
    total = np.array([np.sum(grid_docs == d) for d in docs])  # grid windows starting in each document
    for n in range(1, len(grid) + 1):
        starts = spread_windows(OFFSETS, N_TOKENS, SEQ_LEN, n * SEQ_LEN + 1)
        taken_docs = documents_at(OFFSETS, starts)
        taken = np.array([np.sum(taken_docs == d) for d in docs])
        for d, c in zip(docs, taken):  # a document gives its first c grid windows
            np.testing.assert_array_equal(starts[taken_docs == d], grid[grid_docs == d][:c])
        # Completed rounds: k windows from every document that has k; the round under way: the earlier documents.
        k = int(max(r for r in range(len(grid) + 1) if np.minimum(total, r).sum() <= n))
        extra = taken - np.minimum(total, k)
        assert set(extra.tolist()) <= {0, 1} and extra.sum() == n - np.minimum(total, k).sum()
        ahead = np.flatnonzero(extra)
        eligible = np.flatnonzero(total > k)
        np.testing.assert_array_equal(ahead, eligible[:len(ahead)])


def test_partial_round_goes_to_the_earlier_documents():
    grid_docs = np.unique(documents_at(OFFSETS, np.arange((N_TOKENS - 1) // SEQ_LEN) * SEQ_LEN))
    starts = spread_windows(OFFSETS, N_TOKENS, SEQ_LEN, 3 * SEQ_LEN + 1)
    assert documents_at(OFFSETS, starts).tolist() == grid_docs[:3].tolist()
    assert starts.tolist() == [0, 176, 320]  # the first grid window of docs 0, 1, 2


def test_more_documents_than_the_first_tokens_on_the_same_budget():
    budget = 12 * SEQ_LEN + 1
    first = window_documents(OFFSETS, len(heldout_windows(np.zeros(N_TOKENS), SEQ_LEN, budget)), SEQ_LEN)
    spread = documents_at(OFFSETS, spread_windows(OFFSETS, N_TOKENS, SEQ_LEN, budget))
    assert len(first) == len(spread) == 12
    assert len(np.unique(first)) == 2 and len(np.unique(spread)) == len(LENGTHS)


def test_deterministic_and_all_of_the_grid_without_a_budget():
    a = spread_windows(OFFSETS, N_TOKENS, SEQ_LEN, 200)
    np.testing.assert_array_equal(a, spread_windows(OFFSETS.copy(), N_TOKENS, SEQ_LEN, 200))
    everything = spread_windows(OFFSETS, N_TOKENS, SEQ_LEN)
    np.testing.assert_array_equal(everything, np.arange((N_TOKENS - 1) // SEQ_LEN) * SEQ_LEN)
    np.testing.assert_array_equal(everything, spread_windows(OFFSETS, N_TOKENS, SEQ_LEN, 10 * N_TOKENS))
    tokens = np.arange(N_TOKENS)
    np.testing.assert_array_equal(windows_at(tokens, everything, SEQ_LEN), heldout_windows(tokens, SEQ_LEN))


def test_one_document_gives_the_first_windows():
    starts = spread_windows(np.array([0]), 1000, SEQ_LEN, 161)
    np.testing.assert_array_equal(starts, np.arange(10) * SEQ_LEN)


def test_errors():
    with pytest.raises(DataError):
        spread_windows(OFFSETS, SEQ_LEN, SEQ_LEN, 1000)  # shorter than one window
    with pytest.raises(DataError):
        spread_windows(OFFSETS, N_TOKENS, SEQ_LEN, SEQ_LEN)  # a budget shorter than one window
    with pytest.raises(DataError):
        spread_windows(np.array([5, 10]), N_TOKENS, SEQ_LEN, 200)  # offsets not from 0
    with pytest.raises(DataError):
        spread_windows(np.array([0, 10, 5]), N_TOKENS, SEQ_LEN, 200)  # decreasing
    with pytest.raises(ValueError):
        spread_windows(OFFSETS, N_TOKENS, 0, 200)
    with pytest.raises(DataError):
        windows_at(np.arange(40), np.array([0, 32]), SEQ_LEN)  # the second runs past the end


def test_loss_on_spread_windows_is_the_loss_of_those_windows():
    torch.manual_seed(0)
    model = Decoder(ModelConfig(n_layers=1, d_model=32, n_heads=2, n_kv_heads=2, d_ff=64, vocab_size=97,
                                seq_len=SEQ_LEN))
    tokens = np.random.default_rng(0).integers(0, 97, N_TOKENS).astype(np.uint16)
    starts = spread_windows(OFFSETS, N_TOKENS, SEQ_LEN, 8 * SEQ_LEN + 1)
    spread = heldout_loss(model, tokens, seq_len=SEQ_LEN, batch_size=3, starts=starts)
    whole = heldout_loss(model, tokens, seq_len=SEQ_LEN, batch_size=8)  # every grid window
    np.testing.assert_allclose(spread.window_nats, whole.window_nats[starts // SEQ_LEN], rtol=1e-6)
    assert spread.n_tokens == 8 * SEQ_LEN


def _corpus(folder, heldout: dict, train_copy: tuple[str, int, int]):
    """A tokenizer artifact whose held-out splits have the given (tokens, document offsets); the training split of
    ``train_copy[0]`` holds held-out tokens [start, end) of that source, so decontamination drops the windows
    that contain them."""
    import json

    import pandas as pd

    from tasks.train.shards import write_shard

    rng, rows = np.random.default_rng(0), []
    for source, (tokens, offsets) in heldout.items():
        train = rng.integers(1, 64, 400)
        if source == train_copy[0]:
            piece = tokens[train_copy[1]:train_copy[2]]
            train[50:50 + len(piece)] = piece
        for split, toks, docs in (("train", train, [0]), ("heldout", tokens, offsets)):
            path = folder / "shards" / source / split
            path.parent.mkdir(parents=True, exist_ok=True)
            write_shard(path, toks, vocab_size=64, eos_id=0, tokenizer_hash="synthetic", n_bytes=4 * len(toks),
                        doc_offsets=np.array(docs))
            rows.append({"source": source, "split": split, "n_tokens": len(toks), "n_bytes": 4 * len(toks)})
    pd.DataFrame(rows).to_parquet(folder / "shards.parquet", index=False)
    (folder / "tokenizer.meta.json").write_text(json.dumps({"tokenizer_hash": "synthetic", "padded_vocab_size": 64,
                                                            "eos_id": 0}))
    return folder


def test_the_cpt_stage_scores_and_decontaminates_the_spread_windows(tmp_path):
    from evals.cloze import ClozeItem
    from infra.runs import RunsLayout
    from infra.stage import StageContext
    from tasks.cpt.stage import DOC_ID_STRIDE, _decontaminate, _Scorer, eval_starts
    from tasks.train.corpus import TokenizedCorpus
    from tasks.train.runner import build_model
    from tasks.train.sections import CptConfig, ModelShape, RunBudget

    rng = np.random.default_rng(1)
    d_tokens, g_tokens = rng.integers(1, 64, N_TOKENS), rng.integers(1, 64, 300)
    g_offsets = [0, 100, 130, 200, 260]
    spread_d = spread_windows(OFFSETS, N_TOKENS, SEQ_LEN, 12 * SEQ_LEN + 1)
    dropped = int(spread_d[1])  # document 0's second window, copied into the training split
    folder = _corpus(tmp_path / "tokenizer", {"d": (d_tokens, OFFSETS), "g": (g_tokens, g_offsets)},
                     ("d", dropped + 1, dropped + 1 + SEQ_LEN))
    cfg = CptConfig(domain_sources=["d"], replay_fractions=[0.1], peak_lrs=[1e-3],
                    budget=RunBudget(steps=2, batch_size=2, warmup_steps=1, eval_tokens=12 * SEQ_LEN + 1))
    out = tmp_path / "cpt"
    out.mkdir()
    ctx = StageContext(out=out, inputs={"tokenizer": folder}, layout=RunsLayout(tmp_path / "runs"), key="k",
                       experiment="t")
    corpus = TokenizedCorpus(folder)
    np.testing.assert_array_equal(eval_starts(corpus, "d", SEQ_LEN, cfg.budget.eval_tokens), spread_d)
    encode = lambda text: [ord(ch) % 63 + 1 for ch in text]  # noqa: E731
    items = [ClozeItem("i1", "general", "ab cd", [" e", " f"], 0)]
    masks, items = _decontaminate(ctx, cfg, corpus, ["g"], items, encode, ["d", "g"], SEQ_LEN)
    assert masks["d"].tolist() == [i != 1 for i in range(12)]  # the copied window, found among the spread ones
    model = build_model(ModelShape(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32,
                                   seq_len=SEQ_LEN).build(64), 0)
    _Scorer(ctx, corpus, ["g"], cfg, items, encode, masks).score("base", model, {}, step=0)
    data = np.load(out / "evals" / "base.npz")
    np.testing.assert_array_equal(data["domain_window_docs"], documents_at(OFFSETS, spread_d)[masks["d"]])
    assert len(np.unique(data["domain_window_docs"])) == len(LENGTHS)  # 10 documents; the first 193 tokens: 2
    whole = heldout_loss(model, d_tokens, seq_len=SEQ_LEN, batch_size=8)  # every grid window
    np.testing.assert_allclose(data["domain_window_nats"] * SEQ_LEN,
                               whole.window_nats[spread_d // SEQ_LEN][masks["d"]], rtol=1e-5)
    g_starts = spread_windows(np.array(g_offsets), 300, SEQ_LEN, cfg.budget.eval_tokens)
    np.testing.assert_array_equal(data["general_window_docs"], documents_at(np.array(g_offsets), g_starts))
    assert DOC_ID_STRIDE > len(LENGTHS)
