"""Config section of the tokenizer stage: BPE size, vocab padding, specials, held-out split, fit sample.

Sources: docs/methods.md §8 (tokenizer, padding) and §10 (held-out splits).
"""

from typing import Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from evals.stats import MIN_UNITS
from infra.execution import ExecutionConfig
from infra.section import NOT_IN_KEY, Section

from tasks.train.shards import EOS_TOKEN  # noqa: E402  (the shard format ends documents with it)
NUM_BYTE_TOKENS = 256  # byte-level BPE starts from every byte value (docs/methods.md §8)


class TokenizerExecutionConfig(ExecutionConfig):
    """Where the tokenizer stage runs its per-part work: the held-out decontamination's index and lookups and the
    encoding of the shards (``engine``, ``workers``, ``address``, ``recycle_after``: see ``infra.execution``);
    never part of the cache key (the artifact is the same whatever these settings). ``part_docs``: documents per
    encode call at most; each kept part of the corpus is cut into calls of this many documents, each encoding
    every (source, split) it holds, and the part shards are then joined in corpus order into one shard per
    (source, split), so memory per call is bounded by the call. The calls read the corpus artifact's kept parts,
    ``tokenizer.json`` from the artifact being written and the per-document labels and held-out index from the
    stage's scratch folder, so with ``ray`` every node must see the runs folder at the same path."""

    part_docs: int = Field(default=10_000, ge=1)


