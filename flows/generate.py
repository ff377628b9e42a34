"""Text generation from any checkpoint (``pretrain generate``): the checkpoint, its tokenizer, the prompts.

The checkpoint is a checkpoint directory, a stage artifact holding one, or a Hugging Face model folder (an export).
The tokenizer defaults to the one the checkpoint was trained with (``flows.export``: the tokenizer artifact with the
hash its ``state.json`` records, looked up in the runs folder holding the checkpoint, else in ``--runs-dir`` /
``$PRETRAIN_RUNS_DIR`` / ``./runs``; a Hugging Face folder's own files). ``--tokenizer`` names one explicitly (a
tokenizer artifact folder, a Hugging Face tokenizer folder or a ``tokenizer.json``); when the checkpoint records a
hash, the tokenizer given must have it.

Decoding is ``models.generate`` (KV-cached; greedy, temperature, top-k, top-p); the text is streamed as it is
generated, decoded incrementally so that a character spread over several byte-level tokens is printed whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from infra.errors import ConfigError
from infra.jsonl import jsonl_lines
from infra.runs import RunsLayout
from models.generate import Completion, Sampling, complete


@dataclass
class Generator:
    """A loaded checkpoint and its tokenizer, ready to continue prompts."""

    checkpoint: Path
    model: Any  # models.decoder.Decoder
    tokenizer: Any  # tokenizers.Tokenizer
    tokenizer_path: Path
    eos_id: int | None

    def complete(self, prompt: str, sampling: Sampling, on_text: Callable[[str], Any] | None = None) -> Completion:
        """``models.generate.complete`` with this checkpoint's model and tokenizer."""
        return complete(self.model, self.tokenizer, prompt, sampling, eos_id=self.eos_id, on_text=on_text)


def load_generator(checkpoint: Path, *, tokenizer: Path | None = None, runs_dir: str | None = None) -> Generator:
    """Load ``checkpoint`` (verified) and the tokenizer to decode it with (module docstring).

    Raises:
        CheckpointError: a missing or corrupt checkpoint.
        ConfigError: no tokenizer given and none found for the checkpoint (the message says what to pass), a
            ``--tokenizer`` whose hash differs from the one the checkpoint records (both named), one that cannot be
            loaded, or one with more ids than the model has embedding rows; a Hugging Face architecture the decoder
            cannot represent exactly.
    """
    from flows.export import checkpoint_tokenizer, load_checkpoint

    model, record, directory = load_checkpoint(checkpoint)
    found = checkpoint_tokenizer(directory, record, tokenizer, RunsLayout.resolve(runs_dir))
    if found["tokenizer"].get_vocab_size() > model.cfg.vocab_size:
        raise ConfigError(f"tokenizer {found['path']} has {found['tokenizer'].get_vocab_size()} ids, more than the "
                          f"model's {model.cfg.vocab_size} embedding rows; it is not this model's tokenizer")
    return Generator(directory, model.eval(), found["tokenizer"], Path(found["path"]), found["eos_id"])


def read_prompts(prompts: Sequence[str], prompts_file: Path | None) -> list[str]:
    """The ``--prompt`` values, then the lines of ``--prompts-file`` (UTF-8, one prompt a line ending at ``\n``,
    blank lines skipped).

    Raises:
        ConfigError: no prompt at all, or a prompts file that is missing or not UTF-8.
    """
    out = list(prompts)
    if prompts_file is not None:
        try:
            text = Path(prompts_file).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"--prompts-file {prompts_file} does not exist") from None
        except UnicodeDecodeError as err:
            raise ConfigError(f"--prompts-file {prompts_file} is not UTF-8 (offset {err.start}); save it as "
                              "UTF-8") from None
        out += [line for _, line in jsonl_lines(text) if line.strip()]
    if not out:
        raise ConfigError("no prompt: give --prompt TEXT (repeatable) or --prompts-file FILE (one prompt a line)")
    return out
