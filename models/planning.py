"""Pre-launch arithmetic: compute and time, memory per device, parallelism and recovery, Chinchilla allocation.

Every function is closed-form and cheap; the planner (``pretrain plan``) strings them together. Formulas and the
reference figures the tests reproduce are in docs/methods.md §1 (compute), §3 (memory), §4 (parallelism, checkpoints) and §5
(scaling laws). Units: FLOPs, seconds, bytes (GB = 1e9 bytes), tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from models.arithmetic import param_count
from models.config import ModelConfig

GB = 1e9
PLANNING_RATE = 4e14  # FLOP/s sustained per device, ≈ 40% MFU of an H100 (docs/methods.md §1)

# Dense bf16 tensor-core peaks in FLOP/s, from the vendors' data sheets (no sparsity). docs/methods.md §1: H100 SXM 989
# TFLOP/s; H200 has the same compute peak.
DEVICE_PEAK_BF16 = {
    "H100-SXM": 989e12,
    "H200": 989e12,
    "H100-PCIe": 756e12,
    "A100": 312e12,
    "L40S": 362e12,
}
DEVICE_MEMORY_GB = {"H100-SXM": 80.0, "H200": 141.0, "H100-PCIe": 80.0, "A100": 80.0, "L40S": 48.0}


# --- docs/methods.md §1: compute and time --------------------------------------------------------------------------------

def gpu_hours(flops: float, rate: float = PLANNING_RATE) -> float:
    """Device-hours to execute ``flops`` at a sustained ``rate`` FLOP/s per device: C / (3600·r) (docs/methods.md §1)."""
    return flops / (3600.0 * rate)


def elapsed_hours(flops: float, devices: int, rate: float = PLANNING_RATE) -> float:
    """Wall-clock hours on ``devices`` devices at ``rate`` each: GPU-hours / devices (docs/methods.md §1)."""
    return gpu_hours(flops, rate) / devices


def rate_at_mfu(mfu: float, peak: float = DEVICE_PEAK_BF16["H100-SXM"]) -> float:
    """Sustained FLOP/s per device at model FLOPs utilisation ``mfu`` of ``peak`` (docs/methods.md §1)."""
    return mfu * peak


# --- docs/methods.md §3: memory -------------------------------------------------------------------------------------------

def model_state_bytes(n_params: int, zero_stage: int = 0, ranks: int = 1, bytes_per_param: int = 16) -> float:
    """Per-device bytes of weights, gradients and Adam state under ZeRO (docs/methods.md §3; K = 12 optimiser bytes).

    Mixed precision: bf16 weights 2 + bf16 grads 2 + fp32 master, m, v 12 = 16 bytes/param. Stage 0 (plain data
    parallel) 16N; stage 1 shards the 12 optimiser bytes, N(4 + 12/N_d); stage 2 also the grads, N(2 + 14/N_d);
    stage 3 everything, 16N/N_d. With another ``bytes_per_param`` (18 with fp32 grads, 10 with an 8-bit optimiser)
    the optimiser share is ``bytes_per_param − 4``.

    Raises:
        ValueError: zero_stage not in 0..3 or ranks < 1.
    """
    if zero_stage not in (0, 1, 2, 3) or ranks < 1:
        raise ValueError(f"zero_stage must be 0..3 and ranks >= 1, got {zero_stage}, {ranks}")
    optimiser = bytes_per_param - 4
    if zero_stage == 0:
        return float(n_params * bytes_per_param)
    if zero_stage == 1:
        return n_params * (4 + optimiser / ranks)
    if zero_stage == 2:
        return n_params * (2 + (optimiser + 2) / ranks)
    return n_params * bytes_per_param / ranks


def activation_bytes_per_token_layer(cfg: ModelConfig) -> int:
    """Saved activations per token per layer in bf16 with fused attention: 12d + 4·n_kv·d_h + 6·d_ff (docs/methods.md §3)."""
    return 12 * cfg.d_model + 4 * cfg.n_kv_heads * cfg.head_dim + 6 * cfg.d_ff


def activation_bytes(cfg: ModelConfig, micro_batch: int, *, checkpointing: bool = False,
                     fused_attention: bool = True) -> float:
    """Saved activations of one micro-batch of ``micro_batch`` sequences of cfg.seq_len tokens (docs/methods.md §3).

    Full checkpointing keeps 2·d bytes per token per layer (the block inputs) plus one layer's full activations
    (recomputed during backward). Without fused attention each layer also stores the 2·n_h·T² bytes of attention
    probabilities per sequence.
    """
    tokens = cfg.seq_len * micro_batch
    if checkpointing:
        return float(2 * cfg.d_model * cfg.n_layers * tokens + activation_bytes_per_token_layer(cfg) * tokens)
    total = activation_bytes_per_token_layer(cfg) * cfg.n_layers * tokens
    if not fused_attention:
        total += attention_probability_bytes(cfg, micro_batch)
    return float(total)


def attention_probability_bytes(cfg: ModelConfig, micro_batch: int) -> float:
    """Dense attention probabilities kept without a fused kernel: 2·n_h·T² bytes per layer per sequence (docs/methods.md §3)."""
    return float(2 * cfg.n_heads * cfg.seq_len ** 2 * cfg.n_layers * micro_batch)


def logits_bytes(cfg: ModelConfig, micro_batch: int) -> float:
    """fp32 logits of one micro-batch: 4·T·V bytes per sequence (docs/methods.md §3)."""
    return float(4 * cfg.seq_len * cfg.vocab_size * micro_batch)


def korthikanti_activation_bytes(n_layers: int, seq_len: int, micro_batch: int, hidden: int, heads: int, *,
                                 scores: bool = True) -> float:
    """The primer's form A = L·s·b·h·(34 + 5·a·s/h) bytes (Korthikanti et al. 2022); without the attention scores
    the bracket is 34 (docs/methods.md §3)."""
    bracket = 34 + (5 * heads * seq_len / hidden if scores else 0)
    return float(n_layers * seq_len * micro_batch * hidden * bracket)


@dataclass(frozen=True)
class MemoryFit:
    """Per-device memory of one layout, in bytes, and whether it fits ``device_bytes`` with ``headroom`` spare."""

    states: float
    activations: float
    logits: float
    device_bytes: float
    headroom: float

    @property
    def total(self) -> float:
        return self.states + self.activations + self.logits

    @property
    def fits(self) -> bool:
        return self.total <= self.device_bytes * (1.0 - self.headroom)

    def describe(self) -> str:
        verdict = "fits" if self.fits else "does NOT fit"
        spare = f", keeping {self.headroom:.0%} free" if self.headroom else ""
        return (f"{self.states / GB:.2f} (states) + {self.activations / GB:.2f} (activations) + "
                f"{self.logits / GB:.2f} (logits) = {self.total / GB:.2f} GB {verdict} in "
                f"{self.device_bytes / GB:.0f} GB{spare}")


def memory_fit(cfg: ModelConfig, *, micro_batch: int, device_gb: float, zero_stage: int = 0, ranks: int = 1,
               checkpointing: bool = False, headroom: float = 0.0, bytes_per_param: int = 16,
               activation_dtype_bytes: int = 2) -> MemoryFit:
    """Model states + activations + fp32 logits per device against the device memory (docs/methods.md §3 fit table).

    ``activation_dtype_bytes``: 2 for bf16 autocast (the docs/methods.md §3 figures); 4 for fp32 training (a CPU run).
    """
    return MemoryFit(
        states=model_state_bytes(param_count(cfg).total, zero_stage, ranks, bytes_per_param),
        activations=activation_bytes(cfg, micro_batch, checkpointing=checkpointing) * activation_dtype_bytes / 2,
        logits=logits_bytes(cfg, micro_batch),
        device_bytes=device_gb * GB,
        headroom=headroom,
    )


# --- docs/methods.md §4: parallelism and recovery -------------------------------------------------------------------------

def pipeline_bubble(stages: int, micro_batches: int) -> float:
    """Idle share of a GPipe/1F1B schedule: (p − 1)/(m + p − 1) (docs/methods.md §4)."""
    return (stages - 1) / (micro_batches + stages - 1)


def ring_allreduce_seconds(size_bytes: float, bandwidth: float) -> float:
    """≈ 2S/BW: each device sends and receives 2·(N−1)/N·S bytes (docs/methods.md §4)."""
    return 2.0 * size_bytes / bandwidth


def tensor_parallel_traffic(cfg: ModelConfig, micro_batch: int = 1) -> tuple[float, float]:
    """(bytes per all-reduce, bytes per step over all layers): 4 residual-sized bf16 all-reduces per layer per
    micro-batch, each T·b·d·2 bytes (docs/methods.md §4)."""
    each = 2.0 * cfg.seq_len * micro_batch * cfg.d_model
    return each, 4 * cfg.n_layers * each


def young_interval(save_seconds: float, mtbf_seconds: float) -> tuple[float, float]:
    """Young's optimal checkpoint interval τ* = √(2·δ·M) and the overhead δ/τ + τ/(2M) at τ* (docs/methods.md §4)."""
    tau = math.sqrt(2.0 * save_seconds * mtbf_seconds)
    return tau, save_seconds / tau + tau / (2.0 * mtbf_seconds)


