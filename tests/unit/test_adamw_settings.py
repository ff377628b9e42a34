"""AdamW's β1, β2, ε and weight decay per training stage in TOML (``[<stage>.budget.adamw]``): they reach the
optimiser every stage builds (fresh or resumed), move the stage keys only when set, and one optimiser step equals the
closed-form AdamW update (Loshchilov & Hutter 2019; Kingma & Ba 2015, Algorithm 1)."""

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from flows.config import load_config
from flows.keys import chain_keys
from infra.errors import ConfigError
from models.config import ModelConfig
from models.decoder import Decoder
from tasks.train.config import OptimConfig
from tasks.train.data import MixtureSampler
from tasks.train.optim import build_optimizer
from tasks.train.runner import run_training
from tasks.train.sections import AdamWConfig, RunBudget

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "smoke.toml"
SET = {"beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "weight_decay": 0.05}
TINY = ModelConfig(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, vocab_size=64, seq_len=8)


def _sampler() -> MixtureSampler:
    tokens = np.random.default_rng(0).integers(0, TINY.vocab_size, 4_000).astype(np.uint16)
    return MixtureSampler({"a": tokens}, {"a": 1.0}, seq_len=TINY.seq_len, batch_size=2, seed=0)


def _overrides(section: str, values: dict) -> dict:
    return {f"{section}.budget.adamw.{k}": v for k, v in values.items()}


@pytest.fixture(scope="module")
def smoke():
    return load_config(SMOKE)


@pytest.fixture(scope="module")
def smoke_keys(smoke):
    return {name: k.key for name, k in chain_keys(smoke).items()}


def _check_groups(optimizer: torch.optim.Optimizer, model: nn.Module, adamw: dict) -> None:
    """Betas and ε on every group; λ on the group of 2-D weights only, and every 2-D weight (and only they) in it."""
    by_name = {g["name"]: g for g in optimizer.param_groups}
    assert set(by_name) == {"decayed_matrices", "norms"}
    for group in by_name.values():
        assert group["betas"] == (adamw["beta1"], adamw["beta2"]) and group["eps"] == adamw["eps"]
    assert by_name["decayed_matrices"]["weight_decay"] == adamw["weight_decay"]
    assert by_name["norms"]["weight_decay"] == 0.0
    decayed = {id(p) for p in by_name["decayed_matrices"]["params"]}
    assert decayed == {id(p) for p in model.parameters() if p.ndim == 2}


@pytest.mark.parametrize("section", ["main", "proxy", "cpt"])
def test_toml_settings_reach_the_optimiser_of_each_stage(section):
    cfg = load_config(SMOKE, _overrides(section, SET))
    budget = getattr(cfg, section).budget
    assert budget.adamw == AdamWConfig(**SET)
    budget = budget.model_copy(update={"steps": 2, "warmup_steps": 1, "eval_every": 0, "eval_tokens": 8,
                                       "batch_size": 2})
    model = Decoder(TINY)
    result = run_training(model, _sampler(), peak_lr=1e-3, budget=budget, seed=0)  # the fresh optimiser
    _check_groups(result.optimizer, model, SET)
    # A given optimiser (a resume: loading a checkpoint restores the groups' saved settings) takes the budget's.
    model = Decoder(TINY)
    defaults = build_optimizer(model, OptimConfig(peak_lr=1e-3, warmup_steps=0))
    result = run_training(model, _sampler(), peak_lr=1e-3, budget=budget, seed=0, optimizer=defaults)
    assert result.optimizer is defaults
    _check_groups(defaults, model, SET)


def test_the_resumed_optimiser_keeps_the_configured_settings_over_a_checkpoint(tmp_path):
    """Save with the defaults, load into an optimiser: torch restores the saved groups; ``run_training`` then sets
    the budget's settings, as the main stage's resume path does."""
    from tasks.train.checkpoint import Checkpointer
    from tasks.train.loop import TrainState

    budget = RunBudget(steps=3, batch_size=2, warmup_steps=1, eval_tokens=8, adamw=AdamWConfig(**SET))
    model = Decoder(TINY)
    saved = build_optimizer(model, OptimConfig(peak_lr=1e-3, warmup_steps=0))
    sampler = _sampler()
    run_training(model, sampler, peak_lr=1e-3, budget=budget.model_copy(update={"steps": 1, "adamw": AdamWConfig()}),
                 seed=0, optimizer=saved)
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(tmp_path / "step_00000001", model=model, optimizer=saved, state=TrainState(step=1),
                      sampler_state=sampler.state_dict())
    model = Decoder(TINY)
    optimizer = build_optimizer(model, OptimConfig(peak_lr=1e-3, warmup_steps=0, **SET))
    loaded = checkpointer.load(tmp_path / "step_00000001", model=model, optimizer=optimizer)
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.95)  # what the checkpoint held
    run_training(model, _sampler(), peak_lr=1e-3, budget=budget, seed=0, state=loaded["state"], optimizer=optimizer)
    _check_groups(optimizer, model, SET)


