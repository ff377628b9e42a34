"""Scale-out arithmetic of the planner: other FLOP counts (PaLM, hardware FLOPs), data-parallel and ZeRO traffic
with hybrid sharding, and mixture-of-experts counts, capacity and all-to-all (docs/methods.md §1–§4).

Everything is closed-form, as in ``models.arithmetic`` and ``models.planning``. It lives in a module of its own
because only ``pretrain plan`` uses it: the training stages import those two modules, and their code-version keys
cover what they import. Units: FLOPs, bytes (GB = 1e9), bytes per second, tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from models.arithmetic import param_count
from models.config import ModelConfig
from models.planning import MemoryFit, activation_bytes_per_token_layer, logits_bytes, model_state_bytes

# Planning bandwidths per device and direction, bytes/s: NVLink 4 on an H100 SXM is 900 GB/s both directions
# together (450 each way); one 400 Gb/s NDR InfiniBand adapter per GPU is 50 GB/s (docs/methods.md §4).
INTRA_NODE_BANDWIDTH = 450e9
INTER_NODE_BANDWIDTH = 50e9
DEVICES_PER_NODE = 8  # an HGX/DGX H100 node


# --- docs/methods.md §1: other FLOP counts ----------------------------------------------------------------------------

def palm_flops_per_token(n_params: float, n_layers: int, seq_len: int, d_model: int) -> float:
    """PaLM's count of model FLOPs per token, 6·N + 12·L·T·d (Chowdhery et al. 2022, App. B: 12·L·H·Q·T with
    H·Q = d). N is the parameter count of the 6N shortcut; the attention term charges the full T × T square, twice
    the causal 6·L·d·T of the architecture-aware count (docs/methods.md §1)."""
    return 6.0 * n_params + 12.0 * n_layers * seq_len * d_model


def hardware_flops_per_token(model_flops_per_token: float, checkpointing: bool) -> float:
    """FLOPs the device executes per token: the model count, plus one more forward pass (2 of the 6 per parameter)
    when full activation checkpointing recomputes each block in backward, so 8·N instead of 6·N (Chowdhery et al.
    2022, App. B; Korthikanti et al. 2022). HFU uses this count, MFU the model count (docs/methods.md §1)."""
    return model_flops_per_token * (8.0 / 6.0 if checkpointing else 1.0)


def hfu_from_mfu(mfu: float, checkpointing: bool) -> float:
    """Hardware FLOPs utilisation of a run at model FLOPs utilisation ``mfu``: mfu · 8/6 with full checkpointing,
    mfu without (the same step time, more FLOPs executed)."""
    return hardware_flops_per_token(mfu, checkpointing)


# --- docs/methods.md §4: collectives and data-parallel traffic --------------------------------------------------------

Collective = Literal["all-reduce", "reduce-scatter", "all-gather"]


def ring_bytes(collective: Collective, size_bytes: float, ranks: int) -> float:
    """Bytes each rank sends (and receives) in a ring collective over ``ranks`` of a ``size_bytes`` buffer:
    reduce-scatter and all-gather (n − 1)/n·S each; all-reduce, their sum, 2·(n − 1)/n·S (Patarasuk & Yuan 2009).

    Raises:
        ValueError: ranks < 1, or an unknown collective.
    """
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    share = (ranks - 1) / ranks * size_bytes
    if collective == "all-reduce":
        return 2.0 * share
    if collective in ("reduce-scatter", "all-gather"):
        return share
    raise ValueError(f"unknown collective {collective!r}; use all-reduce, reduce-scatter or all-gather")


@dataclass(frozen=True)
class Links:
    """Per-device bandwidth of a cluster, bytes/s per direction: inside a node and between nodes."""

    intra_node: float = INTRA_NODE_BANDWIDTH
    inter_node: float = INTER_NODE_BANDWIDTH
    devices_per_node: int = DEVICES_PER_NODE

    def bandwidth(self, span: int) -> float:
        """Bandwidth of a collective over ``span`` consecutive devices: NVLink when they share a node, else the
        inter-node link (a ring runs at its slowest hop)."""
        return self.intra_node if span <= self.devices_per_node else self.inter_node

    def where(self, span: int) -> str:
        return "intra-node" if span <= self.devices_per_node else "inter-node"


@dataclass(frozen=True)
class DataParallelTraffic:
    """Gradient and weight traffic of one optimiser step, bytes sent per device.

    Attributes:
        within: collectives inside a shard group of ``shard`` ranks (the whole data-parallel group without HSDP).
        across: the all-reduce of each rank's 1/shard of the gradients over the ``replicas`` = D/shard groups.
        shard / replicas: the group sizes, shard · replicas = D.
        devices: D.
    """

    within: float
    across: float
    shard: int
    replicas: int
    devices: int

    @property
    def total(self) -> float:
        return self.within + self.across

    def seconds(self, links: Links) -> float:
        """Time of the step's traffic, unoverlapped: the within-group part on the link its group spans, the
        across-group part on the link the D devices span."""
        return self.within / links.bandwidth(self.shard) + self.across / links.bandwidth(self.devices)


def data_parallel_traffic(n_params: float, zero_stage: int, devices: int, *, shard_group: int | None = None,
                          comm_bytes: int = 2, micro_batches: int = 1) -> DataParallelTraffic:
    """Bytes each device sends per optimiser step for data parallelism with ZeRO (Rajbhandari et al. 2020) and,
    with ``shard_group`` = G, hybrid sharding (shard within G devices, replicate across D/G; Zhao et al. 2023).

    Within the shard group of S ranks (S = D without HSDP):
        stages 0, 1, 2: reduce-scatter + all-gather = 2·(S − 1)/S·N·bytes (the ring all-reduce of DDP)
        stage 3:        two weight all-gathers (forward, backward) + gradient reduce-scatter = 3·(S − 1)/S·N·bytes
    Across the D/S replica groups: all-reduce of the 1/S gradient shard, 2·(R − 1)/R·N·bytes/S.
    ``micro_batches`` > 1 repeats the stage-3 collectives for every micro-batch (weights re-gathered and gradients
    reduce-scattered per micro-batch, the default of ZeRO-3 and FSDP under gradient accumulation); stages 0–2
    accumulate locally and synchronise once per step.

    Raises:
        ValueError: zero_stage not in 0..3, devices < 1, or a shard group that does not divide the devices.
    """
    if zero_stage not in (0, 1, 2, 3) or devices < 1 or micro_batches < 1:
        raise ValueError(f"zero_stage must be 0..3 and devices, micro_batches >= 1, got {zero_stage}, {devices}, "
                         f"{micro_batches}")
    shard = devices if shard_group is None else shard_group
    if shard < 1 or devices % shard:
        raise ValueError(f"shard_group = {shard_group} must divide devices = {devices}")
    replicas = devices // shard
    size = float(n_params) * comm_bytes
    if zero_stage == 3:
        within = micro_batches * (2 * ring_bytes("all-gather", size, shard) + ring_bytes("reduce-scatter", size, shard))
    else:
        within = ring_bytes("reduce-scatter", size, shard) + ring_bytes("all-gather", size, shard)
    across = ring_bytes("all-reduce", size / shard, replicas)
    return DataParallelTraffic(within, across, shard, replicas, devices)


# --- docs/methods.md §2, §4: mixture of experts -----------------------------------------------------------------------

@dataclass(frozen=True)
class MoEShape:
    """Routed feed-forward layers replacing the dense FFN of ``ModelConfig`` in some blocks.

    Attributes:
        experts: E, SwiGLU experts per MoE layer, each of width ``d_ff_expert``.
        top_k: k experts each token is dispatched to.
        moe_layers: 0-based indices of the blocks whose FFN is routed.
        d_ff_expert: hidden width of one expert.
        capacity_factor: C; each expert takes at most C·tokens·k/E tokens of a routed group (Fedus et al. 2022).
        aux_loss_coef: α of the load-balancing loss α·E·Σ f_i·P_i (Fedus et al. 2022 use 1e-2).
    """

    experts: int
    top_k: int
    moe_layers: tuple[int, ...]
    d_ff_expert: int
    capacity_factor: float = 1.0
    aux_loss_coef: float = 0.01

    def __post_init__(self) -> None:
        if self.experts < 1 or not 1 <= self.top_k <= self.experts:
            raise ValueError(f"need 1 <= top_k <= experts, got top_k = {self.top_k}, experts = {self.experts}")
        if self.d_ff_expert < 1 or self.capacity_factor <= 0:
            raise ValueError(f"d_ff_expert and capacity_factor must be positive, got {self.d_ff_expert}, "
                             f"{self.capacity_factor}")


@dataclass(frozen=True)
class MoEParamCount:
    """Parameter counts of a decoder with routed layers.

    Attributes:
        total: every parameter, all experts included (what is stored and checkpointed).
        active: the parameters one token uses: the dense ones, the router and k experts per MoE layer.
        expert: the expert FFNs of all MoE layers, E·3·d·d_ff_expert each (sharded by expert parallelism).
        dense: total − expert: attention, dense FFNs, routers, embeddings, norms (replicated across the
            expert-parallel group).
        router: d·E per MoE layer.
    """

    total: int
    active: int
    expert: int
    dense: int
    router: int


def moe_param_count(cfg: ModelConfig, moe: MoEShape) -> MoEParamCount:
    """Counts of ``cfg`` with the FFN of each MoE layer replaced by E experts and a d × E router (no bias):
    N_total = N_dense − n_moe·3·d·d_ff + n_moe·(E·3·d·d_ff_e + d·E); N_active has k in place of E in the
    expert term (docs/methods.md §2 per-layer counts; Lepikhin et al. 2020; Fedus et al. 2022).

    Raises:
        ValueError: an MoE layer index outside 0..n_layers − 1.
    """
    _check_layers(cfg, moe)
    d, n_moe = cfg.d_model, len(moe.moe_layers)
    base = param_count(cfg).total
    expert_ffn = 3 * d * moe.d_ff_expert
    router = n_moe * d * moe.experts
    without_dense_ffn = base - n_moe * 3 * d * cfg.d_ff + router
    expert = n_moe * moe.experts * expert_ffn
    return MoEParamCount(total=without_dense_ffn + expert, active=without_dense_ffn + n_moe * moe.top_k * expert_ffn,
                         expert=expert, dense=without_dense_ffn, router=router)


def _check_layers(cfg: ModelConfig, moe: MoEShape) -> None:
    bad = [i for i in moe.moe_layers if not 0 <= i < cfg.n_layers]
    if bad or len(set(moe.moe_layers)) != len(moe.moe_layers):
        raise ValueError(f"MoE layers {list(moe.moe_layers)} must be distinct block indices in 0..{cfg.n_layers - 1}")


def moe_flops_per_token(cfg: ModelConfig, moe: MoEShape) -> float:
    """Training FLOPs per token from the active parameters, 6·N_active_matmul + 6·L·d·T (docs/methods.md §1 with N
    → N_active; the untied input embedding is a lookup). The router's d·E matmul is active and counted."""
    n_matmul = moe_param_count(cfg, moe).active - (0 if cfg.tied_embeddings else cfg.vocab_size * cfg.d_model)
    return float(6 * n_matmul + 6 * cfg.n_layers * cfg.d_model * cfg.seq_len)


