"""Fit the byte-level BPE tokenizer on a mixture-weighted sample of the training split (docs/methods.md §8).

Rules from docs/methods.md §8, each checked on the fitted tokenizer (:func:`check_tokenizer`):
  - byte-level BPE with all 256 byte symbols in the vocabulary, so no text is out of vocabulary;
  - digits split into single characters: no vocabulary entry holds two digits, "12345" is five tokens;
  - special tokens reserved up front, each always one id, even glued to text ("你好<|endoftext|>").

Overlong pre-tokens are capped first: a run of more than ``max_pretoken_chars`` non-space (or space) characters — a
base64 blob, 100,000 repeated letters — is cut into pieces of that many characters, so BPE training and encoding do
not spend quadratic time on one giant "word". Ordinary words are far shorter and never touched.

Pre-tokenizer order matters: Digits must run *before* ByteLevel. ByteLevel maps bytes 0x80-0xFF to printable stand-ins,
some of which are Unicode numbers ("¼", "½", "²"), so Digits running second would cut multi-byte characters such as
"好" apart and never let BPE merge them.

Decoding: ``tok.decode(ids)`` drops special tokens by default; pass ``skip_special_tokens=False`` to get them back.
"""

import unicodedata
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from infra.errors import ConfigError, DataError
from tasks.tokenizer.config import EOS_TOKEN, NUM_BYTE_TOKENS, TokenizerConfig
from tasks.train.pretrained_tokenizer import tokenizer_hash  # noqa: F401  (the identity shards and checkpoints carry)
from tasks.train.shards import vocab_span

DIGIT_PROBE = "12345"


class FitSample(NamedTuple):
    """The fit sample and what it drew: texts, and characters taken per source (unpacks as a 2-tuple)."""

    texts: list[str]
    chars_by_source: dict[str, int]


class Draw(NamedTuple):
    """What the fit sample takes of one source: ``docs``, positions in the source's training documents (corpus
    order) in the order drawn, the last of them cut to ``last_chars`` characters (whole when it fits)."""

    docs: np.ndarray
    last_chars: int


def sample_plan(lengths_by_source: dict[str, np.ndarray], weights: dict[str, float], max_chars: int,
                seed: int) -> tuple[dict[str, Draw], dict[str, int]]:
    """Which documents the fit sample draws (:func:`sample_texts`), from the characters of each source's training
    documents only (``lengths_by_source``, in corpus order): the sample itself is read afterwards, in one pass,
    and nothing but it is held. The draw is the one of :func:`sample_texts`: the same seeded permutation of each
    source's documents, taken while characters are left, so a corpus read part by part gets the tokenizer a
    whole-frame read got.

    Returns:
        ({source: its :class:`Draw`} for every weighted source in name order, {source: characters drawn}).

    Raises:
        ConfigError: as :func:`sample_texts`.
    """
    budgets = _char_budgets(weights, max_chars)
    rng = np.random.default_rng(seed)
    draws, drawn = {}, {}
    for source in sorted(budgets):  # sorted: the RNG stream must not depend on dict order
        lengths = np.asarray(lengths_by_source.get(source, ()), dtype=np.int64)
        if not len(lengths):
            raise ConfigError(f"source {source!r} has weight {weights[source]} but no texts: drop it from the weights")
        order = rng.permutation(len(lengths))
        budget = budgets[source]
        if budget <= 0:
            draws[source], drawn[source] = Draw(order[:0], 0), 0
            continue
        # Documents are taken in ``order`` while characters are left: the one reaching the budget is the last.
        total = np.cumsum(lengths[order])
        k = min(int(np.searchsorted(total, budget, side="left")) + 1, len(order))
        before = int(total[k - 2]) if k >= 2 else 0
        last = min(int(lengths[order[k - 1]]), budget - before)
        draws[source], drawn[source] = Draw(order[:k], last), before + last
    return draws, drawn


def sample_texts(texts_by_source: dict[str, list[str]], weights: dict[str, float], max_chars: int,
                 seed: int) -> FitSample:
    """Draw at most ``max_chars`` characters, split across sources by mixture weight (docs/methods.md §8: "a sample of the final
    mixture (training split only)" — pass training-split texts only).

    Source s gets a budget of ``max_chars * w_s / sum(w)`` characters, filled with whole documents in a seeded random
    order; the document that crosses the budget is truncated to fit. A source smaller than its budget is taken once
    (not repeated), so ``chars_by_source`` may fall short of the budget: compare the two to see it.
    (:func:`sample_plan` decides the same draw from the documents' lengths alone.)

    Raises:
        ConfigError: a weight is negative, all weights are zero, or a weighted source has no texts.
    """
    lengths = {s: np.fromiter(map(len, texts_by_source.get(s) or ()), dtype=np.int64) for s in weights}
    draws, drawn = sample_plan(lengths, weights, max_chars, seed)
    texts = []
    for source, draw in draws.items():
        texts.extend(drawn_texts(draw, [texts_by_source[source][int(i)] for i in draw.docs]))
    return FitSample(texts, drawn)


def drawn_texts(draw: Draw, texts: list[str]) -> list[str]:
    """The sample's pieces of one source: ``texts`` (its drawn documents, in ``draw.docs`` order), the last cut."""
    if texts:
        texts = [*texts[:-1], texts[-1][:draw.last_chars]]
    return texts


