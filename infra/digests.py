"""Content digests of local files: one helper for every stage that names a file by what it holds.

``sha256_file`` streams the file in 1 MiB blocks and remembers the digest per (real path, size,
modification time), so a weight file named by several settings, or read again by a later step of
the same process, is hashed once; rewriting a file changes its size or modification time and so
its cache entry.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

_BLOCK = 1 << 20


def sha256_file(path: str | Path) -> str:
    """The hex sha256 of a local file's bytes."""
    real = Path(path).expanduser().resolve()
    st = real.stat()
    return _sha256(str(real), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=128)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            h.update(block)
    return h.hexdigest()
