"""Append-only JSON-lines logs that survive a SIGKILL mid-write.

A process killed while appending can leave a last line without its newline: a torn line, the
prefix of a record. The next ``append`` cuts it off (with a warning) before it writes, so a log
holds whole records, one per line, except perhaps a torn last line; ``read`` skips that one
(with a warning) and refuses anything else that is not a record: a bad line elsewhere is damage
(another writer, an edit, a disk error), a ``ValueError`` naming the file and the line."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
_CHUNK = 1 << 16


def _torn_tail(f) -> int:
    """The number of bytes after the last newline of the open file ``f`` (0: it ends with one)."""
    end = f.seek(0, os.SEEK_END)
    pos = end
    while pos > 0:
        start = max(0, pos - _CHUNK)
        f.seek(start)
        newline = f.read(pos - start).rfind(b"\n")
        if newline >= 0:
            return end - (start + newline + 1)
        pos = start
    return end


def _record(line: bytes) -> dict | None:
    """The JSON object ``line`` holds, or None."""
    try:
        record = json.loads(line)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return None
    return record if isinstance(record, dict) else None


def append(path: Path, record: dict) -> None:
    """Append ``record`` as one line, after cutting off a torn last line if there is one (a whole
    record that only lacks its newline gets it instead)."""
    with os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "rb+") as f:
        end = f.seek(0, os.SEEK_END)
        torn = _torn_tail(f)
        if torn:
            f.seek(end - torn)
            if _record(f.read(torn)) is None:
                log.warning("%s: cut off a torn last line (%d bytes) left by a killed writer", path, torn)
                f.truncate(end - torn)
            else:
                f.seek(end)
                f.write(b"\n")
        f.seek(0, os.SEEK_END)
        f.write(json.dumps(record).encode() + b"\n")


def read(path: Path) -> list[dict]:
    """The records of ``path`` in order ([] when it does not exist); a torn last line is skipped
    with a warning, any other line that is not a JSON object raises ``ValueError``."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_bytes().split(b"\n")
    last = lines.pop()  # b"" when the file ends with a newline
    out = []
    for number, line in enumerate(lines, 1):
        record = _record(line)
        if record is None:
            raise ValueError(f"{path}, line {number}: not a JSON object record: {line[:200]!r}")
        out.append(record)
    if last:
        record = _record(last)
        if record is None:
            log.warning("%s: skipped its torn last line %d (%d bytes, no newline)", path, len(lines) + 1, len(last))
        else:
            out.append(record)
    return out
