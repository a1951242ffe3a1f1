"""Append-only JSON-lines logs that survive a SIGKILL mid-write.

A process killed while appending can leave a last line without its newline. The next session
appends after it; ``append`` first closes such a torn line, so every record it writes is a line
of its own, and ``read`` skips lines that are not whole JSON records (the torn one)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def append(path: Path, record: dict) -> None:
    """Append ``record`` as one line, after closing a torn last line if there is one."""
    with open(path, "ab+") as f:
        f.seek(0, os.SEEK_END)
        torn = False
        if f.tell():
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) != b"\n"
            f.seek(0, os.SEEK_END)
        f.write((b"\n" if torn else b"") + json.dumps(record).encode() + b"\n")


def read(path: Path) -> list[dict]:
    """The whole records of ``path`` in order ([] when it does not exist); torn lines skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out
