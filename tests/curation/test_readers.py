"""Readers: folders, WebDataset tars (hostile ones too) and Parquet, with deterministic partitions."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from curation import schema
from curation.config import DecodeConfig, InputConfig
from curation.partitions import plan_partitions
from curation.pipeline import run_curation
from curation.readers import read_partition
from curation.recipe import CurationConfig, weightless_content_filters
from infra.tracking import TrackingConfig
from pipelines.demo_corpus import jpeg_bytes


def _img(color=(200, 10, 10), size=(320, 320)) -> bytes:
    return jpeg_bytes(Image.new("RGB", size, color))


def _add(tar: tarfile.TarFile, name: str, data: bytes, kind=tarfile.REGTYPE, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.linkname = (len(data) if kind == tarfile.REGTYPE else 0), kind, link
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def rows_of(cfg: InputConfig, max_bytes: int = 2**26) -> list[dict]:
    return [r for p in plan_partitions(cfg) for t in read_partition(p, cfg, max_bytes) for r in t.to_pylist()]


def test_folder_is_recursive_and_partitions_are_deterministic(tmp_path):
    for i in range(5):
        d = tmp_path / ("a" if i % 2 else "b") / "deep"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"img{i}.jpg").write_bytes(_img())
    (tmp_path / "notes.txt").write_text("not an image input")
    cfg = InputConfig(uri=str(tmp_path), images_per_partition=2)
    first, second = plan_partitions(cfg), plan_partitions(cfg)
    assert [p.id for p in first] == [p.id for p in second] and len(first) == 3
    rows = rows_of(cfg)
    assert len(rows) == 5 and len({r["key"] for r in rows}) == 5
    assert all("." not in r["key"] for r in rows)  # WebDataset-safe keys
    assert {Path(r["source"]).name for r in rows} == {f"img{i}.jpg" for i in range(5)}


def test_webdataset_tar_groups_members_and_survives_hostile_names(tmp_path):
    tar_path = tmp_path / "shard-000.tar"
    with tarfile.open(tar_path, "w") as tar:
        _add(tar, "000001.jpg", _img())
        _add(tar, "000002.png", _img((1, 2, 3)))
        _add(tar, "000001.json", json.dumps({"url": "http://example.com/1.jpg", "caption": "a person"}).encode())
        _add(tar, "../../escape.jpg", _img())  # path traversal: read as bytes, never extracted
        _add(tar, "/abs/path.jpg", _img())
        _add(tar, "link.jpg", b"", kind=tarfile.SYMTYPE, link="/etc/passwd")  # not a file: ignored
        _add(tar, "000003.json", b"{}")  # no image: img2dataset's failed download
    cfg = InputConfig(uri=str(tmp_path))
    rows = rows_of(cfg)
    by_src = {r["source"].split("#", 1)[1]: r for r in rows}
    assert set(by_src) == {"000001.jpg", "000002.png", "../../escape.jpg", "/abs/path.jpg"}
    assert json.loads(by_src["000001.jpg"]["source_meta"])["caption"] == "a person"  # json came later: still joined
    assert all(set(r["key"]) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") for r in rows)
    assert not (tmp_path / "escape.jpg").exists() and not Path("/abs/path.jpg").exists()


def test_tar_members_without_a_key_and_an_extension_are_no_samples(tmp_path):
    """The member-name rule of ``curation.output.split_member``: a name without an extension, or
    a hidden file at the top, names no sample and is skipped, as webdataset's own reader skips it."""
    with tarfile.open(tmp_path / "s.tar", "w") as tar:
        for name in ("README", "docs/LICENSE", ".hidden.png", "000001.jpg", "d/000002.JPG"):
            _add(tar, name, _img())
    rows = rows_of(InputConfig(uri=str(tmp_path)))
    assert sorted(r["source"].split("#", 1)[1] for r in rows) == ["000001.jpg", "d/000002.jpg"]


