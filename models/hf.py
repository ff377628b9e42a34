"""The decoder to and from the Hugging Face ``transformers`` layout (docs/methods.md §2, "Hugging Face layout").

Export targets the family whose shape the model has: ``LlamaForCausalLM`` (no QK-norm, no biases, no window),
``MistralForCausalLM`` (the Llama shape with a ``sliding_window``: Jiang et al. 2023), ``Olmo2ForCausalLM``
(``norm_placement = "post"`` with QK-norm over the whole projections: Team OLMo, "2 OLMo 2 Furious", 2024),
``Qwen3ForCausalLM`` (QK-norm: Qwen3's ``q_norm``/``k_norm`` are RMSNorms over each head's d_h features applied
before RoPE, as here) or ``Qwen2ForCausalLM`` (q/k/v biases, none on o, as ``Qwen2Attention`` builds them). All three
take an explicit ``head_dim`` (d_h ≠ d / n_h, e.g. Qwen3 0.6B–8B); Qwen2 and Qwen3 carry a window in every layer
(``use_sliding_window``, ``max_window_layers = 0``). All use the rotate-half RoPE layout this decoder
uses, so q/k weights are copied as they are, without the interleaved → rotate-half permutation a Meta-layout
checkpoint needs. Import reads local Llama, Mistral, Qwen2, Qwen3 and OLMo 2 folders and refuses, naming the field, every
architecture the decoder cannot represent exactly; nothing is converted approximately.

RoPE: the default type carries θ alone; linear position interpolation (Chen et al. 2023; docs/methods.md §15) is
``rope_type = "linear"`` with ``factor`` s = ``rope_scaling_factor``. ``transformers`` divides every inverse frequency
by s, which turns position m by (m / s)·θ^(−2i/d_h), the angle this decoder gives it. ``rope_type = "llama3"``
(Meta's Llama 3 / 3.1 frequency bands) and ``"yarn"`` (Peng et al. 2023, Qwen2.5 long context) map to
``ModelConfig.rope_scaling`` (``models.config.RopeScaling``), computed by ``models.decoder.scaled_inv_freq`` as
transformers' ``_compute_llama3_parameters`` / ``_compute_yarn_parameters`` do. Dynamic NTK and LongRoPE change
with the sequence length or per dimension from tables and are refused.

Tensor names, ours → theirs (``i`` a block index)::

    tok_embeddings.weight          model.embed_tokens.weight
    blocks.i.attn_norm.weight      model.layers.i.input_layernorm.weight
    blocks.i.attn.w{q,k,v,o}       model.layers.i.self_attn.{q,k,v,o}_proj.weight
    blocks.i.attn.w{q,k,v}.bias    model.layers.i.self_attn.{q,k,v}_proj.bias      (qkv_bias only)
    blocks.i.attn.{q,k}_norm       model.layers.i.self_attn.{q,k}_norm.weight      (QK-norm only)
    blocks.i.ffn_norm.weight       model.layers.i.post_attention_layernorm.weight
    blocks.i.ffn.w_{gate,up,down}  model.layers.i.mlp.{gate,up,down}_proj.weight
    norm.weight                    model.norm.weight

With ``norm_placement = "post"`` (OLMo 2) the two block norms sit on the branch outputs: ``attn_norm`` is
``post_attention_layernorm`` and ``ffn_norm`` is ``post_feedforward_layernorm`` (there is no ``input_layernorm``);
OLMo 2's ``q_norm``/``k_norm`` have n_h·d_h and n_kv·d_h gains under the same names as Qwen3's.
    lm_head.weight                 lm_head.weight                                   (untied only)

``verify`` compares one model of each kind on the same token ids: the largest absolute logit difference (fp32)
and greedy continuations, token for token.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from infra.errors import ConfigError, DataError
from models.config import ModelConfig, RopeScaling
from models.decoder import Decoder

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

LOGIT_TOLERANCE = 1e-4  # max |logit difference| in fp32 that counts as the same model
IMPORTABLE = ("llama", "mistral", "qwen2", "qwen3", "olmo2")

# ModelConfig fields the mapping carries; any other field must sit at its default, or the export is refused.
_MAPPED = {"n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "seq_len", "tied_embeddings",
           "qk_norm", "rope_theta", "rope_scaling_factor", "init_std", "norm_eps", "head_dim", "qkv_bias",
           "rope_scaling", "sliding_window", "norm_placement", "qk_norm_scope"}
_BLOCK = (("attn_norm.weight", "input_layernorm.weight"), ("attn.wq.weight", "self_attn.q_proj.weight"),
          ("attn.wk.weight", "self_attn.k_proj.weight"), ("attn.wv.weight", "self_attn.v_proj.weight"),
          ("attn.wo.weight", "self_attn.o_proj.weight"), ("attn.q_norm.weight", "self_attn.q_norm.weight"),
          ("attn.k_norm.weight", "self_attn.k_norm.weight"), ("ffn_norm.weight", "post_attention_layernorm.weight"),
          ("ffn.w_gate.weight", "mlp.gate_proj.weight"), ("ffn.w_up.weight", "mlp.up_proj.weight"),
          ("ffn.w_down.weight", "mlp.down_proj.weight"), ("attn.wq.bias", "self_attn.q_proj.bias"),
          ("attn.wk.bias", "self_attn.k_proj.bias"), ("attn.wv.bias", "self_attn.v_proj.bias"))


def _name_map(cfg: ModelConfig) -> dict[str, str]:
    """Our parameter name → the ``transformers`` name, for every parameter of a ``Decoder(cfg)``."""
    names = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    post = {"attn_norm.weight": "post_attention_layernorm.weight",
            "ffn_norm.weight": "post_feedforward_layernorm.weight"} if cfg.norm_placement == "post" else {}
    for i in range(cfg.n_layers):
        for ours, theirs in _BLOCK:
            theirs = post.get(ours, theirs)
            if ours.startswith(("attn.q_norm", "attn.k_norm")) and not cfg.qk_norm:
                continue
            if ours.endswith(".bias") and not cfg.qkv_bias:
                continue
            names[f"blocks.{i}.{ours}"] = f"model.layers.{i}.{theirs}"
    if not cfg.tied_embeddings:
        names["lm_head.weight"] = "lm_head.weight"
    return names


def hf_config(cfg: ModelConfig, *, bos_id: int | None, eos_id: int, pad_id: int | None) -> PretrainedConfig:
    """The ``transformers`` config of a decoder of shape ``cfg``: ``Olmo2Config`` with post-norm and QK-norm over the
    projections, ``Qwen3Config`` with per-head QK-norm, ``Qwen2Config`` with q/k/v biases, ``MistralConfig`` with
    neither but a ``sliding_window``, ``LlamaConfig`` otherwise (docs/methods.md §2). A window is written as
    Mistral's ``sliding_window``, or Qwen2/Qwen3's ``use_sliding_window`` with ``max_window_layers = 0`` (every layer
    windowed).

    ``vocab_size`` is the model's embedding rows (the padded vocabulary, docs/methods.md §8);
    ``max_position_embeddings`` is ``cfg.seq_len`` (the extended window of an interpolated model); ``rope_parameters``
    is :func:`hf_rope_parameters`; ``head_dim`` is d_h; dtype float32.

    Args:
        bos_id, eos_id, pad_id: special token ids (``None``: the tokenizer has no such token).

    Raises:
        ConfigError: a ModelConfig field outside the mapping is not at its default, both QK-norm and q/k/v biases
            (no family has both), post-norm without QK-norm over the projections (or the reverse), OLMo 2 with
            biases or a window, linear interpolation on top of Llama 3 / YaRN scaling, or a token id lies outside
            [0, vocab_size); the message names the field.
    """
    from transformers import LlamaConfig, MistralConfig, Olmo2Config, Qwen2Config, Qwen3Config

    for name, info in type(cfg).model_fields.items():
        if name not in _MAPPED and getattr(cfg, name) != info.default:
            raise ConfigError(f"model.{name} = {getattr(cfg, name)!r} has no counterpart in the Hugging Face "
                              "Llama/Qwen3 configs; the model cannot be exported exactly")
    if cfg.qk_norm and cfg.qkv_bias:
        raise ConfigError("model.qk_norm and model.qkv_bias are both set: Qwen3 has QK-norm without q/k/v biases, "
                          "Qwen2 the biases without QK-norm, Llama neither; the model cannot be exported exactly")
    olmo2 = cfg.norm_placement == "post" or cfg.qk_norm_scope == "projection"
    if cfg.norm_placement == "post" and not (cfg.qk_norm and cfg.qk_norm_scope == "projection"):
        raise ConfigError(f"model.norm_placement = 'post' with qk_norm = {cfg.qk_norm}, qk_norm_scope = "
                          f"{cfg.qk_norm_scope!r}: OLMo 2, the one family with post-norm blocks, also normalises the "
                          "whole q and k projections; the model cannot be exported exactly")
    if olmo2 and cfg.norm_placement != "post":
        raise ConfigError("model.qk_norm_scope = 'projection' with norm_placement = 'pre': OLMo 2, the one family "
                          "with QK-norm over the projections, has post-norm blocks; the model cannot be exported "
                          "exactly")
    if olmo2 and (cfg.qkv_bias or cfg.sliding_window is not None):
        name = "qkv_bias" if cfg.qkv_bias else "sliding_window"
        raise ConfigError(f"model.{name} = {getattr(cfg, name)!r}: OLMo 2 has neither q/k/v biases nor a sliding "
                          "window; the model cannot be exported exactly")
    if olmo2 and cfg.head_dim * cfg.n_heads != cfg.d_model:
        raise ConfigError(f"model.head_dim = {cfg.head_dim}: Olmo2Config has no head_dim (it is d_model / n_heads); "
                          "the model cannot be exported exactly")
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
        if value is not None and not 0 <= value < cfg.vocab_size:
            raise ConfigError(f"{name} = {value} lies outside the model's vocabulary [0, {cfg.vocab_size})")
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
                  num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
                  head_dim=cfg.head_dim, hidden_act="silu", max_position_embeddings=cfg.seq_len,
                  initializer_range=cfg.init_std, rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tied_embeddings,
                  rope_parameters=hf_rope_parameters(cfg),
                  attention_dropout=0.0, bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id,
                  dtype="float32")
    window = cfg.sliding_window
    qwen_window = dict(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.n_layers,
                       layer_types=["full_attention"] * cfg.n_layers)
    if window is not None:  # every layer windowed: max_window_layers = 0
        qwen_window = dict(use_sliding_window=True, sliding_window=window, max_window_layers=0,
                           layer_types=["sliding_attention"] * cfg.n_layers)
    if cfg.qkv_bias:  # Qwen2Attention: bias on q/k/v always, never on o
        return Qwen2Config(**common, **qwen_window)
    common["attention_bias"] = False
    if olmo2:
        return Olmo2Config(**common)
    if cfg.qk_norm:
        return Qwen3Config(**common, **qwen_window)
    if window is not None:
        return MistralConfig(**common, sliding_window=window)
    return LlamaConfig(**common, mlp_bias=False, pretraining_tp=1)


def hf_rope_parameters(cfg: ModelConfig) -> dict[str, Any]:
    """``rope_parameters`` of ``cfg`` in the ``transformers`` format (module docstring; docs/methods.md §15).

    ``{"rope_type": "default", "rope_theta": θ}`` at ``rope_scaling_factor`` s = 1, else
    ``{"rope_type": "linear", "factor": s, "rope_theta": θ}``: ``transformers`` divides the inverse frequencies by
    ``factor``, i.e. rotates position m as m / s (Chen et al. 2023). With ``cfg.rope_scaling`` (Llama 3 or YaRN):
    ``{"rope_type": "llama3" | "yarn", "rope_theta": θ, "factor", "original_max_position_embeddings", ...}`` with the
    type's own parameters (those left at None are left out, so ``transformers`` applies the same defaults).

    Raises:
        ConfigError: ``rope_scaling`` together with ``rope_scaling_factor`` ≠ 1 (one ``rope_type`` cannot say both).
    """
    if cfg.rope_scaling is not None:
        if cfg.rope_scaling_factor != 1.0:
            raise ConfigError(f"model.rope_scaling_factor = {cfg.rope_scaling_factor} on top of rope_scaling "
                              f"{cfg.rope_scaling.rope_type!r}: Hugging Face has one rope_type per model; the "
                              "model cannot be exported exactly")
        params = {k: v for k, v in cfg.rope_scaling.model_dump().items() if v is not None}
        if params.get("truncate") is True:
            params.pop("truncate")  # transformers' default
        for name in ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "attention_factor"):
            if name in params:
                params[name] = float(params[name])
        return {**params, "rope_theta": float(cfg.rope_theta)}
    if cfg.rope_scaling_factor == 1.0:
        return {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
    return {"rope_type": "linear", "factor": float(cfg.rope_scaling_factor), "rope_theta": float(cfg.rope_theta)}


def to_hf_state_dict(model: Decoder) -> dict[str, torch.Tensor]:
    """``model``'s weights under the ``transformers`` names (module docstring), fp32 on the CPU, contiguous. A tied
    model has no ``lm_head.weight`` (``transformers`` ties it to ``model.embed_tokens.weight``)."""
    ours = model.state_dict()
    return {theirs: ours[name].detach().to(device="cpu", dtype=torch.float32).contiguous()
            for name, theirs in _name_map(model.cfg).items()}


def to_hf_model(model: Decoder, *, bos_id: int | None, eos_id: int, pad_id: int | None) -> PreTrainedModel:
    """``model`` as a ``LlamaForCausalLM`` / ``MistralForCausalLM`` / ``Qwen3ForCausalLM`` / ``Qwen2ForCausalLM`` /
    ``Olmo2ForCausalLM`` (:func:`hf_config`) in
    memory: fp32, CPU, eval mode.

    Raises:
        ConfigError: as :func:`hf_config`.
    """
    from transformers import AutoModelForCausalLM

    config = hf_config(model.cfg, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _load_exact(hf, to_hf_state_dict(model), tied=model.cfg.tied_embeddings)
    return hf.eval()


def _load_exact(hf: torch.nn.Module, state: dict[str, torch.Tensor], *, tied: bool) -> None:
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [name for name in missing if not (tied and name == "lm_head.weight")]
    if missing or unexpected:  # a mapping fault, not a user error
        raise RuntimeError(f"transformers model does not take the mapped weights: missing {missing}, "
                           f"unexpected {unexpected}")


# --------------------------------------------------------------------------------------------------------- import


def _refuse(what: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{what} = {value!r}: {why}; the decoder cannot represent this model exactly")


def model_config_from_hf(config: PretrainedConfig) -> ModelConfig:
    """The ``ModelConfig`` that represents a Llama / Mistral / Qwen2 / Qwen3 / OLMo 2 ``transformers`` config exactly.

    Mapping: hidden_size → d_model, intermediate_size → d_ff, num_attention_heads / num_key_value_heads →
    n_heads / n_kv_heads, head_dim → head_dim (None when it equals hidden_size / num_attention_heads), Qwen2 →
    qkv_bias, Qwen3 → qk_norm, OLMo 2 → qk_norm with qk_norm_scope "projection" and norm_placement "post",
    Mistral's ``sliding_window`` (Qwen2/Qwen3: ``sliding_window`` where ``use_sliding_window`` makes every layer
    windowed) → sliding_window when shorter than max_position_embeddings (None otherwise: the band then never
    masks anything), vocab_size (the embedding rows), tie_word_embeddings, rope_parameters.rope_theta →
    rope_theta, rope_parameters.factor of ``rope_type = "linear"`` → rope_scaling_factor (linear position
    interpolation, Chen et al. 2023; default type: 1), ``rope_type = "llama3"`` / ``"yarn"`` with their parameters →
    rope_scaling (``models.config.RopeScaling``; a YaRN factor left out is max_position_embeddings /
    original_max_position_embeddings, and mscale / mscale_all_dim become the attention_factor transformers derives
    from them), rms_norm_eps → norm_eps (also the QK-norm eps),
    initializer_range → init_std, max_position_embeddings → seq_len (kept as it is: the RoPE tables then hold
    seq_len × d_h floats each, and training at that length is the caller's choice). A legacy ``rope_scaling`` entry
    is read the same way (``transformers`` standardises it into ``rope_parameters``).

    Raises:
        ConfigError: naming the first field that differs from this decoder: model_type, ``attention_bias`` (Llama
            and Qwen3 then bias o_proj too), ``mlp_bias``, ``hidden_act`` other than silu, an odd ``head_dim``, a
            rope type other than default, linear, llama3 or yarn (``rope_scaling``: dynamic NTK, LongRoPE ... change
            the frequencies in ways the decoder does not), a linear factor below 1, a llama3 / yarn parameter
            missing or out of range, a partial rotary factor, RoPE parameters per layer type, a window in some layers
            only (``max_window_layers`` / ``layer_types``), experts (MoE).
    """
    kind = getattr(config, "model_type", None)
    if kind not in IMPORTABLE:
        raise _refuse("model_type", kind, f"only {', '.join(IMPORTABLE)} folders are read")
    for name in ("attention_bias", "mlp_bias"):
        if getattr(config, name, False):
            raise _refuse(name, True, "the decoder's only biases are Qwen2's q/k/v biases (none on o_proj or the FFN)")
    for name in ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size"):
        if getattr(config, name, None):
            raise _refuse(name, getattr(config, name), "a mixture of experts; the decoder has one dense FFN per block")
    if config.hidden_act != "silu":
        raise _refuse("hidden_act", config.hidden_act, "the FFN is SwiGLU (SiLU gate)")
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None and config.hidden_size % heads:
        raise _refuse("head_dim", head_dim, f"no head_dim and hidden_size / num_attention_heads = "
                      f"{config.hidden_size} / {heads} is not whole")
    if head_dim is not None and (isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2
                                 or head_dim % 2):
        raise _refuse("head_dim", head_dim, "RoPE needs a positive even head width")
    if head_dim == config.hidden_size // heads and config.hidden_size % heads == 0:
        head_dim = None  # the default: the config dumps as before
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if any(isinstance(v, dict) for v in rope.values()):
        raise _refuse("rope_parameters", rope, "RoPE differs by layer type; the decoder has one RoPE")
    rope_type = rope.get("rope_type", rope.get("type", "default"))  # "type": the legacy rope_scaling key
    if rope_type not in ("default", "linear", "llama3", "yarn"):
        raise _refuse("rope_scaling (rope_parameters.rope_type)", rope_type,
                      "only the default RoPE, linear position interpolation ('linear'), Llama 3 ('llama3') and YaRN "
                      "('yarn') are implemented")
    scaling = _rope_scaling_from_hf(rope, rope_type, config.max_position_embeddings)
    factor = rope.get("factor") if rope_type == "linear" else 1.0
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1.0:
        raise _refuse("rope_scaling (rope_parameters.factor)", factor,
                      "linear position interpolation needs a number factor >= 1")
    if rope.get("partial_rotary_factor") not in (None, 1.0):
        raise _refuse("partial_rotary_factor", rope["partial_rotary_factor"], "RoPE rotates every head dimension")
    positions = config.max_position_embeddings
    layer_types = list(getattr(config, "layer_types", None) or [])
    window = getattr(config, "sliding_window", None)
    if set(layer_types) - {"full_attention", "sliding_attention"}:
        raise _refuse("layer_types", sorted(set(layer_types)), "every layer must be full or sliding-window causal "
                      "attention")
    if kind == "mistral":
        windowed = "full_attention" not in layer_types
    else:
        windowed = "sliding_attention" in layer_types
        if windowed and "full_attention" in layer_types:
            where = "max_window_layers" if kind in ("qwen2", "qwen3") else "layer_types"
            raise _refuse(where, getattr(config, where, layer_types),
                          f"only layers {[i for i, t in enumerate(layer_types) if t == 'sliding_attention']} of "
                          f"{len(layer_types)} are windowed; the decoder windows every layer or none")
    if windowed and window is not None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise _refuse("sliding_window", window, "a window must be a positive number of positions")
    sliding_window = window if windowed and window is not None and window < positions else None
    olmo2 = kind == "olmo2"
    return ModelConfig(n_layers=config.num_hidden_layers, d_model=config.hidden_size, n_heads=heads,
                       n_kv_heads=config.num_key_value_heads or heads, d_ff=config.intermediate_size,
                       vocab_size=config.vocab_size, seq_len=positions,
                       tied_embeddings=bool(config.tie_word_embeddings), head_dim=head_dim,
                       qkv_bias=kind == "qwen2", qk_norm=kind in ("qwen3", "olmo2"),
                       qk_norm_scope="projection" if olmo2 else "head",
                       norm_placement="post" if olmo2 else "pre", sliding_window=sliding_window,
                       rope_theta=float(rope.get("rope_theta", 10000.0)), rope_scaling_factor=float(factor),
                       rope_scaling=scaling,
                       init_std=float(config.initializer_range),
                       norm_eps=float(config.rms_norm_eps))


def _rope_scaling_from_hf(rope: dict[str, Any], rope_type: str, positions: int) -> RopeScaling | None:
    """``RopeScaling`` of a llama3 / yarn ``rope_parameters`` dict; None for the other types.

    Raises:
        ConfigError: a parameter is missing, not a number, out of range, or one the decoder does not implement
            (the message names it).
    """
    if rope_type not in ("llama3", "yarn"):
        return None
    where = "rope_scaling (rope_parameters.{})"
    known = {"rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings", "partial_rotary_factor"}
    known |= ({"low_freq_factor", "high_freq_factor"} if rope_type == "llama3"
              else {"beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate"})
    for name in sorted(set(rope) - known):
        raise _refuse(where.format(name), rope[name], f"not a {rope_type} parameter the decoder implements")

    def number(name: str, required: bool) -> float | None:
        value = rope.get(name)
        if value is None and not required:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise _refuse(where.format(name), value, f"{rope_type} scaling needs a number > 0")
        return float(value)

    original = rope.get("original_max_position_embeddings")
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise _refuse(where.format("original_max_position_embeddings"), original,
                      f"{rope_type} scaling needs the pretraining context as a positive integer")
    try:
        if rope_type == "llama3":
            return RopeScaling(rope_type="llama3", factor=number("factor", True), original_max_position_embeddings=original,
                               low_freq_factor=number("low_freq_factor", True),
                               high_freq_factor=number("high_freq_factor", True))
        factor = number("factor", False)
        factor = positions / original if factor is None else factor  # as transformers
        attention = number("attention_factor", False)
        mscale, mscale_all = number("mscale", False), number("mscale_all_dim", False)
        if attention is None and mscale and mscale_all:  # transformers' derivation (DeepSeek-style configs)
            def get_mscale(scale: float, m: float) -> float:
                return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
            attention = get_mscale(factor, mscale) / get_mscale(factor, mscale_all)
        truncate = rope.get("truncate", True)
        if not isinstance(truncate, bool):
            raise _refuse(where.format("truncate"), truncate, "yarn's truncate must be true or false")
        return RopeScaling(rope_type="yarn", factor=factor, original_max_position_embeddings=original,
                           beta_fast=number("beta_fast", False), beta_slow=number("beta_slow", False),
                           attention_factor=attention, truncate=truncate)
    except ConfigError as err:
        raise _refuse("rope_scaling (rope_parameters)", rope, str(err)) from None


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a folder's safetensors weights: ``model.safetensors``, or the shards an index names."""
    import safetensors.torch

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise DataError(f"{folder} has no model.safetensors or model.safetensors.index.json; save the model with "
                        "save_pretrained(..., safe_serialization=True)")
    weights: dict[str, torch.Tensor] = {}
    for name in files:
        if not (folder / name).is_file():
            raise DataError(f"{folder / name} is named by the weight index but missing")
        weights.update(safetensors.torch.load_file(str(folder / name)))
    return weights


def is_hf_folder(path: str | Path) -> bool:
    """A Hugging Face model folder (``config.json``) rather than a checkpoint of this platform (``state.json``)."""
    path = Path(path)
    return (path / "config.json").is_file() and not (path / "state.json").exists()


def decoder_from_hf(folder: Path) -> Decoder:
    """A ``Decoder`` holding the weights of a local Hugging Face model folder (``config.json`` plus safetensors,
    single file or sharded with an index), in fp32. Llama (Llama 3 RoPE scaling included), Mistral (sliding window
    included), Qwen2 / Qwen2.5 (q/k/v biases; YaRN; a window in every layer) and Qwen3 (head_dim ≠ d / n_h) and OLMo 2
    (post-norm, QK-norm over the projections) folders are read;
    tied or untied heads; GQA. See :func:`model_config_from_hf` for the mapping.

    Raises:
        ConfigError: the architecture differs from this decoder (the message names the field, e.g.
            ``attention_bias``, ``max_window_layers``, ``rope_scaling`` of a type other than default, linear, llama3 or
            yarn), or the weights hold a tensor the decoder has no place for (a bias on o_proj).
        DataError: no config.json or no safetensors weights, a tensor is missing, or a shape differs.
    """
    from transformers import AutoConfig

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise DataError(f"{folder} has no config.json: not a Hugging Face model folder")
    kind = json.loads((folder / "config.json").read_text()).get("model_type")
    if kind not in IMPORTABLE:  # before AutoConfig, which may not know the type at all
        raise _refuse("model_type", kind, f"only {', '.join(IMPORTABLE)} folders are read")
    cfg = model_config_from_hf(AutoConfig.from_pretrained(str(folder)))
    theirs = _read_weights(folder)
    theirs = {k: v for k, v in theirs.items() if not k.endswith("rotary_emb.inv_freq")}  # a buffer some files carry
    if cfg.tied_embeddings:
        theirs.pop("lm_head.weight", None)  # transformers ties it to the embedding and ignores a stored copy
    names = _name_map(cfg)
    extra = sorted(set(theirs) - set(names.values()))
    if extra:
        raise ConfigError(f"{folder}: tensors {extra[:5]} have no counterpart in the decoder (biases or modules the "
                          "config does not declare); it cannot represent this model exactly")
    model = Decoder(cfg)
    state = {}
    for ours, name in names.items():
        if name not in theirs:
            raise DataError(f"{folder}: tensor {name} is missing from the weights"
                            + (" (tie_word_embeddings is false, so the head is its own matrix)"
                               if name == "lm_head.weight" else ""))
        expected = model.state_dict()[ours].shape
        if theirs[name].shape != expected:
            raise DataError(f"{folder}: tensor {name} has shape {tuple(theirs[name].shape)}, the config implies "
                            f"{tuple(expected)}")
        state[ours] = theirs[name].to(torch.float32)
    model.load_state_dict(state, strict=True)
    return model.eval()


# --------------------------------------------------------------------------------------------------- verification


def probe_ids(vocab_size: int, seq_len: int, *, rows: int = 2, length: int = 16, seed: int = 0) -> torch.Tensor:
    """A fixed probe batch: LongTensor (rows, min(length, seq_len)) of ids drawn uniformly from [0, vocab_size) with
    a seeded generator (the same ids on every machine)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (rows, min(length, seq_len)), generator=generator)


@torch.no_grad()
def greedy_decoder(model: Decoder, prompt: list[int], max_new_tokens: int, eos_id: int | None) -> list[int]:
    """Greedy continuation of ``prompt`` by ``model`` without a KV cache: each step recomputes the whole prefix and
    appends argmax of the last position's logits; stops after ``eos_id`` or ``max_new_tokens`` new tokens.
    Returns the new tokens only. The prefix must stay within ``model.cfg.seq_len`` (else DataError)."""
    device = next(model.parameters()).device
    ids = list(prompt)
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([ids], device=device))[0, -1]
        ids.append(int(logits.argmax()))
        if ids[-1] == eos_id:
            break
    return ids[len(prompt):]


@torch.no_grad()
def greedy_hf(model: PreTrainedModel, prompt: list[int], max_new_tokens: int, eos_id: int | None,
              pad_id: int | None = None) -> list[int]:
    """``model.generate(do_sample=False)`` of ``prompt`` (one row, no padding): the new tokens, stopping after
    ``eos_id`` or ``max_new_tokens``."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                         min_new_tokens=0, eos_token_id=eos_id, pad_token_id=eos_id if pad_id is None else pad_id,
                         num_beams=1, temperature=None, top_p=None, top_k=None)
    new = out[0, len(prompt):].tolist()
    return new[: new.index(eos_id) + 1] if eos_id in new else new


