"""A released Hugging Face model as the CPT base (``[cpt] base_checkpoint`` naming a model folder).

The folder holds ``config.json`` and safetensors weights (``models.hf.decoder_from_hf`` reads it; an architecture the
decoder cannot represent exactly is refused, naming the field). CPT keeps the base's tokenizer (docs/methods.md §11: a
new vocabulary needs an embedding transition), so ``[tokenizer] pretrained`` must be that tokenizer:

  - when the folder holds a ``tokenizer.json``, the two tokenizers' hashes (``tasks.train.pretrained_tokenizer``)
    must be equal;
  - in every case the model's ``vocab_size`` (its embedding rows) must hold every id the tokenizer emits.

The model shape, the context length included (``max_position_embeddings`` → ``seq_len``), is the base's.
"""

from __future__ import annotations

from pathlib import Path

from infra.errors import CheckpointError, ConfigError
from models.config import ModelConfig
from models.decoder import Decoder
from models.hf import is_hf_folder  # noqa: F401  (re-exported: callers import it from here)
from tasks.train.pretrained_tokenizer import TOKENIZER_FILE, read_pretrained, tokenizer_hash

HF_CONFIG = "config.json"


def hf_model_config(folder: str | Path) -> ModelConfig:
    """The ``ModelConfig`` of the folder's ``config.json``, read without its weights.

    Raises:
        ConfigError: the config cannot be read, or names an architecture the decoder cannot represent
            (``models.hf.model_config_from_hf`` names the field).
    """
    import json

    from models.hf import IMPORTABLE, model_config_from_hf

    folder = Path(folder)
    try:
        kind = json.loads((folder / HF_CONFIG).read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError) as err:
        raise ConfigError(f"{folder / HF_CONFIG} cannot be read as JSON: {err}") from None
    if kind not in IMPORTABLE:  # before AutoConfig, which may not know the type at all
        raise ConfigError(f"{folder}: model_type = {kind!r}: only {', '.join(IMPORTABLE)} folders are read; the "
                          "decoder cannot represent this model exactly")
    from transformers import AutoConfig

    return model_config_from_hf(AutoConfig.from_pretrained(str(folder)))


def check_hf_base(folder: str | Path, tokenizer: str) -> ModelConfig:
    """Check, before anything runs, that the HF base at ``folder`` can be represented and that ``tokenizer`` (the
    ``[tokenizer] pretrained`` path) is its tokenizer (module docstring).

    Returns:
        the base's ``ModelConfig``.

    Raises:
        ConfigError: no pretrained tokenizer is set; the architecture is not representable; the folder's own
            tokenizer differs from ``tokenizer`` (both hashes named); the model's vocab_size is below the
            tokenizer's.
    """
    folder = Path(folder)
    if not tokenizer:
        raise ConfigError(f"{folder} is a Hugging Face model folder: CPT keeps the base's tokenizer, so set "
                          f"[tokenizer] pretrained = \"{folder}\" (or the folder of its tokenizer)")
    cfg = hf_model_config(folder)
    ours = read_pretrained(tokenizer)
    if (folder / TOKENIZER_FILE).is_file():
        from tokenizers import Tokenizer

        theirs = tokenizer_hash(Tokenizer.from_file(str(folder / TOKENIZER_FILE)))
        if theirs != ours.tokenizer_hash:
            raise ConfigError(f"[tokenizer] pretrained = {tokenizer!r} (hash {ours.tokenizer_hash[:12]}…) is not the "
                              f"tokenizer of the CPT base {folder} (hash {theirs[:12]}…); point it at the base's")
    if cfg.vocab_size < ours.vocab_size:
        raise ConfigError(f"the CPT base {folder} has vocab_size = {cfg.vocab_size} embedding rows, fewer than the "
                          f"{ours.vocab_size} ids of [tokenizer] pretrained = {tokenizer!r}: it is not the base's "
                          "tokenizer")
    return cfg


def load_hf_base(folder: str | Path, meta: dict) -> Decoder:
    """The base decoder with its weights, after checking it against the experiment's tokenizer artifact (``meta``:
    its ``tokenizer.meta.json``), before any CPT step.

    Raises:
        CheckpointError: the tokenizer artifact was not adopted from a pretrained tokenizer, or it is not the
            base's (hash or vocabulary, both named).
        ConfigError: the architecture cannot be represented (``models.hf.decoder_from_hf`` names the field).
        DataError: the weights are missing or do not fit the config.
    """
    from models.hf import decoder_from_hf

    folder = Path(folder)
    if "pretrained" not in meta:
        raise CheckpointError(f"the CPT base {folder} is a Hugging Face model, but this experiment's tokenizer was "
                              f"fitted here (hash {meta['tokenizer_hash'][:12]}…); set [tokenizer] pretrained to the "
                              "base's tokenizer")
    if (folder / TOKENIZER_FILE).is_file():
        from tokenizers import Tokenizer

        theirs = tokenizer_hash(Tokenizer.from_file(str(folder / TOKENIZER_FILE)))
        if theirs != meta["tokenizer_hash"]:
            raise CheckpointError(f"the CPT base {folder} has tokenizer {theirs!r}, this experiment's is "
                                  f"{meta['tokenizer_hash']!r}: keep the base's tokenizer for CPT")
    model = decoder_from_hf(folder)
    if model.cfg.vocab_size < int(meta["vocab_size"]):
        raise CheckpointError(f"the CPT base {folder} has {model.cfg.vocab_size} embedding rows, fewer than the "
                              f"{meta['vocab_size']} ids of this experiment's tokenizer")
    return model
