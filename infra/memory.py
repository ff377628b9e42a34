"""Give freed heap memory back to the operating system between the batches of a streaming pass.

A long pass that allocates and frees many large strings (document texts) leaves glibc's heap and Arrow's memory
pool holding the freed pages, so resident memory ratchets up with the corpus even though live data stays bounded.
``release_memory`` asks both to return what is free: Arrow's ``release_unused`` and glibc's ``malloc_trim(0)``
(which also releases free pages inside the heap, not only at its top). Elsewhere (musl, macOS) only Arrow's part
runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import pyarrow as pa


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc.malloc_trim if libc is not None and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def release_memory() -> None:
    """Return free heap pages to the OS (Arrow pool, then glibc); a no-op where neither applies."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
