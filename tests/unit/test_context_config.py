"""``[cpt] kind = "context_extension"``: the config section, its cross-checks, RoPE fields in TOML, and the committed
context configs, which must equal their parent configs outside [cpt] and [gate] (so the chain up to main is reused
from cache)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from flows.config import load_config
from infra.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CONTEXT = {"target_seq_len": 256, "long_sources": ["handbook_en", "python_doc"],
           "recipes": [{"name": "pi", "position": "interpolation"}, {"name": "none", "position": "none"}]}


def smoke(**overrides):
    return load_config(ROOT / "configs" / "smoke.toml", overrides)


def test_smoke_context_config_loads_and_keeps_domain_adaptation_keys_unchanged():
    cfg = load_config(ROOT / "configs" / "smoke_context.toml")
    assert cfg.cpt.kind == "context_extension"
    assert [r.name for r in cfg.cpt.context.recipes] == ["pi", "abf", "none"]
    assert cfg.cpt.context.target_seq_len == 4 * cfg.main.model.seq_len
    dumped = smoke().cpt.model_dump()
    assert "kind" not in dumped and "context" not in dumped  # domain adaptation dumps (and keys) as before
    assert "context" in cfg.cpt.model_dump()


@pytest.mark.parametrize("child, parent", [("smoke_context.toml", "smoke.toml"), ("context.toml", "demo.toml")])
def test_context_configs_equal_their_parent_outside_cpt_and_gate(child, parent):
    a = tomllib.loads((ROOT / "configs" / child).read_text())
    b = tomllib.loads((ROOT / "configs" / parent).read_text())
    for raw in (a, b):
        raw.pop("name")
        raw.pop("cpt")
        raw.pop("gate")
    assert a == b
    cfg = load_config(ROOT / "configs" / child)
    assert cfg.cpt.context.target_seq_len == 4 * cfg.main.model.seq_len  # 4× the window, as documented


@pytest.mark.parametrize("overrides, message", [
    ({"cpt.kind": "context_extension"}, r"needs a \[cpt.context\] table"),
    ({"cpt.context": CONTEXT}, "applies to kind"),
    ({"cpt.kind": "context_extension", "cpt.context": {**CONTEXT, "long_sources": ["nope"]}}, "not sources"),
    ({"cpt.kind": "context_extension", "cpt.context": {**CONTEXT, "target_seq_len": 64}}, "must exceed"),
    ({"cpt.kind": "context_extension",
      "cpt.context": {**CONTEXT, "recipes": [{"name": "a", "position": "none"}, {"name": "a", "position": "none"}]}},
     "repeat"),
    ({"cpt.kind": "context_extension",
      "cpt.context": {**CONTEXT, "recipes": [{"name": "abf", "position": "rope_base", "rope_theta": 5000.0}]}},
     "not larger than the base's"),
    ({"cpt.kind": "context_extension", "cpt.context": {**CONTEXT, "retrieval_lengths": [512]}}, "retrieval_lengths"),
    ({"cpt.kind": "context_extension", "cpt.context": {**CONTEXT, "retrieval_depths": [1.5]}}, "retrieval_depths"),
])
def test_bad_context_sections_are_refused_with_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        smoke(**overrides)


def test_domain_adaptation_still_needs_a_domain_source():
    with pytest.raises(ConfigError, match="name at least one domain source"):
        smoke(**{"cpt.domain_sources": []})


def test_rope_fields_are_settable_in_toml_and_reach_the_model_config():
    cfg = smoke(**{"main.model.rope_theta": 500000.0, "main.model.rope_scaling_factor": 2.0})
    built = cfg.main.model.build(1024)
    assert (built.rope_theta, built.rope_scaling_factor) == (500000.0, 2.0)
    assert smoke().main.model.model_dump() == {k: v for k, v in cfg.main.model.model_dump().items()
                                               if k not in ("rope_theta", "rope_scaling_factor")}
    with pytest.raises(ConfigError, match="rope_scaling_factor"):
        smoke(**{"main.model.rope_scaling_factor": 0.5})


def test_a_gate_on_context_metrics_needs_a_context_extension():
    criteria = [{"name": "long", "metric": "long_loss_reduction_nats", "op": ">=", "threshold": 0.0}]
    with pytest.raises(ConfigError, match="need \\[cpt\\] kind = 'context_extension'"):
        smoke(**{"gate.criteria": criteria})
    with pytest.raises(ConfigError, match="max_long_loss_reduction"):
        smoke(**{"gate.select": "max_long_loss_reduction"})


def test_a_retrieval_criterion_must_name_an_evaluated_length():
    context = {**CONTEXT, "retrieval_lengths": [64, 256]}
    criteria = [{"name": "r", "metric": "retrieval_accuracy_delta", "op": ">=", "threshold": -0.1, "length": 128}]
    with pytest.raises(ConfigError, match=r"length = 128 is not a passkey length \[64, 256\]"):
        smoke(**{"cpt.kind": "context_extension", "cpt.context": context, "gate.criteria": criteria,
                 "gate.select": "max_long_loss_reduction"})
    # The default lengths: the base window, then doublings up to the target.
    criteria[0]["length"] = 128
    assert smoke(**{"cpt.kind": "context_extension", "cpt.context": CONTEXT, "gate.criteria": criteria}).gate
