"""Shape of the decoder-only transformer (docs/methods.md §2).

A ``ModelConfig`` fully determines the parameter count (``models.arithmetic.param_count``) and the module
built by ``models.decoder.Decoder``; it is stored as JSON inside every checkpoint.
"""

from __future__ import annotations

from typing import Literal

from pydantic import SerializerFunctionWrapHandler, model_serializer, model_validator

from infra.errors import ConfigError
from infra.section import Section


class RopeScaling(Section):
    """A frequency-dependent RoPE rescaling of a released base (docs/methods.md §15), as Hugging Face spells it in
    ``rope_parameters`` (``rope_scaling`` before transformers 5). Each inverse frequency ω_i = θ^(−2i/d_h) is
    replaced by ω'_i; positions are not divided.

    ``rope_type = "llama3"`` (Meta, "The Llama 3 Herd of Models", 2024, §3.3 / the reference ``apply_scaling``;
    transformers ``_compute_llama3_parameters``): with wavelength λ_i = 2π/ω_i, L = original_max_position_embeddings,
    λ_lo = L / low_freq_factor, λ_hi = L / high_freq_factor: ω' = ω for λ < λ_hi, ω' = ω / factor for λ > λ_lo, and
    between them ω' = (1 − a)·ω/factor + a·ω with a = (L/λ − low_freq_factor) / (high_freq_factor − low_freq_factor).

    ``rope_type = "yarn"`` (Peng et al. 2023, "YaRN", arXiv:2309.00071; transformers ``_compute_yarn_parameters``):
    ω' = ω/factor·(1 − e_i) + ω·e_i, where e_i = 1 − clamp((i − lo)/(hi − lo), 0, 1) over the d_h/2 pair indices i and
    lo, hi are the pair indices that turn beta_fast and beta_slow times over L positions, d_h·ln(L/(2πβ))/(2 ln θ)
    (floored / ceiled when ``truncate``, clamped to [0, d_h − 1]); cos and sin are multiplied by
    ``attention_factor`` (default 0.1·ln(factor) + 1, 1 at factor ≤ 1), so attention logits scale by its square.

    Fields:
        rope_type: "llama3" or "yarn".
        factor: s > 0, the interpolation factor of the low frequencies.
        original_max_position_embeddings: L, the pretraining context in tokens.
        low_freq_factor, high_freq_factor: llama3 only (required there, high > low > 0).
        beta_fast, beta_slow: yarn only, rotations bounding the ramp (None: 32 and 1, as transformers).
        attention_factor: yarn only, the cos/sin multiplier (None: derived from factor as above).
        truncate: yarn only, round the ramp bounds to whole pair indices.
    """

    rope_type: Literal["llama3", "yarn"]
    factor: float
    original_max_position_embeddings: int
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    @model_validator(mode="after")
    def _check(self) -> "RopeScaling":
        if not self.factor > 0:
            raise ConfigError(f"model.rope_scaling.factor = {self.factor}: must be > 0")
        if self.original_max_position_embeddings < 1:
            raise ConfigError(f"model.rope_scaling.original_max_position_embeddings = "
                              f"{self.original_max_position_embeddings}: must be a positive integer")
        llama3 = ("low_freq_factor", "high_freq_factor")
        yarn = ("beta_fast", "beta_slow", "attention_factor")
        own, other = (llama3, yarn) if self.rope_type == "llama3" else (yarn, llama3)
        for name in other:
            if getattr(self, name) is not None:
                raise ConfigError(f"model.rope_scaling.{name} = {getattr(self, name)}: not a parameter of "
                                  f"rope_type {self.rope_type!r}")
        if self.rope_type == "llama3":
            for name in own:
                if getattr(self, name) is None or not getattr(self, name) > 0:
                    raise ConfigError(f"model.rope_scaling.{name} = {getattr(self, name)}: llama3 scaling needs a "
                                      "number > 0")
            if not self.high_freq_factor > self.low_freq_factor:
                raise ConfigError(f"model.rope_scaling.high_freq_factor = {self.high_freq_factor} must exceed "
                                  f"low_freq_factor = {self.low_freq_factor}")
        return self

    @model_serializer(mode="wrap")
    def _own_fields_only(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)
        if self.rope_type == "llama3":
            for name in ("beta_fast", "beta_slow", "attention_factor", "truncate"):
                data.pop(name, None)
        else:
            data.pop("low_freq_factor", None)
            data.pop("high_freq_factor", None)
        return data