def test_truncated_tar_keeps_what_was_read_and_records_the_rest(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(3):
            _add(tar, f"{i:06d}.jpg", _img(size=(400, 400)))
    data = buf.getvalue()
    (tmp_path / "broken.tar").write_bytes(data[: len(data) // 2])
    rows = rows_of(InputConfig(uri=str(tmp_path), format="webdataset"))
    errors = [r for r in rows if r["reason"] == schema.READ_FAILED]
    assert len(errors) == 1 and errors[0]["source"].endswith("#unreadable")
    assert 1 <= len([r for r in rows if r["raw"]]) < 3


def test_oversized_member_is_recorded_without_reading(tmp_path):
    with tarfile.open(tmp_path / "s.tar", "w") as tar:
        _add(tar, "big.jpg", _img(size=(900, 900)))
        _add(tar, "ok.jpg", _img(size=(16, 16)))
    rows = {r["source"].split("#")[1]: r for r in rows_of(InputConfig(uri=str(tmp_path)), max_bytes=2000)}
    assert rows["big.jpg"]["reason"] == schema.FILE_TOO_LARGE and rows["big.jpg"]["raw"] is None
    assert rows["ok.jpg"]["reason"] is None


def test_parquet_with_bytes_column_and_with_path_column(tmp_path):
    (tmp_path / "files").mkdir()
    paths = []
    for i in range(3):
        p = tmp_path / "files" / f"p{i}.jpg"
        p.write_bytes(_img())
        paths.append(str(p))
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"key": ["x1", "x2"], "jpg": [_img(), b"garbage"]}), tmp_path / "pq" / "bytes.parquet")
    rows = rows_of(InputConfig(uri=str(tmp_path / "pq" / "bytes.parquet")))
    assert [r["source"].rsplit("#", 1)[1] for r in rows] == ["row=0", "row=1"] and rows[0]["key"].startswith("x1-")
    pq.write_table(
        pa.table({"url": paths + [str(tmp_path / "missing.jpg")]}), tmp_path / "paths.parquet", row_group_size=2
    )
    cfg = InputConfig(uri=str(tmp_path / "paths.parquet"), images_per_partition=2)
    assert len(plan_partitions(cfg)) == 2
    rows = rows_of(cfg)
    assert [r["reason"] for r in rows] == [None, None, None, schema.READ_FAILED]
    with pytest.raises(ValueError, match="parquet_image_column"):
        plan_partitions(InputConfig(uri=str(tmp_path / "pq" / "bytes.parquet"), parquet_image_column="nope"))


def test_tar_input_through_the_whole_pipeline(tmp_path, ray_local):
    with tarfile.open(tmp_path / "in.tar", "w") as tar:
        _add(tar, "a.jpg", _img((10, 200, 10), (400, 300)))
        _add(tar, "a.json", b'{"caption": "x"}')
        _add(tar, "b.jpg", b"\xff\xd8 not really")
        _add(tar, "c.jpg", _img((10, 200, 10), (400, 300)))
    cfg = CurationConfig(
        input=InputConfig(uri=str(tmp_path / "in.tar")),
        output_dir=str(tmp_path / "out"),
        decode=DecodeConfig(),
        tracking=TrackingConfig(enabled=False),
        content=weightless_content_filters(text=False),
    )
    cfg.detector.backend = "none"
    result = run_curation(cfg)
    assert (result.stats["inputs"], result.stats["kept"], result.stats["errors"]) == (3, 1, 1)
    assert result.stats["dropped_by_reason"] == {"exact_duplicate": 1}
    assert [s for s in result.stats["steps"] if s["name"] == "detector"][0]["applied"] is False
    for name in ("content.embedding", "content.artistic", "content.watermark", "content.text"):
        assert [s for s in result.stats["steps"] if s["name"] == name][0]["applied"] is False


def test_the_per_folder_resolver_equals_storage_resolve(tmp_path):
    from curation.readers import _Resolver
    from infra import storage

    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.jpg").write_bytes(b"1")
    (tmp_path / "link").symlink_to(tmp_path / "a")  # a linked folder
    (tmp_path / "a" / "y.jpg").symlink_to(tmp_path / "a" / "b" / "x.jpg")  # a linked file
    resolve = _Resolver()
    for uri in [
        tmp_path / "a" / "b" / "x.jpg",
        tmp_path / "link" / "b" / "x.jpg",
        tmp_path / "a" / "y.jpg",
        tmp_path / "link" / "y.jpg",
        f"{tmp_path}/a/../a/y.jpg",
        "relative/x.jpg",
        tmp_path / "missing.jpg",
    ]:
        assert resolve(str(uri))[1] == storage.resolve(str(uri))[1], uri


def _img2dataset_folder(folder: Path) -> Path:
    """img2dataset 1.47's output for 4 URLs: ``00000.tar`` with the 2 successes (jpg + json + txt),
    ``00000.parquet`` with all 4 attempts and their status, ``00000_stats.json``. The first success
    was upscaled from 120x120 (stored 400x400), the second downscaled from 1600x1200."""
    folder.mkdir()
    attempts = [
        ("000000000", "success", None, (400, 400), (120, 120)),
        ("000000001", "success", None, (400, 300), (1600, 1200)),
        ("000000002", "failed_to_download", "HTTP Error 404: Not Found", None, None),
        ("000000003", "failed_to_resize", "image decode failed", None, None),
    ]
    records = []
    with tarfile.open(folder / "00000.tar", "w") as tar:
        for key, status, error, size, original in attempts:
            record = {"url": f"http://example.com/{key}.jpg", "key": key, "status": status, "error_message": error}
            record.update(width=size and size[0], height=size and size[1])
            record.update(original_width=original and original[0], original_height=original and original[1])
            records.append({**record, "caption": f"photo {key}"})
            if status == "success":
                _add(tar, f"{key}.jpg", _img(size=size))
                _add(tar, f"{key}.txt", f"photo {key}".encode())
                _add(tar, f"{key}.json", json.dumps(record).encode())
    pq.write_table(pa.Table.from_pylist(records), folder / "00000.parquet")
    (folder / "00000_stats.json").write_text(json.dumps({"count": 4, "successes": 2, "failed_to_download": 1}))
    return folder


