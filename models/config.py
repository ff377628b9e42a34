"""Shape of the decoder-only transformer (docs/methods.md §2).

A ``ModelConfig`` fully determines the parameter count (``models.arithmetic.param_count``) and the module
built by ``models.decoder.Decoder``; it is stored as JSON inside every checkpoint.
"""

from __future__ import annotations

from pydantic import SerializerFunctionWrapHandler, model_serializer, model_validator

from infra.errors import ConfigError
from infra.section import Section


class ModelConfig(Section):
    """Decoder shape: pre-norm RMSNorm, GQA with RoPE, SwiGLU FFN, no biases (docs/methods.md §2).

    Fields:
        n_layers: L, number of decoder blocks.
        d_model: d, residual width.
        n_heads: n_h, query heads; d_model must divide evenly, head_dim = d_model / n_heads.
        n_kv_heads: n_kv, key/value heads (GQA); must divide n_heads (n_kv == n_h is plain multi-head).
        d_ff: hidden width of the SwiGLU FFN (three d × d_ff matrices).
        vocab_size: V, tokenizer vocabulary (padded to a multiple of 64/128, docs/methods.md §8).
        seq_len: T, context length in tokens used for training and for the 6·L·d·T attention FLOPs.
        tied_embeddings: output head shares the input embedding matrix.
        qk_norm: RMSNorm with a learned gain (size head_dim) on q and k per head, before RoPE (docs/methods.md §2).
        rope_theta: RoPE base frequency θ (Su et al. 2021); a larger base slows every rotation, the "base frequency"
            recipe of context extension (Xiong et al. 2023; docs/methods.md §15).
        rope_scaling_factor: linear position interpolation s ≥ 1 (Chen et al. 2023): position m is rotated as m / s,
            so s times more positions fit the angles the model was trained on. 1 = none. Hugging Face calls this
            ``rope_type = "linear"`` with ``factor`` s.
        init_std: std of N(0, σ) init for matrices; residual projections use σ/√(2L) (docs/methods.md §2).
        norm_eps: ε inside RMSNorm.

    Raises:
        ConfigError: a non-positive size, d_model not divisible by n_heads, n_heads not divisible by
            n_kv_heads, or an odd head_dim (RoPE rotates pairs); the message names the field.
    """

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    vocab_size: int
    seq_len: int
    tied_embeddings: bool = True
    qk_norm: bool = False
    rope_theta: float = 10000.0
    rope_scaling_factor: float = 1.0
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
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model = {self.d_model} is not divisible by model.n_heads = {self.n_heads}; "
                "pick n_heads dividing d_model"
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"model.n_kv_heads = {self.n_kv_heads} does not divide model.n_heads = {self.n_heads}; "
                "each KV head must serve a whole group of query heads"
            )
        if self.head_dim % 2:
            raise ConfigError(
                f"model.d_model / model.n_heads = {self.head_dim} is odd; RoPE needs an even head_dim"
            )
        return self

    @model_serializer(mode="wrap")
    def _unscaled_dumps_as_before(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)
        if self.rope_scaling_factor == 1.0:  # no interpolation: configs and keys of unscaled models stay as they were
            data.pop("rope_scaling_factor", None)
        return data

    @property
    def head_dim(self) -> int:
        """d_h = d_model / n_heads."""
        return self.d_model // self.n_heads