def expert_capacity(tokens: float, moe: MoEShape) -> float:
    """Tokens one expert accepts from a routed group of ``tokens``: C·tokens·k/E (Fedus et al. 2022 for k = 1;
    GShard's 2·tokens/E for top-2 at C = 1, Lepikhin et al. 2020). Assignments past it are dropped (the token
    skips the expert through the residual)."""
    return moe.capacity_factor * tokens * moe.top_k / moe.experts


def dropped_share_bounds(moe: MoEShape) -> tuple[float, float]:
    """(least, most) share of the token→expert assignments that capacity drops, over all routings.

    Least: max(0, 1 − C): the E experts hold C·tokens·k slots for tokens·k assignments. Most: max(0, 1 − C·k/E),
    reached when every token picks the same k experts (no expert can receive a token twice, so each holds at most
    ``tokens`` and keeps min(tokens, capacity)). At perfect balance and C ≥ 1 nothing is dropped.
    """
    c, k, e = moe.capacity_factor, moe.top_k, moe.experts
    return max(0.0, 1.0 - c), max(0.0, 1.0 - c * k / e)


def load_balancing_loss(dispatch_share: Sequence[float], router_probability: Sequence[float], alpha: float) -> float:
    """Switch Transformer auxiliary loss α·E·Σ_i f_i·P_i (Fedus et al. 2022): f_i the share of assignments sent
    to expert i, P_i its mean router probability over the tokens. With f_i = P_i = 1/E (perfect balance) it is α;
    with every token sent to one expert with probability 1 it is α·E.

    Raises:
        ValueError: the two sequences differ in length or are empty.
    """
    if len(dispatch_share) != len(router_probability) or not dispatch_share:
        raise ValueError(f"need one f_i and one P_i per expert, got {len(dispatch_share)} and "
                         f"{len(router_probability)}")
    return alpha * len(dispatch_share) * sum(f * p for f, p in zip(dispatch_share, router_probability))


