"""The decoder against the ``transformers`` implementations: export (Llama, Qwen3) and import (Llama, Mistral,
Qwen3) give the same logits (fp32, ≤ 1e-4) and the same greedy continuations; a wrong mapping is caught; an
architecture the decoder cannot represent is refused with the field named."""

from __future__ import annotations

import pytest
import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen3Config, Qwen3ForCausalLM)

from infra.errors import ConfigError, DataError
from models.config import ModelConfig
from models.decoder import Decoder
from models.hf import (LOGIT_TOLERANCE, decoder_from_hf, hf_config, probe_ids, to_hf_model, to_hf_state_dict,
                       verify)

EOS, PAD = 0, 1
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13]]


def tiny(**kw) -> ModelConfig:
    # init_std 0.1: logits spread enough that greedy argmax never rests on a near tie
    base = dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, vocab_size=128, seq_len=32, init_std=0.1)
    return ModelConfig(**{**base, **kw})


def _decoder(cfg: ModelConfig, seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    model = Decoder(cfg).eval()
    with torch.no_grad():  # norm gains away from 1, so a gain mapped to the wrong place shows
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    return model


def _check(ours: Decoder, theirs, label: str) -> float:
    result = verify(ours, theirs, probe_ids(ours.cfg.vocab_size, ours.cfg.seq_len), prompts=PROMPTS,
                    max_new_tokens=8, eos_id=EOS, pad_id=PAD)
    print(f"{label}: max |logit diff| = {result.max_abs_logit_diff:.3g}; greedy equal = {result.greedy_equal}")
    assert result.max_abs_logit_diff <= LOGIT_TOLERANCE, result.describe()
    assert result.greedy_equal, result.describe()
    assert result.passed
    assert any(len(c) > 1 for c in result.ours)  # the continuations really were compared
    return result.max_abs_logit_diff


SHAPES = {
    "mha-tied": tiny(n_kv_heads=4),
    "gqa-untied": tiny(tied_embeddings=False),
    "gqa-tied-qknorm": tiny(qk_norm=True),
    "mqa-untied-qknorm": tiny(n_kv_heads=1, qk_norm=True, tied_embeddings=False, rope_theta=500000.0, norm_eps=1e-6),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_export_in_memory_matches_transformers(name):
    cfg = SHAPES[name]
    ours = _decoder(cfg)
    theirs = to_hf_model(ours, bos_id=None, eos_id=EOS, pad_id=PAD)
    assert isinstance(theirs, Qwen3ForCausalLM if cfg.qk_norm else LlamaForCausalLM)
    assert not theirs.training and next(theirs.parameters()).dtype == torch.float32
    _check(ours, theirs, f"export {name}")


def test_hf_config_fields():
    llama = hf_config(tiny(tied_embeddings=False, norm_eps=1e-6, rope_theta=5e5), bos_id=None, eos_id=EOS, pad_id=PAD)
    assert (llama.model_type, llama.vocab_size, llama.head_dim, llama.max_position_embeddings) == ("llama", 128, 16, 32)
    assert (llama.num_key_value_heads, llama.intermediate_size, llama.rms_norm_eps) == (2, 96, 1e-6)
    assert llama.rope_parameters == {"rope_type": "default", "rope_theta": 5e5}
    assert "factor" not in llama.to_dict()["rope_parameters"]
    scaled = hf_config(tiny(rope_scaling_factor=2.0), bos_id=None, eos_id=EOS, pad_id=PAD)
    assert scaled.rope_parameters == {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert scaled.max_position_embeddings == 32
    assert (llama.tie_word_embeddings, llama.attention_bias, llama.mlp_bias) == (False, False, False)
    assert (llama.bos_token_id, llama.eos_token_id, llama.pad_token_id, llama.dtype) == (None, EOS, PAD, torch.float32)
    qwen = hf_config(tiny(qk_norm=True), bos_id=2, eos_id=EOS, pad_id=None)
    assert (qwen.model_type, qwen.head_dim, qwen.sliding_window, qwen.tie_word_embeddings) == ("qwen3", 16, None, True)
    assert qwen.layer_types == ["full_attention"] * 2 and qwen.bos_token_id == 2


def test_hf_config_refuses_an_id_outside_the_vocabulary():
    with pytest.raises(ConfigError, match="eos_id = 128"):
        hf_config(tiny(), bos_id=None, eos_id=128, pad_id=None)


def test_state_dict_names_and_tying():
    tied, untied = to_hf_state_dict(_decoder(tiny())), to_hf_state_dict(_decoder(tiny(tied_embeddings=False)))
    assert "lm_head.weight" not in tied and "lm_head.weight" in untied
    assert "model.layers.1.self_attn.k_proj.weight" in tied and "model.layers.0.self_attn.q_norm.weight" not in tied
    assert "model.layers.0.self_attn.q_norm.weight" in to_hf_state_dict(_decoder(tiny(qk_norm=True)))


@pytest.mark.parametrize("name", ["gqa-untied", "gqa-tied-qknorm"])
def test_export_saved_and_imported_back_is_the_same_model(name, tmp_path):
    ours = _decoder(SHAPES[name])
    to_hf_model(ours, bos_id=None, eos_id=EOS, pad_id=PAD).save_pretrained(tmp_path)
    back = decoder_from_hf(tmp_path)
    assert back.cfg == ours.cfg
    for key, value in ours.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key
    _check(back, AutoModelForCausalLM.from_pretrained(tmp_path), f"export→save→import {name}")


# ---------------------------------------------------------------------------------------------------------- import


def _saved(model_cls, config, folder, **save) -> torch.nn.Module:
    torch.manual_seed(1)
    model = model_cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder, **save)
    return model


SMALL = dict(vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=32, initializer_range=0.1, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=None)

IMPORTS = {
    "llama-gqa-untied": (LlamaForCausalLM, lambda: LlamaConfig(
        **SMALL, num_key_value_heads=2, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 5e5})),
    "llama-mha-tied": (LlamaForCausalLM, lambda: LlamaConfig(**SMALL, num_key_value_heads=4, tie_word_embeddings=True,
                                                             rms_norm_eps=1e-5)),
    "mistral-no-window": (MistralForCausalLM,
                          lambda: MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=None)),
    "mistral-window-covers-positions": (MistralForCausalLM,
                                        lambda: MistralConfig(**SMALL, num_key_value_heads=1, sliding_window=32)),
    "qwen3-gqa-tied": (Qwen3ForCausalLM, lambda: Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=16,
                                                             tie_word_embeddings=True)),
    "qwen3-mha-untied": (Qwen3ForCausalLM, lambda: Qwen3Config(**SMALL, num_key_value_heads=4, head_dim=16,
                                                               tie_word_embeddings=False)),
    # linear position interpolation (Chen et al. 2023), in the current and the legacy spelling
    "llama-linear-rope": (LlamaForCausalLM, lambda: LlamaConfig(
        **SMALL, num_key_value_heads=2, rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5})),
    "qwen3-legacy-rope-scaling": (Qwen3ForCausalLM, lambda: Qwen3Config(
        **SMALL, num_key_value_heads=2, head_dim=16, rope_scaling={"type": "linear", "factor": 2.5})),
}
SCALING = {"llama-linear-rope": 4.0, "qwen3-legacy-rope-scaling": 2.5}