def fit_tokenizer(texts: Iterable[str], cfg: TokenizerConfig) -> Tokenizer:
    """Train byte-level BPE of at most ``cfg.vocab_size`` entries (specials and 256 bytes included) on ``texts``.

    Special tokens get ids 0..k-1 in ``cfg.special_tokens`` order, so ``<|endoftext|>`` is id 0.

    Raises:
        DataError: the fitted tokenizer breaks a docs/methods.md §8 rule (see :func:`check_tokenizer`).
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer(cfg.max_pretoken_chars)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        special_tokens=list(cfg.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    check_tokenizer(tok, cfg.special_tokens, cfg.max_pretoken_chars)
    return tok


def pre_tokenizer(max_pretoken_chars: int) -> pre_tokenizers.PreTokenizer:
    """Cap overlong runs, then split digits, then GPT-2 byte-level splitting (module docstring explains the order)."""
    cap = int(max_pretoken_chars)
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(rf"\S{{{cap}}}|\s{{{cap}}}"), behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True),  # before ByteLevel: see module docstring
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])


def check_tokenizer(tok: Tokenizer, special_tokens: list[str], max_pretoken_chars: int | None = None) -> None:
    """Verify the rules of docs/methods.md §8 listed in the module docstring on a fitted tokenizer: all 256 bytes present, no
    entry with two digits, "12345" → five tokens, each special one id next to Chinese text and decoding back to
    itself, and (when given) no pre-token longer than ``max_pretoken_chars`` characters.

    Raises:
        DataError: naming the first rule broken.
    """
    vocab = tok.get_vocab()
    missing = [ch for ch in pre_tokenizers.ByteLevel.alphabet() if ch not in vocab]
    if missing:
        raise DataError(f"{len(missing)} of {NUM_BYTE_TOKENS} byte symbols missing from the vocab: text could be OOV")
    multi = [t for t in vocab if t not in special_tokens and _count_digits(t) > 1]
    if multi:
        raise DataError(f"vocab entries with more than one digit (docs/methods.md §8 digit split): {multi[:5]}")
    n_probe = len(tok.encode(DIGIT_PROBE).ids)
    if n_probe != len(DIGIT_PROBE):
        raise DataError(f"{DIGIT_PROBE!r} encodes to {n_probe} tokens, expected {len(DIGIT_PROBE)} (docs/methods.md §8)")
    for special in special_tokens:
        special_id = tok.token_to_id(special)
        if tok.encode(f"你好{special}世界").ids.count(special_id) != 1:
            raise DataError(f"special token {special!r} does not encode to its single id next to text")
        if tok.decode([special_id], skip_special_tokens=False) != special:
            raise DataError(f"special token {special!r} does not decode back to itself")
    if max_pretoken_chars is not None and tok.pre_tokenizer is not None:
        probe = "x" * (3 * max_pretoken_chars) + " " * (3 * max_pretoken_chars) + "7" * 10
        longest = max(len(piece) for piece, _ in tok.pre_tokenizer.pre_tokenize_str(probe))
        if longest > max_pretoken_chars:  # byte-level symbols of ASCII are one character each
            raise DataError(f"a pre-token of {longest} characters got through the cap of {max_pretoken_chars}")


def padded_vocab_size(tok: Tokenizer, multiple: int) -> int:
    """Rows of the model's embedding: the vocab size (highest id + 1, :func:`tasks.train.shards.vocab_span`) rounded
    up to ``multiple`` (docs/methods.md §8: 152,064 = 1,188 × 128).

    Raises:
        ConfigError: ``multiple`` is not positive.
    """
    if multiple <= 0:
        raise ConfigError(f"pad multiple must be > 0, got {multiple}")
    return -(-vocab_span(tok) // multiple) * multiple


def eos_id(tok: Tokenizer) -> int:
    """Id of ``<|endoftext|>``, the document separator (docs/methods.md §8 packing).

    Raises:
        DataError: the tokenizer has no such token.
    """
    token_id = tok.token_to_id(EOS_TOKEN)
    if token_id is None:
        raise DataError(f"tokenizer has no {EOS_TOKEN!r}: refit it with that token first in special_tokens")
    return token_id


def token_bytes(token: str) -> bytes:
    """The raw bytes a byte-level vocabulary entry stands for (undoes GPT-2's byte→printable-character map)."""
    return bytes(_BYTE_OF_SYMBOL[ch] for ch in token)


def _count_digits(token: str) -> int:
    # Unicode categories N*: the classes Digits(individual_digits) isolates (Rust char::is_numeric).
    text = token_bytes(token).decode("utf-8", errors="ignore")
    return sum(unicodedata.category(ch).startswith("N") for ch in text)


def _char_budgets(weights: dict[str, float], max_chars: int) -> dict[str, int]:
    if any(w < 0 for w in weights.values()):
        raise ConfigError(f"mixture weights must be >= 0, got {weights}")
    total = sum(weights.values())
    if total <= 0:
        raise ConfigError(f"mixture weights sum to {total}: give at least one source a positive weight")
    return {s: int(max_chars * w / total) for s, w in weights.items() if w > 0}


def _byte_symbol_table() -> dict[str, int]:
    """GPT-2's reversible map: printable bytes stand for themselves, the rest shift to U+0100 onwards."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, shift = {}, 0
    for b in range(NUM_BYTE_TOKENS):
        if b in printable:
            symbols[chr(b)] = b
        else:
            symbols[chr(NUM_BYTE_TOKENS + shift)] = b
            shift += 1
    return symbols


_BYTE_OF_SYMBOL = _byte_symbol_table()
