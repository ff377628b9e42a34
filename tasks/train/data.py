"""The training loader: packed rows from token shards, drawn by mixture weights, resumable to the exact batch (docs/methods.md §8).

Each source's shard is cut into rows of T + 1 tokens by a packing policy (:mod:`tasks.train.packing`). Rows of a
source are read in a seeded random order, one permutation per epoch; when a source runs out of rows its epoch count
goes up and a new permutation starts. How many rows of a batch each source gets is decided by deterministic
largest-remainder apportionment with carried remainders: after n batches of B rows, source s has given ⌊w_s·n·B⌋ or
⌈w_s·n·B⌉ rows, so the realised mixture follows the weights exactly instead of drifting as independent draws would.

The loader's position — per source the epoch and the offset into that epoch's permutation, plus the carried
remainders — is a small JSON dict saved in every checkpoint. The permutation of epoch e of source s is drawn from
PCG64 seeded with (seed, a SHA-256 of s, e), so restoring the position reproduces the same batches exactly.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from infra.errors import ConfigError, DataError
from tasks.train.packing import PackPlan, plan_rows

WEIGHT_TOLERANCE = 1e-6
IGNORE_INDEX = -100  # target of a padding position: no loss (torch cross_entropy's default ignore_index)
STATE_VERSION = 2


@dataclass(frozen=True)
class TokenStream:
    """One source's training shard: ``tokens`` (n_tokens,) integer ids, ``doc_offsets`` (n_docs,) int64 starts."""

    tokens: np.ndarray
    doc_offsets: np.ndarray


class Batch(NamedTuple):
    """One batch. x, y: (B, T) int64 with y[:, t] the token after x[:, t] (``IGNORE_INDEX`` where that is padding);
    sources: the source of each row (B,); doc_ids: (B, T) int64 document index of each input position (-1 for
    padding), or None when the loader does not mask across documents."""

    x: torch.Tensor
    y: torch.Tensor
    sources: list[str]
    doc_ids: torch.Tensor | None = None


