"""Weighted multi-source batch sampler over flat token shards (SPEC §8).

Each batch row is a random window of seq_len + 1 tokens from one source. How many rows each source gets is
decided by deterministic largest-remainder apportionment with carried remainders: after n batches of B rows,
source s has been given ⌊w_s·n·B⌋ or ⌈w_s·n·B⌉ rows, so the realised mixture follows the weights exactly
over time instead of drifting the way independent draws would. Only window offsets are random.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from infra.errors import ConfigError, DataError

WEIGHT_TOLERANCE = 1e-6


class MixtureSampler:
    """Draws (x, y) batches, rows apportioned across sources by weight.

    Args:
        streams: source name → 1-D integer token array (uint16/uint32 memmap of a shard, SPEC §8).
        weights: source name → mixture weight; same keys as ``streams``, each ≥ 0, summing to 1 (±1e-6).
        seq_len: T, tokens per input row; each window holds T + 1 tokens.
        batch_size: B, rows per batch.
        seed: seeds the window-offset generator (numpy PCG64).

    Raises:
        ConfigError: weights name a source missing from streams (or the reverse), a weight is negative or
            non-finite, weights do not sum to 1, or seq_len/batch_size < 1.
        DataError: a stream is empty or not 1-D, or a positively weighted stream is shorter than seq_len + 1
            tokens; the message names the source.
    """

    def __init__(self, streams: dict[str, np.ndarray], weights: dict[str, float], *, seq_len: int,
                 batch_size: int, seed: int):
        _check_config(streams, weights, seq_len, batch_size)
        self.sources = sorted(streams)
        self.streams = streams
        self.weights = {s: float(weights[s]) for s in self.sources}
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._carry = {s: 0.0 for s in self.sources}
        self._rows_drawn = {s: 0 for s in self.sources}
        self.batches_drawn = 0

    def _apportion(self) -> dict[str, int]:
        """Rows per source for the next batch: largest remainder on quota w·B + carried remainder.

        A source rounded up last batch carries a negative remainder; its quota can dip below zero, so rows
        start at max(⌊quota⌋, 0) and are then added to the largest / taken from the smallest remainders
        until the batch holds exactly B rows. Ties go to the alphabetically first source.
        """
        live = [s for s in self.sources if self.weights[s] > 0]
        quota = {s: self.weights[s] * self.batch_size + self._carry[s] for s in live}
        rows = {s: max(math.floor(quota[s]), 0) for s in live}
        remainder = lambda s: quota[s] - rows[s]  # noqa: E731 - reads with the current rows
        while sum(rows.values()) < self.batch_size:
            rows[max(live, key=lambda s: (remainder(s), -live.index(s)))] += 1
        while sum(rows.values()) > self.batch_size:
            rows[min((s for s in live if rows[s] > 0), key=lambda s: (remainder(s), -live.index(s)))] -= 1
        self._carry = {s: (remainder(s) if s in quota else 0.0) for s in self.sources}
        return {s: rows.get(s, 0) for s in self.sources}

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        """Next batch: x, y LongTensors (B, T) with y[:, t] = x[:, t + 1] in the source window; row sources (B,)."""
        rows = self._apportion()
        windows, row_sources = [], []
        for source in self.sources:
            stream = self.streams[source]
            starts = self._rng.integers(0, len(stream) - self.seq_len, size=rows[source])
            windows += [np.asarray(stream[i:i + self.seq_len + 1], dtype=np.int64) for i in starts]
            row_sources += [source] * rows[source]
            self._rows_drawn[source] += rows[source]
        self.batches_drawn += 1
        batch = torch.from_numpy(np.stack(windows))  # (B, T + 1)
        return batch[:, :-1].contiguous(), batch[:, 1:].contiguous(), row_sources

    def realised_fractions(self) -> dict[str, float]:
        """Share of rows drawn so far per source (all zero before the first batch)."""
        total = sum(self._rows_drawn.values())
        return {s: (n / total if total else 0.0) for s, n in self._rows_drawn.items()}

    def state_dict(self) -> dict:
        """JSON-serialisable position: RNG state, batches drawn, rows per source, carried remainders."""
        return {
            "seed": self.seed,
            "rng": self._rng.bit_generator.state,
            "batches_drawn": self.batches_drawn,
            "rows_drawn": dict(self._rows_drawn),
            "carry": dict(self._carry),
            "weights": dict(self.weights),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a position saved by ``state_dict``; the next batches equal the uninterrupted run's.

        Raises:
            DataError: the saved state was taken with different sources or weights.
        """
        if set(state["weights"]) != set(self.sources) or any(
                abs(state["weights"][s] - self.weights[s]) > WEIGHT_TOLERANCE for s in self.sources):
            raise DataError(
                f"sampler state has weights {state['weights']} but this sampler has {self.weights}; "
                "resume with the mixture the checkpoint was trained on"
            )
        self._rng.bit_generator.state = state["rng"]
        self.batches_drawn = int(state["batches_drawn"])
        self._rows_drawn = {s: int(state["rows_drawn"][s]) for s in self.sources}
        self._carry = {s: float(state["carry"][s]) for s in self.sources}


def _check_config(streams: dict[str, np.ndarray], weights: dict[str, float], seq_len: int, batch_size: int) -> None:
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
        if stream.ndim != 1 or len(stream) == 0:
            raise DataError(f"stream of source {source!r} has shape {stream.shape}: need a non-empty 1-D token array")
        if weights[source] > 0 and len(stream) < seq_len + 1:
            raise DataError(
                f"stream of source {source!r} has {len(stream):,} tokens, fewer than seq_len + 1 = {seq_len + 1}; "
                "add data or give it weight 0"
            )