def test_img2dataset_failed_downloads_are_inputs_and_geometry_uses_the_original_size(tmp_path):
    from curation.decode import Decode
    from curation.filters.geometry import Geometry, GeometryConfig
    from curation.steps import run_steps_locally

    cfg = InputConfig(uri=str(_img2dataset_folder(tmp_path / "i2d")))
    rows = rows_of(cfg)
    by_member = {r["source"].rsplit("#", 1)[1]: r for r in rows}
    assert sorted(by_member) == ["000000000.jpg", "000000001.jpg", "row=2", "row=3"]  # each attempt exactly once
    for row_no, status in ((2, "failed_to_download"), (3, "failed_to_resize")):
        failed = by_member[f"row={row_no}"]
        assert failed["source"] == f"{tmp_path / 'i2d' / '00000.parquet'}#row={row_no}"
        assert failed["reason"] == schema.DOWNLOAD_FAILED and failed["error_message"].startswith(f"{status}: ")
        assert json.loads(failed["source_meta"])["url"] == f"http://example.com/00000000{row_no}.jpg"
    scored = run_steps_locally(
        pa.Table.from_pylist(rows, schema=schema.RAW_SCHEMA),
        [Decode(DecodeConfig()), Geometry(GeometryConfig(min_short_side=256))],
    )
    geometry = {r["source"].rsplit("#", 1)[1]: r for r in scored.to_pylist()}
    upscaled, downscaled = geometry["000000000.jpg"], geometry["000000001.jpg"]
    assert (upscaled["width"], upscaled["original_width"], upscaled["reason"]) == (400, 120, schema.TOO_SMALL)
    assert (downscaled["width"], downscaled["original_width"], downscaled["reason"]) == (400, 1600, None)
    assert geometry["row=2"]["decode_ok"] is False and geometry["row=2"]["reason"] == schema.DOWNLOAD_FAILED
    # A tar with a Parquet beside it but no _stats.json (a curated output's sidecar) holds no failures.
    (tmp_path / "i2d" / "00000_stats.json").unlink()
    assert sorted(r["source"].rsplit("#", 1)[1] for r in rows_of(cfg)) == ["000000000.jpg", "000000001.jpg"]


UNREADABLE_RECORD = r"img2dataset's record of failed downloads \S*/i2d/00000\.parquet cannot be read"


def test_an_unreadable_record_of_failed_downloads_fails_the_partition(tmp_path):
    cfg = InputConfig(uri=str(_img2dataset_folder(tmp_path / "i2d")))
    record = tmp_path / "i2d" / "00000.parquet"
    whole = record.read_bytes()
    for broken, why in ((whole[: len(whole) // 2], "ArrowInvalid"), (b"", "ArrowInvalid")):  # cut short, empty
        record.write_bytes(broken)
        with pytest.raises(RuntimeError, match=f"{UNREADABLE_RECORD} \\({why}: "):
            rows_of(cfg)
    pq.write_table(pa.table({"url": ["http://example.com/0.jpg"]}), record)  # a Parquet, not img2dataset's record
    with pytest.raises(RuntimeError, match=f"{UNREADABLE_RECORD} \\(no 'key' and 'status' columns in \\['url'\\]\\)"):
        rows_of(cfg)
    # No record at all: the tar is a plain WebDataset shard, every image it holds read.
    record.unlink()
    assert sorted(r["source"].rsplit("#", 1)[1] for r in rows_of(cfg)) == ["000000000.jpg", "000000001.jpg"]


def test_img2dataset_funnel_starts_at_what_was_attempted(tmp_path, ray_local):
    cfg = CurationConfig(
        input=InputConfig(uri=str(_img2dataset_folder(tmp_path / "i2d"))),
        output_dir=str(tmp_path / "out"),
        tracking=TrackingConfig(enabled=False),
        content=weightless_content_filters(text=False),
    )
    cfg.detector.backend, cfg.geometry.min_short_side = "none", 256
    # An unreadable record of its failed downloads fails the run, which the repaired record resumes.
    record = tmp_path / "i2d" / "00000.parquet"
    whole = record.read_bytes()
    record.write_bytes(whole[:100])
    with pytest.raises(RuntimeError, match=UNREADABLE_RECORD):
        run_curation(cfg)
    record.write_bytes(whole)
    result = run_curation(cfg)
    stats = result.stats
    assert (stats["inputs"], stats["kept"], stats["dropped"], stats["errors"]) == (4, 1, 1, 2)
    assert stats["errors_by_reason"] == {"download_failed": 2} and stats["dropped_by_reason"] == {"too_small": 1}
    assert stats["funnel"][0] == {"step": "input", "in": 4, "out": 2, "removed": {"download_failed": 2}}
    assert stats["reconciled"] is True
    # the per-partition layout's shard index: its one shard, with the one kept sample
    index = json.loads((tmp_path / "out" / "shardindex.json").read_text())
    shard = Path(result.shards[0]).name
    assert [(s["url"], s["nsamples"]) for s in index["shardlist"]] == [(f"shards/{shard}", 1)]