def all_to_all_bytes(tokens: float, d_model: int, top_k: int, expert_parallel: int, dtype_bytes: int = 2) -> float:
    """Bytes one device sends in one all-to-all of an MoE layer: tokens·d·bytes·k·(EP − 1)/EP, its ``tokens``
    each copied to k experts, of which (EP − 1)/EP live on other devices on average (Lepikhin et al. 2020,
    GShard's dispatch and combine). Capacity padding would multiply it by C."""
    if expert_parallel < 1:
        raise ValueError(f"expert_parallel must be >= 1, got {expert_parallel}")
    return float(tokens) * d_model * dtype_bytes * top_k * (expert_parallel - 1) / expert_parallel


def moe_step_all_to_all_bytes(cfg: ModelConfig, moe: MoEShape, *, micro_batch: int, micro_batches: int,
                              expert_parallel: int, dtype_bytes: int = 2) -> float:
    """Bytes each device sends in the all-to-alls of one optimiser step: 4 per MoE layer per micro-batch
    (dispatch and combine, forward and backward), each ``all_to_all_bytes`` of the micro-batch's b·T tokens."""
    each = all_to_all_bytes(micro_batch * cfg.seq_len, cfg.d_model, moe.top_k, expert_parallel, dtype_bytes)
    return 4.0 * len(moe.moe_layers) * micro_batches * each


