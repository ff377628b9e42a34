"""The planner reproduces every docs/methods.md §1–§5 reference figure, and the main run refuses a layout that does not fit."""

import json

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.plan import build_plan, load_plan
from infra.errors import ConfigError
from models.arithmetic import flops_6nd, param_count, training_flops
from models.config import ModelConfig
from models.planning import (DEVICE_PEAK_BF16, GB, Chinchilla, activation_bytes, activation_bytes_per_token_layer,
                             attention_probability_bytes, checkpoint_bytes, elapsed_hours, gpu_hours,
                             korthikanti_activation_bytes, logits_bytes, memory_fit, model_state_bytes,
                             pipeline_bubble, rate_at_mfu, require_fit, served_token_break_even,
                             tensor_parallel_traffic, tokens_per_param_allocation, young_interval)

CASE = ModelConfig(n_layers=36, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=15360, vocab_size=152064,
                   seq_len=8192, tied_embeddings=False)
SMALL = ModelConfig(n_layers=12, d_model=768, n_heads=12, n_kv_heads=12, d_ff=2048, vocab_size=32000, seq_len=2048)
N_CASE = 9_550_729_216


def close(value, expected, rel=5e-4):
    return value == pytest.approx(expected, rel=rel)


def test_compute_and_time_case_study():
    flops = training_flops(CASE, 2e12)
    assert close(flops, 1.216e23) and close(flops_6nd(CASE, 2e12), 1.146e23)
    assert close(flops_6nd(CASE, 2e12) / flops - 1, -0.058, rel=0.02)
    assert gpu_hours(flops) == pytest.approx(84_465.3, abs=0.1)
    assert elapsed_hours(flops, 80) == pytest.approx(1055.82, abs=0.01)
    assert elapsed_hours(flops, 80) / 24 == pytest.approx(43.99, abs=0.01)
    cpt = training_flops(CASE, 2e9)
    assert close(cpt, 1.216e20) and gpu_hours(cpt) == pytest.approx(84.5, abs=0.05)
    assert elapsed_hours(cpt, 8) == pytest.approx(10.56, abs=0.01)
    days = [elapsed_hours(flops, 80, rate_at_mfu(m, DEVICE_PEAK_BF16["H100-SXM"])) / 24 for m in (0.3, 0.4, 0.5)]
    assert [round(d, 1) for d in days] == [59.3, 44.5, 35.6]
    assert close(training_flops(SMALL, 2.5e9), 1.926e18)


@pytest.mark.parametrize("n, d, flops, hours, gpus, days", [
    (9.5e9, 190e9, 1.083e22, 7_520.8, 16, 19.59), (9.5e9, 2e12, 1.140e23, 79_166.7, 80, 41.23),
    (9.5e9, 15e12, 8.550e23, 593_750.0, 80, 309.24), (1e9, 20e9, 1.200e20, 83.3, 4, 0.87),
    (9.5e9, 2e9, 1.140e20, 79.2, 8, 0.41)])
def test_shortcut_table(n, d, flops, hours, gpus, days):
    c6 = 6 * n * d
    assert close(c6, flops, rel=1e-3)
    assert gpu_hours(c6) == pytest.approx(hours, abs=0.05)
    assert elapsed_hours(c6, gpus) / 24 == pytest.approx(days, abs=0.005)


def test_model_states_by_zero_stage():
    assert param_count(CASE).total == N_CASE
    for ranks, expected in [(8, (152.8, 52.5, 35.8, 19.1)), (64, (152.8, 40.0, 21.2, 2.4)),
                            (80, (152.8, 39.6, 20.8, 1.9))]:
        got = tuple(round(model_state_bytes(N_CASE, stage, ranks) / GB, 1) for stage in range(4))
        assert got == expected
    assert model_state_bytes(7e9, 0) / GB == pytest.approx(112.0)
    with pytest.raises(ValueError):
        model_state_bytes(N_CASE, 4, 8)