class ModelConfig(Section):
    """Decoder shape: pre-norm RMSNorm, GQA with RoPE, SwiGLU FFN, no biases unless asked (docs/methods.md §2).

    Fields:
        n_layers: L, number of decoder blocks.
        d_model: d, residual width.
        n_heads: n_h, query heads; d_model must divide evenly unless ``head_dim`` is given.
        n_kv_heads: n_kv, key/value heads (GQA); must divide n_heads (n_kv == n_h is plain multi-head).
        d_ff: hidden width of the SwiGLU FFN (three d × d_ff matrices).
        vocab_size: V, tokenizer vocabulary (padded to a multiple of 64/128, docs/methods.md §8).
        seq_len: T, context length in tokens used for training and for the 6·L·d·T attention FLOPs.
        tied_embeddings: output head shares the input embedding matrix.
        head_dim: d_h, the width of each attention head. None (the default) = d_model / n_heads, filled in at
            validation; an explicit value (Qwen3 0.6B–8B: 128 with d_model 1024 and 16 heads) makes q/k/v project
            d → n_h·d_h (n_kv·d_h) and o project n_h·d_h → d. Left out of the dump when it equals d_model / n_heads.
        qkv_bias: additive biases on the q, k and v projections, none on o (Qwen2 / Qwen2.5). Left out of the dump
            when false.
        qk_norm: RMSNorm with a learned gain on q and k, before RoPE (docs/methods.md §2); over each head's d_h
            features (Qwen3) or over the whole projection, see ``qk_norm_scope``.
        qk_norm_scope: "head" (default: one RMSNorm of size d_h shared by the heads, applied per head) or
            "projection" (OLMo 2: Team OLMo, "2 OLMo 2 Furious", 2024: one RMSNorm of size n_h·d_h over the whole q
            projection and one of size n_kv·d_h over k, before the heads are split). Needs ``qk_norm``; left out of
            the dump at "head".
        norm_placement: "pre" (default: x + attn(norm(x)), then x + ffn(norm(x))) or "post" (OLMo 2: x +
            norm(attn(x)), then x + norm(ffn(x)); the block input is not normalised). Left out of the dump at "pre".
        sliding_window: w, sliding-window attention (Mistral 7B v0.1: Jiang et al. 2023; Qwen2 with
            use_sliding_window): query position p attends key positions s with p − w < s ≤ p, i.e. at most the
            last w keys including itself (transformers' ``sliding_window_overlay``: kv_idx > q_idx − w), in every
            layer. None (default) = full causal attention, left out of the dump.
        rope_theta: RoPE base frequency θ (Su et al. 2021); a larger base slows every rotation, the "base frequency"
            recipe of context extension (Xiong et al. 2023; docs/methods.md §15).
        rope_scaling_factor: linear position interpolation s ≥ 1 (Chen et al. 2023): position m is rotated as m / s,
            so s times more positions fit the angles the model was trained on. 1 = none. Hugging Face calls this
            ``rope_type = "linear"`` with ``factor`` s.
        rope_scaling: a frequency-dependent rescaling (:class:`RopeScaling`: Llama 3 or YaRN), applied to the
            inverse frequencies before ``rope_scaling_factor`` divides the positions. None = none, left out of the
            dump.
        init_std: std of N(0, σ) init for matrices; residual projections use σ/√(2L) (docs/methods.md §2).
        norm_eps: ε inside RMSNorm.

    Raises:
        ConfigError: a non-positive size, d_model not divisible by n_heads (without head_dim), n_heads not
            divisible by n_kv_heads, an odd head_dim (RoPE rotates pairs), a sliding_window below 1, or
            qk_norm_scope "projection" without qk_norm; the message names the field.
    """

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    vocab_size: int
    seq_len: int
    tied_embeddings: bool = True
    head_dim: int | None = None
    qkv_bias: bool = False
    qk_norm: bool = False
    qk_norm_scope: Literal["head", "projection"] = "head"
    norm_placement: Literal["pre", "post"] = "pre"
    sliding_window: int | None = None
    rope_theta: float = 10000.0
    rope_scaling_factor: float = 1.0
    rope_scaling: RopeScaling | None = None
    init_std: float = 0.02
    norm_eps: float = 1e-5

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "seq_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name} = {getattr(self, name)}: must be a positive integer")
        for name in ("rope_theta", "init_std", "norm_eps"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"model.{name} = {getattr(self, name)}: must be > 0")
        if self.rope_scaling_factor < 1.0:
            raise ConfigError(f"model.rope_scaling_factor = {self.rope_scaling_factor}: must be >= 1 (1 = no position "
                              "interpolation; s > 1 divides every position by s)")
        if self.head_dim is not None and self.head_dim < 1:
            raise ConfigError(f"model.head_dim = {self.head_dim}: must be a positive integer (or left out: "
                              "d_model / n_heads)")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model = {self.d_model} is not divisible by model.n_heads = {self.n_heads}; "
                "pick n_heads dividing d_model, or give head_dim"
            )
        if self.head_dim is None:  # frozen section: resolved once, here
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"model.n_kv_heads = {self.n_kv_heads} does not divide model.n_heads = {self.n_heads}; "
                "each KV head must serve a whole group of query heads"
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ConfigError(f"model.sliding_window = {self.sliding_window}: must be a positive integer (or left "
                              "out: full causal attention)")
        if self.qk_norm_scope != "head" and not self.qk_norm:
            raise ConfigError(f"model.qk_norm_scope = {self.qk_norm_scope!r} needs model.qk_norm = true")
        if self.head_dim % 2:
            raise ConfigError(
                f"model.head_dim = {self.head_dim} is odd; RoPE needs an even head_dim"
            )
        return self

    @model_serializer(mode="wrap")
    def _unscaled_dumps_as_before(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)
        if self.rope_scaling_factor == 1.0:  # no interpolation: configs and keys of unscaled models stay as they were
            data.pop("rope_scaling_factor", None)
        # the same for the fields added for released bases: a model without them dumps (and keys) as before
        if self.head_dim == self.d_model // self.n_heads and self.d_model % self.n_heads == 0:
            data.pop("head_dim", None)
        if not self.qkv_bias:
            data.pop("qkv_bias", None)
        if self.rope_scaling is None:
            data.pop("rope_scaling", None)
        if self.qk_norm_scope == "head":
            data.pop("qk_norm_scope", None)
        if self.norm_placement == "pre":
            data.pop("norm_placement", None)
        if self.sliding_window is None:
            data.pop("sliding_window", None)
        return data