def moe_activation_bytes(cfg: ModelConfig, moe: MoEShape, micro_batch: int, *, checkpointing: bool = False) -> float:
    """Saved bf16 activations of one micro-batch (an estimate after docs/methods.md §3): an MoE block stores the
    dense block's 12·d + 4·n_kv·d_h, then per token C·k expert slots of 6·d_ff_expert + 2·d (SwiGLU internals and
    the dispatched input copy) and 4·E bytes of fp32 router probabilities. Full checkpointing keeps 2·d per token
    per block plus the largest block's activations."""
    _check_layers(cfg, moe)
    tokens = cfg.seq_len * micro_batch
    dense = activation_bytes_per_token_layer(cfg)
    attention = dense - 6 * cfg.d_ff
    routed = attention + moe.capacity_factor * moe.top_k * (6 * moe.d_ff_expert + 2 * cfg.d_model) + 4 * moe.experts
    n_moe = len(moe.moe_layers)
    if checkpointing:
        largest = max(routed, dense) if n_moe < cfg.n_layers else routed
        return float(2 * cfg.d_model * cfg.n_layers * tokens + largest * tokens)
    return float(((cfg.n_layers - n_moe) * dense + n_moe * routed) * tokens)


def moe_state_bytes(counts: MoEParamCount, zero_stage: int, *, shard: int, expert_parallel: int,
                    bytes_per_param: int = 16) -> float:
    """Model states per device with expert parallelism (docs/methods.md §3 ZeRO forms): the dense parameters
    sharded by ZeRO over the ``shard`` ranks; each device holds E/EP experts, 1/EP of the expert parameters,
    sharded by ZeRO over the shard/EP ranks that hold the same experts (Rajbhandari et al. 2022, DeepSpeed-MoE).

    Raises:
        ValueError: expert_parallel does not divide shard.
    """
    if expert_parallel < 1 or shard % expert_parallel:
        raise ValueError(f"expert_parallel = {expert_parallel} must divide the shard group of {shard} devices")
    return (model_state_bytes(counts.dense, zero_stage, shard, bytes_per_param)
            + model_state_bytes(counts.expert / expert_parallel, zero_stage, shard // expert_parallel,
                                bytes_per_param))


def moe_memory_fit(cfg: ModelConfig, moe: MoEShape, *, micro_batch: int, device_gb: float, zero_stage: int,
                   shard: int, expert_parallel: int, checkpointing: bool = False, headroom: float = 0.0,
                   bytes_per_param: int = 16, activation_dtype_bytes: int = 2) -> MemoryFit:
    """States (``moe_state_bytes``) + activations (``moe_activation_bytes``) + fp32 logits per device."""
    return MemoryFit(
        states=moe_state_bytes(moe_param_count(cfg, moe), zero_stage, shard=shard, expert_parallel=expert_parallel,
                               bytes_per_param=bytes_per_param),
        activations=moe_activation_bytes(cfg, moe, micro_batch, checkpointing=checkpointing)
        * activation_dtype_bytes / 2,
        logits=logits_bytes(cfg, micro_batch),
        device_bytes=device_gb * 1e9,
        headroom=headroom,
    )


def moe_data_parallel_traffic(counts: MoEParamCount, zero_stage: int, devices: int, *, expert_parallel: int,
                              shard_group: int | None = None, comm_bytes: int = 2,
                              micro_batches: int = 1) -> DataParallelTraffic:
    """``data_parallel_traffic`` of an MoE: the dense parameters over the shard group S, each device's 1/EP of the
    expert parameters over the S/EP ranks holding the same experts (same replica groups across).

    Raises:
        ValueError: as ``data_parallel_traffic``, or expert_parallel does not divide the shard group.
    """
    shard = devices if shard_group is None else shard_group
    if expert_parallel < 1 or shard % expert_parallel:
        raise ValueError(f"expert_parallel = {expert_parallel} must divide the shard group of {shard} devices")
    dense = data_parallel_traffic(counts.dense, zero_stage, devices, shard_group=shard, comm_bytes=comm_bytes,
                                  micro_batches=micro_batches)
    expert = data_parallel_traffic(counts.expert / expert_parallel, zero_stage, devices // expert_parallel,
                                   shard_group=shard // expert_parallel, comm_bytes=comm_bytes,
                                   micro_batches=micro_batches)
    return DataParallelTraffic(dense.within + expert.within, dense.across + expert.across, shard, dense.replicas,
                               devices)
