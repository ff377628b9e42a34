"""RoPE under context extension (docs/methods.md §15): the tables against the closed form, the no-op recipe leaves
a model's logits inside its window unchanged, the recipes' config rules, unchanged dumps at the defaults, and an
interpolated model through the Hugging Face layout and back."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from infra.errors import ConfigError, DataError
from models.config import ModelConfig
from models.context import PositionRecipe, extended_config
from models.decoder import Decoder, rope_tables
from models.hf import LOGIT_TOLERANCE, decoder_from_hf, hf_config, probe_ids, to_hf_model, verify
from tasks.train.sections import ModelShape

EOS, PAD = 0, 1


def _angle(m: int, i: int, head_dim: int, theta: float, s: float) -> float:
    """(m / s)·θ^(−2i/d_h) in float64, independently of torch (Su et al. 2021; Chen et al. 2023)."""
    return (m / s) * theta ** (-2.0 * i / head_dim)


@pytest.mark.parametrize("s", [1.0, 2.0, 4.0, 8.0, 2.5])
@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_rope_tables_match_the_closed_form(s, theta):
    head_dim, seq_len = 16, 300
    cos, sin = rope_tables(head_dim, seq_len, theta, s)
    assert cos.shape == sin.shape == (seq_len, head_dim) and cos.dtype == torch.float32
    for m in (0, 1, 7, 63, 64, 255, 299):
        for i in range(head_dim // 2):
            a = _angle(m, i, head_dim, theta, s)
            for col in (i, i + head_dim // 2):  # rotate-half: pair i sits in columns i and i + d_h/2
                assert abs(float(cos[m, col]) - math.cos(a)) <= 1e-7, (m, i, col)
                assert abs(float(sin[m, col]) - math.sin(a)) <= 1e-7, (m, i, col)


def test_interpolation_maps_position_m_onto_position_m_over_s():
    cos4, sin4 = rope_tables(16, 256, 10000.0, 4.0)
    cos1, sin1 = rope_tables(16, 64, 10000.0)
    assert torch.equal(cos4[::4], cos1) and torch.equal(sin4[::4], sin1)  # m = 4k rotates as k, exactly
    assert not torch.allclose(cos4[1:64], cos1[1:64])


def test_a_larger_base_slows_every_rotation_but_the_first_pair():
    head_dim = 16
    cos, _ = rope_tables(head_dim, 128, 500000.0)
    for i in range(head_dim // 2):
        assert abs(float(cos[100, i]) - math.cos(_angle(100, i, head_dim, 500000.0, 1.0))) <= 1e-7
    slow = [_angle(100, i, head_dim, 500000.0, 1.0) for i in range(1, head_dim // 2)]
    fast = [_angle(100, i, head_dim, 10000.0, 1.0) for i in range(1, head_dim // 2)]
    assert all(a < b for a, b in zip(slow, fast))


def test_unscaled_table_equals_the_table_before_interpolation_existed():
    head_dim, seq_len, theta = 32, 128, 10000.0
    # the formula as it stood before rope_scaling_factor: positions used as they are
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = rope_tables(head_dim, seq_len, theta, 1.0)
    assert torch.equal(cos, angles.cos().float()) and torch.equal(sin, angles.sin().float())
    assert all(torch.equal(a, b) for a, b in zip(rope_tables(head_dim, seq_len, theta), (cos, sin)))


# ------------------------------------------------------------------------------------------------- recipes on a model


T = 16
BASE = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=64, seq_len=T, init_std=0.1)


def _base_model() -> Decoder:
    torch.manual_seed(0)
    return Decoder(BASE).eval()


def _extended(base: Decoder, recipe: PositionRecipe) -> Decoder:
    model = Decoder(extended_config(base.cfg, 4 * T, recipe)).eval()
    model.load_state_dict(base.state_dict())
    return model


@torch.no_grad()
def test_no_op_recipe_keeps_the_logits_inside_the_trained_window():
    base = _base_model()
    none = _extended(base, PositionRecipe(name="none", position="none"))
    assert none.cfg.seq_len == 4 * T and none.cfg.rope_theta == BASE.rope_theta
    assert none.cfg.rope_scaling_factor == 1.0
    ids = torch.randint(0, BASE.vocab_size, (2, 4 * T), generator=torch.Generator().manual_seed(0))
    for length in (1, 5, T):
        assert torch.equal(base(ids[:, :length]), none(ids[:, :length])), length
    assert none(ids).shape == (2, 4 * T, BASE.vocab_size)
    with pytest.raises(DataError, match="exceeds model.seq_len"):
        base(ids)


@torch.no_grad()
@pytest.mark.parametrize("recipe", [PositionRecipe(name="pi", position="interpolation"),
                                    PositionRecipe(name="abf", position="rope_base", rope_theta=5e5)])
def test_position_recipes_change_the_logits_and_take_the_longer_window(recipe):
    base = _base_model()
    model = _extended(base, recipe)
    ids = torch.randint(0, BASE.vocab_size, (2, 4 * T), generator=torch.Generator().manual_seed(0))
    ours, theirs = base(ids[:, :T]), model(ids[:, :T])
    assert torch.equal(ours[:, 0], theirs[:, 0])  # position 0 is never rotated
    assert (ours - theirs).abs().max() > 1e-3
    assert model(ids).shape == (2, 4 * T, BASE.vocab_size)


# ------------------------------------------------------------------------------------------------- config rules


def test_extended_config_applies_each_recipe():
    pi = extended_config(BASE, 64, PositionRecipe(name="pi", position="interpolation"))
    assert (pi.seq_len, pi.rope_scaling_factor, pi.rope_theta) == (64, 4.0, 10000.0)
    fixed = extended_config(BASE, 64, PositionRecipe(name="pi2", position="interpolation", factor=2.0))
    assert fixed.rope_scaling_factor == 2.0
    abf = extended_config(BASE, 64, PositionRecipe(name="abf", position="rope_base", rope_theta=5e5))
    assert (abf.seq_len, abf.rope_scaling_factor, abf.rope_theta) == (64, 1.0, 5e5)
    assert extended_config(BASE, 16, PositionRecipe(name="none", position="none")) == BASE


def test_interpolation_composes_with_an_interpolated_base():
    once = extended_config(BASE, 64, PositionRecipe(name="pi", position="interpolation"))
    twice = extended_config(once, 128, PositionRecipe(name="pi", position="interpolation"))
    assert twice.rope_scaling_factor == 8.0 and twice.seq_len == 128
    fixed = extended_config(once, 192, PositionRecipe(name="pi3", position="interpolation", factor=3.0))
    assert fixed.rope_scaling_factor == 12.0
    kept = extended_config(once, 128, PositionRecipe(name="abf", position="rope_base", rope_theta=5e5))
    assert (kept.rope_scaling_factor, kept.rope_theta) == (4.0, 5e5)


def test_extended_config_refusals():
    with pytest.raises(ValueError, match="shorter than the base's seq_len = 16"):
        extended_config(BASE, 8, PositionRecipe(name="none", position="none"))
    for theta in (10000.0, 5000.0):
        with pytest.raises(ValueError, match="not larger than the base's 10000"):
            extended_config(BASE, 64, PositionRecipe(name="abf", position="rope_base", rope_theta=theta))


@pytest.mark.parametrize("fields, message", [
    (dict(position="rope_base", rope_theta=5e5, factor=2.0), "factor belongs to position = 'interpolation'"),
    (dict(position="rope_base"), "needs rope_theta > 0"),
    (dict(position="interpolation", factor=0.5), "must be >= 1"),
    (dict(position="interpolation", rope_theta=5e5), "rope_theta belongs to position = 'rope_base'"),
    (dict(position="none", factor=2.0), "takes neither factor nor rope_theta"),
    (dict(position="yarn"), "position"),
    (dict(position="none", name="a b"), "recipe name 'a b'"),
])
def test_position_recipe_validation(fields, message):
    with pytest.raises((ValueError, ConfigError), match=message):
        PositionRecipe(**{"name": "r", **fields})


def test_describe_names_what_each_recipe_does():
    assert PositionRecipe(name="pi", position="interpolation").describe(BASE, 64) == \
        "position interpolation ×4 (positions / 4), θ 10000"
    assert PositionRecipe(name="abf", position="rope_base", rope_theta=5e5).describe(BASE, 64) == \
        "RoPE base θ 10000 → 500000"


# ------------------------------------------------------------------------------------------------- unchanged dumps


SHAPE = dict(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, seq_len=16)
MODEL_KEYS = {"n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "seq_len", "tied_embeddings",
              "qk_norm", "rope_theta", "init_std", "norm_eps"}  # ModelConfig's fields before interpolation


def test_default_rope_dumps_as_before():
    cfg = ModelConfig(vocab_size=64, **SHAPE)
    assert set(cfg.model_dump()) == MODEL_KEYS
    assert ModelShape(**SHAPE).model_dump() == {**SHAPE, "tied_embeddings": True, "qk_norm": False}
    assert ModelConfig.model_validate(json.loads(cfg.model_dump_json())) == cfg


def test_non_default_rope_is_dumped():
    cfg = ModelConfig(vocab_size=64, rope_scaling_factor=4.0, rope_theta=5e5, **SHAPE)
    assert cfg.model_dump()["rope_scaling_factor"] == 4.0 and cfg.model_dump()["rope_theta"] == 5e5
    assert ModelConfig.model_validate(json.loads(cfg.model_dump_json())) == cfg
    shape = ModelShape(rope_scaling_factor=4.0, rope_theta=5e5, **SHAPE).model_dump()
    assert (shape["rope_scaling_factor"], shape["rope_theta"]) == (4.0, 5e5)
    assert "rope_scaling_factor" not in ModelShape(rope_theta=5e5, **SHAPE).model_dump()
    assert ModelShape(rope_theta=5e5, **SHAPE).build(64).rope_scaling_factor == 1.0


# ------------------------------------------------------------------------------------------------- Hugging Face


LONG = ModelConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, vocab_size=128, seq_len=64,
                   init_std=0.1, rope_scaling_factor=4.0, rope_theta=5e5)  # a 16-token base window, extended ×4


def _long_model() -> Decoder:
    torch.manual_seed(0)
    model = Decoder(LONG).eval()
    with torch.no_grad():  # norm gains away from 1, as in test_hf_interop
        for p in model.parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    return model


def test_hf_config_of_an_interpolated_model():
    config = hf_config(LONG, bos_id=None, eos_id=EOS, pad_id=PAD)
    assert config.rope_parameters == {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5}
    assert config.max_position_embeddings == 64


def test_interpolated_model_round_trips_through_transformers(tmp_path):
    ours = _long_model()
    to_hf_model(ours, bos_id=None, eos_id=EOS, pad_id=PAD).save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["rope_parameters"] == {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5}
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert isinstance(theirs, LlamaForCausalLM)
    probe = probe_ids(LONG.vocab_size, LONG.seq_len, length=64)
    assert probe.shape == (2, 64)  # four times the 16-token window the positions were scaled from
    result = verify(ours, theirs, probe, prompts=[[5, 6, 7]], max_new_tokens=8, eos_id=EOS, pad_id=PAD)
    print(f"linear RoPE ×4, 64 tokens: {result.describe()}")
    assert result.max_abs_logit_diff <= LOGIT_TOLERANCE and result.passed, result.describe()
    back = decoder_from_hf(tmp_path)
    assert back.cfg == LONG
    assert (back.cfg.rope_scaling_factor, back.cfg.rope_theta, back.cfg.seq_len) == (4.0, 5e5, 64)
    assert all(torch.equal(back.state_dict()[k], v) for k, v in ours.state_dict().items())


@torch.no_grad()
def test_control_interpolated_model_exported_without_its_factor_is_caught():
    ours = _long_model()
    config = hf_config(LONG, bos_id=None, eos_id=EOS, pad_id=PAD)
    config.rope_parameters = {"rope_type": "default", "rope_theta": 5e5}
    theirs = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    theirs.load_state_dict(to_hf_model(ours, bos_id=None, eos_id=EOS, pad_id=PAD).state_dict())
    probe = probe_ids(LONG.vocab_size, LONG.seq_len, length=64)
    result = verify(ours, theirs, probe, prompts=[], max_new_tokens=1, eos_id=EOS)
    assert result.max_abs_logit_diff > LOGIT_TOLERANCE
