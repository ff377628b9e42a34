"""The CPT recovery phase (``[cpt] recovery_steps``, docs/methods.md §11): a grid axis that continues each adapted
candidate k steps on general text only at a constant LR. Checked here: the config (dumps and keys unchanged at the
default, clear errors), and a tiny real CPT stage whose recovered candidates equal the adapted weights continued by
hand, count the tokens of both phases, reuse the cache and reach the gate as candidates of their own."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers

from evals.cloze import ClozeItem
from evals.gate import GateConfig, GateCriterion
from flows.config import load_config
from infra.errors import ConfigError
from infra.runs import RunsLayout
from infra.stage import StageContext
from tasks.cpt.stage import run as run_cpt
from tasks.gate.stage import run as run_gate
from tasks.train.checkpoint import Checkpointer, load_model
from tasks.train.config import OptimConfig
from tasks.train.data import IGNORE_INDEX, MixtureSampler
from tasks.train.loop import TrainState
from tasks.train.optim import build_optimizer
from tasks.train.runner import build_model
from tasks.train.sections import CptConfig, ModelShape, RunBudget

from tests.unit.toy_inputs import TOKENIZER_HASH, VOCAB, write_toy_inputs

ROOT = Path(__file__).resolve().parents[2]
BUDGET = RunBudget(steps=4, batch_size=4, warmup_steps=1, eval_every=2, eval_tokens=64)
PEAK_LR, RATIO, SEQ_LEN = 3e-3, 0.5, 8
# Every field [cpt] had before the recovery phase: a domain-adaptation dump holds exactly these at the default.
OLD_FIELDS = {"domain_sources", "replay_fractions", "peak_lrs", "budget", "min_lr_ratio", "seeds", "replay_sampling",
              "replay_weights", "base_checkpoint", "decontaminate"}


def _cpt(**fields) -> CptConfig:
    return CptConfig(**{"domain_sources": ["d"], "replay_fractions": [0.25], "peak_lrs": [PEAK_LR], "budget": BUDGET,
                        **fields})


# ----------------------------------------------------------------------------------------------------- config


def test_default_dump_and_keys_are_as_before_and_the_axis_enters_them():
    assert set(_cpt().model_dump(mode="json")) == OLD_FIELDS
    # [0] is no recovery: an LR for it acts on nothing, so neither field reaches the dump (the stage key).
    assert _cpt(recovery_steps=[0], recovery_lr_ratio=0.3).model_dump(mode="json") == _cpt().model_dump(mode="json")
    on = _cpt(recovery_steps=[0, 50]).model_dump(mode="json")
    assert on["recovery_steps"] == [0, 50] and "recovery_lr_ratio" not in on  # unset: min_lr_ratio, in the dump
    assert _cpt(recovery_steps=[0, 50], recovery_lr_ratio=0.3).model_dump(mode="json")["recovery_lr_ratio"] == 0.3
    smoke = load_config(ROOT / "configs" / "smoke.toml")
    assert set(smoke.cpt.model_dump(mode="json")) == OLD_FIELDS
    assert load_config(ROOT / "configs" / "smoke.toml", {"cpt.recovery_steps": [0, 5]}).cpt.recovers


def test_recovery_lr_is_the_ratio_of_the_peak_or_the_adapt_floor():
    assert _cpt(recovery_steps=[0, 5], recovery_lr_ratio=0.25).recovery_lr(4e-3) == pytest.approx(1e-3)
    assert _cpt(recovery_steps=[0, 5], min_lr_ratio=0.05).recovery_lr(4e-3) == pytest.approx(2e-4)
    assert not _cpt().recovers and _cpt(recovery_steps=[7]).recovers


@pytest.mark.parametrize("fields, match", [
    ({"recovery_steps": [0, 5, 5]}, "recovery_steps .* distinct"),
    ({"recovery_steps": [0, -3]}, "recovery_steps .* ≥ 0"),
    ({"recovery_steps": []}, "recovery_steps"),
    ({"recovery_steps": [0, 5], "min_lr_ratio": 0.0}, "set recovery_lr_ratio"),
    ({"recovery_steps": [0, 5], "recovery_lr_ratio": 0.0}, "recovery_lr_ratio"),
    ({"recovery_steps": [0, 5], "recovery_lr_ratio": 1.5}, "recovery_lr_ratio"),
])
def test_bad_recovery_settings_are_refused(fields, match):
    with pytest.raises((ValueError, ConfigError), match=match):
        _cpt(**fields)


def test_a_context_extension_refuses_the_recovery_axis():
    with pytest.raises(ConfigError, match=r"cpt: .*recovery_steps \[0, 5\] applies to kind = 'domain_adaptation'"):
        load_config(ROOT / "configs" / "smoke_context.toml", {"cpt.recovery_steps": [0, 5]})
    assert load_config(ROOT / "configs" / "smoke_context.toml", {"cpt.recovery_steps": [0]}).cpt.kind == \
        "context_extension"


# ------------------------------------------------------------------------------------------------ the stage


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """Toy shards (general a, b at 0.5 each; domain d), a word-level tokenizer over their ids and a main checkpoint
    of a 1-layer decoder."""
    root = tmp_path_factory.mktemp("inputs")
    found = write_toy_inputs(root, {"a": 594, "b": 594, "d": 594})
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(found["tokenizer"] / "tokenizer.json"))
    shape = ModelShape(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, seq_len=SEQ_LEN)
    model = build_model(shape.build(VOCAB), seed=0)
    main = root / "main"
    Checkpointer(main, extra={"tokenizer_hash": TOKENIZER_HASH}).save(
        main / "checkpoint", model=model, optimizer=build_optimizer(model, OptimConfig(peak_lr=1e-3, warmup_steps=0)),
        state=TrainState(), sampler_state={})
    return {**found, "main": main}


ITEMS = [ClozeItem(f"i{n}", "general" if n % 2 else "domain", " ".join(f"w{(3 * n + j) % 60 + 1}" for j in range(4)),
                   [f" w{n + 1}", f" w{n + 7}"], 0) for n in range(6)]


def _stage(root: Path, inputs: dict, attempt: str, cfg: CptConfig) -> tuple[Path, dict]:
    out = root / "runs" / "artifacts" / "cpt" / f".tmp-{attempt}"
    out.mkdir(parents=True)
    ctx = StageContext(out=out, inputs=inputs, layout=RunsLayout(root / "runs"), key=f"k-{attempt}", experiment="t",
                       torch_threads=1)
    return out, run_cpt(ctx, cfg, general=["a", "b"], cloze_items=ITEMS)


def _continue_by_hand(adapted: Path, streams: dict, steps: int, seed: int, lr: float) -> dict[str, torch.Tensor]:
    """The adapted checkpoint continued ``steps`` AdamW steps at the constant ``lr`` on batches of a and b (0.5
    each), whose rows go on from the adapt loader's position of each source: the reference, written out."""
    model = load_model(adapted)
    optimizer = build_optimizer(model, OptimConfig(peak_lr=lr, warmup_steps=0))
    optimizer.load_state_dict(torch.load(adapted / "optimizer.pt", weights_only=True))
    saved = json.loads((adapted / "state.json").read_text())["sampler"]
    sampler = MixtureSampler(streams, {"a": 0.5, "b": 0.5}, seq_len=SEQ_LEN, batch_size=BUDGET.batch_size, seed=seed,
                             packing="best_fit")  # [packing]'s default
    state = sampler.state_dict()
    state["position"] = {s: saved["position"][s] for s in ("a", "b")}
    state["batches_drawn"] = saved["batches_drawn"]
    sampler.load_state_dict(state)
    model.train()
    for _ in range(steps):
        batch = sampler.next_batch()
        logits = model(batch.x).float()
        nats = F.cross_entropy(logits.flatten(0, 1), batch.y.flatten(), reduction="none", ignore_index=IGNORE_INDEX)
        (nats.sum() * (1 / int((batch.y != IGNORE_INDEX).sum()))).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_recovered_candidates_continue_the_adapted_weights_and_reach_the_gate(tmp_path, inputs):
    from tasks.train.corpus import TokenizedCorpus

    corpus = TokenizedCorpus(inputs["tokenizer"])
    tokens = {s: corpus.stream(s, "train") for s in ("a", "b")}
    cfg = _cpt(recovery_steps=[0, 2, 3], recovery_lr_ratio=RATIO)
    out, summary = _stage(tmp_path, inputs, "first", cfg)
    names = ["base", "replay0.25_lr0.003", "replay0.25_lr0.003_rec2", "replay0.25_lr0.003_rec3"]
    candidates = json.loads((out / "candidates.json").read_text())
    assert list(candidates) == names
    assert summary["trained"] == 3 and summary["reused"] == 0  # the adapt phase once, its recoveries 0 → 2 → 3
    adapted = out / "candidates" / names[1]
    seed = candidates[names[1]]["seed"]
    assert [candidates[n]["recovery_steps"] for n in names] == [None, 0, 2, 3]
    assert [candidates[n]["recovery_lr"] for n in names[1:]] == [None, RATIO * PEAK_LR, RATIO * PEAK_LR]

    # Weights: the adapted candidate continued by hand, 2 and 3 steps (the 3-step one was trained as 2 + 1).
    for name, k in ((names[2], 2), (names[3], 3)):
        expected = _continue_by_hand(adapted, tokens, k, seed, RATIO * PEAK_LR)
        got = load_model(out / "candidates" / name).state_dict()
        for key, tensor in expected.items():
            torch.testing.assert_close(got[key], tensor, rtol=1e-5, atol=1e-7, msg=f"{name} {key}")
    before = load_model(adapted).state_dict()
    assert all(not torch.equal(before[key], tensor) for key, tensor in expected.items() if tensor.ndim == 2)

    # Tokens seen count both phases: 4 adapt steps + k recovery steps of 4 rows × 8 tokens.
    per_step = BUDGET.batch_size * SEQ_LEN
    for name, k in zip(names[1:], (0, 2, 3)):
        state = json.loads((out / "candidates" / name / "state.json").read_text())
        assert (state["step"], state["tokens_seen"]) == (BUDGET.steps + k, (BUDGET.steps + k) * per_step)
        assert candidates[name]["tokens_seen"] == (BUDGET.steps + k) * per_step
    heldout = pd.read_parquet(out / "heldout.parquet")
    rows = heldout[heldout["checkpoint"] == names[3]]
    assert (rows["tokens_seen"] == (BUDGET.steps + 3) * per_step).all() and (rows["recovery_steps"] == 3).all()
    assert heldout.loc[heldout["checkpoint"] == "base", "recovery_steps"].isna().all()
    cloze = pd.read_parquet(out / "cloze.parquet")
    assert sorted(cloze["checkpoint"].unique()) == sorted(names)
    assert cloze.groupby("checkpoint")["recovery_steps"].first().dropna().to_dict() == {
        names[1]: 0, names[2]: 2, names[3]: 3}

    # The gate scores every candidate on the same units and reports the axis.
    gate_out = tmp_path / "gate"
    gate_out.mkdir()
    gate = GateConfig(criteria=[GateCriterion(name="gain", metric="domain_loss_reduction_nats", op=">=",
                                              threshold=0.0)])
    run_gate(StageContext(out=gate_out, inputs={"cpt": out, "main": inputs["main"]},
                          layout=RunsLayout(tmp_path / "runs"), key="g", experiment="t"), gate)
    table = pd.read_parquet(gate_out / "decisions.parquet").set_index("candidate")
    assert list(table.index) == names[1:]
    assert table["param_recovery_steps"].to_dict() == {names[1]: 0, names[2]: 2, names[3]: 3}
    base_domain = candidates["base"]["domain_loss_nats"]
    for name in names[1:]:
        assert table.loc[name, "domain_loss_reduction_nats"] == pytest.approx(
            base_domain - candidates[name]["domain_loss_nats"], abs=1e-9)

    # A longer recovery continues the cached 3-step one; the recovery-free grid trains nothing (its keys stay).
    longer, summary = _stage(tmp_path, inputs, "longer", cfg.model_copy(update={"recovery_steps": [0, 2, 3, 5]}))
    assert summary["trained"] == 1 and summary["reused"] == 3
    expected = _continue_by_hand(adapted, tokens, 5, seed, RATIO * PEAK_LR)
    got = load_model(longer / "candidates" / "replay0.25_lr0.003_rec5").state_dict()
    for key, tensor in expected.items():
        torch.testing.assert_close(got[key], tensor, rtol=1e-5, atol=1e-7)
    plain, summary = _stage(tmp_path, inputs, "plain", _cpt())
    assert summary["trained"] == 0 and summary["reused"] == 1
    assert list(json.loads((plain / "candidates.json").read_text())) == names[:2]
    entry = json.loads((plain / "candidates.json").read_text())[names[1]]
    assert set(entry) == {"replay_fraction", "peak_lr", "seed", "realised_replay_fraction", "general_loss_nats",
                          "domain_loss_nats", "cloze_accuracy"}
    assert "recovery_steps" not in pd.read_parquet(plain / "heldout.parquet").columns
    assert load_file(str(plain / "candidates" / names[1] / "model.safetensors")).keys() == \
        load_file(str(adapted / "model.safetensors")).keys()
    for key, tensor in load_file(str(plain / "candidates" / names[1] / "model.safetensors")).items():
        assert torch.equal(tensor, load_file(str(adapted / "model.safetensors"))[key])