class MixtureSampler:
    """Draws batches of packed rows, apportioned across sources by weight.

    Args:
        streams: source name → :class:`TokenStream`, or a bare 1-D token array (read as one document).
        weights: source name → mixture weight; same keys as ``streams``, each ≥ 0, summing to 1 (±1e-6).
        seq_len: T, input tokens per row; a row holds T + 1 tokens.
        batch_size: B, rows per batch.
        seed: seeds the row order of every source and epoch.
        packing: ``concat`` or ``best_fit`` (docs/methods.md §8; :mod:`tasks.train.packing`).
        document_mask: return ``doc_ids`` so the model masks attention across documents.
        pad_id: input id placed at padding positions (their targets are ``IGNORE_INDEX``, and padding only ever
            follows real tokens, so causal attention never lets a real token see it).
        sampling: ``exact`` (every batch holds w·B rows of each source, remainders carried by largest remainder)
            or ``bernoulli`` (each row drawn from a source with probability w: the shares hold in expectation).

    Raises:
        ConfigError: weights name a source missing from streams (or the reverse), a weight is negative or
            non-finite, weights do not sum to 1, seq_len/batch_size < 1, or the packing policy is unknown.
        DataError: a stream is empty or not 1-D, or a positively weighted stream yields no row (fewer than
            T + 1 tokens under ``concat``); the message names the source.
    """

    def __init__(self, streams: dict[str, TokenStream | np.ndarray], weights: dict[str, float], *, seq_len: int,
                 batch_size: int, seed: int, packing: str = "concat", document_mask: bool = False, pad_id: int = 0,
                 sampling: str = "exact"):
        streams = {s: v if isinstance(v, TokenStream) else TokenStream(v, np.zeros(1, np.int64))
                   for s, v in streams.items()}
        _check_config(streams, weights, seq_len, batch_size)
        self.sources = sorted(streams)
        self.streams = streams
        self.weights = {s: float(weights[s]) for s in self.sources}
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.packing, self.document_mask, self.pad_id = packing, document_mask, pad_id
        if sampling not in ("exact", "bernoulli"):
            raise ConfigError(f"sampling {sampling!r}: use exact (largest remainder per batch) or bernoulli (each row "
                              "drawn from a source with probability equal to its weight)")
        self.sampling = sampling
        self.plans: dict[str, PackPlan] = {}
        for s in self.sources:
            if self.weights[s] > 0:
                plan = plan_rows(streams[s].doc_offsets, len(streams[s].tokens), seq_len, packing)
                if plan.n_rows == 0:
                    raise DataError(f"stream of source {s!r} has {len(streams[s].tokens):,} tokens and yields no row "
                                    f"of seq_len + 1 = {seq_len + 1} under {packing!r}; add data or give it weight 0")
                self.plans[s] = plan
        self._carry = {s: 0.0 for s in self.sources}
        self._rows_drawn = {s: 0 for s in self.sources}
        self._epoch = {s: 0 for s in self.sources}
        self._offset = {s: 0 for s in self.sources}
        self._order: dict[str, np.ndarray] = {}
        self.batches_drawn = 0

    def _apportion(self) -> dict[str, int]:
        """Rows per source for the next batch: largest remainder on quota w·B + carried remainder.

        A source rounded up last batch carries a negative remainder; its quota can dip below zero, so rows
        start at max(⌊quota⌋, 0) and are then added to the largest / taken from the smallest remainders
        until the batch holds exactly B rows. Ties go to the alphabetically first source.
        """
        live = [s for s in self.sources if self.weights[s] > 0]
        if self.sampling == "bernoulli":
            # Each row picks its source independently (a multinomial over the batch), from a generator keyed by
            # the batch number, so a resumed loader draws the same counts without extra state.
            rng = np.random.Generator(np.random.PCG64([self.seed, 0xB3, self.batches_drawn]))
            counts = rng.multinomial(self.batch_size, [self.weights[s] for s in live])
            return {s: int(counts[live.index(s)]) if s in live else 0 for s in self.sources}
        quota = {s: self.weights[s] * self.batch_size + self._carry[s] for s in live}
        rows = {s: max(math.floor(quota[s]), 0) for s in live}
        remainder = lambda s: quota[s] - rows[s]  # noqa: E731 - reads with the current rows
        while sum(rows.values()) < self.batch_size:
            rows[max(live, key=lambda s: (remainder(s), -live.index(s)))] += 1
        while sum(rows.values()) > self.batch_size:
            rows[min((s for s in live if rows[s] > 0), key=lambda s: (remainder(s), -live.index(s)))] -= 1
        self._carry = {s: (remainder(s) if s in quota else 0.0) for s in self.sources}
        return {s: rows.get(s, 0) for s in self.sources}

    def _permutation(self, source: str) -> np.ndarray:
        epoch = self._epoch[source]
        cached = self._order.get(source)
        if cached is None or cached[0] != epoch:
            name = int.from_bytes(hashlib.sha256(source.encode()).digest()[:8], "big")
            rng = np.random.Generator(np.random.PCG64([self.seed, name, epoch]))
            self._order[source] = (epoch, rng.permutation(self.plans[source].n_rows))
        return self._order[source][1]

    def _next_rows(self, source: str, n: int) -> list[int]:
        rows = []
        while len(rows) < n:
            order = self._permutation(source)
            take = order[self._offset[source]:self._offset[source] + n - len(rows)]
            rows.extend(int(r) for r in take)
            self._offset[source] += len(take)
            if self._offset[source] == len(order):
                self._epoch[source] += 1
                self._offset[source] = 0
        return rows

    def next_batch(self) -> Batch:
        """The next :class:`Batch` of B rows."""
        rows = self._apportion()
        width = self.seq_len + 1
        ids = np.full((self.batch_size, width), self.pad_id, dtype=np.int64)
        docs = np.full((self.batch_size, width), -1, dtype=np.int64)
        filled = np.zeros((self.batch_size, width), dtype=bool)
        row_sources: list[str] = []
        i = 0
        for source in self.sources:
            stream, plan = self.streams[source], self.plans.get(source)
            for r in self._next_rows(source, rows[source]):
                row_ids, row_docs = plan.row(stream.tokens, stream.doc_offsets, r)
                ids[i, :len(row_ids)], docs[i, :len(row_ids)], filled[i, :len(row_ids)] = row_ids, row_docs, True
                row_sources.append(source)
                i += 1
            self._rows_drawn[source] += rows[source]
        self.batches_drawn += 1
        y = np.where(filled[:, 1:], ids[:, 1:], IGNORE_INDEX)
        doc_ids = torch.from_numpy(docs[:, :-1].copy()) if self.document_mask else None
        return Batch(torch.from_numpy(ids[:, :-1].copy()), torch.from_numpy(y), row_sources, doc_ids)

    def realised_fractions(self) -> dict[str, float]:
        """Share of rows drawn so far per source (all zero before the first batch)."""
        total = sum(self._rows_drawn.values())
        return {s: (n / total if total else 0.0) for s, n in self._rows_drawn.items()}

    def epochs_completed(self) -> dict[str, float]:
        """Fractional epochs read so far per source: full passes plus the share of the current one."""
        return {s: self._epoch[s] + (self._offset[s] / self.plans[s].n_rows if s in self.plans else 0.0)
                for s in self.sources}

    def packing_stats(self) -> dict[str, dict[str, float]]:
        """Per weighted source: rows, documents, share of documents cut, padding share, tokens dropped."""
        return {s: {"rows": p.n_rows, "docs": p.n_docs, "cut_share": p.cut_share, "padding_share": p.padding_share,
                    "tokens_dropped": p.tokens_dropped} for s, p in self.plans.items()}

    def state_dict(self) -> dict:
        """JSON-serialisable position: per source (shard, epoch, offset), carried remainders, rows and batches drawn."""
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "packing": self.packing,
            "sampling": self.sampling,
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "batches_drawn": self.batches_drawn,
            "weights": dict(self.weights),
            "carry": dict(self._carry),
            "rows_drawn": dict(self._rows_drawn),
            "position": {s: {"epoch": self._epoch[s], "offset": self._offset[s],
                             "rows": self.plans[s].n_rows if s in self.plans else 0} for s in self.sources},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a position saved by ``state_dict``; the next batches equal the uninterrupted run's.

        Raises:
            DataError: the state was saved by another loader version, with different sources, weights, packing,
                seq_len or batch_size, or over shards with a different number of rows.

        The saved seed replaces this loader's: it names the row orders the checkpointed run was reading.
        """
        if state.get("version") != STATE_VERSION:
            raise DataError(f"loader state version {state.get('version')} != {STATE_VERSION}: this checkpoint was "
                            "written by an older loader; restart the run from scratch")
        if set(state["weights"]) != set(self.sources) or any(
                abs(state["weights"][s] - self.weights[s]) > WEIGHT_TOLERANCE for s in self.sources):
            raise DataError(
                f"sampler state has weights {state['weights']} but this sampler has {self.weights}; "
                "resume with the mixture the checkpoint was trained on"
            )
        for field in ("packing", "seq_len", "batch_size", "sampling"):
            if state.get(field, "exact") != getattr(self, field):
                raise DataError(f"loader state has {field} = {state[field]!r}, this loader {getattr(self, field)!r}")
        for s, pos in state["position"].items():
            rows = self.plans[s].n_rows if s in self.plans else 0
            if pos["rows"] != rows:
                raise DataError(f"source {s!r} had {pos['rows']:,} rows when saved and has {rows:,} now: the shard "
                                "changed under the checkpoint")
        self.seed, self._order = int(state["seed"]), {}
        self.batches_drawn = int(state["batches_drawn"])
        self._carry = {s: float(state["carry"][s]) for s in self.sources}
        self._rows_drawn = {s: int(state["rows_drawn"][s]) for s in self.sources}
        self._epoch = {s: int(state["position"][s]["epoch"]) for s in self.sources}
        self._offset = {s: int(state["position"][s]["offset"]) for s in self.sources}


def _check_config(streams: dict[str, TokenStream], weights: dict[str, float], seq_len: int, batch_size: int) -> None:
    if seq_len < 1 or batch_size < 1:
        raise ConfigError(f"seq_len = {seq_len}, batch_size = {batch_size}: both must be ≥ 1")
    if set(weights) != set(streams):
        raise ConfigError(
            f"mixture weights name {sorted(set(weights) - set(streams))} with no stream and streams "
            f"{sorted(set(streams) - set(weights))} have no weight; give every stream a weight (0 to skip it)"
        )
    for source, w in weights.items():
        if not (math.isfinite(w) and w >= 0):
            raise ConfigError(f"weight of source {source!r} = {w}: must be a finite number ≥ 0")
    total = sum(weights.values())
    if abs(total - 1.0) > WEIGHT_TOLERANCE:
        raise ConfigError(f"mixture weights sum to {total:.8f}, not 1 (±{WEIGHT_TOLERANCE}); normalise them")
    for source, stream in streams.items():
        if stream.tokens.ndim != 1 or len(stream.tokens) == 0:
            raise DataError(f"stream of source {source!r} has shape {stream.tokens.shape}: need a non-empty 1-D "
                            "token array")