class TokenizerConfig(Section):
    """What the tokenizer stage needs, validated when built.

    Fields:
        vocab_size: target BPE vocabulary in tokens, counting the specials and the 256 byte tokens (docs/methods.md §8).
        pad_multiple: the model's embedding rows are padded to a multiple of this (64 or 128, docs/methods.md §8).
        special_tokens: reserved up front; the first must be ``<|endoftext|>``, the EOS that separates documents.
        heldout_fraction: share of near-duplicate families held out, in (0, 1) (docs/methods.md §10).
        min_heldout_docs: held-out documents required per source (docs/methods.md §10: held-out loss per source);
            default ``evals.stats.MIN_UNITS["documents"]`` (5), the fewest from which a verdict on a held-out loss
            difference may be decided (docs/methods.md §16).
        sample_max_chars: cap on the tokenizer fit sample, in characters.
        seed: seeds the split hash and the fit sample.
        decontam_ngram: training documents sharing a word n-gram of this length with any held-out document are
            removed before fitting (docs/methods.md §7 decontamination; 0 turns it off).
        decontam_common_docs: an n-gram held by this many training documents or more is common phrasing, ignored.
        fit_weights: source → weight of the fit sample (docs/methods.md §8: a sample of the final mixture). Empty:
            the general sources at their natural shares of the training characters (the mixture ablation's
            reference candidate), plus ``fit_domain_share`` for the ``[cpt] domain_sources``
            (``tasks.tokenizer.composition``). Sources left out are not sampled.
        fit_domain_share: with ``fit_weights`` empty, the share δ in [0, 1) of the fit sample drawn from the
            ``[cpt] domain_sources``, split equally among them; the general sources share 1 − δ. 0 (default): domain
            text is not sampled. The kept model's share of domain tokens is (1 − f)·D_cpt / (D_main + D_cpt).
        max_pretoken_chars: longer runs of non-space (or space) characters are cut into pieces this long before
            BPE, so base64 blobs and repeated characters cost what ordinary text costs.
        domain_terms: terms whose fragmentation (tokens per term, the pieces) is reported (docs/methods.md §11).
        execution: where the shards are encoded (:class:`TokenizerExecutionConfig`); not part of the cache key.
        pretrained: a released tokenizer to adopt instead of fitting one: a Hugging Face tokenizer folder holding
            ``tokenizer.json`` or that file itself (``tasks.train.pretrained_tokenizer``). Its vocabulary, EOS and
            padding ids go into the shards, and the content of its files, not the path, is in the cache key; the
            fit fields (vocab_size, special_tokens, fit_weights, sample_max_chars, max_pretoken_chars) are then
            unused. Empty: fit byte-level BPE.

    Raises:
        pydantic.ValidationError: a field is invalid; the message names the field and the fix (``pretrained``: the
            path is missing, has no tokenizer.json, or no EOS can be determined).
    """

    vocab_size: int = 4096
    pad_multiple: Literal[64, 128] = 64
    special_tokens: list[str] = [EOS_TOKEN, "<|pad|>", "<|im_start|>", "<|im_end|>"]
    heldout_fraction: float = 0.1
    min_heldout_docs: int = MIN_UNITS["documents"]
    sample_max_chars: int = 5_000_000
    seed: int = 0
    decontam_ngram: int = Field(default=13, ge=0)
    decontam_common_docs: int = Field(default=50, ge=2)
    fit_weights: dict[str, float] = {}
    fit_domain_share: float = Field(default=0.0, ge=0.0, lt=1.0)
    max_pretoken_chars: int = Field(default=64, ge=4, le=4096)
    domain_terms: list[str] = []
    execution: TokenizerExecutionConfig = Field(default=TokenizerExecutionConfig(), json_schema_extra=NOT_IN_KEY)
    # The key holds the content of the tokenizer's files instead (the stage's key_extra), so a moved copy is reused.
    pretrained: str = Field(default="", json_schema_extra=NOT_IN_KEY)

    @field_validator("pretrained")
    @classmethod
    def _pretrained_readable(cls, path: str) -> str:
        if path:
            from tasks.train.pretrained_tokenizer import read_pretrained

            read_pretrained(path)  # ConfigError (a ValueError): reported under tokenizer.pretrained
        return path

    @field_validator("fit_weights")
    @classmethod
    def _weights_non_negative(cls, weights: dict[str, float]) -> dict[str, float]:
        bad = {s: w for s, w in weights.items() if not (w >= 0 and w < float("inf"))}
        if bad:
            raise ValueError(f"fit_weights must be finite and >= 0, got {bad}")
        if weights and sum(weights.values()) <= 0:
            raise ValueError("fit_weights sum to 0: give at least one source a positive weight, or leave it empty")
        return weights

    @model_validator(mode="after")
    def _one_way_to_weigh(self) -> "TokenizerConfig":
        if self.fit_weights and self.fit_domain_share:
            raise ValueError(f"fit_domain_share = {self.fit_domain_share} applies to the default fit sample only: "
                             "with fit_weights given, weigh the domain sources there and drop fit_domain_share")
        return self

    @model_serializer(mode="wrap")
    def _default_domain_share_dumps_as_before(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)
        if data.get("fit_domain_share") == 0.0:  # no domain text in the fit sample: dumps stay as they were
            data.pop("fit_domain_share", None)
        return data

    @field_validator("special_tokens")
    @classmethod
    def _specials_start_with_eos(cls, tokens: list[str]) -> list[str]:
        if not tokens or tokens[0] != EOS_TOKEN:
            raise ValueError(f"special_tokens must start with {EOS_TOKEN!r} (the EOS), got {tokens!r}")
        if any(not t for t in tokens) or len(set(tokens)) != len(tokens):
            raise ValueError(f"special_tokens must be non-empty and unique, got {tokens!r}")
        return tokens

    @field_validator("heldout_fraction")
    @classmethod
    def _fraction_in_open_unit(cls, fraction: float) -> float:
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"heldout_fraction must lie strictly between 0 and 1, got {fraction}")
        return fraction

    @field_validator("min_heldout_docs", "seed")
    @classmethod
    def _non_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError(f"must be >= 0, got {value}")
        return value

    @field_validator("sample_max_chars")
    @classmethod
    def _positive_sample(cls, value: int) -> int:
        if value <= 0:
            raise ValueError(f"sample_max_chars must be > 0 characters, got {value}")
        return value

    @model_validator(mode="after")
    def _vocab_holds_bytes_and_specials(self) -> "TokenizerConfig":
        floor = NUM_BYTE_TOKENS + len(self.special_tokens)
        if self.vocab_size <= floor:
            raise ValueError(
                f"vocab_size={self.vocab_size} leaves no room for merges: it must exceed "
                f"{NUM_BYTE_TOKENS} byte tokens + {len(self.special_tokens)} special tokens = {floor}"
            )
        return self

