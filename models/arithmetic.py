"""Closed-form parameter counts and training FLOPs of a ``ModelConfig`` (docs/methods.md §1, §2).

Nothing here builds a module, so the 9.5B case-study shape is counted in microseconds. Tests check the
five reference rows of docs/methods.md §2 and the FLOP figures of §1; ``Decoder`` must agree with ``param_count``.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.config import ModelConfig


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts (docs/methods.md §2).

    Attributes:
        total: every trainable parameter (a tied embedding counted once).
        blocks: the L decoder blocks, their norms (and q/k/v biases, with qkv_bias) included.
        embedding: V·d, or 2·V·d when the output head is untied.
        decayed_matrices: 2-D weights that get AdamW weight decay (embeddings included, docs/methods.md §6).
        norms: RMSNorm gains (2·d per block, d final, plus 2·d_h per block with QK-norm per head, or
            (n_h + n_kv)·d_h with QK-norm over the whole projections, OLMo 2); no decay.
    """

    total: int
    blocks: int
    embedding: int
    decayed_matrices: int
    norms: int


def _per_layer(cfg: ModelConfig) -> tuple[int, int, int]:
    """(matrix params, norm params, bias params) of one block: attention 2·d·n_h·d_h + 2·d·n_kv·d_h (2·d² + 2·d·n_kv·d_h
    at d_h = d/n_h), FFN 3·d·d_ff, norms 2·d (+ 2·d_h with QK-norm per head, + (n_h + n_kv)·d_h with QK-norm over the
    projections), q/k/v biases (n_h + 2·n_kv)·d_h with qkv_bias."""
    d, d_h = cfg.d_model, cfg.head_dim
    matrices = 2 * d * cfg.n_heads * d_h + 2 * d * cfg.n_kv_heads * d_h + 3 * d * cfg.d_ff
    qk_norms = 0
    if cfg.qk_norm:
        qk_norms = 2 * d_h if cfg.qk_norm_scope == "head" else (cfg.n_heads + cfg.n_kv_heads) * d_h
    norms = 2 * d + qk_norms
    biases = (cfg.n_heads + 2 * cfg.n_kv_heads) * d_h if cfg.qkv_bias else 0
    return matrices, norms, biases


def param_count(cfg: ModelConfig) -> ParamCount:
    """Exact parameter counts of the decoder described by ``cfg`` (docs/methods.md §2 formulas)."""
    layer_matrices, layer_norms, layer_biases = _per_layer(cfg)
    embedding = cfg.vocab_size * cfg.d_model * (1 if cfg.tied_embeddings else 2)
    norms = cfg.n_layers * layer_norms + cfg.d_model
    blocks = cfg.n_layers * (layer_matrices + layer_norms + layer_biases)
    return ParamCount(
        total=blocks + embedding + cfg.d_model,
        blocks=blocks,
        embedding=embedding,
        decayed_matrices=cfg.n_layers * layer_matrices + embedding,
        norms=norms,
    )


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token, 6·N_matmul + 6·L·d·T (docs/methods.md §1, architecture-aware).

    N_matmul = N − V·d when untied (the input embedding is a lookup, not a matmul), N when tied
    (the shared matrix is the output projection). 6·L·d·T counts the attention score/value matmuls
    forward and backward at sequence length T = cfg.seq_len.
    """
    n_total = param_count(cfg).total
    n_matmul = n_total if cfg.tied_embeddings else n_total - cfg.vocab_size * cfg.d_model
    return float(6 * n_matmul + 6 * cfg.n_layers * cfg.d_model * cfg.seq_len)


def training_flops(cfg: ModelConfig, tokens: float) -> float:
    """C = (6·N_matmul + 6·L·d·T)·D FLOPs for D = ``tokens`` training tokens (docs/methods.md §1, the default convention)."""
    return flops_per_token(cfg) * float(tokens)


def flops_6nd(cfg: ModelConfig, tokens: float) -> float:
    """C6 = 6·N·D FLOPs, N = total parameters: Chinchilla's shortcut, for scaling-law and payback maths only (docs/methods.md §1)."""
    return 6.0 * param_count(cfg).total * float(tokens)
