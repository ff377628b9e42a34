"""Autoregressive sampling from a ``Decoder`` with its KV cache: greedy, temperature, top-k and nucleus (top-p).

One sequence at a time. The prompt is prefilled once into a ``models.decoder.KVCache``; every later step feeds
only the new token, at the next RoPE position. Each step's next-token distribution is

    greedy (temperature = 0):  argmax_v z_v
    sampled (temperature τ > 0): p ∝ exp(z / τ), restricted to the k largest logits (top-k, Fan et al. 2018) and
                                 then to the nucleus: the smallest set of tokens, most probable first, whose
                                 probability mass is ≥ p (top-p, Holtzman et al. 2020), renormalised,

drawn with a ``torch.Generator`` seeded from ``Sampling.seed`` (created anew for each sequence, so a prompt gets
the same continuation whatever was generated before it). Generation stops at EOS (not returned) or after
``max_new_tokens``.

Context window: the model attends at most ``cfg.seq_len`` positions (its RoPE tables). A prompt longer than that
is cropped from the left to its last ``seq_len`` tokens. While prompt + generated tokens fit in ``seq_len`` the KV
cache is used; once they do not, each further step recomputes the last ``seq_len`` tokens without a cache (the
window slides left, positions 0..seq_len-1), exactly as an uncached loop over ``context[-seq_len:]`` does.

Usage::

    from models.generate import Sampling, complete
    done = complete(model, tokenizer, "Debian is", Sampling(max_new_tokens=20), eos_id=0,
                    on_text=lambda s: print(s, end="", flush=True))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from infra.errors import DataError
from models.decoder import KVCache
from models.sampling import Sampling  # noqa: F401  (re-exported: the settings beside the code)

StopReason = Literal["eos", "length"]


def top_k_mask(logits: torch.Tensor, k: int) -> torch.Tensor:
    """bool (..., V), True for the k largest logits of the last dimension (ties with the k-th kept too); k = 0 or
    k ≥ V keeps all (Fan et al. 2018)."""
    if k <= 0 or k >= logits.shape[-1]:
        return torch.ones_like(logits, dtype=torch.bool)
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return logits >= kth


def nucleus_mask(probs: torch.Tensor, p: float) -> torch.Tensor:
    """bool (..., V): the nucleus of each distribution ``probs`` (..., V), the smallest set of tokens, taken most
    probable first, whose total probability is ≥ p (Holtzman et al. 2020). A token is kept when the mass of the
    tokens ranked before it is < p, so the most probable token is always kept; p = 1 keeps all."""
    if p >= 1:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass ranked strictly before each token
    keep_sorted = before < p
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def next_token_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The sampling distribution (V,) float64 of one step's logits (V,) for τ > 0: softmax(z/τ) cut to top-k,
    then to the nucleus of what is left, renormalised."""
    z = logits.double() / sampling.temperature
    z = z.masked_fill(~top_k_mask(z, sampling.top_k), float("-inf"))
    probs = torch.softmax(z, dim=-1)
    probs = probs * nucleus_mask(probs, sampling.top_p)
    return probs / probs.sum()