def test_default_dumps_are_unchanged(smoke):
    """At the defaults no budget dumps an ``adamw`` table: the dumps (and keys) are those from before the table."""
    assert smoke.main.budget.model_dump() == {"steps": 16, "batch_size": 8, "warmup_steps": 2, "eval_every": 8,
                                              "eval_tokens": 2048, "schedule": "wsd", "decay_fraction": 0.2,
                                              "decay_shape": "1-sqrt"}
    assert smoke.proxy.budget.model_dump() == {"steps": 12, "batch_size": 8, "warmup_steps": 2, "eval_every": 0,
                                               "eval_tokens": 2048}
    for section in (smoke.main, smoke.proxy, smoke.cpt):
        assert "adamw" not in section.budget.model_dump()
        assert "adamw" not in section.model_dump_json()


def test_a_change_moves_the_stage_keys_and_the_defaults_written_out_do_not(smoke_keys):
    for section, first in (("main", "main"), ("proxy", "mixture"), ("cpt", "cpt")):
        keys = {n: k.key for n, k in chain_keys(load_config(SMOKE, _overrides(section, {"beta2": 0.99}))).items()}
        assert keys[first] != smoke_keys[first], section
        written = load_config(SMOKE, _overrides(section, AdamWConfig().model_dump()))
        assert {n: k.key for n, k in chain_keys(written).items()} == smoke_keys
    keys = {n: k.key for n, k in chain_keys(load_config(SMOKE, _overrides("main", {"eps": 1e-6}))).items()}
    assert keys["main"] != smoke_keys["main"] and keys["branches"] != smoke_keys["branches"]
    assert keys["sweep"] == smoke_keys["sweep"]  # upstream stages do not read [main]


@pytest.mark.parametrize("field, value, words", [
    ("beta1", 1.0, "main.budget.adamw.beta1: Input should be less than 1"),
    ("beta2", -0.1, "main.budget.adamw.beta2: Input should be greater than or equal to 0"),
    ("eps", 0.0, "main.budget.adamw.eps: Input should be greater than 0"),
    ("weight_decay", -0.01, "main.budget.adamw.weight_decay: Input should be greater than or equal to 0"),
    ("beta", 0.9, "main.budget.adamw.beta: unknown key"),
    ("eps", "1e-8", "main.budget.adamw.eps: expected a number, got the string '1e-8'"),
])
def test_bad_settings_are_refused_naming_the_field(field, value, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        load_config(SMOKE, {f"main.budget.adamw.{field}": value})


def test_two_adamw_steps_equal_the_closed_form():
    """θ_t = θ_{t−1}(1 − ηλ) − η·m̂_t/(√v̂_t + ε), m̂_t = m_t/(1 − β1^t), v̂_t = v_t/(1 − β2^t) (Loshchilov & Hutter
    2019, Algorithm 2, with torch's ε outside the root). Two steps: at t = 1 the bias correction cancels β1, β2."""
    adamw = load_config(SMOKE, _overrides("main", SET)).main.budget.adamw
    torch.manual_seed(0)
    module = nn.Linear(3, 2).double()  # a 2-D weight (decayed) and a 1-D bias (not)
    lr = 0.01
    optimizer = build_optimizer(module, OptimConfig(peak_lr=lr, warmup_steps=0, **adamw.model_dump()))
    start = {name: p.detach().clone() for name, p in module.named_parameters()}
    grads = [{name: torch.randn_like(p) for name, p in module.named_parameters()} for _ in range(2)]
    for step in grads:
        for name, p in module.named_parameters():
            p.grad = step[name].clone()
        optimizer.step()
    b1, b2, eps = adamw.beta1, adamw.beta2, adamw.eps
    for name, p in module.named_parameters():
        decay = adamw.weight_decay if p.ndim == 2 else 0.0
        theta = start[name].clone()
        m = torch.zeros_like(theta)
        v = torch.zeros_like(theta)
        for t, step in enumerate(grads, start=1):
            g = step[name]
            theta = theta * (1 - lr * decay)
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            theta = theta - lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps)
        assert torch.allclose(p.detach(), theta, rtol=0, atol=1e-14), name