@dataclass
class Verification:
    """The outcome of :func:`verify`: ``max_abs_logit_diff`` (fp32, over the probe batch), the greedy continuations
    of each prompt by both models, and ``passed`` (difference ≤ ``tolerance`` and every continuation equal)."""

    max_abs_logit_diff: float
    tolerance: float
    ours: list[list[int]] = field(default_factory=list)
    theirs: list[list[int]] = field(default_factory=list)

    @property
    def greedy_equal(self) -> bool:
        return self.ours == self.theirs

    @property
    def passed(self) -> bool:
        return self.max_abs_logit_diff <= self.tolerance and self.greedy_equal

    def as_dict(self) -> dict[str, Any]:
        return {"max_abs_logit_diff": self.max_abs_logit_diff, "tolerance": self.tolerance,
                "greedy_equal": self.greedy_equal, "greedy_ours": self.ours, "greedy_transformers": self.theirs,
                "passed": self.passed}

    def describe(self) -> str:
        first = next((i for i, (a, b) in enumerate(zip(self.ours, self.theirs)) if a != b), None)
        greedy = "greedy continuations equal" if self.greedy_equal else \
            f"greedy continuation {first} differs: ours {self.ours[first]}, transformers {self.theirs[first]}"
        return f"max |logit difference| {self.max_abs_logit_diff:.3g} (tolerance {self.tolerance:g}); {greedy}"


