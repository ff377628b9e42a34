"""Read access to a tokenizer artifact for training and evaluation: the tokenizer, its identity, the token shards,
and what each packing policy makes of them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from tokenizers import Tokenizer

from tasks.train.data import TokenStream
from tasks.train.packing import POLICIES, plan_rows
from tasks.train.shards import read_shard

class TokenizedCorpus:
    """Read access to a tokenizer artifact: the tokenizer, its identity and the token shards."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.meta = json.loads((self.path / "tokenizer.meta.json").read_text())
        self.headers = pd.read_parquet(self.path / "shards.parquet")

    @property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_file(str(self.path / "tokenizer.json"))

    @property
    def vocab_size(self) -> int:
        return int(self.meta["padded_vocab_size"])

    def tokens(self, source: str, split: str):
        """The shard's flat token array (memmap), checked against this tokenizer's hash."""
        shard = read_shard(self.path / "shards" / source / split, expected_tokenizer_hash=self.meta["tokenizer_hash"])
        return shard.tokens

    def stream(self, source: str, split: str) -> TokenStream:
        """The shard's tokens (memmap) and document offsets, checked against this tokenizer's hash."""
        shard = read_shard(self.path / "shards" / source / split, expected_tokenizer_hash=self.meta["tokenizer_hash"])
        return TokenStream(shard.tokens, shard.doc_offsets)

    @property
    def pad_id(self) -> int:
        """Input id for padding positions: ``<|pad|>`` when reserved, else EOS (targets there are ignored anyway)."""
        return int(self.meta.get("pad_id", self.meta["eos_id"]))

    def tokens_per_byte(self, source: str, split: str) -> float:
        row = self.headers[(self.headers["source"] == source) & (self.headers["split"] == split)].iloc[0]
        return float(row["n_tokens"]) / float(row["n_bytes"])

    def train_sizes(self, sources: list[str]) -> dict[str, int]:
        train = self.headers[self.headers["split"] == "train"].set_index("source")["n_tokens"]
        return {name: int(train.get(name, 0)) for name in sources}

    def has(self, source: str, split: str) -> bool:
        return bool(((self.headers["source"] == source) & (self.headers["split"] == split)).any())


def packing_report(corpus: TokenizedCorpus, seq_lens: Sequence[int]) -> pd.DataFrame:
    """Per training shard, row length and policy: rows, documents, documents cut, cut share, padding share and
    tokens dropped (:mod:`tasks.train.packing`), for every packing policy, so the choice is made on figures."""
    rows = []
    for source in corpus.headers.loc[corpus.headers["split"] == "train", "source"]:
        shard = corpus.stream(source, "train")
        for seq_len in sorted(set(seq_lens)):
            for policy in POLICIES:
                plan = plan_rows(shard.doc_offsets, len(shard.tokens), seq_len, policy)
                rows.append(dict(source=source, seq_len=seq_len, policy=policy, n_rows=plan.n_rows,
                                 n_docs=plan.n_docs, docs_cut=plan.docs_cut, cut_share=plan.cut_share,
                                 padding_share=plan.padding_share, tokens_dropped=plan.tokens_dropped))
    return pd.DataFrame(rows, columns=PACKING_COLUMNS)


PACKING_COLUMNS = ["source", "seq_len", "policy", "n_rows", "n_docs", "docs_cut", "cut_share", "padding_share",
                   "tokens_dropped"]
