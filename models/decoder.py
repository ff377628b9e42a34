"""Decoder-only transformer: pre-norm RMSNorm, GQA with RoPE, SwiGLU FFN (docs/methods.md §2). No biases, except
q/k/v biases with ``qkv_bias`` (Qwen2); d_h is d / n_h unless ``head_dim`` sets it. Options for released bases:
``sliding_window`` (Mistral 7B v0.1, Jiang et al. 2023: banded causal attention), ``norm_placement = "post"`` and
``qk_norm_scope = "projection"`` (OLMo 2, Team OLMo, "2 OLMo 2 Furious", 2024).

Shape legend: B batch, T sequence length, d model width, V vocabulary, n_h query heads, n_kv key/value
heads, d_h head width, d_ff FFN hidden width.

Incremental decoding: ``Decoder.forward(idx, cache=KVCache(...))`` keeps each layer's rotated keys and values, so
a prompt is prefilled once and every later call feeds only the new tokens, at positions offset by what the cache
already holds (``models/generate.py`` drives it). Without a cache, forward is the training path.
"""

from __future__ import annotations

import math

import torch
import torch.utils.checkpoint
import torch.nn.functional as F
from torch import nn

from infra.errors import DataError
from models.config import ModelConfig, RopeScaling


class RMSNorm(nn.Module):
    """x / rms(x) · g over the last dimension, learned gain g initialised to 1 (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., dim) → (..., dim), same dtype as ``x``."""
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def scaled_inv_freq(inv_freq: torch.Tensor, head_dim: int, theta: float,
                    scaling: RopeScaling) -> tuple[torch.Tensor, float]:
    """Rescaled inverse frequencies (d_h/2,) and the cos/sin multiplier of a Llama 3 or YaRN ``scaling``.

    Llama 3: Meta, "The Llama 3 Herd of Models" (2024) and its reference ``apply_scaling``, as transformers'
    ``_compute_llama3_parameters`` (modeling_rope_utils.py): frequencies whose wavelength 2π/ω exceeds
    L / low_freq_factor are divided by ``factor``, those below L / high_freq_factor are kept, and the band between
    is blended linearly in L/λ. Multiplier 1.

    YaRN: Peng et al. 2023 (arXiv:2309.00071), as transformers' ``_compute_yarn_parameters``: a linear ramp over
    pair indices between the dimensions that turn beta_fast and beta_slow times in L positions blends ω/factor (low
    frequencies) into ω (high); multiplier ``attention_factor`` or 0.1·ln(factor) + 1. See :class:`RopeScaling`.

    Args:
        inv_freq: ω_i = θ^(−2i/d_h), float64 (d_h/2,).
    """
    s = scaling.factor
    L = scaling.original_max_position_embeddings
    if scaling.rope_type == "llama3":
        low, high = scaling.low_freq_factor, scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        out = torch.where(wavelen > L / low, inv_freq / s, inv_freq)
        smooth = (L / wavelen - low) / (high - low)
        blended = (1 - smooth) * out / s + smooth * out
        medium = (wavelen >= L / high) & (wavelen <= L / low)
        return torch.where(medium, blended, out), 1.0
    beta_fast = scaling.beta_fast or 32.0
    beta_slow = scaling.beta_slow or 1.0

    def correction_dim(rotations: float) -> float:  # the pair dimension that turns ``rotations`` times in L positions
        return head_dim * math.log(L / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, head_dim - 1)
    if lo == hi:
        hi += 0.001  # as transformers: no zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep ω), 0: interpolate (ω / s)
    out = inv_freq / s * (1 - keep) + inv_freq * keep
    if scaling.attention_factor is not None:
        multiplier = float(scaling.attention_factor)
    else:
        multiplier = 1.0 if s <= 1 else 0.1 * math.log(s) + 1.0
    return out, multiplier