def pick(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """One token id from one step's logits (V,): argmax when greedy, else a draw from ``next_token_probs`` with
    ``generator`` (a CPU ``torch.Generator``)."""
    if sampling.greedy:
        return int(torch.argmax(logits))
    probs = next_token_probs(logits.detach().cpu(), sampling)
    return int(torch.multinomial(probs, 1, generator=generator))


@dataclass
class Generation:
    """The outcome of one ``generate``: ``tokens`` the new ids (EOS excluded), ``stop_reason`` ``eos`` or
    ``length``, ``prompt_tokens`` the prompt length fed to the model and ``cropped`` the prompt tokens dropped
    from the left to fit ``seq_len``."""

    tokens: list[int]
    stop_reason: StopReason
    prompt_tokens: int
    cropped: int


class _Stream:
    """Iterator over the new token ids of one generation; ``stop_reason`` is set once it is exhausted."""

    def __init__(self, steps: Iterator[int], owner: "_Decoding"):
        self._steps, self._owner = steps, owner

    def __iter__(self) -> "_Stream":
        return self

    def __next__(self) -> int:
        return next(self._steps)

    @property
    def stop_reason(self) -> StopReason | None:
        return self._owner.stop_reason


@dataclass
class _Decoding:
    stop_reason: StopReason | None = None


def stream_tokens(model: nn.Module, prompt: Sequence[int], sampling: Sampling, *, eos_id: int | None = None,
                  n_vocab: int | None = None) -> _Stream:
    """Iterator over the new token ids of a generation, one id per step as soon as it is chosen (streaming).

    Args:
        model: a ``Decoder`` (or a module wrapping one that takes ``cache=``), in any mode; it is run in eval
            mode under ``torch.no_grad``; its mode is restored when the iterator is exhausted or closed.
        prompt: token ids (T_p,), T_p ≥ 1; longer than ``cfg.seq_len``: cropped from the left.
        sampling: the decoding settings.
        eos_id: stop when this id is chosen (it is not yielded); None: run ``max_new_tokens`` steps.
        n_vocab: ids ≥ n_vocab (the padding rows of a padded vocabulary) are never chosen; None: all V.

    The exhausted iterator's ``stop_reason`` is ``eos`` or ``length``.

    Raises:
        DataError: an empty prompt, or a prompt id outside 0..V-1.
    """
    state = _Decoding()
    return _Stream(_decode(model, _context(model, prompt, n_vocab), sampling, eos_id, n_vocab, state), state)


def generate(model: nn.Module, prompt: Sequence[int], sampling: Sampling, *, eos_id: int | None = None,
             n_vocab: int | None = None, on_token: Callable[[int], Any] | None = None) -> Generation:
    """Generate after ``prompt`` (ids (T_p,)) until EOS or ``sampling.max_new_tokens``; ``on_token(id)`` is called
    for each new id as it is chosen. Arguments and errors as in ``stream_tokens``."""
    stream = stream_tokens(model, prompt, sampling, eos_id=eos_id, n_vocab=n_vocab)
    tokens = []
    for token in stream:
        tokens.append(token)
        if on_token is not None:
            on_token(token)
    seq_len = _core(model).cfg.seq_len
    return Generation(tokens, stream.stop_reason or "length", min(len(prompt), seq_len),
                      max(0, len(prompt) - seq_len))


def _core(model: nn.Module) -> nn.Module:
    """The ``Decoder`` inside a wrapper (DDP's ``module``); FSDP2 modules are Decoders themselves."""
    return getattr(model, "module", model) if not hasattr(model, "cfg") else model


def _context(model: nn.Module, prompt: Sequence[int], n_vocab: int | None) -> list[int]:
    """The prompt ids as the model sees them (cropped from the left to cfg.seq_len), checked."""
    cfg = _core(model).cfg
    context = [int(t) for t in prompt]
    if not context:
        raise DataError("empty prompt: give at least one token (e.g. the EOS id, the document boundary)")
    if min(context) < 0 or max(context) >= cfg.vocab_size:
        raise DataError(f"prompt ids must be in 0..{cfg.vocab_size - 1} (model.vocab_size); got "
                        f"{min(context)}..{max(context)}")
    if n_vocab is not None and n_vocab < 1:
        raise DataError(f"n_vocab = {n_vocab}: must be ≥ 1")
    return context[-cfg.seq_len:]


def _decode(model: nn.Module, context: list[int], sampling: Sampling, eos_id: int | None, n_vocab: int | None,
            state: _Decoding) -> Iterator[int]:
    cfg = _core(model).cfg
    device = next(model.parameters()).device
    generator = None if sampling.greedy else torch.Generator().manual_seed(sampling.seed)
    was_training = model.training
    model.eval()

    def as_batch(ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor([list(ids)], dtype=torch.long, device=device)  # (1, T)

    try:
        cache: KVCache | None = KVCache(cfg)
        with torch.no_grad():
            logits = model(as_batch(context), cache=cache)[0, -1]  # (V,) at the last prompt position
        for step in range(sampling.max_new_tokens):
            if n_vocab is not None and n_vocab < logits.shape[-1]:
                logits = logits.clone()
                logits[n_vocab:] = float("-inf")
            token = pick(logits.float(), sampling, generator)
            if token == eos_id:
                state.stop_reason = "eos"
                break
            yield token
            context.append(token)
            if step + 1 == sampling.max_new_tokens:
                state.stop_reason = "length"
                break
            with torch.no_grad():
                if cache is not None and len(context) <= cfg.seq_len:
                    logits = model(as_batch([token]), cache=cache)[0, -1]
                else:  # the window slides: positions shift, so cached keys no longer apply
                    cache = None
                    logits = model(as_batch(context[-cfg.seq_len:]))[0, -1]
    finally:
        model.train(was_training)


@dataclass
class Completion:
    """A decoded generation: ``text`` the new text (EOS excluded), ``tokens`` its ids, ``stop_reason``,
    ``prompt_tokens`` and ``cropped`` as in ``Generation``."""

    text: str
    tokens: list[int]
    stop_reason: StopReason
    prompt_tokens: int
    cropped: int


def complete(model: nn.Module, tokenizer: Any, prompt: str, sampling: Sampling, *, eos_id: int | None,
             n_vocab: int | None = None, on_text: Callable[[str], Any] | None = None) -> Completion:
    """Encode ``prompt`` with ``tokenizer`` (a ``tokenizers.Tokenizer``; special-token strings map to their ids),
    generate, and decode the new tokens.

    ``on_text(chunk)`` receives the text as it is generated, decoded incrementally with the tokenizer's
    ``DecodeStream``: a chunk is released only once its bytes form whole UTF-8 characters, so a character split
    over several byte-level tokens is never printed in halves. The chunks join to ``Completion.text`` (a generation
    cut inside a character ends with U+FFFD, released last). ``n_vocab`` defaults to the tokenizer's vocabulary.

    Raises:
        DataError: the prompt encodes to no token and there is no ``eos_id`` to start from; ids as in
            ``stream_tokens``.
    """
    from tokenizers.decoders import DecodeStream

    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    if not ids and eos_id is not None:
        ids = [eos_id]  # an empty prompt starts a document
    decoder, chunks = DecodeStream(skip_special_tokens=False), []

    def emit(token: int) -> None:
        chunk = decoder.step(tokenizer, token)
        if chunk:
            chunks.append(chunk)
            if on_text is not None:
                on_text(chunk)

    n_vocab = tokenizer.get_vocab_size() if n_vocab is None else n_vocab
    done = generate(model, ids, sampling, eos_id=eos_id, n_vocab=n_vocab, on_token=emit)
    text = tokenizer.decode(done.tokens, skip_special_tokens=False)
    streamed = "".join(chunks)
    rest = text[len(streamed):] if text.startswith(streamed) else ""
    if rest and on_text is not None:
        on_text(rest)
    return Completion(streamed + rest, done.tokens, done.stop_reason, done.prompt_tokens, done.cropped)
