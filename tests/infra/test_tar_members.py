"""``infra.storage.write_tar_members``: the one tar writer of curated and annotation shards."""

from __future__ import annotations

import os
import tarfile
import time

import pyarrow.fs as pafs

from infra.storage import write_tar_members

MEMBERS = [("b.jpg", b"\xff\xd8 image"), ("b.json", b"{}"), ("a.jpg", b"")]


def test_members_in_order_with_fixed_metadata_and_equal_bytes(tmp_path):
    fs = pafs.LocalFileSystem()
    write_tar_members(fs, str(tmp_path / "one" / "x.tar"), iter(MEMBERS))
    time.sleep(0.01)
    old = os.umask(0o077)  # the writer's umask and clock must not reach the members
    try:
        write_tar_members(fs, str(tmp_path / "two" / "x.tar"), MEMBERS)
    finally:
        os.umask(old)
    one, two = (tmp_path / "one" / "x.tar").read_bytes(), (tmp_path / "two" / "x.tar").read_bytes()
    assert one == two
    with tarfile.open(tmp_path / "one" / "x.tar") as tar:
        infos = tar.getmembers()
        assert [(i.name, tar.extractfile(i).read()) for i in infos] == MEMBERS
        assert {(i.mtime, i.mode, i.uid, i.gid, i.uname, i.gname) for i in infos} == {(0, 0o644, 0, 0, "", "")}
    assert os.listdir(tmp_path / "one") == ["x.tar"]  # no temporary file left beside it