def rope_tables(head_dim: int, seq_len: int, theta: float, scaling_factor: float = 1.0,
                scaling: RopeScaling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each (T, d_h), for rotary embeddings (Su et al. 2021, rotate-half layout).

    Position m of pair i turns by (m / s) · ω_i with ω_i = θ^(−2i/d_h); s = ``scaling_factor`` is linear position
    interpolation (Chen et al. 2023; docs/methods.md §15), 1 = none. ``scaling`` (Llama 3 or YaRN,
    :func:`scaled_inv_freq`) replaces ω_i by its rescaled value and multiplies both tables by its attention factor.
    """
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (d_h/2,)
    multiplier = 1.0
    if scaling is not None:
        inv_freq, multiplier = scaled_inv_freq(inv_freq, head_dim, theta, scaling)
    positions = torch.arange(seq_len, dtype=torch.float64) / scaling_factor  # (T,)
    angles = torch.outer(positions, inv_freq)  # (T, d_h/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, d_h)
    return (angles.cos() * multiplier).float(), (angles.sin() * multiplier).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, T, n, d_h) by position; cos/sin (T, d_h). Computed in fp32, returned in x's dtype."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]  # (T, 1, d_h) broadcast over heads
    return (xf * cos + rotated * sin).to(x.dtype)


def document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """Block-diagonal causal mask from doc_ids (B, T): bool (B, 1, T, T), True where query t may attend key s, i.e.
    s ≤ t and both positions belong to the same document."""
    T = doc_ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()
    same = doc_ids[:, :, None] == doc_ids[:, None, :]  # (B, T, T)
    return (same & causal)[:, None]


class LayerKV:
    """One attention layer's cached keys and values: buffers (B, n_kv, T_max, d_h), filled up to ``length``.

    The buffers are allocated at the first ``append``, with the dtype and device of the keys written then (the
    autocast dtype under autocast).
    """

    def __init__(self, max_len: int):
        self.max_len, self.length = max_len, 0
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, n_kv, T, d_h) at positions length..length+T-1; return every cached position's keys and
        values, each (B, n_kv, length + T, d_h).

        Raises:
            DataError: the cache would hold more than ``max_len`` positions, or the batch size changed.
        """
        B, n_kv, T, d_h = k.shape
        if self.length + T > self.max_len:
            raise DataError(f"KV cache holds {self.length} positions; {T} more exceed its {self.max_len}")
        if self.k is None:
            self.k = k.new_zeros(B, n_kv, self.max_len, d_h)
            self.v = v.new_zeros(B, n_kv, self.max_len, d_h)
        elif self.k.shape[0] != B:
            raise DataError(f"KV cache was filled for batch size {self.k.shape[0]}, not {B}")
        end = self.length + T
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]


class KVCache:
    """Per-layer key/value cache of one batch of sequences for incremental decoding (no document mask).

    ``length`` positions are cached (0 before the prefill); the next ``Decoder.forward`` call places its tokens at
    positions length, length + 1, ... in the RoPE tables. ``max_len`` defaults to cfg.seq_len, the positions the
    RoPE tables cover; a context longer than that must be cropped by the caller.
    """

    def __init__(self, cfg: ModelConfig, max_len: int | None = None):
        self.max_len = cfg.seq_len if max_len is None else max_len
        if not 1 <= self.max_len <= cfg.seq_len:
            raise DataError(f"KV cache of {self.max_len} positions: must be 1..model.seq_len = {cfg.seq_len}")
        self.layers = [LayerKV(self.max_len) for _ in range(cfg.n_layers)]

    @property
    def length(self) -> int:
        """Positions cached so far (the same in every layer)."""
        return self.layers[0].length


def _offset_causal_mask(T: int, start: int, device: torch.device) -> torch.Tensor:
    """bool (T, start + T): query t (at position start + t) may attend key s iff s ≤ start + t."""
    keys = torch.arange(start + T, device=device)
    return keys[None, :] <= (start + torch.arange(T, device=device))[:, None]


def sliding_window_mask(T: int, start: int, window: int, device: torch.device) -> torch.Tensor:
    """bool (T, start + T): query t (at position p = start + t) may attend key s iff p − window < s ≤ p, i.e. the
    last ``window`` positions including its own (transformers' ``sliding_window_causal_mask_function``)."""
    keys = torch.arange(start + T, device=device)[None, :]
    queries = (start + torch.arange(T, device=device))[:, None]
    return (keys <= queries) & (keys > queries - window)


