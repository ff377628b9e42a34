"""Hugging Face Hub ids given where a local folder is expected: the platform reads released models and tokenizers
from folders on disk only, so an error about a missing path says when the path reads as a Hub id, and how to
download it into a folder."""

import re
from pathlib import Path

# A Hub repository id is owner/name: letters, digits, "-", "_" and ".", at most 96 characters each
# (huggingface_hub.utils.validate_repo_id).
_HUB_ID_RE = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")


def looks_like_hub_id(path: str | Path) -> bool:
    """Whether ``path`` reads as a Hub repository id (``owner/name``, e.g. ``meta-llama/Llama-3.2-1B``) and
    nothing of that name is on disk."""
    text = str(path)
    return bool(_HUB_ID_RE.fullmatch(text)) and ".." not in text and not Path(text).exists()


def hub_id_hint(path: str | Path, files: str = "") -> str:
    """A sentence to add to a "does not exist" message when ``path`` looks like a Hub id, else "".

    ``files``: ``hf download`` options that limit what is fetched (e.g. ``--include '*.json'`` for a tokenizer).
    """
    if not looks_like_hub_id(path):
        return ""
    folder = f"hf-models/{str(path).split('/')[1]}"
    command = " ".join(part for part in (".venv/bin/hf download", str(path), files, "--local-dir", folder) if part)
    return (f"; {path} looks like a Hugging Face Hub id: download it into a folder first, e.g. `{command}`, and give "
            "that folder (a gated model needs `.venv/bin/hf auth login` first)")
