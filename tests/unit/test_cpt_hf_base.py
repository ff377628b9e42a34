"""A Hugging Face model folder as the CPT base: refused at config load unless ``[tokenizer] pretrained`` is its
tokenizer and the decoder can represent it, and loaded with the base's own shape after a check against the
tokenizer artifact."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from flows.config import load_config
from infra.errors import CheckpointError, ConfigError
from tasks.cpt.hf_base import check_hf_base, is_hf_folder, load_hf_base
from tasks.tokenizer.fit import tokenizer_hash

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 320


def _tokenizer(seed_text: str) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([seed_text] * 20, trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def _base(folder: Path, *, vocab: int = VOCAB, tokenizer: Tokenizer | None = None, **config) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hf = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, eos_token_id=2,
                     **config)
    LlamaForCausalLM(hf).save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save(str(folder / "tokenizer.json"))
        (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return folder


@pytest.fixture(scope="module")
def tok():
    return _tokenizer("continued pretraining keeps the base tokenizer and its embeddings")


@pytest.fixture(scope="module")
def base(tmp_path_factory, tok):
    return _base(tmp_path_factory.mktemp("base"), tokenizer=tok)


def _config(tmp_path: Path, base: Path, tokenizer: Path | None) -> Path:
    text = (ROOT / "configs" / "smoke.toml").read_text().replace("[cpt]\n", f'[cpt]\nbase_checkpoint = "{base}"\n', 1)
    if tokenizer is not None:
        text = text.replace("[tokenizer]\n", f'[tokenizer]\npretrained = "{tokenizer}"\n', 1)
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_the_base_and_its_tokenizer_load_with_the_base_shape(base, tmp_path):
    cfg = load_config(_config(tmp_path, base, base))
    assert cfg.cpt.base_checkpoint == str(base)
    shape = check_hf_base(base, str(base))
    assert (shape.d_model, shape.n_layers, shape.n_kv_heads, shape.d_ff, shape.seq_len) == (64, 2, 2, 96, 32)
    assert is_hf_folder(base)


def test_config_refuses_an_hf_base_without_its_tokenizer(base, tmp_path):
    with pytest.raises(ConfigError, match=r"cpt.base_checkpoint: .* set \[tokenizer\] pretrained"):
        load_config(_config(tmp_path, base, None))
    other = tmp_path / "other"
    other.mkdir()
    _tokenizer("a different corpus gives a different vocabulary").save(str(other / "tokenizer.json"))
    (other / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(ConfigError, match=r"cpt.base_checkpoint: .*is not the tokenizer of the CPT base .*hash"):
        load_config(_config(tmp_path, base, other))


def test_config_refuses_a_model_smaller_than_the_tokenizer(tmp_path, tok):
    small = _base(tmp_path / "small", vocab=256)  # no tokenizer of its own: only the vocabulary can be compared
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    tok.save(str(tokenizer / "tokenizer.json"))
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(ConfigError, match="vocab_size = 256 embedding rows, fewer than the"):
        load_config(_config(tmp_path, small, tokenizer))


def test_config_refuses_an_architecture_the_decoder_cannot_represent(base, tmp_path):
    biased = tmp_path / "biased"
    shutil.copytree(base, biased)
    config = json.loads((biased / "config.json").read_text())
    (biased / "config.json").write_text(json.dumps({**config, "attention_bias": True}))
    with pytest.raises(ConfigError, match="cpt.base_checkpoint: .*attention_bias"):
        load_config(_config(tmp_path, biased, biased))
    (biased / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(ConfigError, match="model_type = 'gpt2'"):
        load_config(_config(tmp_path, biased, biased))


def test_load_checks_the_tokenizer_artifact_before_any_step(base, tok):
    meta = {"tokenizer_hash": tokenizer_hash(tok), "vocab_size": tok.get_vocab_size(), "pretrained": {}}
    model = load_hf_base(base, meta)
    assert model.cfg.d_model == 64 and model.cfg.vocab_size == VOCAB and not model.cfg.tied_embeddings
    with pytest.raises(CheckpointError, match="fitted here"):
        load_hf_base(base, {k: v for k, v in meta.items() if k != "pretrained"})
    with pytest.raises(CheckpointError, match="keep the base's tokenizer"):
        load_hf_base(base, {**meta, "tokenizer_hash": "0" * 64})
    with pytest.raises(CheckpointError, match="fewer than the 1000 ids"):
        load_hf_base(base, {**meta, "vocab_size": 1000})


def test_a_platform_checkpoint_is_not_an_hf_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "state.json").write_text("{}")
    assert not is_hf_folder(tmp_path)


def test_the_cpt_key_follows_the_base_weights_not_only_its_path(tmp_path, tok):
    """A base replaced in place (same path, other weights) is a new CPT key; the same files give the same key."""
    from flows.keys import stage_key
    from flows.registry import STAGES

    cpt = next(s for s in STAGES if s.name == "cpt")
    upstream = {"tokenizer": "t", "mixture": "m", "main": "x"}
    folder = _base(tmp_path / "base", tokenizer=tok)
    cfg = load_config(_config(tmp_path, folder, folder))
    first = stage_key(cpt, cfg, upstream)
    assert first.config["base_weights"] and stage_key(cpt, cfg, upstream).key == first.key
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    weights["lm_head.weight"] = weights["lm_head.weight"] * 1.5
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    assert stage_key(cpt, load_config(_config(tmp_path, folder, folder)), upstream).key != first.key