@pytest.mark.parametrize("name", list(IMPORTS))
def test_import_matches_transformers(name, tmp_path):
    model_cls, make = IMPORTS[name]
    theirs = _saved(model_cls, make(), tmp_path)
    ours = decoder_from_hf(tmp_path)
    assert ours.cfg.qk_norm == name.startswith("qwen3")
    assert ours.cfg.tied_embeddings == theirs.config.tie_word_embeddings
    assert ours.cfg.seq_len == 32 and ours.cfg.init_std == 0.1
    assert ours.cfg.rope_scaling_factor == SCALING.get(name, 1.0)
    _check(ours, theirs, f"import {name}")


def test_import_reads_sharded_weights(tmp_path):
    theirs = _saved(LlamaForCausalLM, LlamaConfig(**SMALL, num_key_value_heads=2, tie_word_embeddings=False),
                    tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (tmp_path / "model.safetensors").exists()
    _check(decoder_from_hf(tmp_path), theirs, "import llama sharded")


def test_import_reads_bf16_weights_as_fp32(tmp_path):
    torch.manual_seed(1)
    theirs = LlamaForCausalLM(LlamaConfig(**SMALL, num_key_value_heads=2)).to(torch.bfloat16)
    theirs.save_pretrained(tmp_path)
    ours = decoder_from_hf(tmp_path)
    assert next(ours.parameters()).dtype == torch.float32
    # reloaded in fp32 rather than theirs.float(): .to(bfloat16) also rounded the RoPE inv_freq buffer
    _check(ours, AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32), "import llama bf16 weights")


# ------------------------------------------------------------------------------------------------- negative controls


def _hf_from(ours: Decoder, config, state) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.load_state_dict(state, strict=False)
    return model