def checkpoint_bytes(n_params: int) -> tuple[float, float]:
    """(fp32 master + Adam moments 12 bytes/param, plus bf16 weights: 14 bytes/param) (docs/methods.md §4)."""
    return 12.0 * n_params, 14.0 * n_params


# --- docs/methods.md §5: Chinchilla allocation ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Chinchilla:
    """L(N, D) = E + A/N^α + B/D^β with the Hoffmann et al. (2022) fit (docs/methods.md §5)."""

    E: float = 1.69
    A: float = 406.4
    B: float = 410.7
    alpha: float = 0.34
    beta: float = 0.28

    def loss(self, n: float, d: float) -> float:
        return self.E + self.A / n ** self.alpha + self.B / d ** self.beta

    def optimum(self, c6: float) -> tuple[float, float]:
        """Loss-minimising (N, D) for C6 = 6·N·D: N = G·(C/6)^(β/(α+β)), G = (αA/(βB))^(1/(α+β))."""
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))
        n = g * (c6 / 6.0) ** (self.beta / (self.alpha + self.beta))
        return n, c6 / (6.0 * n)

    def equal_loss_optimum(self, target: float) -> tuple[float, float]:
        """Cheapest (N, D) in C6 reaching ``target`` loss: on the compute-optimal frontier, bisection on log C.

        Raises:
            ValueError: target is at or below the irreducible loss E.
        """
        lo, hi = 1e10, 1e35  # FLOPs
        if not (self.loss(*self.optimum(hi)) <= target <= self.loss(*self.optimum(lo))):
            raise ValueError(f"target loss {target:.3f} is outside what {lo:.0e}–{hi:.0e} FLOPs reach "
                             f"({self.loss(*self.optimum(hi)):.3f}–{self.loss(*self.optimum(lo)):.3f}); the "
                             f"irreducible loss is {self.E:.3f}")
        for _ in range(200):
            mid = math.sqrt(lo * hi)
            if self.loss(*self.optimum(mid)) > target:
                lo = mid
            else:
                hi = mid
        return self.optimum(hi)