@torch.no_grad()
def verify(ours: Decoder, theirs: PreTrainedModel, probe: torch.Tensor, *, prompts: list[list[int]],
           max_new_tokens: int, eos_id: int | None, pad_id: int | None = None,
           tolerance: float = LOGIT_TOLERANCE) -> Verification:
    """Compare ``ours`` and a ``transformers`` model in fp32 on the CPU: logits on ``probe`` (B, T) and the greedy
    continuation of each prompt (``greedy_decoder`` against ``generate(do_sample=False)``). ``ours`` is compared as
    a fp32 CPU copy in eval mode, so the caller's module is left as it was; ``theirs`` is moved to fp32, CPU and eval
    mode in place.

    Returns:
        the :class:`Verification`; a mismatch is reported there, not raised.
    """
    import copy

    mine = copy.deepcopy(ours).to(device="cpu", dtype=torch.float32).eval()
    theirs = theirs.to(device="cpu", dtype=torch.float32).eval()
    diff = (mine(probe).float() - theirs(input_ids=probe).logits.float()).abs().max()
    result = Verification(max_abs_logit_diff=float(diff), tolerance=tolerance)
    for prompt in prompts:
        result.ours.append(greedy_decoder(mine, prompt, max_new_tokens, eos_id))
        result.theirs.append(greedy_hf(theirs, prompt, max_new_tokens, eos_id, pad_id))
    return result
