"""End to end: continued pretraining of a released Hugging Face base through ``pretrain run``.

A tiny random Llama (GQA, untied head) and a small byte-level BPE trained on the smoke fixtures' text are saved
into one folder, as ``save_pretrained`` writes them. The smoke config then adopts that tokenizer
(``[tokenizer] pretrained``) and starts CPT from that model (``[cpt] base_checkpoint``); the gate must compare the
base with the candidates and record a decision; the export stage then writes the kept model as a verified Hugging
Face folder with the base's own EOS token.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pandas as pd
import pytest
import torch

from conftest import ROOT, pretrain, stage_status
from flows.registry import stage_names

pytestmark = pytest.mark.e2e

VOCAB = 512
EOS_TOKEN, EOS_ID = "</s>", 2


def build_base(folder: Path) -> "torch.nn.Module":
    """Save a tiny random ``LlamaForCausalLM`` and its tokenizer (BPE on the smoke fixtures, EOS ``</s>``) into
    ``folder``; returns the transformers model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    texts = [p.read_text(encoding="utf-8", errors="ignore")
             for p in sorted((ROOT / "tests" / "fixtures" / "smoke").rglob("*")) if p.is_file()]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<unk>", "<s>", EOS_TOKEN], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    assert tok.get_vocab_size() == VOCAB and tok.token_to_id(EOS_TOKEN) == EOS_ID
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token=EOS_TOKEN,
                            unk_token="<unk>").save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=1, eos_token_id=EOS_ID, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    return model


def _config(base: Path) -> str:
    """The smoke config with the HF base's tokenizer and weights, and a smaller CPT grid and sweep."""
    text = (ROOT / "configs" / "smoke.toml").read_text()
    edits = {'name = "smoke"': 'name = "smoke-hf-base"',
             "[tokenizer]\n": f'[tokenizer]\npretrained = "{base}"\n',
             "[cpt]\n": f'[cpt]\nbase_checkpoint = "{base}"\n',
             "replay_fractions = [0.1, 0.3]": "replay_fractions = [0.1]",
             "n_trials = 4": "n_trials = 2"}
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def test_cpt_from_a_hugging_face_base_reaches_a_gate_decision(tmp_path, record_property):
    from models.hf import LOGIT_TOLERANCE, decoder_from_hf, probe_ids
    from tasks.tokenizer.fit import tokenizer_hash
    from tokenizers import Tokenizer

    base = tmp_path / "tiny-llama"
    theirs = build_base(base)
    ours = decoder_from_hf(base)
    probe = probe_ids(VOCAB, 64, rows=2, length=64)
    with torch.no_grad():
        diff = float((ours(probe) - theirs(input_ids=probe).logits).abs().max())
    print(f"HF base: max |logit difference| transformers vs imported decoder = {diff:.3g}")
    record_property("max_abs_logit_diff", diff)
    assert diff <= LOGIT_TOLERANCE

    config = tmp_path / "hf-base.toml"
    config.write_text(_config(base))
    runs = tmp_path / "runs"
    proc = pretrain("run", str(config), runs=runs)
    assert stage_status(proc.stdout) == {name: "ran" for name in stage_names()}

    artifacts = runs / "artifacts"
    (tok_dir,) = (artifacts / "tokenizer").glob("*/tokenizer.meta.json")
    meta = json.loads(tok_dir.read_text())
    base_hash = tokenizer_hash(Tokenizer.from_file(str(base / "tokenizer.json")))
    assert meta["tokenizer_hash"] == base_hash
    assert (meta["eos_id"], meta["vocab_size"], meta["padded_vocab_size"]) == (EOS_ID, VOCAB, VOCAB)
    assert meta["pretrained"]["eos_token"] == EOS_TOKEN
    headers = pd.read_parquet(tok_dir.parent / "shards.parquet")
    assert set(headers["dtype"]) == {"uint16"}
    shard = json.loads((tok_dir.parent / "shards" / "python_doc" / "train.json").read_text())
    assert (shard["eos_id"], shard["tokenizer_hash"]) == (EOS_ID, base_hash)

    (cpt_dir,) = [p.parent for p in (artifacts / "cpt").glob("*/candidates.json")]
    candidates = json.loads((cpt_dir / "candidates.json").read_text())
    assert candidates["base"]["checkpoint"] == str(base)
    assert sorted(candidates) == ["base", "replay0.1_lr0.001", "replay0.1_lr0.003"]
    for name in ("replay0.1_lr0.001", "replay0.1_lr0.003"):
        state = json.loads((cpt_dir / "candidates" / name / "state.json").read_text())
        assert state["model_config"] == ours.cfg.model_dump()  # the base's shape, not [main] model's (d_model 32)
        assert state["extra"]["tokenizer_hash"] == base_hash and state["extra"]["base"] == str(base)
    heldout = pd.read_parquet(cpt_dir / "heldout.parquet")
    assert {"base", "replay0.1_lr0.001", "replay0.1_lr0.003"} <= set(heldout["checkpoint"])

    (gate_dir,) = [p.parent for p in (artifacts / "gate").glob("*/decision.json")]
    decision = json.loads((gate_dir / "decision.json").read_text())
    assert decision["base_checkpoint"] == str(base)
    table = pd.read_parquet(gate_dir / "decisions.parquet")
    assert sorted(table["candidate"]) == ["replay0.1_lr0.001", "replay0.1_lr0.003"]
    assert set(table["decision"]) <= {"pass", "fail", "undetermined"}
    assert decision["kept"] in {"base", *table["candidate"]}
    con = duckdb.connect(str(runs / "results.duckdb"), read_only=True)
    try:
        recorded = con.execute("SELECT count(*) FROM gate_decisions WHERE experiment = 'smoke-hf-base'").fetchone()[0]
    finally:
        con.close()
    assert recorded == len(table)
    print(f"gate kept {decision['kept']}: " + "; ".join(f"{r.candidate} {r.decision}" for r in table.itertuples()))

    # The kept model leaves as a Hugging Face folder with the base's tokenizer and EOS, verified on export.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    (folder,) = [p.parent for p in (artifacts / "export").glob("*/model/export.json")]
    record = json.loads((folder / "export.json").read_text())
    assert record["passed"] and record["max_abs_logit_diff"] <= LOGIT_TOLERANCE and record["greedy_equal"]
    assert record["tokenizer_hash"] == base_hash and record["eos_id"] == EOS_ID
    exported = AutoTokenizer.from_pretrained(folder)
    assert exported.eos_token == EOS_TOKEN
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.vocab_size == VOCAB
    print(f"export of {decision['kept']}: max |logit difference| {record['max_abs_logit_diff']:.3g}")
