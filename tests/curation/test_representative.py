"""A duplicate family keeps its best-quality copy: originals over conversions, then resolution,
then bytes per pixel, then the smallest key (one real photo saved in several encodings)."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from curation import schema
from curation.config import DecodeConfig
from curation.decode import Decode
from curation.dedup import representative_sort_key
from curation.dedup.steps import DedupContext, DedupExact, DedupNear, candidate_columns, run_dedup
from curation.recipe import CurationConfig
from tests.conftest import IMAGES


def _save(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _animated(img: Image.Image) -> bytes:
    frames = [img.convert("P", palette=Image.Palette.ADAPTIVE), img.transpose(Image.Transpose.ROTATE_180).convert("P")]
    return _save(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100)


def encodings(raw_jpeg: bytes) -> dict[str, bytes]:
    """The same photo, same size: the original JPEG and deliberate conversions of it. Keys sort the
    original last, so the smallest-key tie-break alone would never pick it."""
    im = Image.open(io.BytesIO(raw_jpeg)).convert("RGB")
    return {
        "a_palette_png": _save(im.convert("P", palette=Image.Palette.ADAPTIVE, colors=256), "PNG"),
        "b_grey16_png": _save(Image.fromarray(np.asarray(im.convert("L")).astype(np.uint16) * 257), "PNG"),
        "c_cmyk_jpeg": _save(im.convert("CMYK"), "JPEG", quality=95),
        "d_webp": _save(im, "WEBP"),
        "e_rgba_png": _save(im.convert("RGBA"), "PNG"),
        "f_grey_jpeg": _save(im.convert("L"), "JPEG", quality=95),
        "g_animated_gif": _animated(im),
        "z_original_jpeg": raw_jpeg,
    }


def decoded_candidates(files: dict[str, bytes]) -> tuple[pa.Table, list]:
    """Decode as the pipeline does, then keep the columns the recipe's dedup steps read."""
    step = Decode(DecodeConfig())
    rows = [
        step.decode_row({"partition": "p", "key": k, "source": k, "raw": v, "reason": None, "input_bytes": len(v)})
        for k, v in files.items()
    ]
    assert all(r["decode_ok"] for r in rows), [r["error_message"] for r in rows]
    table = pa.Table.from_pylist(rows, schema=pa.schema(schema.BASE_FIELDS))
    cfg = CurationConfig()
    steps = [DedupExact.from_config(cfg), DedupNear.from_config(cfg)]
    columns, absent = candidate_columns(steps, set(Decode.writes))
    assert not absent and {"converted", "input_bytes"} <= set(columns)
    return table.select(columns), steps


@pytest.fixture(scope="module")
def family():
    return decoded_candidates(encodings((IMAGES / "obama.jpg").read_bytes()))


def test_the_original_jpeg_represents_its_family(family):
    candidates, steps = family
    by_key = {r["key"]: r for r in candidates.to_pylist()}
    assert not by_key["z_original_jpeg"]["converted"] and not by_key["d_webp"]["converted"]
    assert all(by_key[k]["converted"] for k in by_key if k not in ("z_original_jpeg", "d_webp")), by_key
    decisions = run_dedup(steps, candidates, DedupContext()).to_pylist()
    assert sorted(d["key"] for d in decisions) == sorted(k for k in by_key if k != "z_original_jpeg")
    assert {d["duplicate_of"] for d in decisions} == {"z_original_jpeg"}
    assert {d["reason"] for d in decisions} == {"near_duplicate"}
    # the rule in Python says the same as the Arrow sort that made the decisions
    assert min(by_key.values(), key=representative_sort_key)["key"] == "z_original_jpeg"


def test_resolution_then_bytes_per_pixel_then_key_order_the_originals(family):
    candidates, _ = family
    rows = {r["key"]: r for r in candidates.to_pylist()}
    original, webp = rows["z_original_jpeg"], rows["d_webp"]
    assert original["input_bytes"] > webp["input_bytes"]  # same size, more bytes per pixel: the original wins
    assert representative_sort_key(original) < representative_sort_key(webp)
    bigger_webp = {**webp, "width": webp["width"] + 1}
    assert representative_sort_key(bigger_webp) < representative_sort_key(original)  # resolution before bytes
    converted_bigger = {**rows["a_palette_png"], "width": original["width"] * 2}
    assert representative_sort_key(original) < representative_sort_key(converted_bigger)  # an original before any size
    twin = {**original, "key": "a_twin"}
    assert representative_sort_key(twin) < representative_sort_key(original)  # full tie: the smallest key