def test_activations_logits_and_attention():
    assert activation_bytes_per_token_layer(CASE) == 145_408 and 145_408 / CASE.d_model == pytest.approx(35.5)
    assert round(activation_bytes(CASE, 1) / GB, 2) == 42.88
    assert round(activation_bytes(CASE, 1, checkpointing=True) / GB, 2) == 3.61
    assert round(logits_bytes(CASE, 1) / GB, 2) == 4.98
    assert round(attention_probability_bytes(CASE, 1) / GB, 1) == 154.6
    assert round(korthikanti_activation_bytes(32, 4096, 1, 4096, 32) / GB, 1) == 104.2
    assert round(korthikanti_activation_bytes(32, 4096, 1, 4096, 32, scores=False) / GB, 1) == 18.3
    assert round(2 * 4096 * 4096 * 32 / GB, 2) == 1.07  # checkpointed primer form: 2·s·b·h per layer


@pytest.mark.parametrize("cfg, kwargs, total, fits", [
    (CASE, dict(micro_batch=1, zero_stage=3, ranks=8, device_gb=80), 66.97, True),
    (CASE, dict(micro_batch=1, zero_stage=3, ranks=8, device_gb=80, checkpointing=True), 27.69, True),
    (CASE, dict(micro_batch=1, zero_stage=1, ranks=80, device_gb=80), 87.50, False),
    (SMALL, dict(micro_batch=16, device_gb=24), 15.61, True),
    (SMALL, dict(micro_batch=32, device_gb=24), 29.47, False),
])
def test_fit_table(cfg, kwargs, total, fits):
    fit = memory_fit(cfg, **kwargs)
    assert round(fit.total / GB, 2) == total and fit.fits is fits
    assert ("does NOT fit" in fit.describe()) is not fits


def test_parallelism_and_recovery():
    assert [round(pipeline_bubble(p, m), 3) for p, m in [(4, 4), (4, 16), (8, 8), (8, 64)]] == \
        [0.429, 0.158, 0.467, 0.099]
    each, per_step = tensor_parallel_traffic(CASE)
    assert each == 67_108_864 and round(per_step / GB, 2) == 9.66
    assert per_step / 450e9 * 1e3 == pytest.approx(21.5, abs=0.05) and per_step / 50e9 * 1e3 == pytest.approx(193, abs=0.5)
    tau, overhead = young_interval(60, 3.09 * 3600)
    assert tau / 60 == pytest.approx(19.3, abs=0.05) and overhead == pytest.approx(0.104, abs=5e-4)
    tau, overhead = young_interval(60, 633 * 3600)
    assert tau / 60 == pytest.approx(275.6, abs=0.05) and overhead == pytest.approx(0.007, abs=5e-4)
    assert young_interval(60, 3 * 3600)[1] == pytest.approx(0.105, abs=5e-4)
    assert young_interval(10, 3 * 3600)[1] == pytest.approx(0.043, abs=5e-4)
    states, with_weights = checkpoint_bytes(N_CASE)
    assert round(states / GB, 1) == 114.6 and round(with_weights / GB, 1) == 133.7


def test_chinchilla_allocation_case_study():
    law = Chinchilla()
    assert law.loss(N_CASE, 2e12) == pytest.approx(2.001990, abs=1e-6)
    c6 = 6 * N_CASE * 2e12
    n, d = law.optimum(c6)
    assert n / 1e9 == pytest.approx(15.526, abs=1e-3) and d / 1e12 == pytest.approx(1.230, abs=1e-3)
    assert law.loss(n, d) == pytest.approx(1.998483, abs=1e-6)
    n20, d20 = tokens_per_param_allocation(c6)
    assert n20 / 1e9 == pytest.approx(30.904, abs=1e-3) and d20 / 1e12 == pytest.approx(0.618, abs=1e-3)
    assert law.loss(n20, d20) == pytest.approx(2.005373, abs=1e-6)
    n_eq, d_eq = law.equal_loss_optimum(law.loss(N_CASE, 2e12))
    assert n_eq / 1e9 == pytest.approx(15.018, abs=1e-3) and d_eq / 1e12 == pytest.approx(1.182, abs=1e-3)
    assert 6 * n_eq * d_eq == pytest.approx(1.065e23, rel=5e-4)
    assert served_token_break_even(N_CASE, 2e12, n_eq, d_eq) == pytest.approx(7.439e11, rel=5e-4)
    with pytest.raises(ValueError):
        law.equal_loss_optimum(1.5)


