"""Dedup before the models: on a corpus with 20% exact duplicates the detector and the text filter
score 20% fewer rows than the single pass did (every row past geometry), and the kept set is the
one the single pass kept (of identical bytes, the smallest key)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.dataset as pads
import pytest

from curation.pipeline import run_curation
from tests.conftest import IMAGES
from tests.curation.test_pipeline import demo_config

pytestmark = pytest.mark.slow

GEOMETRY_AND_ERRORS = {
    "too_small",
    "aspect_ratio",
    "read_failed",
    "empty_file",
    "file_too_large",
    "not_an_image",
    "decompression_bomb",
    "truncated",
    "decode_failed",
    "unsupported_mode",
}


def corpus(folder: Path, copies: int) -> Path:
    """Eight real photos (the shared ones and two of Ultralytics'), and ``copies`` byte-identical reposts."""
    import ultralytics

    folder.mkdir(parents=True)
    photos = sorted(IMAGES.iterdir()) + [
        Path(ultralytics.__file__).parent / "assets" / n for n in ("bus.jpg", "zidane.jpg")
    ]
    for src in photos:
        shutil.copyfile(src, folder / src.name)
    for src in photos[:copies]:
        (folder / "reposts").mkdir(exist_ok=True)
        shutil.copyfile(src, folder / "reposts" / src.name)
    return folder


def manifest(out: Path) -> list[dict]:
    return pads.dataset(sorted(str(p) for p in (out / "manifest").glob("*.parquet"))).to_table().to_pylist()


def scored(rows: list[dict], column: str) -> int:
    """Rows a model stage scored: it writes its column on every row it scores, and only there."""
    return sum(r[column] is not None for r in rows)


def test_models_see_no_duplicate_and_the_kept_set_is_unchanged(tmp_path, ray_local, centernet_path):
    unique = manifest(
        Path(
            run_curation(
                demo_config(corpus(tmp_path / "unique", 0), tmp_path / "u", centernet_path, name="unique")
            ).output_dir
        )
    )
    dups = manifest(
        Path(
            run_curation(
                demo_config(corpus(tmp_path / "dups", 2), tmp_path / "d", centernet_path, name="dups")
            ).output_dir
        )
    )
    assert len(unique) == 8 and len(dups) == 10  # 2 of 10 inputs are duplicates: 20%
    # The single pass scored every row that decoded and passed geometry; two passes score the survivors.
    single_pass = sum(r["reason"] not in GEOMETRY_AND_ERRORS for r in dups)
    assert single_pass == 10
    for column in ("person_count", "text_coverage"):  # the detector, then the text filter on what it kept
        assert scored(dups, column) == scored(unique, column), column
    assert scored(dups, "person_count") == single_pass - 2  # 20% fewer detector calls
    assert scored(unique, "text_coverage") > 0
    exact = [r for r in dups if r["reason"] == "exact_duplicate"]
    assert len(exact) == 2 and all(r["person_count"] is None and r["text_coverage"] is None for r in exact)
    # Kept set: what the unique corpus keeps, each by the smallest key among its identical copies.
    smallest = {}
    for r in sorted(dups, key=lambda r: r["key"]):
        smallest.setdefault(r["sha256"], r["key"])
    kept_unique = {r["sha256"] for r in unique if r["status"] == "kept"}
    assert kept_unique and {r["key"] for r in dups if r["status"] == "kept"} == {smallest[s] for s in kept_unique}