def _fails(ours: Decoder, theirs, label: str) -> None:
    result = verify(ours, theirs, probe_ids(ours.cfg.vocab_size, ours.cfg.seq_len), prompts=PROMPTS,
                    max_new_tokens=8, eos_id=EOS, pad_id=PAD)
    print(f"{label}: max |logit diff| = {result.max_abs_logit_diff:.3g}; greedy equal = {result.greedy_equal}")
    assert result.max_abs_logit_diff > LOGIT_TOLERANCE
    assert not result.passed


@pytest.mark.parametrize("name", ["gqa-untied", "gqa-tied-qknorm"])
def test_control_interleaved_rope_layout_is_caught(name):
    """q/k rows permuted from rotate-half to the interleaved (Meta) layout: RoPE then rotates the wrong pairs."""
    ours = _decoder(SHAPES[name])
    cfg, state = ours.cfg, to_hf_state_dict(ours)
    for key in list(state):
        if key.endswith(("q_proj.weight", "k_proj.weight")):
            w = state[key]
            heads = w.shape[0] // cfg.head_dim
            state[key] = w.view(heads, cfg.head_dim // 2, 2, -1).transpose(1, 2).reshape(w.shape).contiguous()
    _fails(ours, _hf_from(ours, hf_config(cfg, bos_id=None, eos_id=EOS, pad_id=PAD), state), f"control rope {name}")


def test_control_wrong_eps_is_caught():
    ours = _decoder(tiny(norm_eps=1e-5, init_std=0.02))
    config = hf_config(ours.cfg, bos_id=None, eos_id=EOS, pad_id=PAD)
    config.rms_norm_eps = 1e-6  # the transformers default, not the model's
    _fails(ours, _hf_from(ours, config, to_hf_state_dict(ours)), "control eps 1e-6 for 1e-5")


def test_control_untied_head_exported_as_tied_is_caught():
    ours = _decoder(tiny(tied_embeddings=False))
    config = hf_config(ours.cfg, bos_id=None, eos_id=EOS, pad_id=PAD)
    config.tie_word_embeddings = True
    state = {k: v for k, v in to_hf_state_dict(ours).items() if k != "lm_head.weight"}
    _fails(ours, _hf_from(ours, config, state), "control untied head dropped")


# --------------------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("config, field", [
    (Qwen2Config(**SMALL, num_key_value_heads=2, use_sliding_window=True, sliding_window=8, max_window_layers=1),
     "max_window_layers = 1"),
    (LlamaConfig(**SMALL, rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "rope_scaling"),
    (LlamaConfig(**SMALL, rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0,
                                           "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}), "'longrope'"),
    (LlamaConfig(**SMALL, rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 0.5}),
     "factor.*0.5"),
    (LlamaConfig(**SMALL, rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 16, "partial_rotary_factor": 0.5}),
     "partial_rotary_factor"),
    (LlamaConfig(**SMALL, attention_bias=True), "attention_bias"),
    (LlamaConfig(**SMALL, mlp_bias=True), "mlp_bias"),
    (LlamaConfig(**SMALL, hidden_act="gelu"), "hidden_act"),
    (Qwen2Config(**SMALL, num_key_value_heads=2, hidden_act="gelu"), "hidden_act"),
    (Qwen3Config(**SMALL, head_dim=16, attention_bias=True), "attention_bias"),
    (Qwen3Config(**SMALL, head_dim=16, use_sliding_window=True, sliding_window=8, max_window_layers=1),
     "max_window_layers = 1"),
])
def test_import_refuses_what_the_decoder_cannot_represent(config, field, tmp_path):
    config.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=field):
        decoder_from_hf(tmp_path)


def test_import_refuses_an_unknown_family(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "mixtral"}')
    with pytest.raises(ConfigError, match="model_type = 'mixtral'"):
        decoder_from_hf(tmp_path)


def test_import_refuses_a_stray_bias_tensor(tmp_path):
    _saved(LlamaForCausalLM, LlamaConfig(**SMALL, num_key_value_heads=2), tmp_path)
    import safetensors.torch

    weights = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    weights["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    safetensors.torch.save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="q_proj.bias"):
        decoder_from_hf(tmp_path)


def test_import_names_a_missing_untied_head(tmp_path):
    _saved(LlamaForCausalLM, LlamaConfig(**SMALL, num_key_value_heads=2, tie_word_embeddings=False), tmp_path)
    import safetensors.torch

    weights = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    del weights["lm_head.weight"]
    safetensors.torch.save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(DataError, match="lm_head.weight is missing"):
        decoder_from_hf(tmp_path)


def test_import_needs_safetensors(tmp_path):
    LlamaConfig(**SMALL).save_pretrained(tmp_path)
    with pytest.raises(DataError, match="no model.safetensors"):
        decoder_from_hf(tmp_path)
