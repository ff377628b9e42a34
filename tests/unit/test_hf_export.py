"""``export_checkpoint`` and ``pretrain export``: a checkpoint plus its tokenizer become a folder that transformers
loads with no extra arguments, verified before it exists; a failed verification leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import models.hf
from infra.errors import CheckpointError, ConfigError, DataError
from models.config import ModelConfig
from models.decoder import Decoder
from tasks.export.hf import SAMPLE_TEXTS, export_checkpoint
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.fit import eos_id, fit_tokenizer, padded_vocab_size, tokenizer_hash
from tasks.train.checkpoint import Checkpointer
from tasks.train.config import OptimConfig
from tasks.train.loop import TrainState
from tasks.train.optim import build_optimizer

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["The quick brown fox jumps over the lazy dog, again and again.",
         "Debian 是一个自由的操作系统。你好，世界！", "def add(x, y):\n    return x + y\n", "Numbers 12345 and 67890 split into digits."] * 20


def _tokenizer(folder: Path, vocab_size: int = 320) -> dict:
    """A tokenizer artifact as the tokenizer stage writes it: tokenizer.json and tokenizer.meta.json."""
    folder.mkdir(parents=True)
    tok = fit_tokenizer(TEXTS, TokenizerConfig(vocab_size=vocab_size))
    tok.save(str(folder / "tokenizer.json"))
    meta = {"tokenizer_hash": tokenizer_hash(tok), "eos_id": eos_id(tok), "pad_id": tok.token_to_id("<|pad|>"),
            "vocab_size": tok.get_vocab_size(), "padded_vocab_size": padded_vocab_size(tok, 64)}
    (folder / "tokenizer.meta.json").write_text(json.dumps(meta))
    return meta


def _checkpoint(folder: Path, meta: dict, *, record_hash: bool = True, **shape) -> Decoder:
    cfg = ModelConfig(**{**dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, seq_len=64), **shape,
                         "vocab_size": meta["padded_vocab_size"]})
    torch.manual_seed(0)
    model = Decoder(cfg)
    extra = {"tokenizer_hash": meta["tokenizer_hash"]} if record_hash else {}
    Checkpointer(folder.parent, extra=extra).save(folder, model=model, optimizer=build_optimizer(
        model, OptimConfig(peak_lr=1e-3, warmup_steps=1)), state=TrainState(step=3, tokens_seen=96), sampler_state={})
    return model.eval()


@pytest.fixture
def made(tmp_path):
    meta = _tokenizer(tmp_path / "tokenizer")
    return tmp_path, meta


@pytest.mark.parametrize("shape, architecture", [({}, "LlamaForCausalLM"),
                                                 ({"qk_norm": True, "tied_embeddings": False, "n_kv_heads": 4},
                                                  "Qwen3ForCausalLM")])
def test_exported_folder_loads_with_no_arguments_and_is_the_same_model(made, shape, architecture):
    root, meta = made
    ours = _checkpoint(root / "ckpt", meta, **shape)
    record = export_checkpoint(root / "ckpt", root / "tokenizer", root / "hf")
    out = root / "hf"
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "generation_config.json",
                                              "tokenizer.json", "tokenizer_config.json", "export.json"}
    assert not [p for p in root.iterdir() if ".tmp-" in p.name]
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == architecture == record["architecture"]
    assert model.dtype == torch.float32 and model.config.vocab_size == meta["padded_vocab_size"]
    assert (model.generation_config.eos_token_id, model.generation_config.pad_token_id) == (meta["eos_id"],
                                                                                          meta["pad_id"])
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id) == (meta["eos_id"],
                                                                                      meta["pad_id"], None)
    from tokenizers import Tokenizer

    project = Tokenizer.from_file(str(root / "tokenizer" / "tokenizer.json"))
    for text in (*SAMPLE_TEXTS, "un texte que l'export n'a jamais vu: 2024-06-01 <|im_start|>"):
        assert tokenizer(text)["input_ids"] == project.encode(text).ids
    saved = json.loads((out / "export.json").read_text())
    print(f"export {architecture}: max |logit diff| = {saved['max_abs_logit_diff']:.3g}")
    assert saved["passed"] and saved["greedy_equal"] and saved["max_abs_logit_diff"] <= 1e-4
    assert saved["tokenizer_hash"] == meta["tokenizer_hash"] and saved["step"] == 3
    ids = tokenizer("The quick brown", return_tensors="pt")
    generated = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert generated.shape[1] > ids["input_ids"].shape[1]
    with torch.no_grad():
        diff = (model(**ids).logits - ours(ids["input_ids"])).abs().max().item()
    assert diff <= 1e-4


def test_a_failed_verification_leaves_no_folder(made, monkeypatch):
    """A mapping fault (the exported config carries the wrong RMSNorm eps) is caught by the reload check."""
    root, meta = made
    _checkpoint(root / "ckpt", meta, norm_eps=1e-5)
    right = models.hf.hf_config

    def wrong_eps(cfg, **ids):
        config = right(cfg, **ids)
        config.rms_norm_eps = 1e-6
        return config

    monkeypatch.setattr(models.hf, "hf_config", wrong_eps)
    with pytest.raises(DataError, match="failed its verification.*max \\|logit difference\\|"):
        export_checkpoint(root / "ckpt", root / "tokenizer", root / "hf")
    assert not (root / "hf").exists()
    assert not [p for p in root.iterdir() if ".tmp-" in p.name]


def test_the_export_stage_shows_each_step_of_the_export_on_a_bar(made):
    from infra.runs import RunsLayout
    from infra.stage import StageContext
    from recording_progress import RecordingProgress
    from tasks.export.stage import MODEL_DIR, run

    root, meta = made
    _checkpoint(root / "ckpt", meta)
    gate, out = root / "gate", root / "export"
    gate.mkdir(), out.mkdir()
    (gate / "decision.json").write_text(json.dumps({"kept": "c1", "kept_checkpoint": str(root / "ckpt")}))
    progress = RecordingProgress()
    ctx = StageContext(out=out, inputs={"gate": gate, "tokenizer": root / "tokenizer"}, layout=RunsLayout(root),
                       key="k", experiment="t", progress=progress)
    assert run(ctx)["greedy_equal"] and (out / MODEL_DIR / "export.json").exists()
    (bar,) = progress.bars
    assert bar.description.startswith("export: load, write, reload and verify")
    assert (bar.total, bar.finished) == (4, True)


def test_a_tokenizer_other_than_the_trained_one_is_refused(made):
    root, meta = made
    _checkpoint(root / "ckpt", {**meta, "tokenizer_hash": "0" * 64})
    with pytest.raises(CheckpointError, match="trained with tokenizer '0000"):
        export_checkpoint(root / "ckpt", root / "tokenizer", root / "hf")
    assert not (root / "hf").exists()


def test_an_existing_output_folder_is_refused(made):
    root, meta = made
    _checkpoint(root / "ckpt", meta)
    (root / "hf").mkdir()
    (root / "hf" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="exists and is not an empty folder"):
        export_checkpoint(root / "ckpt", root / "tokenizer", root / "hf")
    assert (root / "hf" / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------------------------------------------ the command


def _pretrain(*args: str, runs: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PRETRAIN_RUNS_DIR": str(runs), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_command_finds_the_tokenizer_the_checkpoint_was_trained_with(tmp_path):
    """The checkpoint sits in a runs folder's artifact store; its recorded tokenizer hash names the artifact."""
    runs = tmp_path / "runs"
    meta = _tokenizer(runs / "artifacts" / "tokenizer" / "tok-key")
    other = _tokenizer(runs / "artifacts" / "tokenizer" / "aaa-other", vocab_size=300)  # listed first, other hash
    assert other["tokenizer_hash"] != meta["tokenizer_hash"]
    _checkpoint(runs / "artifacts" / "main" / "main-key" / "checkpoint", meta)
    proc = _pretrain("export", str(runs / "artifacts" / "main" / "main-key"), str(tmp_path / "hf"),
                     runs=tmp_path / "elsewhere")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "max |logit difference|" in proc.stdout and "greedy continuations equal" in proc.stdout
    record = json.loads((tmp_path / "hf" / "export.json").read_text())
    assert record["passed"] and record["tokenizer_dir"] == str(runs / "artifacts" / "tokenizer" / "tok-key")
    AutoModelForCausalLM.from_pretrained(tmp_path / "hf")


