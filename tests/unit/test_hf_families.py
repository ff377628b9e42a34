"""The bases people release, as the decoder represents them exactly: Qwen3 with head_dim ≠ d / n_h, Qwen2 with q/k/v
biases, Llama 3 RoPE scaling (``rope_type = "llama3"``) and YaRN (``rope_type = "yarn"``). Tiny random models are
built and saved by ``transformers`` itself; import gives its logits (fp32, ≤ 1e-4) and greedy continuations, and the
export loads back into the same architecture class with the same logits. What is still not representable is refused
with the field named."""

from __future__ import annotations

import json

import pytest
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

from infra.errors import ConfigError
from models.config import ModelConfig, RopeScaling
from models.decoder import Decoder
from models.hf import LOGIT_TOLERANCE, decoder_from_hf, hf_config

from tests.unit.hf_random import EOS, PAD, check_against, compare, import_export_round_trip, saved_random  # noqa: E402
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13]]
COMMON = dict(vocab_size=96, num_hidden_layers=2, initializer_range=0.1, eos_token_id=EOS, pad_token_id=PAD,
              bos_token_id=None)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64, "rope_theta": 10000.0}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 10000.0}

FAMILIES = {
    # Qwen3 0.6B–8B shape: head_dim 128 with d 256 and 4 heads (d / n_h = 64)
    "qwen3-head-dim-128": (Qwen3ForCausalLM, lambda: Qwen3Config(
        **COMMON, hidden_size=256, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        head_dim=128, max_position_embeddings=32, tie_word_embeddings=True)),
    # Qwen2 / Qwen2.5: biases on q/k/v (filled with randn below), none on o
    "qwen2-qkv-bias": (Qwen2ForCausalLM, lambda: Qwen2Config(
        **COMMON, hidden_size=64, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=32, tie_word_embeddings=False)),
    # Llama 3.1 RoPE bands; 16-wide heads at θ = 1e4: pair 0 kept, pairs 1–2 blended, pairs 3–7 divided by 8
    "llama3-rope": (LlamaForCausalLM, lambda: LlamaConfig(
        **COMMON, hidden_size=64, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, tie_word_embeddings=False, rope_parameters=dict(LLAMA3))),
    # Qwen2.5 long context: YaRN, with biases, legacy ``rope_scaling`` spelling as Qwen2.5's READMEs write it
    "qwen2-yarn": (Qwen2ForCausalLM, lambda: Qwen2Config(
        **COMMON, hidden_size=64, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128, tie_word_embeddings=True, rope_theta=10000.0,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})),
}
EXPECTED = {
    "qwen3-head-dim-128": dict(head_dim=128, qk_norm=True, qkv_bias=False, rope_scaling=None),
    "qwen2-qkv-bias": dict(head_dim=16, qk_norm=False, qkv_bias=True, rope_scaling=None),
    "llama3-rope": dict(head_dim=16, qk_norm=False, qkv_bias=False, rope_scaling=RopeScaling(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64)),
    "qwen2-yarn": dict(head_dim=16, qk_norm=False, qkv_bias=True, rope_scaling=RopeScaling(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=32)),
}


_saved = saved_random


def _verify(ours: Decoder, theirs):
    return compare(ours, theirs, PROMPTS, 16)


def _check(ours: Decoder, theirs, label: str) -> float:
    return check_against(ours, theirs, label, PROMPTS, 16)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_import_and_export_match_transformers(name, tmp_path):
    model_cls, make = FAMILIES[name]
    _, (theirs, back) = import_export_round_trip(model_cls, make(), EXPECTED[name], tmp_path, name, PROMPTS)
    assert back.config.rope_parameters["rope_type"] == theirs.config.rope_parameters["rope_type"]


@pytest.mark.parametrize("name", ["llama3-rope", "qwen2-yarn"])
def test_control_the_probe_sees_the_rope_scaling(name, tmp_path):
    """The same weights with plain RoPE differ from transformers beyond the tolerance: the probe positions do
    exercise the rescaled frequencies (and YaRN's attention factor)."""
    model_cls, make = FAMILIES[name]
    theirs = _saved(model_cls, make(), tmp_path)
    ours = decoder_from_hf(tmp_path)
    plain = Decoder(ours.cfg.model_copy(update={"rope_scaling": None})).eval()
    plain.load_state_dict(ours.state_dict())
    result = _verify(plain, theirs)
    print(f"control {name} without scaling: max |logit diff| = {result.max_abs_logit_diff:.3g}")
    assert result.max_abs_logit_diff > 100 * LOGIT_TOLERANCE


def test_explicit_head_dim_shapes_and_dump():
    cfg = ModelConfig(n_layers=1, d_model=256, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=64, seq_len=8,
                      head_dim=128, qkv_bias=True)
    attn = Decoder(cfg).blocks[0].attn
    assert attn.wq.weight.shape == (512, 256) and attn.wk.weight.shape == (256, 256)
    assert attn.wo.weight.shape == (256, 512) and attn.wv.bias.shape == (256,) and attn.wo.bias is None
    assert not attn.wq.bias.any()  # biases start at zero
    assert cfg.model_dump()["head_dim"] == 128 and cfg.model_dump()["qkv_bias"] is True
    plain = ModelConfig(n_layers=1, d_model=256, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=64, seq_len=8)
    assert plain.head_dim == 64
    assert {"head_dim", "qkv_bias", "rope_scaling"}.isdisjoint(plain.model_dump())  # dumps and keys as before
    assert ModelConfig(**plain.model_dump(), head_dim=64).model_dump() == plain.model_dump()
    scaled = ModelConfig(**plain.model_dump(), rope_scaling=RopeScaling(**{k: v for k, v in LLAMA3.items()
                                                                         if k != "rope_theta"}))
    assert ModelConfig(**json.loads(json.dumps(scaled.model_dump()))) == scaled  # as a checkpoint's state.json


def test_a_rope_type_not_implemented_is_still_refused_by_name(tmp_path):
    LlamaConfig(**COMMON, hidden_size=64, intermediate_size=80, num_attention_heads=4, max_position_embeddings=64,
                rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"rope_type\) = 'dynamic': only .*'llama3'.*'yarn'"):
        decoder_from_hf(tmp_path)


def test_a_llama3_parameter_the_decoder_does_not_implement_is_refused_by_name(tmp_path):
    config = LlamaConfig(**COMMON, hidden_size=64, intermediate_size=80, num_attention_heads=4,
                         max_position_embeddings=512, rope_parameters=dict(LLAMA3))
    config.rope_parameters["low_freq_factor"] = 4.0  # no band left between the two wavelengths
    config.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="high_freq_factor = 4.0 must exceed low_freq_factor"):
        decoder_from_hf(tmp_path)


def test_export_refuses_what_no_family_holds():
    base = dict(n_layers=1, d_model=64, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=64, seq_len=8)
    with pytest.raises(ConfigError, match="qk_norm and model.qkv_bias"):
        hf_config(ModelConfig(**base, qk_norm=True, qkv_bias=True), bos_id=None, eos_id=EOS, pad_id=PAD)
    scaled = ModelConfig(**base, rope_scaling_factor=2.0, rope_scaling=RopeScaling(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=4))
    with pytest.raises(ConfigError, match="rope_scaling_factor = 2.0"):
        hf_config(scaled, bos_id=None, eos_id=EOS, pad_id=PAD)
