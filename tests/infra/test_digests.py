"""``infra.digests.sha256_file``: the digest of the bytes, whatever the path spelling, and a new
digest once the file is rewritten (the cache is keyed by size and modification time too)."""

from __future__ import annotations

import hashlib
import os

from infra.digests import sha256_file


def test_digest_is_the_bytes_sha256_across_blocks_and_path_spellings(tmp_path, monkeypatch):
    data = bytes(range(256)) * 9000  # 2.2 MiB: three read blocks
    path = tmp_path / "weights.bin"
    path.write_bytes(data)
    (tmp_path / "link.bin").symlink_to(path)
    monkeypatch.chdir(tmp_path)
    expected = hashlib.sha256(data).hexdigest()
    assert sha256_file(path) == sha256_file("weights.bin") == sha256_file(str(tmp_path / "link.bin")) == expected


def test_a_rewritten_file_is_hashed_again(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(b"first")
    before = sha256_file(path)
    path.write_bytes(b"second, longer")
    assert sha256_file(path) == hashlib.sha256(b"second, longer").hexdigest() != before
    # Same size, other bytes, a later modification time: hashed again too.
    stat = path.stat()
    path.write_bytes(b"SECOND, LONGER")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert sha256_file(path) == hashlib.sha256(b"SECOND, LONGER").hexdigest()
