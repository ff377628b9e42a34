"""The content digest of a CPT base: what its cache keys (the stage's and each context-extension candidate's) read
instead of its path."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


@functools.lru_cache(maxsize=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def base_digest(folder: Path) -> str:
    """SHA-256 over the files that define a CPT base: the ``checksums.json`` of a checkpoint of this platform (it
    lists every file's SHA-256), else every regular file of a Hugging Face model folder (config, weights, tokenizer),
    by name. A base replaced in place under the same path then gets a new key. Each file is read once per process
    and size and modification time: a large base costs one read of its files per process."""
    folder = Path(folder)
    files = [folder / "checksums.json"] if (folder / "checksums.json").is_file() else sorted(
        p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(f"{path.name}\0{_file_digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)}\0".encode())
    return digest.hexdigest()
