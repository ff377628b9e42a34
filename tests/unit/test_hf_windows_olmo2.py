"""Sliding-window attention (Mistral 7B v0.1, Jiang et al. 2023; Qwen2 with ``use_sliding_window``) and OLMo 2
(Team OLMo, "2 OLMo 2 Furious", 2024: post-norm blocks, QK-norm over the whole q and k projections), as the decoder
represents them exactly. Tiny random models are built and saved by ``transformers`` itself; import gives their
logits (fp32, ≤ 1e-4) on probes longer than the window and their greedy continuations, and the export loads back
into the same architecture class with the same logits. Controls show the probes exercise each feature."""

from __future__ import annotations

import pytest
import torch
from transformers import (LlamaForCausalLM, MistralConfig, MistralForCausalLM, Olmo2Config,
                          Olmo2ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from infra.errors import ConfigError
from models.arithmetic import param_count
from models.config import ModelConfig
from models.decoder import Decoder, KVCache, sliding_window_mask
from models.hf import LOGIT_TOLERANCE, decoder_from_hf, hf_config, to_hf_model

from tests.unit.hf_random import EOS, PAD, check_against, compare, import_export_round_trip, saved_random  # noqa: E402
PROBE_LEN = 24  # three windows of 8
PROMPTS = [[5, 6, 7], list(range(10, 22))]  # the second prompt alone exceeds the window
COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=32, initializer_range=0.1, eos_token_id=EOS,
              pad_token_id=PAD, bos_token_id=None)

FAMILIES = {
    # Mistral 7B v0.1: a window (here 8) shorter than the context (32) in every layer
    "mistral-window-8": (MistralForCausalLM, lambda: MistralConfig(**COMMON, sliding_window=8,
                                                                   tie_word_embeddings=False)),
    # Qwen2 with use_sliding_window and max_window_layers = 0: every layer windowed (and q/k/v biases)
    "qwen2-window-8": (Qwen2ForCausalLM, lambda: Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=8,
                                                             max_window_layers=0, tie_word_embeddings=True)),
    # Qwen3 with every layer windowed: per-head QK-norm and a window together
    "qwen3-window-8": (Qwen3ForCausalLM, lambda: Qwen3Config(**COMMON, head_dim=16, use_sliding_window=True,
                                                             sliding_window=8, max_window_layers=0)),
    # OLMo 2: post-norm blocks, q/k norms of n_h·d_h = 64 and n_kv·d_h = 32 gains
    "olmo2": (Olmo2ForCausalLM, lambda: Olmo2Config(**COMMON, tie_word_embeddings=False, rms_norm_eps=1e-6)),
}
EXPECTED = {
    "mistral-window-8": dict(sliding_window=8, norm_placement="pre", qk_norm=False, qkv_bias=False),
    "qwen2-window-8": dict(sliding_window=8, norm_placement="pre", qk_norm=False, qkv_bias=True),
    "qwen3-window-8": dict(sliding_window=8, norm_placement="pre", qk_norm=True, qk_norm_scope="head",
                           qkv_bias=False),
    "olmo2": dict(sliding_window=None, norm_placement="post", qk_norm=True, qk_norm_scope="projection",
                  qkv_bias=False, norm_eps=1e-6),
}


_saved = saved_random


def _verify(ours: Decoder, theirs):
    return compare(ours, theirs, PROMPTS, PROBE_LEN)


def _check(ours: Decoder, theirs, label: str) -> float:
    return check_against(ours, theirs, label, PROMPTS, PROBE_LEN)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_import_and_export_match_transformers(name, tmp_path):
    model_cls, make = FAMILIES[name]
    ours, (_, back) = import_export_round_trip(model_cls, make(), EXPECTED[name], tmp_path, name, PROMPTS,
                                               PROBE_LEN)
    assert getattr(back.config, "sliding_window", None) == ours.cfg.sliding_window


@pytest.mark.parametrize("name, update", [
    ("mistral-window-8", {"sliding_window": None}),
    ("qwen2-window-8", {"sliding_window": None}),
    ("qwen3-window-8", {"sliding_window": None}),
    ("olmo2", {"norm_placement": "pre"}),
])
def test_control_the_probe_sees_the_feature(name, update, tmp_path):
    """The same weights without the window (OLMo 2: with pre-norm blocks) differ from transformers far beyond the
    tolerance: the probes do exercise the feature."""
    model_cls, make = FAMILIES[name]
    theirs = _saved(model_cls, make(), tmp_path)
    ours = decoder_from_hf(tmp_path)
    other = Decoder(ours.cfg.model_copy(update=update)).eval()
    other.load_state_dict(ours.state_dict())
    result = _verify(other, theirs)
    print(f"control {name} with {update}: max |logit diff| = {result.max_abs_logit_diff:.3g}")
    assert result.max_abs_logit_diff > 100 * LOGIT_TOLERANCE


def test_olmo2_qk_norm_is_over_the_whole_projection():
    cfg = ModelConfig(n_layers=1, d_model=64, n_heads=4, n_kv_heads=2, d_ff=32, vocab_size=64, seq_len=8,
                      qk_norm=True, qk_norm_scope="projection", norm_placement="post")
    attn = Decoder(cfg).blocks[0].attn
    assert attn.q_norm.weight.shape == (64,) and attn.k_norm.weight.shape == (32,)
    assert sum(p.numel() for p in Decoder(cfg).parameters()) == param_count(cfg).total
    assert cfg.model_dump()["qk_norm_scope"] == "projection" and cfg.model_dump()["norm_placement"] == "post"
    with pytest.raises(ConfigError, match="qk_norm_scope = 'projection' needs model.qk_norm"):
        ModelConfig(**{**cfg.model_dump(), "qk_norm": False})


