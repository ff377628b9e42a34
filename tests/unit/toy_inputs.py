"""Synthetic stage inputs shared by the training tests: a tokenizer artifact (shards and headers, no tokenizer
file) with sources a and b, and a mixture choice of both at equal weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.train.shards import write_shard

VOCAB, TOKENIZER_HASH = 64, "synthetic"


def run_main(ctx, cfg, **kwargs) -> dict:
    """``tasks.main.stage.run``, then what the pipeline does once the artifact is committed: remove the key's
    scratch folder (a stage never removes its own; a later attempt of the same key would resume from it)."""
    from infra.stage import scratch_folder
    from tasks.main.stage import run

    summary = run(ctx, cfg, **kwargs)
    shutil.rmtree(scratch_folder(ctx.layout.root, "main", ctx.key), ignore_errors=True)
    return summary


def write_toy_inputs(root: Path, train_tokens: dict[str, int], heldout_tokens: int = 80) -> dict[str, Path]:
    """``root/tokenizer`` with ``train_tokens[s]`` training and ``heldout_tokens`` held-out random tokens per source
    (4 bytes per token, one document per split), and ``root/mixture`` choosing a and b at 0.5 each."""
    tokenizer, mixture = root / "tokenizer", root / "mixture"
    rng, rows = np.random.default_rng(0), []
    for source, n_train in train_tokens.items():
        for split, n_tokens in (("train", n_train), ("heldout", heldout_tokens)):
            path = tokenizer / "shards" / source / split
            path.parent.mkdir(parents=True, exist_ok=True)
            write_shard(path, rng.integers(1, VOCAB, n_tokens), vocab_size=VOCAB, eos_id=0,
                        tokenizer_hash=TOKENIZER_HASH, n_bytes=4 * n_tokens, doc_offsets=np.array([0]))
            rows.append({"source": source, "split": split, "n_tokens": n_tokens, "n_bytes": 4 * n_tokens})
    pd.DataFrame(rows).to_parquet(tokenizer / "shards.parquet", index=False)
    (tokenizer / "tokenizer.meta.json").write_text(json.dumps(
        {"tokenizer_hash": TOKENIZER_HASH, "padded_vocab_size": VOCAB, "eos_id": 0}))
    mixture.mkdir()
    (mixture / "choice.json").write_text(json.dumps({"name": "natural", "weights": {"a": 0.5, "b": 0.5}}))
    return {"tokenizer": tokenizer, "mixture": mixture}
