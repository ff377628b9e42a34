"""A checkpoint and its tokenizer as a Hugging Face folder, verified before it exists (docs/methods.md §2).

The folder holds what ``AutoModelForCausalLM.from_pretrained(folder)`` and ``AutoTokenizer.from_pretrained(folder)``
read with no extra arguments::

    config.json              LlamaConfig (no QK-norm) or Qwen3Config (QK-norm), dtype float32 (models.hf)
    model.safetensors        the weights under the transformers tensor names, fp32
    generation_config.json   eos / pad / bos ids (the project tokenizer has no BOS: null)
    tokenizer.json           the fitted byte-level BPE, as the tokenizer stage wrote it
    tokenizer_config.json    PreTrainedTokenizerFast over it: EOS <|endoftext|>, pad, the other special tokens
    export.json              what was verified: max |logit difference|, greedy continuations, token ids, verdict

It is written under a temporary name and renamed into place only after the written files, reloaded through
``transformers``, give the checkpoint's logits (fp32, ≤ 1e-4 on a fixed probe batch), its greedy continuations, and
the project tokenizer's ids on sample text. Otherwise nothing is left behind.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

from infra.atomic import atomic_dir, atomic_write_text
from infra.errors import CheckpointError, ConfigError, DataError

EXPORT_RECORD = "export.json"
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
# Text the exported tokenizer must encode to the project tokenizer's ids: scripts of the demo corpus, digits,
# code, and special tokens glued to text (docs/methods.md §8).
SAMPLE_TEXTS = (
    "The quick brown fox jumps over the lazy dog. 1234567890",
    "Debian 是一个自由的操作系统。你好，世界！",
    "def add(x, y):\n    return x + y  # 42\n",
    "end of one document<|endoftext|>start of the next",
    "  leading spaces,\ttabs and\nnew lines  ",
)
PROBE_ROWS, PROBE_LENGTH, PROBE_SEED, MAX_NEW_TOKENS = 2, 16, 0, 8
EXPORT_STEPS = 4  # progress steps of export_checkpoint: load and check, write, reload, compare


def _tokenizer_files(tokenizer: Path) -> tuple[Any, dict, Path]:
    """The tokenizer to export (``tokenizers.Tokenizer``), its meta and its ``tokenizer.json``.

    ``tokenizer`` is a tokenizer stage artifact (``tokenizer.json`` + ``tokenizer.meta.json``), or a released
    tokenizer (a Hugging Face tokenizer folder or a bare ``tokenizer.json``), whose EOS and pad ids are read as
    ``[tokenizer] pretrained`` reads them (``tasks.train.pretrained_tokenizer``); the meta then has no
    ``padded_vocab_size``.

    Raises:
        DataError: the path does not exist, or holds no tokenizer.json; or a released tokenizer without an EOS.
    """
    from tokenizers import Tokenizer

    from tasks.train.pretrained_tokenizer import read_pretrained

    path = Path(tokenizer)
    if not path.exists():
        raise DataError(f"--tokenizer {path} does not exist; give a tokenizer stage artifact "
                        "(runs/artifacts/tokenizer/<key>), a Hugging Face tokenizer folder or a tokenizer.json")
    if (path / "tokenizer.meta.json").is_file() and (path / "tokenizer.json").is_file():
        meta = json.loads((path / "tokenizer.meta.json").read_text())
        return Tokenizer.from_file(str(path / "tokenizer.json")), meta, path / "tokenizer.json"
    try:
        adopted = read_pretrained(path)
    except ConfigError as err:
        raise DataError(f"{err}") from None
    meta = {"eos_id": adopted.eos_id, "pad_id": adopted.pad_id, "tokenizer_hash": adopted.tokenizer_hash}
    return adopted.load(), meta, adopted.tokenizer_file


def hf_tokenizer(tokenizer_dir: Path, *, model_max_length: int) -> Any:
    """The stage's tokenizer as a ``PreTrainedTokenizerFast``: EOS the meta's ``eos_id`` (``<|endoftext|>`` for a
    fitted tokenizer, the released one's own for ``[tokenizer] pretrained``), pad the meta's ``pad_id``,
    no BOS or UNK (byte-level BPE has no unknown text), the remaining special tokens as extra special tokens, and no
    whitespace clean-up on decode (decode returns the text the ids came from).

    Raises:
        DataError: tokenizer.json or tokenizer.meta.json is missing, or the meta's eos_id is not a token.
    """
    from transformers import PreTrainedTokenizerFast

    tok, meta, tokenizer_json = _tokenizer_files(tokenizer_dir)
    eos = tok.id_to_token(int(meta["eos_id"]))  # <|endoftext|> when fitted; a released tokenizer's own otherwise
    if eos is None:
        raise DataError(f"{tokenizer_dir}: eos_id {meta['eos_id']} is not a token of its tokenizer.json")
    pad = tok.id_to_token(int(meta.get("pad_id", meta["eos_id"])))
    specials = [t.content for t in tok.get_added_tokens_decoder().values() if t.special]
    extra = [t for t in specials if t not in (eos, pad)]
    return PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), eos_token=eos,
                                   pad_token=pad, bos_token=None, unk_token=None, extra_special_tokens=extra,
                                   model_max_length=model_max_length, clean_up_tokenization_spaces=False)


def _check_ids(project: Any, exported: Any, folder: Path) -> None:
    """The exported tokenizer gives the project tokenizer's ids (nothing added) and decodes them back to the same
    text on every sample; raises DataError naming the first sample that differs."""
    for text in SAMPLE_TEXTS:
        want = project.encode(text).ids
        got = exported(text)["input_ids"]
        if got != want:
            raise DataError(f"exported tokenizer in {folder} encodes {text!r} as {got}, the project tokenizer "
                            f"as {want}")
        if exported.decode(got) != project.decode(want, skip_special_tokens=False):
            raise DataError(f"exported tokenizer in {folder} decodes {want} as {exported.decode(got)!r}")


def _prompts(exported: Any, seq_len: int) -> tuple[list[list[int]], int]:
    """Greedy prompts from the sample texts (at most half the context each) and how many tokens to generate."""
    prompts = [ids[: max(1, seq_len // 2)] for ids in (exported(t)["input_ids"] for t in SAMPLE_TEXTS) if ids]
    return prompts, max(1, min(MAX_NEW_TOKENS, seq_len - max(map(len, prompts))))


def export_checkpoint(checkpoint_dir: Path, tokenizer_dir: Path, out_dir: Path,
                      advance: Callable[[int], None] = lambda n: None) -> dict[str, Any]:
    """Write the checkpoint and tokenizer as a Hugging Face folder at ``out_dir`` (module docstring), verified.
    ``advance(1)`` is called after each of its ``EXPORT_STEPS`` steps: the checkpoint loaded and checked, the folder
    written, the folder reloaded through ``transformers``, the comparison done.

    Verification reloads the written folder through ``transformers`` (``AutoModelForCausalLM``, ``AutoTokenizer``)
    and compares it with the checkpoint's ``Decoder`` in fp32: logits on a fixed probe batch (``models.hf.probe_ids``,
    2 × 16 ids, seed 0) within ``models.hf.LOGIT_TOLERANCE``, the greedy continuation of every sample text equal
    token for token, and the tokenizer's ids equal to the project tokenizer's.

    Returns:
        the record written to ``out_dir/export.json``: architecture, source checkpoint and step, tokenizer hash,
        ``max_abs_logit_diff``, ``greedy_equal``, ``passed``, library versions.

    Raises:
        CheckpointError: a missing/corrupt/sharded checkpoint, or one trained with another tokenizer (hash or
            vocabulary size differ).
        ConfigError: ``out_dir`` exists and is not empty, or the model cannot be expressed in the target config.
        DataError: tokenizer files missing, or the verification failed (the message gives the figures); no folder
            is left at ``out_dir`` then.
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from models.hf import LOGIT_TOLERANCE, decoder_from_hf, is_hf_folder, probe_ids, to_hf_model, verify
    from tasks.train.checkpoint import load_model, verify_checkpoint

    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        what = "is not an empty folder" if out_dir.is_dir() else "is a file"
        raise ConfigError(f"{out_dir} exists and {what}; remove it or choose another output folder")
    project, meta, tokenizer_json = _tokenizer_files(tokenizer_dir)
    if is_hf_folder(checkpoint_dir):  # a released base that CPT started from, kept by the gate
        record: dict[str, Any] = {"format": "hugging_face"}
        model = decoder_from_hf(checkpoint_dir).eval()
    else:
        record = verify_checkpoint(checkpoint_dir)
        model = load_model(checkpoint_dir).eval()
    saved = record.get("extra", {}).get("tokenizer_hash")
    if saved and saved != meta.get("tokenizer_hash"):
        raise CheckpointError(f"{checkpoint_dir} was trained with tokenizer {saved!r}, {tokenizer_dir} holds "
                              f"{meta.get('tokenizer_hash')!r}: export it with the tokenizer it was trained with")
    # A stage artifact records the embedding rows it padded to; a released tokenizer may have fewer ids than its
    # model's rows (padded by the model's authors), never more.
    vocab = int(meta.get("padded_vocab_size", model.cfg.vocab_size))
    if model.cfg.vocab_size != vocab or project.get_vocab_size() > model.cfg.vocab_size:
        raise CheckpointError(f"{checkpoint_dir} has {model.cfg.vocab_size} embedding rows, the tokenizer in "
                              f"{tokenizer_dir} {project.get_vocab_size()} tokens (padded to {vocab})")
    eos_id, pad_id = int(meta["eos_id"]), int(meta.get("pad_id", meta["eos_id"]))
    advance(1)
    theirs = to_hf_model(model, bos_id=None, eos_id=eos_id, pad_id=pad_id)
    theirs.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id)
    tokenizer = hf_tokenizer(tokenizer_dir, model_max_length=model.cfg.seq_len)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out_dir) as tmp:
        theirs.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # transformers writes tokenizer.json back with a no-op post-processor; the project's file, byte for byte,
        # keeps the tokenizer's hash, so the export is recognised as the checkpoint's tokenizer.
        shutil.copyfile(tokenizer_json, tmp / "tokenizer.json")
        del theirs
        advance(1)
        reloaded = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
        reloaded_tokenizer = AutoTokenizer.from_pretrained(tmp)
        _check_ids(project, reloaded_tokenizer, out_dir)
        advance(1)
        prompts, new_tokens = _prompts(reloaded_tokenizer, model.cfg.seq_len)
        probe = probe_ids(model.cfg.vocab_size, model.cfg.seq_len, rows=PROBE_ROWS, length=PROBE_LENGTH,
                          seed=PROBE_SEED)
        result = verify(model, reloaded, probe, prompts=prompts, max_new_tokens=new_tokens,
                        eos_id=reloaded.generation_config.eos_token_id,
                        pad_id=reloaded.generation_config.pad_token_id, tolerance=LOGIT_TOLERANCE)
        advance(1)
        if not result.passed:
            raise DataError(f"export of {checkpoint_dir} failed its verification against transformers: "
                            f"{result.describe()}; nothing was written to {out_dir}")
        summary = {"architecture": type(reloaded).__name__, "model_type": reloaded.config.model_type,
                   "checkpoint": str(checkpoint_dir), "step": record.get("step"),
                   "tokens_seen": record.get("tokens_seen"), "tokenizer_dir": str(tokenizer_dir),
                   "tokenizer_hash": meta.get("tokenizer_hash"), "tokenizer_ids_equal": True,
                   "tokenizer_samples": len(SAMPLE_TEXTS), "eos_id": eos_id, "pad_id": pad_id, "bos_id": None,
                   "probe": {"rows": int(probe.shape[0]), "length": int(probe.shape[1]), "seed": PROBE_SEED},
                   "greedy_prompts": prompts, "greedy_new_tokens": new_tokens, **result.as_dict(),
                   "dtype": "float32", "transformers_version": transformers.__version__,
                   "torch_version": torch.__version__}
        atomic_write_text(tmp / EXPORT_RECORD, json.dumps(summary, indent=2))
    return summary