def test_command_without_a_resolvable_tokenizer_asks_for_one(tmp_path):
    meta = _tokenizer(tmp_path / "tokenizer")
    _checkpoint(tmp_path / "ckpt", meta, record_hash=False)
    proc = _pretrain("export", str(tmp_path / "ckpt"), str(tmp_path / "hf"), runs=tmp_path / "runs")
    assert proc.returncode == 2
    assert "records no tokenizer_hash" in proc.stdout and "--tokenizer DIR" in proc.stdout
    assert not (tmp_path / "hf").exists()
    proc = _pretrain("export", str(tmp_path / "ckpt"), str(tmp_path / "hf"), "--tokenizer", str(tmp_path / "tokenizer"),
                     runs=tmp_path / "runs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def test_a_released_base_folder_with_its_own_eos_token_exports_verified(tmp_path):
    """The gate keeps the released base CPT started from (a Hugging Face folder, no state.json) and the experiment
    adopted that base's tokenizer, whose EOS is ``</s>``: the export loads the folder and keeps that EOS."""
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = Tokenizer(tok_models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=300, special_tokens=["</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    from tokenizers import decoders
    tok.decoder = decoders.ByteLevel()
    stage = tmp_path / "tokenizer"
    stage.mkdir()
    tok.save(str(stage / "tokenizer.json"))
    eos = tok.token_to_id("</s>")
    (stage / "tokenizer.meta.json").write_text(json.dumps({
        "tokenizer_hash": tokenizer_hash(tok), "eos_id": eos, "pad_id": eos, "vocab_size": tok.get_vocab_size(),
        "padded_vocab_size": 320}))
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        tie_word_embeddings=False, eos_token_id=eos))
    base.save_pretrained(tmp_path / "base")
    record = export_checkpoint(tmp_path / "base", stage, tmp_path / "out")
    assert record["passed"] and record["max_abs_logit_diff"] <= 1e-4 and record["greedy_equal"]
    exported = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert exported.eos_token == "</s>" and exported.eos_token_id == eos
    assert json.loads((tmp_path / "out" / "generation_config.json").read_text())["eos_token_id"] == eos


def test_the_export_is_itself_a_checkpoint_for_export_generate_and_harness(tmp_path):
    """The exported tokenizer.json is the checkpoint's, byte for byte (same hash), so the exported folder reads
    as the same model everywhere: re-exported, generated from, and given as --tokenizer to the checkpoint."""
    from flows.generate import load_generator
    from infra.runs import RunsLayout
    from flows.export import export
    from models.generate import Sampling

    runs = tmp_path / "runs"
    meta = _tokenizer(runs / "artifacts" / "tokenizer" / "tok-key")
    _checkpoint(runs / "artifacts" / "main" / "k" / "checkpoint", meta)
    stage_tokenizer = runs / "artifacts" / "tokenizer" / "tok-key" / "tokenizer.json"
    layout = RunsLayout(tmp_path / "elsewhere")
    export(runs / "artifacts" / "main" / "k", tmp_path / "hf", None, layout)
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == stage_tokenizer.read_bytes()
    again = export(tmp_path / "hf", tmp_path / "hf2", None, layout)  # a Hugging Face folder: its own tokenizer
    assert again["passed"] and again["tokenizer_hash"] == meta["tokenizer_hash"]

    greedy = Sampling(max_new_tokens=6)
    from_checkpoint = load_generator(runs / "artifacts" / "main" / "k", runs_dir=str(layout.root))
    from_export = load_generator(tmp_path / "hf")
    with_export_tokenizer = load_generator(runs / "artifacts" / "main" / "k", tokenizer=tmp_path / "hf")
    with_bare_file = load_generator(runs / "artifacts" / "main" / "k", tokenizer=stage_tokenizer)
    outputs = [tuple(g.complete("The quick brown", greedy).tokens) for g in
               (from_checkpoint, from_export, with_export_tokenizer, with_bare_file)]
    assert len(outputs[0]) == 6 and len(set(outputs)) == 1


def test_export_takes_a_bare_tokenizer_json_and_names_a_missing_tokenizer(made):
    root, meta = made
    _checkpoint(root / "ckpt", meta)
    with pytest.raises(DataError, match="--tokenizer .*nowhere does not exist"):
        export_checkpoint(root / "ckpt", root / "nowhere", root / "hf")
    record = export_checkpoint(root / "ckpt", root / "tokenizer" / "tokenizer.json", root / "hf")
    assert record["passed"] and record["tokenizer_hash"] == meta["tokenizer_hash"]


def test_a_folder_that_is_no_checkpoint_is_named_as_such(tmp_path):
    from flows.export import checkpoint_folder

    (tmp_path / "main" / "k1").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="is not a checkpoint: it holds no state.json or config.json"):
        checkpoint_folder(tmp_path / "main")
    (tmp_path / "export" / "k2" / "model").mkdir(parents=True)
    (tmp_path / "export" / "k2" / "model" / "config.json").write_text("{}")
    assert checkpoint_folder(tmp_path / "export" / "k2") == tmp_path / "export" / "k2" / "model"
