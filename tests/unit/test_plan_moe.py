"""Mixture-of-experts planning (docs/methods.md §2, §4): total and active parameters counted block by block, FLOPs
from the active ones, capacity, the Switch load-balancing loss, dropped-token bounds against a brute force over
every routing, the all-to-all bytes, expert-parallel memory, and the ``[moe]`` plan file."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from flows.plan import build_plan, load_plan
from infra.errors import ConfigError
from models.arithmetic import param_count
from models.config import ModelConfig
from models.planning import GB
from models.scaleout import (MoEShape, all_to_all_bytes, dropped_share_bounds, expert_capacity, load_balancing_loss,
                             moe_activation_bytes, moe_flops_per_token, moe_param_count, moe_state_bytes,
                             moe_step_all_to_all_bytes)

# L 4, d 1024, 8 heads of 128, 4 KV heads, d_ff 4096, V 1000, untied.
SMALL = ModelConfig(n_layers=4, d_model=1024, n_heads=8, n_kv_heads=4, d_ff=4096, vocab_size=1000, seq_len=512,
                    tied_embeddings=False)
E, K, D_FF_E = 8, 2, 2048
EVERY_OTHER = MoEShape(experts=E, top_k=K, moe_layers=(1, 3), d_ff_expert=D_FF_E, capacity_factor=1.25)


def _by_hand(experts_counted: int) -> int:
    """The decoder summed block by block: attention 2·d² + 2·d·n_kv·d_h = 2·1024² + 2·1024·512, norms 2·d, and a
    dense SwiGLU (3·d·4096) or ``experts_counted`` experts (3·d·2048 each) plus a d × 8 router."""
    d = 1024
    total = 2 * 1000 * d + d  # untied embedding and output head, final norm
    for layer in range(4):
        total += 2 * d * d + 2 * d * 4 * 128 + 2 * d
        total += (experts_counted * 3 * d * 2048 + d * 8) if layer in (1, 3) else 3 * d * 4096
    return total


def test_total_and_active_parameters_block_by_block():
    counts = moe_param_count(SMALL, EVERY_OTHER)
    assert counts.total == _by_hand(E) and counts.active == _by_hand(K)
    assert counts.expert == 2 * E * 3 * 1024 * 2048 and counts.router == 2 * 1024 * 8
    assert counts.dense + counts.expert == counts.total
    # one expert as wide as the dense FFN is the dense model plus its d × 1 routers
    single = MoEShape(experts=1, top_k=1, moe_layers=(0, 1, 2, 3), d_ff_expert=4096)
    assert moe_param_count(SMALL, single).total == param_count(SMALL).total + 4 * 1024


def test_flops_per_token_from_active_parameters():
    counts = moe_param_count(SMALL, EVERY_OTHER)
    n_matmul = _by_hand(K) - 1000 * 1024  # the untied input embedding is a lookup
    assert moe_flops_per_token(SMALL, EVERY_OTHER) == 6 * n_matmul + 6 * 4 * 1024 * 512
    assert 6 * counts.active == 6 * _by_hand(K)


def test_capacity_and_load_balancing_loss():
    assert expert_capacity(4096, EVERY_OTHER) == 1.25 * 4096 * 2 / 8 == 1280
    alpha = 0.01
    balanced = [1 / E] * E
    assert load_balancing_loss(balanced, balanced, alpha) == pytest.approx(alpha, rel=1e-12)
    one_hot = [1.0] + [0.0] * (E - 1)
    assert load_balancing_loss(one_hot, one_hot, alpha) == pytest.approx(alpha * E)
    f = [0.5, 0.5, 0, 0, 0, 0, 0, 0]
    p = [0.4, 0.4, 0.1, 0.1, 0, 0, 0, 0]
    assert load_balancing_loss(f, p, alpha) == pytest.approx(0.01 * 8 * (0.2 + 0.2))
    with pytest.raises(ValueError, match="one f_i and one P_i"):
        load_balancing_loss([0.5, 0.5], [1.0], alpha)


@pytest.mark.parametrize("capacity_factor", [0.5, 1.0, 1.5, 2.5])
def test_dropped_share_bounds_match_every_routing(capacity_factor):
    """4 experts, top-2, 4 tokens: all 6⁴ routings, each expert keeping min(load, C·T·k/E) assignments."""
    experts, k, tokens = 4, 2, 4
    shape = MoEShape(experts=experts, top_k=k, moe_layers=(0,), d_ff_expert=8, capacity_factor=capacity_factor)
    capacity = expert_capacity(tokens, shape)
    shares = []
    for routing in itertools.product(itertools.combinations(range(experts), k), repeat=tokens):
        loads = [sum(expert in choice for choice in routing) for expert in range(experts)]
        kept = sum(min(load, capacity) for load in loads)
        shares.append(1 - kept / (tokens * k))
    least, most = dropped_share_bounds(shape)
    assert (least, most) == pytest.approx((min(shares), max(shares)))


def test_all_to_all_bytes():
    # 4096 tokens × d 1024 × 2 bytes × k 2 × 7/8 leave the device in one all-to-all
    assert all_to_all_bytes(4096, 1024, 2, 8) == 4096 * 1024 * 2 * 2 * 7 // 8 == 14_680_064
    assert all_to_all_bytes(4096, 1024, 2, 1) == 0  # every expert local
    # docs/methods.md §4: dispatch + combine of one token, k 2, d 4096, bf16 = 2·k·d·2 = 32,768 B
    assert 2 * all_to_all_bytes(1, 4096, 2, 10**9) == pytest.approx(32_768, rel=1e-8)
    # a step: 4 all-to-alls (dispatch, combine; forward, backward) × 2 MoE layers × 3 micro-batches of 1 × 512 tokens
    step = moe_step_all_to_all_bytes(SMALL, EVERY_OTHER, micro_batch=1, micro_batches=3, expert_parallel=4)
    assert step == 4 * 2 * 3 * 512 * 1024 * 2 * 2 * 3 / 4


def test_expert_parallel_states_and_activations():
    counts = moe_param_count(SMALL, EVERY_OTHER)
    # plain DP over 8 with EP 8: dense states replicated, each device 1/8 of the experts, 16 bytes each
    assert moe_state_bytes(counts, 0, shard=8, expert_parallel=8) == 16 * counts.dense + 16 * counts.expert / 8
    # ZeRO-1 over 16: the dense optimiser share over 16, the experts' over the 2 devices holding the same experts
    assert moe_state_bytes(counts, 1, shard=16, expert_parallel=8) == pytest.approx(
        counts.dense * (4 + 12 / 16) + counts.expert / 8 * (4 + 12 / 2))
    with pytest.raises(ValueError, match="must divide"):
        moe_state_bytes(counts, 1, shard=12, expert_parallel=8)
    # E = k = 1 expert as wide as the dense FFN, C = 1: each routed block adds the 2·d input copy + 4 B of router
    single = MoEShape(experts=1, top_k=1, moe_layers=(0, 1, 2, 3), d_ff_expert=4096, capacity_factor=1.0)
    dense_per_token_layer = 12 * 1024 + 4 * 4 * 128 + 6 * 4096
    assert moe_activation_bytes(SMALL, single, 2) == 4 * (dense_per_token_layer + 2 * 1024 + 4) * 2 * 512


def test_moe_plan_file_prints_the_figures():
    tables = build_plan(load_plan(Path("configs/plan_moe.toml")))
    rows = {(t.title.split(":")[0], label): value for t in tables for label, value, _ in t.rows}
    plan = load_plan(Path("configs/plan_moe.toml"))
    shape = plan.moe.shape(plan.model)
    counts = moe_param_count(plan.model, shape)
    assert rows[("Mixture of experts (8 experts, top-2)", "total parameters")] == f"{counts.total:,}"
    assert rows[("Mixture of experts (8 experts, top-2)", "active parameters")] == f"{counts.active:,}"
    assert rows[("Mixture of experts (8 experts, top-2)", "load-balancing loss")] == "α·E·Σ f_i·P_i, α = 0.01"
    assert rows[("moe pretrain", "training FLOPs")] == f"{moe_flops_per_token(plan.model, shape) * 2e12:.4g}"
    # 1.25 × 8,192 × 2 / 8 = 2,560 tokens per expert per micro-batch
    assert rows[("moe pretrain", "expert capacity")] == "2,560 tokens per expert per micro-batch"
    assert rows[("moe pretrain", "experts per device")] == "1 of 8 per MoE layer"
    step = 4 * 36 * 6 * 8192 * 4096 * 2 * 2 * 7 / 8  # layers × micro-batches × tokens·d·bytes·k·(EP − 1)/EP
    assert rows[("moe pretrain", "all-to-all per step")] == f"{step / GB:,.2f} GB per device, " \
        f"{step / 450e9 * 1e3:,.1f} ms"
    # ZeRO-1 over 80 devices: dense over 80, each device's eighth of the experts over the 10 holding it
    states = counts.dense * (4 + 12 / 80) + counts.expert / 8 * (4 + 12 / 10)
    assert rows[("moe pretrain", "model states, ZeRO-1")] == f"{states / GB:.2f} GB"


def _without_moe(text: str) -> str:
    return text[:text.index("[moe]")] + text[text.index("[[runs]]"):]


@pytest.mark.parametrize("edit, message", [
    (_without_moe, "runs.0.expert_parallel = 8 needs a [moe] section"),
    (lambda t: t.replace("expert_parallel = 8", "expert_parallel = 16"), "must divide moe.experts = 8"),
    (lambda t: t.replace("top_k = 2", "top_k = 9"), "moe.top_k = 9 exceeds moe.experts = 8"),
    (lambda t: t.replace("every = 1 ", "layers = [0, 36] "), "do not fit a model of 36 blocks"),
    (lambda t: t.replace("every = 1 ", "every = 2\nlayers = [1] "), "give one of them"),
])
def test_bad_moe_plans_are_refused(tmp_path, edit, message):
    (tmp_path / "p.toml").write_text(edit(Path("configs/plan_moe.toml").read_text()))
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_plan(tmp_path / "p.toml")
