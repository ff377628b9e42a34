"""Decontamination: find training documents that share a word n-gram with an evaluation item (docs/methods.md §7).

Texts are reduced to lower-cased ``\\w+`` tokens, so whitespace, line wraps and punctuation never hide a match.
Each token is hashed with xxh3-64 and every window of n tokens gets the polynomial hash
Σ_k h(w_{i+k})·P^(n−1−k) mod 2^64, computed for all windows of a document at once with numpy. An item shorter than
``ngram`` words (a one-sentence cloze context) contributes its whole token sequence as one shorter n-gram, as long as
it has at least ``MIN_ITEM_TOKENS`` tokens; shorter items cannot be checked and are counted as such.
(13-gram overlap follows Brown et al. 2020, "Language Models are Few-Shot Learners", App. C.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import xxhash

_TOKEN_RE = re.compile(r"\w+")
_P = np.uint64(1_000_003)  # odd multiplier of the window hash; arithmetic wraps mod 2^64 by design
MIN_ITEM_TOKENS = 8


def tokens(text: str) -> list[str]:
    """Lower-cased word tokens (``\\w+``) of ``text``."""
    return _TOKEN_RE.findall(text.lower())


def window_hashes(words: Sequence[str], n: int) -> np.ndarray:
    """Hashes of every window of ``n`` consecutive words, shape (max(len(words) − n + 1, 0),) uint64."""
    if len(words) < n:
        return np.empty(0, dtype=np.uint64)
    h = np.fromiter((xxhash.xxh3_64_intdigest(w.encode("utf-8")) for w in words), dtype=np.uint64, count=len(words))
    out = np.zeros(len(words) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            out = out * _P + h[k:len(words) - n + 1 + k]
    return out


def _member(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """``np.isin(values, sorted_set)`` for a sorted array of unique values: a binary search per value. (``np.isin``
    sorts both arrays on every call: with a held-out split's ~10^6 n-grams that was seconds per document.)"""
    at = np.searchsorted(sorted_set, values)
    at[at == len(sorted_set)] = 0
    return sorted_set[at] == values


@dataclass
class EvalItem:
    """One evaluation text: ``set_name`` (e.g. "cloze:demo.jsonl"), ``item_id`` within it, and its ``text``."""

    set_name: str
    item_id: str
    text: str


@dataclass
class EvalIndex:
    """Hashed n-grams of every evaluation item, for lookup against training documents.

    ``grams[length]``: sorted unique uint64 window hashes of that many tokens, and ``owner[length]`` the index in
    ``items`` of the first item holding each (16 bytes per n-gram, so whole held-out splits fit).
    ``unchecked``: (set, id) of items too short to check.
    """

    ngram: int
    items: list[EvalItem] = field(default_factory=list)
    grams: dict[int, np.ndarray] = field(default_factory=dict)
    owner: dict[int, np.ndarray] = field(default_factory=dict)
    unchecked: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def build(cls, items: Iterable[EvalItem], ngram: int,
              advance: Callable[[int], None] = lambda n: None) -> "EvalIndex":
        """The index of ``items``' ``ngram``-grams; ``advance(1)`` is called as each item is hashed (progress)."""
        index = cls(ngram=ngram, items=list(items))
        parts: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        for i, item in enumerate(index.items):
            words = tokens(item.text)
            advance(1)
            if len(words) < MIN_ITEM_TOKENS:
                index.unchecked.append((item.set_name, item.item_id))
                continue
            length = min(ngram, len(words))
            hashes = window_hashes(words, length)
            parts.setdefault(length, []).append((hashes, np.full(len(hashes), i, dtype=np.int64)))
        for length, chunks in parts.items():
            hashes = np.concatenate([h for h, _ in chunks])
            owners = np.concatenate([o for _, o in chunks])
            uniq, first = np.unique(hashes, return_index=True)  # first occurrence → lowest item index
            index.grams[length], index.owner[length] = uniq, owners[first]
        return index

    def save(self, path: Path) -> None:
        """Write the index as one ``.npz`` (arrays, and the items as JSON text): no pickle, so loading runs no code."""
        meta = {"ngram": self.ngram, "items": [asdict(item) for item in self.items], "unchecked": self.unchecked}
        arrays = {f"grams_{n}": g for n, g in self.grams.items()} | {f"owner_{n}": o for n, o in self.owner.items()}
        with open(path, "wb") as f:
            np.savez(f, meta=np.array(json.dumps(meta)), **arrays)

    @classmethod
    def load(cls, path: Path) -> "EvalIndex":
        """The index ``save`` wrote."""
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            lengths = sorted(int(name.removeprefix("grams_")) for name in data.files if name.startswith("grams_"))
            return cls(ngram=meta["ngram"], items=[EvalItem(**item) for item in meta["items"]],
                       grams={n: data[f"grams_{n}"] for n in lengths}, owner={n: data[f"owner_{n}"] for n in lengths},
                       unchecked=[tuple(pair) for pair in meta["unchecked"]])

    @property
    def n_items(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.grams)

    def hits(self, text: str) -> list[tuple[int, int]]:
        """Distinct (length, hash) evaluation n-grams occurring in ``text``."""
        if not self.grams:
            return []
        words = tokens(text)
        found: list[tuple[int, int]] = []
        for length, grams in self.grams.items():
            windows = window_hashes(words, length)
            if len(windows) and len(grams):
                found.extend((length, int(h)) for h in np.unique(windows[_member(windows, grams)]))
        return found

    def describe(self, length: int, h: int) -> tuple[str, EvalItem]:
        """(n-gram text, the first item holding it) of a hit returned by :meth:`hits`."""
        grams = self.grams[length]
        item = self.items[int(self.owner[length][np.searchsorted(grams, np.uint64(h))])]
        words = tokens(item.text)
        windows = window_hashes(words, length)
        at = int(np.flatnonzero(windows == np.uint64(h))[0])
        return " ".join(words[at:at + length]), item


def load_eval_files(patterns: Sequence[str]) -> list[EvalItem]:
    """Evaluation items from files matching ``patterns`` (globs): JSONL rows with a ``text`` field (``id`` or
    ``item_id`` optional), or plain text with one item per blank-line separated paragraph.

    Raises:
        DataError: a pattern matches no file, a JSONL line is not a JSON object with ``text``.
    """
    import glob

    from infra.errors import DataError
    from infra.jsonl import jsonl_lines

    items: list[EvalItem] = []
    for pattern in patterns:
        paths = sorted(glob.glob(pattern, recursive=True))
        if not paths:
            raise DataError(f"corpus.decontamination.eval_files: {pattern!r} matches no file")
        for path in map(Path, paths):
            text = path.read_text(encoding="utf-8", errors="replace")
            if path.suffix == ".jsonl":
                for n, line in jsonl_lines(text):  # "\n" only: U+2028 may sit raw in a JSON string
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                        items.append(EvalItem(path.name, str(row.get("item_id", row.get("id", n))), row["text"]))
                    except (ValueError, KeyError, AttributeError) as err:
                        raise DataError(f"{path}:{n}: not a JSON object with a 'text' field ({err})") from err
            else:
                for n, para in enumerate(p for p in text.split("\n\n") if p.strip()):
                    items.append(EvalItem(path.name, str(n), para))
    return items