class Attention(nn.Module):
    """Causal grouped-query attention; parameters 2·d·n_h·d_h + 2·d·n_kv·d_h (2·d² + 2·d·n_kv·d_h at d_h = d/n_h,
    docs/methods.md §2), plus 2·d_h with QK-norm per head ((n_h + n_kv)·d_h over the projections) and
    (n_h + 2·n_kv)·d_h with q/k/v biases.

    ``qk_norm_scope = "head"``: one RMSNorm of size d_h on each head of q and of k (Qwen3); ``"projection"``: an
    RMSNorm of size n_h·d_h over the whole q projection and one of n_kv·d_h over k, before the heads are split
    (OLMo 2). Both before RoPE. ``sliding_window`` w applies to the cached path here; the uncached path receives
    the band in ``mask`` from :class:`Decoder`."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, q_dim, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.d_model, kv_dim, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.d_model, kv_dim, bias=cfg.qkv_bias)
        self.wo = nn.Linear(q_dim, cfg.d_model, bias=False)
        self.qk_norm_whole = cfg.qk_norm_scope == "projection"
        q_norm_dim, k_norm_dim = (q_dim, kv_dim) if self.qk_norm_whole else (cfg.head_dim, cfg.head_dim)
        self.q_norm = RMSNorm(q_norm_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(k_norm_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.window = cfg.sliding_window
        # Instrument (docs/methods.md §6 (learning-rate stability grid)): when set, forward also records the largest |q·k|/√d_h over causal pairs.
        self.probe_logits, self.max_logit = False, 0.0

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None, cache: LayerKV | None = None) -> torch.Tensor:
        """x (B, T, d), cos/sin (T, d_h), mask None (causal) or bool (B, 1, T, T) / (T, T), True = may attend →
        (B, T, d).

        With ``cache`` (no mask), x holds the tokens at positions cache.length..cache.length+T-1 (cos/sin are those
        positions' rows); their keys and values are appended and the queries attend every cached position up to
        their own.
        """
        B, T, _ = x.shape
        q, k = self.wq(x), self.wk(x)  # (B, T, n_h·d_h), (B, T, n_kv·d_h)
        if self.q_norm is not None and self.qk_norm_whole:  # OLMo 2: over the whole projections
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(B, T, self.n_heads, self.head_dim)  # (B, T, n_h, d_h)
        k = k.view(B, T, self.n_kv_heads, self.head_dim)  # (B, T, n_kv, d_h)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim)  # (B, T, n_kv, d_h)
        if self.q_norm is not None and not self.qk_norm_whole:  # per head
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, n, T, d_h)
        if cache is not None:
            return self._cached(q, k, v, cache)
        if self.probe_logits:
            self._record_max_logit(q, k, mask)
        gqa = self.n_kv_heads != self.n_heads
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, n_h·d_h) → (B, T, d)

    def _cached(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: LayerKV) -> torch.Tensor:
        """Attention of q (B, n_h, T, d_h) over the cache after appending k, v (B, n_kv, T, d_h) → (B, T, d)."""
        B, _, T, _ = q.shape
        start = cache.length
        k, v = cache.append(k, v)  # (B, n_kv, start + T, d_h)
        gqa = self.n_kv_heads != self.n_heads
        if self.window is not None and start + T > self.window:  # some key lies outside a query's window
            mask = sliding_window_mask(T, start, self.window, q.device)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        elif start == 0:  # prefill: plain causal
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        elif T == 1:  # one new token attends every cached position
            y = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        else:  # several new tokens after a prefix: causal with the diagonal shifted by ``start``
            mask = _offset_causal_mask(T, start, q.device)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


    @torch.no_grad()
    def _record_max_logit(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> None:
        """max |q·k|/√d_h over the pairs the layer may attend (q (B, n_h, T, d_h), k (B, n_kv, T, d_h))."""
        k = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        scores = (q.float() @ k.float().transpose(-1, -2)).abs() / math.sqrt(self.head_dim)  # (B, n_h, T, T)
        T = q.shape[2]
        allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril() if mask is None else mask
        self.max_logit = max(self.max_logit, float(scores.masked_fill(~allowed, 0.0).max()))


class SwiGLU(nn.Module):
    """W_down(SiLU(W_gate x) ⊙ W_up x), 3·d·d_ff parameters (Shazeer 2020; docs/methods.md §2)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w_up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w_down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d) → (B, T, d) through a (B, T, d_ff) hidden."""
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + ffn(norm(x)); with ``norm_placement = "post"`` (OLMo 2)
    x + norm(attn(x)), then x + norm(ffn(x)), the same two norms (``attn_norm``, ``ffn_norm``) on the branch outputs."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = SwiGLU(cfg)
        self.post_norm = cfg.norm_placement == "post"
        self.recompute = False  # activation checkpointing, set through Decoder.activation_checkpointing

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None, cache: LayerKV | None = None) -> torch.Tensor:
        """(B, T, d) → (B, T, d); ``mask`` and ``cache`` as in :meth:`Attention.forward`.

        With ``recompute`` (training only) the block keeps just its input and recomputes the rest in backward.
        The checkpoint sits inside the block so that, under FSDP, the unit's parameter gathering wraps it.
        """
        if cache is not None:
            return self._forward(x, cos, sin, None, cache)
        if self.recompute and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(self._forward, x, cos, sin, mask, use_reentrant=False)
        return self._forward(x, cos, sin, mask)

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 mask: torch.Tensor | None, cache: LayerKV | None = None) -> torch.Tensor:
        if self.post_norm:
            x = x + self.attn_norm(self.attn(x, cos, sin, mask, cache))
            return x + self.ffn_norm(self.ffn(x))
        x = x + self.attn(self.attn_norm(x), cos, sin, mask, cache)
        return x + self.ffn(self.ffn_norm(x))


class Decoder(nn.Module):
    """Token ids → next-token logits. ``sum(p.numel())`` equals ``param_count(cfg).total`` (docs/methods.md §2).

    Init (docs/methods.md §2): every matrix N(0, init_std); the residual projections (attention ``wo`` and FFN
    ``w_down``) N(0, init_std/√(2L)); norm gains 1; q/k/v biases 0. With tied embeddings the output head reuses the
    input embedding matrix, so a tied model has one V × d matrix.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = None if cfg.tied_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.head_dim, cfg.seq_len, cfg.rope_theta, cfg.rope_scaling_factor, cfg.rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)  # (T_max, d_h)
        self.register_buffer("rope_sin", sin, persistent=False)  # (T_max, d_h)
        self.reset_parameters()

    @property
    def activation_checkpointing(self) -> bool:
        """Recompute each block's activations in backward instead of storing them (docs/methods.md §3: stored activations
        drop to the block inputs). A runtime choice: not part of the config or the weights."""
        return all(block.recompute for block in self.blocks)

    @activation_checkpointing.setter
    def activation_checkpointing(self, enabled: bool) -> None:
        for block in self.blocks:
            block.recompute = bool(enabled)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Re-draw all weights with the init of docs/methods.md §2 (uses the global torch RNG)."""
        residual_std = self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif p.ndim == 1:
                p.fill_(1.0)
            elif name.endswith(("attn.wo.weight", "ffn.w_down.weight")):
                p.normal_(0.0, residual_std)
            else:
                p.normal_(0.0, self.cfg.init_std)

    def forward(self, idx: torch.Tensor, doc_ids: torch.Tensor | None = None, *,
                cache: KVCache | None = None) -> torch.Tensor:
        """idx LongTensor (B, T) with T ≤ cfg.seq_len → logits (B, T, V) (autocast dtype under autocast).

        ``doc_ids`` (B, T), the document each position belongs to, turns on a block-diagonal causal mask: a
        position attends only to earlier positions of its own document (docs/methods.md §8 packing). None: plain causal.
        With ``cfg.sliding_window`` w < T, a (T, T) band mask (p − w < s ≤ p) is built once per call and combined
        with the document mask; at w ≥ T (or None) the mask-free causal path runs unchanged.

        ``cache``: incremental decoding; idx holds the tokens at positions cache.length..cache.length+T-1 (the
        whole prompt on the first call, then the new tokens), their keys and values are appended to the cache,
        and the logits equal those of the same positions in one uncached forward over the whole sequence.

        Raises:
            DataError: T exceeds cfg.seq_len (RoPE tables are built for seq_len positions), or doc_ids' shape
                differs from idx's; with a cache: doc_ids given, or cache.length + T beyond the cache's positions.
        """
        if cache is not None:
            return self._forward_cached(idx, doc_ids, cache)
        T = idx.shape[1]
        if T > self.cfg.seq_len:
            raise DataError(f"input length T = {T} exceeds model.seq_len = {self.cfg.seq_len}; crop the batch")
        mask = None
        if doc_ids is not None:
            if doc_ids.shape != idx.shape:
                raise DataError(f"doc_ids has shape {tuple(doc_ids.shape)}, idx {tuple(idx.shape)}: they must match")
            mask = document_mask(doc_ids.to(idx.device))
        window = self.cfg.sliding_window
        if window is not None and window < T:
            band = sliding_window_mask(T, 0, window, idx.device)  # (T, T)
            mask = band if mask is None else mask & band
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]  # (T, d_h)
        x = self.tok_embeddings(idx)  # (B, T, d)
        for block in self.blocks:
            x = block(x, cos, sin, mask)
        x = self.norm(x)
        head = self.tok_embeddings.weight if self.lm_head is None else self.lm_head.weight  # (V, d)
        return F.linear(x, head)  # (B, T, V)

    def _forward_cached(self, idx: torch.Tensor, doc_ids: torch.Tensor | None, cache: KVCache) -> torch.Tensor:
        """``forward`` with a KV cache: idx (B, T) at positions cache.length.. → logits (B, T, V)."""
        if doc_ids is not None:
            raise DataError("doc_ids with a KV cache: incremental decoding continues one document; drop doc_ids")
        start, T = cache.length, idx.shape[1]
        if start + T > cache.max_len:
            raise DataError(f"KV cache holds {start} positions; {T} more exceed its {cache.max_len} "
                            f"(model.seq_len = {self.cfg.seq_len}): crop the context from the left")
        cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]  # (T, d_h)
        x = self.tok_embeddings(idx)  # (B, T, d)
        for block, layer in zip(self.blocks, cache.layers):
            x = block(x, cos, sin, None, layer)
        x = self.norm(x)
        head = self.tok_embeddings.weight if self.lm_head is None else self.lm_head.weight  # (V, d)
        return F.linear(x, head)  # (B, T, V)