def tokens_per_param_allocation(c6: float, ratio: float = 20.0) -> tuple[float, float]:
    """(N, D) with D = ratio·N and 6·N·D = C6: N = √(C6 / (6·ratio)) (the "20 tokens per parameter" rule)."""
    n = math.sqrt(c6 / (6.0 * ratio))
    return n, ratio * n


def served_token_break_even(n_trained: float, d_trained: float, n_alternative: float, d_alternative: float) -> float:
    """Served tokens after which a model trained past its compute optimum (smaller N, more D) pays back: the
    training FLOPs it costs beyond the equal-loss optimum, divided by the serving FLOPs it saves per token
    (2N each, docs/methods.md §5). Negative when it never pays back."""
    extra_training = 6.0 * (n_trained * d_trained - n_alternative * d_alternative)
    saved_per_token = 2.0 * (n_alternative - n_trained)
    if saved_per_token <= 0 or extra_training <= 0:  # not smaller, or not dearer to train: nothing to pay back
        return float("inf") if saved_per_token <= 0 < extra_training else 0.0
    return extra_training / saved_per_token


def detected_device() -> tuple[str, float]:
    """(name, memory in GB) of the device training would use: the first CUDA device, else this machine's RAM."""
    import os

    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return props.name, props.total_memory / GB
    return "cpu", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB


def require_fit(cfg: ModelConfig, micro_batch: int, *, headroom: float = 0.1, zero_stage: int = 0, ranks: int = 1,
                checkpointing: bool = False, local_processes: int = 1) -> MemoryFit:
    """One rank's memory (docs/methods.md §3) on the detected device; refuses a layout that does not fit.

    ``micro_batch``: rows one rank holds at a time; ``zero_stage``/``ranks``: how model states are sharded (FSDP
    full shard = ZeRO-3 over all ranks); ``local_processes``: processes sharing one CPU's RAM (each gets its share).

    Raises:
        ConfigError: the layout needs more than (1 − headroom) of the device's memory; the message gives the
            numbers (states, activations, logits, total, device) and the usual fixes.
    """
    from infra.errors import ConfigError

    name, memory_gb = detected_device()
    if name == "cpu":
        memory_gb /= max(local_processes, 1)
    fit = memory_fit(cfg, micro_batch=micro_batch, device_gb=memory_gb, headroom=headroom, zero_stage=zero_stage,
                     ranks=ranks, checkpointing=checkpointing, activation_dtype_bytes=2 if name != "cpu" else 4)
    if not fit.fits:
        raise ConfigError(f"the run does not fit on {name}: {fit.describe()}; lower batch_size or seq_len, use a "
                          "smaller model, or shard it over more devices (see `pretrain plan`)")
    return fit
