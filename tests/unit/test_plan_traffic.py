"""Data-parallel and ZeRO traffic, hybrid sharding, state bytes, the PaLM FLOP count and HFU in ``pretrain plan``
(docs/methods.md §1, §3, §4), each against the closed form with small integers, and the case-study figures of
the plan file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flows.plan import build_plan, load_plan
from infra.errors import ConfigError
from models.arithmetic import flops_per_token, param_count
from models.planning import GB
from models.scaleout import (Links, data_parallel_traffic, hardware_flops_per_token, hfu_from_mfu,
                             palm_flops_per_token, ring_bytes)

CASE_FILE = Path("configs/plan_case_study.toml")
N_CASE = 9_550_729_216


def _rows(path: Path) -> dict[tuple[str, str], tuple[str, str]]:
    return {(t.title.split(":")[0], label): (value, note) for t in build_plan(load_plan(path))
            for label, value, note in t.rows}


def test_ring_collectives():
    assert ring_bytes("all-reduce", 1000, 8) == 2 * 7 / 8 * 1000 == 1750
    assert ring_bytes("reduce-scatter", 1000, 8) == ring_bytes("all-gather", 1000, 8) == 875
    assert ring_bytes("all-reduce", 1000, 1) == 0
    with pytest.raises(ValueError, match="unknown collective"):
        ring_bytes("broadcast", 1000, 8)


def test_zero_traffic_ratio_is_three_halves():
    # N = 1000 bf16 elements over D = 8: ZeRO-1/2 and DDP 2·7/8·1000·2 = 3500 bytes, ZeRO-3 3·7/8·1000·2 = 5250
    low = [data_parallel_traffic(1000, stage, 8).total for stage in (0, 1, 2)]
    full = data_parallel_traffic(1000, 3, 8)
    assert low == [3500, 3500, 3500] and full.total == 5250 and full.total / low[0] == 1.5
    assert full.across == 0 and full.replicas == 1
    # ZeRO-3 repeating its collectives for a = 4 micro-batches: 3·a·(D − 1)/D·N·bytes
    assert data_parallel_traffic(1000, 3, 8, micro_batches=4).total == 4 * 5250
    assert data_parallel_traffic(1000, 1, 8, micro_batches=4).total == 3500  # accumulated locally, synced once
    assert data_parallel_traffic(1000, 1, 8, comm_bytes=4).total == 7000


def test_hybrid_shard_traffic_and_time():
    # N = 1200, D = 16, G = 4 (R = 4 groups), bf16: within 2·3/4·1200·2 = 3600; across 2·3/4·(1200/4)·2 = 900
    hybrid = data_parallel_traffic(1200, 1, 16, shard_group=4)
    assert (hybrid.within, hybrid.across, hybrid.shard, hybrid.replicas) == (3600, 900, 4, 4)
    flat = data_parallel_traffic(1200, 1, 16)
    assert flat.total == 2 * 15 / 16 * 1200 * 2 == hybrid.total  # the same bytes, on faster links
    links = Links(intra_node=100.0, inter_node=10.0, devices_per_node=4)
    assert hybrid.seconds(links) == 3600 / 100 + 900 / 10 and flat.seconds(links) == 4500 / 10
    zero3 = data_parallel_traffic(1200, 3, 16, shard_group=4)
    assert (zero3.within, zero3.across) == (3 * 3 / 4 * 1200 * 2, 900)
    with pytest.raises(ValueError, match="must divide"):
        data_parallel_traffic(1200, 1, 16, shard_group=5)


def test_palm_count_and_hfu():
    n, layers, seq_len, d = 1_000_000, 4, 512, 256
    assert palm_flops_per_token(n, layers, seq_len, d) - 6 * n == 12 * layers * seq_len * d == 6_291_456
    assert hardware_flops_per_token(6 * n, checkpointing=True) == pytest.approx(8 * n)
    assert hardware_flops_per_token(6 * n, checkpointing=False) == 6 * n
    assert hfu_from_mfu(0.3, True) / 0.3 == pytest.approx(8 / 6) and hfu_from_mfu(0.3, False) == 0.3


def test_case_study_keeps_its_figures_and_adds_the_traffic():
    rows = _rows(CASE_FILE)
    assert rows[("pretrain", "training FLOPs")][0] == "1.216e+23"
    assert rows[("pretrain", "elapsed")][0] == "1,055.82 h = 43.99 days"
    assert rows[("pretrain", "model states, ZeRO-1")][0] == "39.64 GB"
    assert rows[("cpt", "model states, ZeRO-3")][0] == "19.10 GB"
    # ZeRO-1 over 80 devices on the 50 GB/s inter-node links: 2·79/80·N·2 bytes
    ddp = 2 * 79 / 80 * N_CASE * 2
    assert rows[("pretrain", "DDP / ZeRO-1 / ZeRO-2 traffic")][0] == \
        f"{ddp / GB:,.2f} GB per step, {ddp / 50e9 * 1e3:,.1f} ms"
    assert rows[("pretrain", "DDP / ZeRO-1 / ZeRO-2 traffic")][1].startswith("← chosen")
    zero3 = 3 * 79 / 80 * N_CASE * 2
    assert rows[("pretrain", "ZeRO-3 traffic")][0] == f"{zero3 / GB:,.2f} GB per step, {zero3 / 50e9:,.2f} s"
    # CPT: ZeRO-3 over the 8 GPUs of one node, 450 GB/s
    cpt = 3 * 7 / 8 * N_CASE * 2
    assert rows[("cpt", "ZeRO-3 traffic")][0] == f"{cpt / GB:,.2f} GB per step, {cpt / 450e9 * 1e3:,.1f} ms"
    # PaLM's count and HFU of the checkpointed pretraining run
    case = load_plan(CASE_FILE).model
    palm = (6 * N_CASE + 12 * 36 * 8192 * 4096) * 2e12
    assert rows[("pretrain", "PaLM FLOPs")][0] == f"{palm:.4g}"
    assert rows[("pretrain", "MFU at the planning rate")][0] == f"{4e14 / 989e12:.1%}"
    assert rows[("pretrain", "HFU at the planning rate")][0] == f"{4e14 / 989e12 * 8 / 6:.1%}"
    assert rows[("pretrain", "HFU at MFU 30% / MFU 40% / MFU 50%")][0] == "40.0% / 53.3% / 66.7%"
    assert rows[("cpt", "HFU at the planning rate")][0] == rows[("cpt", "MFU at the planning rate")][0]
    assert rows[("pretrain", "hardware FLOPs")][0] == f"{flops_per_token(case) * 8 / 6 * 2e12:.4g}"


def test_hybrid_shard_and_state_bytes_in_the_plan_file():
    rows = _rows(CASE_FILE)
    # the variant: ZeRO-3 within G = 8 of 80, 18 bytes per parameter → 18·N/8 per device
    assert rows[("pretrain variant", "model states, ZeRO-3")][0] == f"{18 * N_CASE / 8 / GB:.2f} GB"
    assert rows[("pretrain variant", "model states, ZeRO-0")][0] == f"{18 * N_CASE / GB:.2f} GB"
    within, across = 3 * 7 / 8 * N_CASE * 2, 2 * 9 / 10 * N_CASE / 8 * 2
    assert rows[("pretrain variant", "HSDP traffic")][0] == \
        f"{(within + across) / GB:,.2f} GB per step, {(within / 450e9 + across / 50e9) * 1e3:,.1f} ms"
    # without shard_group the alternative within a node is shown beside the chosen flat layout
    hint = rows[("pretrain", "if HSDP within a node (G = 8)")]
    assert f"states {N_CASE * (4 + 12 / 8) / GB:.2f} GB per device" in hint[1]


@pytest.mark.parametrize("state_bytes, zero1", [(10, 4 + 6 / 8), (18, 4 + 14 / 8), (16, 4 + 12 / 8)])
def test_state_bytes_override(tmp_path, state_bytes, zero1):
    text = CASE_FILE.read_text().replace('name = "cpt"', f'name = "cpt"\nstate_bytes_per_param = {state_bytes}', 1)
    (tmp_path / "p.toml").write_text(text)
    rows = _rows(tmp_path / "p.toml")
    assert rows[("cpt", "model states, ZeRO-0")][0] == f"{state_bytes * N_CASE / GB:.2f} GB"
    assert rows[("cpt", "model states, ZeRO-1")][0] == f"{zero1 * N_CASE / GB:.2f} GB"
    assert rows[("cpt", "model states, ZeRO-3")][0] == f"{state_bytes * N_CASE / 8 / GB:.2f} GB"
    assert (("cpt", "state bytes per parameter") in rows) is (state_bytes != 16)


def test_declared_bandwidths_set_the_times(tmp_path):
    text = CASE_FILE.read_text().replace("inter_node_gb_s = 50.0", "inter_node_gb_s = 25.0", 1)
    (tmp_path / "p.toml").write_text(text)
    ddp = 2 * 79 / 80 * N_CASE * 2
    assert _rows(tmp_path / "p.toml")[("pretrain", "DDP / ZeRO-1 / ZeRO-2 traffic")][0] == \
        f"{ddp / GB:,.2f} GB per step, {ddp / 25e9:,.2f} s"  # 1.51 s: past a second, shown in seconds


def test_new_fields_default_to_the_old_plan(tmp_path):
    """A plan without the new keys prints the old compute and memory rows, and adds only traffic rows."""
    shape = "\n".join(line for line in CASE_FILE.read_text().splitlines()
                      if not re.match(r"(flop_conventions|intra_node|inter_node|devices_per_node)", line))
    (tmp_path / "p.toml").write_text(shape)
    tables = {t.title: [label for label, _, _ in t.rows] for t in build_plan(load_plan(tmp_path / "p.toml"))}
    assert tables["pretrain: compute and time (2e+12 tokens, 80 × H100-SXM)"] == [
        "training FLOPs", "6ND shortcut", "GPU-hours", "elapsed", "elapsed at MFU 30%", "elapsed at MFU 40%",
        "elapsed at MFU 50%"]
    assert tables["cpt: memory per device (ZeRO-3, micro-batch 1)"] == [
        "model states, ZeRO-0", "model states, ZeRO-1", "model states, ZeRO-2", "model states, ZeRO-3",
        "total with full checkpointing"]
    assert param_count(load_plan(tmp_path / "p.toml").model).total == N_CASE


@pytest.mark.parametrize("line, message", [
    ("shard_group = 7", "shard_group = 7 must divide devices = 8"),
    ("shard_group = 16", "shard_group = 16 must divide devices = 8"),
    ("expert_parallel = 2", "runs.1.expert_parallel = 2 needs a [moe] section"),
    ("state_bytes_per_param = 4", "runs.1.state_bytes_per_param"),
    ("inter_node_gb_s = 0.0", "runs.1.inter_node_gb_s"),
])
def test_bad_layouts_are_refused(tmp_path, line, message):
    (tmp_path / "p.toml").write_text(CASE_FILE.read_text().replace('name = "cpt"', f'name = "cpt"\n{line}', 1))
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_plan(tmp_path / "p.toml")


def test_unknown_flop_convention_is_refused(tmp_path):
    (tmp_path / "p.toml").write_text(CASE_FILE.read_text().replace('["palm", "hfu"]', '["palm", "mfu"]'))
    with pytest.raises(ConfigError, match=re.escape("runs.0.flop_conventions.1")):
        load_plan(tmp_path / "p.toml")
