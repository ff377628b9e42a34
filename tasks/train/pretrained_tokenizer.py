"""A released tokenizer adopted as the experiment's (``[tokenizer] pretrained``): its files, EOS and padding ids,
vocabulary and identity.

A pretrained tokenizer is a folder in the Hugging Face layout (``tokenizer.json``, with ``tokenizer_config.json``
and/or ``special_tokens_map.json`` naming its special tokens), or a bare ``tokenizer.json`` file. The EOS that
ends every document in a shard (docs/methods.md §8 packing) is, in order:

  1. ``eos_token`` of ``tokenizer_config.json``;
  2. ``eos_token`` of ``special_tokens_map.json``;
  3. else the first of :data:`CONVENTIONAL_EOS` that the tokenizer holds as a special token.

No EOS from any of these is refused: documents could not be separated.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from infra.errors import ConfigError
from infra.hub import hub_id_hint
from tasks.train.shards import vocab_span

TOKENIZER_FILE = "tokenizer.json"
# The files that define a Hugging Face tokenizer: its identity in cache keys is their content.
TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
HUB_TOKENIZER_FILES = "--include '*.json'"  # the files above without the weights, from a Hub repository
# End-of-document tokens of released tokenizers (GPT-2/Qwen, Llama 2/Mistral, Llama 3, Gemma), for a bare file.
CONVENTIONAL_EOS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")


@dataclass(frozen=True)
class PretrainedTokenizer:
    """A pretrained tokenizer as the tokenizer stage adopts it.

    Attributes:
        path: the folder or file as given.
        tokenizer_file: its ``tokenizer.json``.
        eos_token, eos_id: the document separator and its id.
        pad_id: the id of ``pad_token`` when its config names one held in the vocabulary, else ``eos_id`` (padding
            targets are ignored, so the input id there only has to exist).
        vocab_size: the highest id + 1 (added tokens included), the rows an embedding needs.
        tokenizer_hash: :func:`tokenizer_hash` of the loaded tokenizer.
    """

    path: Path
    tokenizer_file: Path
    eos_token: str
    eos_id: int
    pad_id: int
    vocab_size: int
    tokenizer_hash: str

    def load(self) -> Tokenizer:
        return Tokenizer.from_file(str(self.tokenizer_file))


def tokenizer_hash(tok: Tokenizer) -> str:
    """Hex SHA-256 of the tokenizer's JSON, keys sorted and no whitespace: the identity shards and checkpoints carry."""
    canonical = json.dumps(json.loads(tok.to_str()), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def tokenizer_file(path: str | Path) -> Path:
    """The ``tokenizer.json`` of a pretrained tokenizer given as a folder or as the file itself.

    Raises:
        ConfigError: the path does not exist (the message says so when it reads as a Hugging Face Hub id, with
            the command that downloads it), or is a folder without ``tokenizer.json``.
    """
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        if (path / TOKENIZER_FILE).is_file():
            return path / TOKENIZER_FILE
        raise ConfigError(f"{path} has no {TOKENIZER_FILE}: give a Hugging Face tokenizer folder (saved with "
                          "save_pretrained by a fast tokenizer) or the tokenizer.json file itself")
    raise ConfigError(f"{path} does not exist (relative paths are read from the working directory)"
                      f"{hub_id_hint(path, files=HUB_TOKENIZER_FILES)}")


def read_pretrained(path: str | Path) -> PretrainedTokenizer:
    """Load the pretrained tokenizer at ``path`` and determine its EOS and padding ids (module docstring).

    Raises:
        ConfigError: the path or its ``tokenizer.json`` is missing or unreadable, a config file is not JSON, the
            named EOS is not in the vocabulary, or no EOS can be determined.
    """
    file = tokenizer_file(path)
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as err:  # the Rust binding raises a bare Exception for malformed JSON or models
        raise ConfigError(f"{file} is not a tokenizer the tokenizers library can load: {err}") from None
    folder = None if Path(path).is_file() else file.parent
    configs = [_json(folder / name) for name in ("tokenizer_config.json", "special_tokens_map.json")] if folder else []
    eos = next((t for t in (_token(c.get("eos_token")) for c in configs) if t), None)
    if eos is None:
        specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
        eos = next((t for t in CONVENTIONAL_EOS if t in specials), None)
    if eos is None:
        raise ConfigError(f"cannot determine the EOS of {path}: no eos_token in tokenizer_config.json or "
                          f"special_tokens_map.json, and none of {list(CONVENTIONAL_EOS)} is a special token; give "
                          "the tokenizer's folder with a tokenizer_config.json naming eos_token")
    eos_id = tok.token_to_id(eos)
    if eos_id is None:
        raise ConfigError(f"{path}: eos_token {eos!r} is not in the tokenizer's vocabulary")
    pad = next((t for t in (_token(c.get("pad_token")) for c in configs) if t), None)
    pad_id = tok.token_to_id(pad) if pad is not None else None
    return PretrainedTokenizer(path=Path(path), tokenizer_file=file, eos_token=eos, eos_id=int(eos_id),
                               pad_id=int(eos_id if pad_id is None else pad_id), vocab_size=vocab_span(tok),
                               tokenizer_hash=tokenizer_hash(tok))


def files_digest(path: str | Path) -> dict[str, str]:
    """SHA-256 of each file that defines the pretrained tokenizer at ``path`` (:data:`TOKENIZER_FILES` present
    in the folder, or the one file), by file name: its identity in the tokenizer stage's key.

    Raises:
        ConfigError: as :func:`tokenizer_file`.
    """
    file = tokenizer_file(path)
    folder = file.parent
    files = [file] if Path(path).is_file() else [folder / n for n in TOKENIZER_FILES if (folder / n).is_file()]
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path} is not valid JSON: {err}") from None
    return value if isinstance(value, dict) else {}


def _token(value: Any) -> str | None:
    """A special token as the config files write it: a string, or an AddedToken dict with ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None
