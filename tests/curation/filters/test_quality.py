"""The image-quality step on the real photos: blurred and over/under-exposed copies score worse
than their originals on every photo, the shipped thresholds pass every original, and a family of
an original and its blurred copy keeps the original."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image, ImageFilter

from curation import schema
from curation.config import DecodeConfig
from curation.decode import Decode
from curation.dedup.steps import DedupContext, DedupNear, candidate_columns, run_dedup
from curation.filters.quality import BADLY_EXPOSED, BLURRED, Quality, QualityConfig, sharpness
from curation.recipe import HUMANS1B, CurationConfig, weightless_content_filters
from curation.steps import BuiltRecipe, run_steps_locally
from infra.config import load_config


@pytest.fixture(scope="module")
def photos(real_images) -> dict[str, Image.Image]:
    """The real photos: the shared assets and those our dependencies ship, people and scenes."""
    import skimage.data

    scenes = {name: Image.fromarray(getattr(skimage.data, name)()).convert("RGB") for name in SCENES}
    return {**real_images, **scenes}


SCENES = ("camera", "coffee", "chelsea", "rocket")  # scikit-image's (camera: a person, grey)


def _jpeg(im: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", **{"quality": 92, **kw})
    return buf.getvalue()


def exposed(im: Image.Image, stops: int) -> Image.Image:
    """``im`` with its linear light multiplied by 2**stops (sRGB decoded and re-encoded, clipped):
    an exposure change, one table lookup per channel value."""
    a = np.arange(256) / 255.0
    linear = np.clip(np.where(a <= 0.04045, a / 12.92, ((a + 0.055) / 1.055) ** 2.4) * 2.0**stops, 0.0, 1.0)
    srgb = np.where(linear <= 0.0031308, linear * 12.92, 1.055 * linear ** (1 / 2.4) - 0.055)
    return im.point(np.round(srgb * 255.0).astype(int).tolist() * 3)


def decoded(files: dict[str, bytes]) -> pa.Table:
    rows = [
        {"partition": "p", "key": k, "source": k, "raw": v, "reason": None, "input_bytes": len(v)}
        for k, v in files.items()
    ]
    return Decode(DecodeConfig()).process(pa.Table.from_pylist(rows, schema=schema.RAW_SCHEMA))


def measured(files: dict[str, bytes], cfg: QualityConfig | None = None) -> dict[str, dict]:
    table = run_steps_locally(decoded(files), [Quality(cfg or QualityConfig())])
    return {r["key"]: r for r in table.to_pylist()}


@pytest.fixture(scope="module")
def copies(photos) -> dict[str, dict[str, dict]]:
    """photo -> copy -> its row after decode and the quality step."""
    out = {}
    for name, im in photos.items():
        files = {
            "original": _jpeg(im),
            "blur 2px": _jpeg(im.filter(ImageFilter.GaussianBlur(2))),
            "blur 1%": _jpeg(im.filter(ImageFilter.GaussianBlur(0.01 * min(im.size)))),
            "+1 EV": _jpeg(exposed(im, 1)),
            "-1 EV": _jpeg(exposed(im, -1)),
            "+3 EV": _jpeg(exposed(im, 3)),
        }
        out[name] = measured(files)
    return out


def test_every_blurred_or_exposed_copy_scores_worse_than_its_original(copies):
    assert len(copies) >= 14
    for name, rows in copies.items():
        orig = rows["original"]
        for blur in ("blur 2px", "blur 1%"):
            assert rows[blur]["sharpness"] < orig["sharpness"], (name, blur)
        for over in ("+1 EV", "+3 EV"):
            assert rows[over]["clipped_bright"] > orig["clipped_bright"], (name, over)
        assert rows["-1 EV"]["clipped_dark"] > orig["clipped_dark"], name


def test_the_shipped_thresholds_pass_every_original_and_flag_strong_flaws(copies):
    assert {n: r["original"]["rank_quality"] for n, r in copies.items()} == {n: 0 for n in copies}
    assert all(r["blur 1%"]["rank_quality"] == 1 for r in copies.values())
    assert all(r["+3 EV"]["rank_quality"] == 1 for r in copies.values())


def test_reasons_only_when_told_and_only_on_pending_rows(photos):
    im = photos["bus"]
    files = {
        "sharp": _jpeg(im),
        "blurred": _jpeg(im.filter(ImageFilter.GaussianBlur(10))),
        "blown": _jpeg(exposed(im, 3)),
    }
    rows = measured(files)
    assert {k: r["reason"] for k, r in rows.items()} == dict.fromkeys(files)  # by default it only ranks
    assert {k: r["rank_quality"] for k, r in rows.items()} == {"sharp": 0, "blurred": 1, "blown": 1}
    dropping = QualityConfig(drop_blurred=True, drop_badly_exposed=True)
    assert {k: r["reason"] for k, r in measured(files, dropping).items()} == {
        "sharp": None,
        "blurred": BLURRED,
        "blown": BADLY_EXPOSED,
    }
    batch = decoded({**files, "broken": b"not an image"})
    batch = schema.set_reasons(batch, [schema.TOO_SMALL, None, None, None])  # ended before the step
    out = {r["key"]: r for r in Quality(dropping).process(batch).to_pylist()}
    assert out["sharp"]["sharpness"] is None and out["sharp"]["reason"] == schema.TOO_SMALL
    assert out["broken"]["sharpness"] is None and out["broken"]["reason"] == "not_an_image"
    assert out["blurred"]["reason"] == BLURRED


def test_a_flat_image_is_not_sharp():
    assert sharpness(np.full((64, 80), 128, np.uint8)) == 0.0
    noise = np.random.default_rng(0).integers(0, 256, (64, 80)).astype(np.uint8)
    assert sharpness(noise) > 4.0  # white noise: about 5


def test_a_family_of_an_original_and_its_blurred_copy_keeps_the_original(photos):
    im = photos["obama"]
    blurred = im.filter(ImageFilter.GaussianBlur(0.01 * min(im.size)))
    files = {
        "a_blurred_bigger.jpg": _jpeg(blurred.resize((im.width * 5 // 4, im.height * 5 // 4)), quality=98),
        "b_blurred.png": (lambda b: (blurred.save(b, "PNG"), b.getvalue())[1])(io.BytesIO()),
        "z_original.jpg": _jpeg(im, quality=85),
    }
    table = run_steps_locally(decoded(files), [Quality(QualityConfig())])
    steps = [DedupNear.from_config(CurationConfig())]
    columns, _ = candidate_columns(steps, {*Decode.writes, *Quality.writes})
    assert "rank_quality" in columns
    decisions = run_dedup(steps, table.select(columns), DedupContext()).to_pylist()
    assert {d["key"]: d["duplicate_of"] for d in decisions} == {
        "a_blurred_bigger.jpg": "z_original.jpg",
        "b_blurred.png": "z_original.jpg",
    }
    # without the step's rank the rule would have kept the larger blurred copy
    unranked = run_dedup(steps, table.select([c for c in columns if c != "rank_quality"]), DedupContext())
    assert set(unranked.column("duplicate_of").to_pylist()) == {"a_blurred_bigger.jpg"}


def test_the_step_runs_in_the_first_pass_on_decodes_thumbnail():
    cfg = load_config(
        HUMANS1B.config_class(),
        overrides=["input.uri=x", "output_dir=y", "detector.backend=none", "content.embedding.enabled=false"],
    )
    cfg.content = weightless_content_filters()
    built = BuiltRecipe([s.from_config(cfg) for s in HUMANS1B.steps])
    first = built.passes()[0]
    assert "quality" in [s.name for s in first.row_steps]
    assert "rank_quality" in built.available() and "thumbnail" not in built.available()
