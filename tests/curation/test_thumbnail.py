"""Decode's grey thumbnail: reduced from the pixels the hash uses, the same size for every copy of
a picture, readable by the steps of pass 1's read task only, and never staged."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from curation import schema, staging
from curation.config import DecodeConfig
from curation.decode import THUMBNAIL_SIDE, Decode, thumbnail_pixels
from curation.recipe import HUMANS1B
from curation.steps import BuiltRecipe, RowStep
from infra import storage
from infra.config import load_config
from tests.conftest import IMAGES


def _encoded(im: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def _decoded(files: dict[str, bytes]) -> pa.Table:
    rows = [
        {"partition": "p", "key": k, "source": k, "raw": v, "reason": None, "input_bytes": len(v)}
        for k, v in files.items()
    ]
    return Decode(DecodeConfig()).process(pa.Table.from_pylist(rows, schema=schema.RAW_SCHEMA))


def test_every_copy_of_a_photo_gets_the_same_size_of_thumbnail():
    photo = Image.open(IMAGES / "obama.jpg").convert("RGB")  # 910 x 1137
    files = {
        "jpeg": (IMAGES / "obama.jpg").read_bytes(),  # kept as it is: measured on its draft decode
        "png": _encoded(photo, "PNG"),  # decoded in full
        "half_jpeg": _encoded(photo.resize((455, 568)), "JPEG"),
    }
    table = _decoded(files)
    thumbs = {
        k: thumbnail_pixels(v) for k, v in zip(table.column("key").to_pylist(), table.column("thumbnail").to_pylist())
    }
    assert {k: t.shape for k, t in thumbs.items()} == {k: (80, THUMBNAIL_SIDE) for k in files}
    png = thumbs["png"].astype(np.float64)
    for key, thumb in thumbs.items():  # the same picture, whichever path decoded it, at whichever size
        assert np.abs(thumb - png).mean() < 1.5, key


def test_a_small_image_is_never_enlarged_and_a_bad_one_has_none():
    small = _encoded(Image.new("RGB", (40, 30), (200, 10, 10)), "PNG")
    table = _decoded({"small": small, "bad": b"not an image"})
    thumb, none = table.column("thumbnail").to_pylist()
    assert (thumb["width"], thumb["height"]) == (40, 30) and none is None
    assert thumbnail_pixels(thumb).max() == thumbnail_pixels(thumb).min()  # one grey level: a flat image


def test_staging_drops_the_transient_columns(tmp_path):
    table = _decoded({"a": (IMAGES / "obama.jpg").read_bytes()})
    fs, root = storage.resolve(str(tmp_path))
    staging.write_parts(fs, root, table)
    staged = staging.read_partition_rows(fs, root, "p")
    assert "thumbnail" not in staged.column_names and "phash" in staged.column_names


class _ReadsThumbnail(RowStep):
    section = "reads_thumbnail"
    reads = ("thumbnail",)

    def process(self, batch: pa.Table) -> pa.Table:
        return batch


def _steps_with(position: int) -> BuiltRecipe:
    cfg = load_config(
        HUMANS1B.config_class(),
        overrides=["input.uri=x", "output_dir=y", "detector.backend=none", "content.embedding.enabled=false"],
    )
    steps = [s.from_config(cfg) for s in HUMANS1B.steps if not s.section.startswith("content.")]
    return BuiltRecipe([*steps[:position], _ReadsThumbnail(), *steps[position:]])


def test_only_the_first_pass_can_read_the_thumbnail():
    built = _steps_with(3)  # after geometry, before exact dedup
    built.check_columns()
    assert "thumbnail" not in built.available()
    later = _steps_with(6)  # after the detector: pass 2
    with pytest.raises(
        ValueError,
        match=r"step 'reads_thumbnail' reads column 'thumbnail', which no earlier enabled step writes: "
        r"'thumbnail' lives only in the first pass .*; move 'reads_thumbnail' there",
    ):
        later.check_columns()