def test_seven_b_compute_optimal():
    c = 6 * 7e9 * (20 * 7e9)
    assert c == pytest.approx(5.88e21) and gpu_hours(c) == pytest.approx(4083, abs=1)


def test_case_study_plan_file_renders_the_reference_table():
    rows = {(t.title.split(":")[0], label): value for t in build_plan(load_plan("configs/plan_case_study.toml"))
            for label, value, _ in t.rows}
    assert rows[("Model", "parameters")] == "9,550,729,216"
    assert rows[("pretrain", "GPU-hours")] == "84,465.3"
    assert rows[("pretrain", "elapsed")] == "1,055.82 h = 43.99 days"
    assert rows[("pretrain", "global batch")] == "480 sequences" and rows[("cpt", "global batch")] == "128 sequences"
    assert rows[("cpt", "model states, ZeRO-3")] == "19.10 GB"
    assert rows[("Chinchilla allocation (L = 1.69 + 406.4/N^0.34 + 410.7/D^0.28, C6 = 6ND)",
                 "served-token break-even")] == "7.439e+11 tokens"


def test_plan_command_prints_json_and_rejects_bad_plans(tmp_path):
    result = CliRunner().invoke(app, ["plan", "configs/plan_case_study.toml", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert {"section", "label", "value", "note"} <= set(rows[0])
    bad = tmp_path / "bad.toml"
    with open("configs/plan_case_study.toml") as f:
        bad.write_text(f.read().replace('device = "H100-SXM"', 'device = "TPU"', 1))
    result = CliRunner().invoke(app, ["plan", str(bad)])
    assert result.exit_code == 2 and "runs.0.device" in result.output


def test_experiment_config_is_planned_from_its_main_section():
    rows = {label: value for t in build_plan(load_plan("configs/demo.toml")) for label, value, _ in t.rows}
    demo_main = ModelConfig(n_layers=4, d_model=128, n_heads=4, n_kv_heads=2, d_ff=352, vocab_size=4096, seq_len=256)
    assert rows["parameters"] == f"{param_count(demo_main).total:,}"
    assert rows["global batch"] == "8 sequences"


def test_main_run_refuses_a_layout_that_does_not_fit():
    with pytest.raises(ConfigError, match=r"does not fit on .*states.*activations.*logits"):
        require_fit(CASE, micro_batch=64)
    assert require_fit(SMALL.model_copy(update={"n_layers": 2}), micro_batch=1).fits


@pytest.mark.parametrize("line, field", [("mfu = [0.3, 1.5]", "runs.0.mfu"), ("mfu = [0.0]", "runs.0.mfu"),
                                         ("tokens = inf", "runs.0.tokens")])
def test_plan_rejects_impossible_utilisation_and_infinite_tokens(tmp_path, line, field):
    with open("configs/plan_case_study.toml") as f:
        text = f.read().replace('name = "pretrain"', f'name = "pretrain"\n{line}', 1)
    if line.startswith("tokens"):
        text = text.replace("tokens = 2e12\n", "", 1)
    (tmp_path / "p.toml").write_text(text)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_plan(tmp_path / "p.toml")


def test_break_even_edges_and_out_of_range_targets():
    assert served_token_break_even(1e9, 2e10, 1e9, 2e10) == 0.0  # already the optimum
    assert served_token_break_even(2e9, 2e10, 1e9, 2e10) == float("inf")  # bigger and dearer: never
    law = Chinchilla()
    for target in (1.6921, 40.0, float("nan")):
        with pytest.raises(ValueError, match="outside"):
            law.equal_loss_optimum(target)
