"""TokenizerConfig: defaults are valid, bad fields are refused with the field named (docs/methods.md §8, §10)."""

import pytest
from pydantic import ValidationError

from tasks.tokenizer.config import TokenizerConfig


def test_defaults_match_spec_lab2_shape():
    cfg = TokenizerConfig()
    assert cfg.vocab_size == 4096
    assert cfg.special_tokens[0] == "<|endoftext|>"
    assert cfg.pad_multiple in (64, 128)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("special_tokens", ["<|pad|>", "<|endoftext|>"]),
        ("special_tokens", ["<|endoftext|>", "<|endoftext|>"]),
        ("special_tokens", []),
        ("heldout_fraction", 0.0),
        ("heldout_fraction", 1.0),
        ("pad_multiple", 96),
        ("vocab_size", 260),
        ("min_heldout_docs", -1),
        ("sample_max_chars", 0),
    ],
)
def test_invalid_field_is_named(field, value):
    with pytest.raises(ValidationError) as err:
        TokenizerConfig(**{field: value})
    assert field in str(err.value)


def test_unknown_key_and_mutation_refused():
    with pytest.raises(ValidationError, match="vocab_sz"):
        TokenizerConfig(vocab_sz=1000)
    cfg = TokenizerConfig()
    with pytest.raises(ValidationError):
        cfg.vocab_size = 8192