def test_cpt_candidates_and_their_recovery_phase_train_with_the_configured_adamw(tmp_path):
    """A tiny real CPT stage with ``[cpt.budget.adamw]`` set and a recovery axis: the AdamW groups saved with the
    adapted candidate and with its recovered one (which continues the adapted optimiser) hold the settings."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from evals.cloze import ClozeItem
    from infra.runs import RunsLayout
    from infra.stage import StageContext
    from tasks.cpt.stage import run as run_cpt
    from tasks.train.checkpoint import Checkpointer
    from tasks.train.loop import TrainState
    from tasks.train.runner import build_model
    from tasks.train.sections import CptConfig, ModelShape
    from tests.unit.toy_inputs import TOKENIZER_HASH, VOCAB, write_toy_inputs

    inputs = write_toy_inputs(tmp_path / "inputs", {"a": 594, "b": 594, "d": 594})
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(inputs["tokenizer"] / "tokenizer.json"))
    shape = ModelShape(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, seq_len=8)
    model = build_model(shape.build(VOCAB), seed=0)
    main = tmp_path / "inputs" / "main"
    Checkpointer(main, extra={"tokenizer_hash": TOKENIZER_HASH}).save(
        main / "checkpoint", model=model, optimizer=build_optimizer(model, OptimConfig(peak_lr=1e-3, warmup_steps=0)),
        state=TrainState(), sampler_state={})
    budget = RunBudget(steps=3, batch_size=4, warmup_steps=1, eval_tokens=64, adamw=AdamWConfig(**SET))
    cfg = CptConfig(domain_sources=["d"], replay_fractions=[0.25], peak_lrs=[3e-3], budget=budget,
                    recovery_steps=[0, 2], recovery_lr_ratio=0.5)
    out = tmp_path / "runs" / "artifacts" / "cpt" / ".tmp-a"
    out.mkdir(parents=True)
    items = [ClozeItem(f"i{n}", "general" if n % 2 else "domain", " ".join(f"w{(3 * n + j) % 60 + 1}" for j in range(4)),
                       [f" w{n + 1}", f" w{n + 7}"], 0) for n in range(4)]
    ctx = StageContext(out=out, inputs={**inputs, "main": main}, layout=RunsLayout(tmp_path / "runs"), key="k",
                       experiment="t", torch_threads=1)
    run_cpt(ctx, cfg, general=["a", "b"], cloze_items=items)
    for name in ("replay0.25_lr0.003", "replay0.25_lr0.003_rec2"):
        saved = torch.load(out / "candidates" / name / "optimizer.pt", weights_only=True)["param_groups"]
        by_name = {g["name"]: g for g in saved}
        for group in saved:
            assert tuple(group["betas"]) == (SET["beta1"], SET["beta2"]) and group["eps"] == SET["eps"], name
        assert by_name["decayed_matrices"]["weight_decay"] == SET["weight_decay"]
        assert by_name["norms"]["weight_decay"] == 0.0