def test_window_mask_convention():
    """p − w < s ≤ p: the last w keys including the query's own, as transformers' kv_idx > q_idx − w."""
    mask = sliding_window_mask(6, 0, 3, torch.device("cpu"))
    assert mask.sum(1).tolist() == [1, 2, 3, 3, 3, 3]
    assert mask[5].tolist() == [False, False, False, True, True, True]
    assert sliding_window_mask(4, 0, 1, torch.device("cpu")).equal(torch.eye(4, dtype=torch.bool))
    offset = sliding_window_mask(2, 4, 3, torch.device("cpu"))  # positions 4, 5 over keys 0..5
    assert offset.tolist() == [[False, False, True, True, True, False], [False, False, False, True, True, True]]


def _tiny(**kw) -> ModelConfig:
    return ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, vocab_size=64, seq_len=32, **kw)


def test_default_path_and_dump_unchanged():
    plain = _tiny()
    assert {"sliding_window", "norm_placement", "qk_norm_scope"}.isdisjoint(plain.model_dump())
    assert ModelConfig(**plain.model_dump(), sliding_window=None, norm_placement="pre",
                       qk_norm_scope="head").model_dump() == plain.model_dump()
    torch.manual_seed(0)
    base = Decoder(plain).eval()
    wide = Decoder(_tiny(sliding_window=32)).eval()  # a window covering every position never masks
    wide.load_state_dict(base.state_dict())
    idx = torch.randint(0, 64, (2, 32))
    with torch.no_grad():
        assert torch.equal(base(idx), wide(idx))
    with pytest.raises(ConfigError, match="sliding_window = 0"):
        _tiny(sliding_window=0)


@torch.no_grad()
def test_windowed_cache_matches_the_uncached_forward():
    torch.manual_seed(0)
    model = Decoder(_tiny(sliding_window=5)).eval()
    idx = torch.randint(0, 64, (2, 20))
    full = model(idx)
    cache = KVCache(model.cfg)
    parts = [model(idx[:, :7], cache=cache), model(idx[:, 7:10], cache=cache)]
    parts += [model(idx[:, t:t + 1], cache=cache) for t in range(10, 20)]
    assert (torch.cat(parts, dim=1) - full).abs().max() < 1e-5
    with torch.no_grad():  # the window does change the logits
        unwindowed = Decoder(_tiny()).eval()
        unwindowed.load_state_dict(model.state_dict())
        assert (unwindowed(idx) - full).abs().max() > 1e-2


@torch.no_grad()
def test_document_mask_and_window_combine():
    torch.manual_seed(0)
    model = Decoder(_tiny(sliding_window=4)).eval()
    idx = torch.randint(0, 64, (1, 16))
    doc_ids = torch.tensor([[0] * 6 + [1] * 10])
    packed = model(idx, doc_ids)
    assert (packed[:, :6] - model(idx[:, :6])).abs().max() < 1e-5
    assert (packed[:, 6:] - model(idx[:, 6:])).abs().max() < 1e-5


def test_export_architecture_for_a_window():
    """A windowed Llama-shaped model exports as Mistral (LlamaConfig has no window); Qwen2 keeps every layer
    windowed; what no family holds is refused with the field named."""
    window = hf_config(_tiny(sliding_window=8), bos_id=None, eos_id=EOS, pad_id=PAD)
    assert window.model_type == "mistral" and window.sliding_window == 8
    assert hf_config(_tiny(), bos_id=None, eos_id=EOS, pad_id=PAD).model_type == "llama"
    assert isinstance(to_hf_model(Decoder(_tiny()), bos_id=None, eos_id=EOS, pad_id=PAD), LlamaForCausalLM)
    qwen = hf_config(_tiny(sliding_window=8, qkv_bias=True), bos_id=None, eos_id=EOS, pad_id=PAD)
    assert qwen.layer_types == ["sliding_attention"] * 2 and qwen.sliding_window == 8
    olmo = dict(qk_norm=True, qk_norm_scope="projection", norm_placement="post")
    with pytest.raises(ConfigError, match="sliding_window = 8"):
        hf_config(_tiny(sliding_window=8, **olmo), bos_id=None, eos_id=EOS, pad_id=PAD)
    with pytest.raises(ConfigError, match="norm_placement = 'post'"):
        hf_config(_tiny(norm_placement="post"), bos_id=None, eos_id=EOS, pad_id=PAD)
    with pytest.raises(ConfigError, match="norm_placement = 'post' with qk_norm = True, qk_norm_scope = 'head'"):
        hf_config(_tiny(norm_placement="post", qk_norm=True), bos_id=None, eos_id=EOS, pad_id=PAD)
    with pytest.raises(ConfigError, match="qk_norm_scope = 'projection' with norm_placement = 'pre'"):
        hf_config(_tiny(qk_norm=True, qk_norm_scope="projection"), bos_id=None, eos_id=EOS, pad_id=PAD)


def test_import_refuses_a_window_in_some_layers_only(tmp_path):
    Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=8, max_window_layers=1).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"max_window_layers = 1: only layers \[1\] of 2 are windowed"):
        decoder_from_hf(tmp_path)
