"""Image bytes staged by reference: kept JPEGs are read again from the input, never copied into staging."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile

import pytest
from PIL import Image

from curation import staging
from curation.config import DecodeConfig, InputConfig
from curation.decode import Decode
from curation.partitions import plan_partitions
from curation.readers import read_partition
from curation.steps import run_steps_locally
from infra import storage
from pipelines.demo_corpus import jpeg_bytes


def _jpeg(color, size=(96, 80)) -> bytes:
    return jpeg_bytes(Image.new("RGB", size, color))


def _png(color) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 64), color).save(out, format="PNG")
    return out.getvalue()


def _decoded(uri: str) -> list:
    cfg = InputConfig(uri=uri)
    return [
        run_steps_locally(t, [Decode(DecodeConfig())])
        for p in plan_partitions(cfg)
        for t in read_partition(p, cfg, 2**26)
    ]


def _staged(tmp_path, tables) -> tuple:
    fs, root = storage.resolve(str(tmp_path / "out"))
    for t in tables:
        staging.write_parts(fs, root, t)
    pid = tables[0].column("partition")[0].as_py()
    return fs, root, staging.read_partition_rows(fs, root, pid)


def test_kept_jpegs_are_staged_by_reference_and_read_back_checked(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    files = {"a.jpg": _jpeg((200, 10, 10)), "b.jpg": _jpeg((10, 200, 10)), "c.png": _png((1, 2, 3))}
    for name, data in files.items():
        (raw / name).write_bytes(data)
    fs, root, rows = _staged(tmp_path, _decoded(str(raw)))
    by_name = {s.rsplit("/", 1)[-1]: i for i, s in enumerate(rows.column("source").to_pylist())}
    uris, images = rows.column("bytes_uri").to_pylist(), rows.column("image").to_pylist()
    # untouched JPEGs: a reference to the file, no bytes in staging; the re-encoded PNG: its bytes
    assert uris[by_name["a.jpg"]] == storage.resolve(str(raw / "a.jpg"))[1] and images[by_name["a.jpg"]] is None
    assert uris[by_name["c.png"]] is None and images[by_name["c.png"]] is not None

    loaded = staging.load_image_bytes(rows, [True] * rows.num_rows)
    assert loaded.column("image").to_pylist()[by_name["a.jpg"]] == files["a.jpg"]
    assert loaded.column("image").to_pylist()[by_name["b.jpg"]] == files["b.jpg"]
    assert loaded.column("image").to_pylist()[by_name["c.png"]] == images[by_name["c.png"]]
    # only the rows asked for are read
    only_a = staging.load_image_bytes(rows, [i == by_name["a.jpg"] for i in range(rows.num_rows)])
    assert only_a.column("image").to_pylist()[by_name["b.jpg"]] is None

    (raw / "b.jpg").write_bytes(_jpeg((10, 200, 11)))  # the input changed after pass 1 read it
    with pytest.raises(RuntimeError, match="b.jpg.*changed since pass 1"):
        staging.load_image_bytes(rows, [True] * rows.num_rows)
    (raw / "b.jpg").unlink()
    with pytest.raises(RuntimeError, match="can no longer be read"):
        staging.load_image_bytes(rows, [True] * rows.num_rows)


def _tar(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_uncompressed_tar_members_are_referenced_by_offset_compressed_ones_are_staged(tmp_path):
    long_name = "x" * 120  # a GNU/PAX long-name header before the member moves its data offset
    members = {
        "000001.jpg": _jpeg((200, 10, 10)),
        f"{long_name}.jpg": _jpeg((10, 10, 200)),
        "000001.json": b'{"caption": "red"}',
    }
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    (plain / "shard.tar").write_bytes(_tar(members))
    (packed / "shard.tar").write_bytes(gzip.compress(_tar(members)))

    _, _, rows = _staged(tmp_path / "p", _decoded(str(plain)))
    assert rows.num_rows == 2 and rows.column("image").null_count == 2
    assert [storage.resolve(u)[1] for u in set(rows.column("bytes_uri").to_pylist())] == [
        storage.resolve(str(plain / "shard.tar"))[1]
    ]
    loaded = staging.load_image_bytes(rows, [True, True])
    wanted = {hashlib.sha256(members[n]).hexdigest(): members[n] for n in ("000001.jpg", f"{long_name}.jpg")}
    for sha, data in zip(loaded.column("sha256").to_pylist(), loaded.column("image").to_pylist()):
        assert data == wanted[sha]

    _, _, rows = _staged(tmp_path / "g", _decoded(str(packed)))
    assert rows.num_rows == 2 and rows.column("bytes_uri").null_count == 2
    assert sorted(rows.column("image").to_pylist()) == sorted(wanted.values())
