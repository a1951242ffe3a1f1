"""Fixtures for the content-filter tests: real photos, rendered text/watermarks, saved random models.

Real photos come from shared/assets and from packages the project depends on. Captions and
watermarks are rendered onto them with the DejaVu font matplotlib ships. Models are randomly
initialised, saved to files, and loaded back through the steps' own code.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a hub miss costs ~47 s of retries otherwise

import pyarrow as pa
import pytest
from PIL import Image, ImageDraw, ImageFont

from curation.schema import BASE_FIELDS
from tests.conftest import IMAGES as ASSETS  # noqa: E402

# A CLIP small enough for CPU tests (embedding width 32, 64 px input).
TINY_CLIP = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


def _font_path() -> str:
    import matplotlib

    return os.path.join(matplotlib.get_data_path(), "fonts", "ttf", "DejaVuSans-Bold.ttf")


@pytest.fixture(scope="session")
def real_images() -> dict[str, Image.Image]:
    """Real photos by name (RGB)."""
    import matplotlib
    import skimage.data

    assets = Path(os.environ.get("HUMANVISION_ASSETS", ASSETS))
    if not assets.is_dir():
        pytest.fail(f"shared test images not found at {assets} (see shared/assets/PROVENANCE.md)")
    images = {p.stem: Image.open(p).convert("RGB") for p in sorted(assets.iterdir()) if p.suffix in (".jpg", ".png")}
    ultralytics = Path(importlib.util.find_spec("ultralytics").origin).parent / "assets"  # not imported
    for name in ("bus", "zidane"):
        images[name] = Image.open(ultralytics / f"{name}.jpg").convert("RGB")
    images["grace_hopper"] = Image.open(
        os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")
    ).convert("RGB")
    images["astronaut"] = Image.fromarray(skimage.data.astronaut())
    return images


def _overlay(im: Image.Image, draw_fn) -> Image.Image:
    layer = Image.new("RGBA", im.size, (0, 0, 0, 0))
    draw_fn(ImageDraw.Draw(layer), *im.size)
    return Image.alpha_composite(im.convert("RGBA"), layer).convert("RGB")


def meme_caption(im: Image.Image, text: str = "WHEN YOU FINALLY\nFINISH THE PROJECT") -> Image.Image:
    """Two lines of large white text with a black outline across the bottom."""
    out = im.copy()
    w, h = out.size
    ImageDraw.Draw(out).multiline_text(
        (w / 2, h * 0.97),
        text,
        font=ImageFont.truetype(_font_path(), int(w / 12)),
        fill="white",
        stroke_width=max(2, w // 200),
        stroke_fill="black",
        anchor="md",
        align="center",
    )
    return out


def news_bar(im: Image.Image, text: str = "Breaking news: crowds gather downtown") -> Image.Image:
    """A translucent dark band near the bottom with one line of text (a TV caption)."""

    def draw(d, w, h):
        d.rectangle((0, h * 0.80, w, h * 0.95), fill=(0, 0, 0, 170))
        size = h * 0.07 if w > h else w * 0.05
        d.text(
            (w * 0.04, h * 0.875),
            text,
            font=ImageFont.truetype(_font_path(), int(size)),
            fill=(255, 255, 255, 255),
            anchor="lm",
        )

    return _overlay(im, draw)


def corner_mark(
    im: Image.Image, text: str = "\u00a9 shutterstock", corner: str = "br", alpha: int = 180
) -> Image.Image:
    """Small translucent text in a corner, as stock photo sites stamp it."""

    def draw(d, w, h):
        m = min(w, h) * 0.015
        xy, anchor = {
            "br": ((w - m, h - m), "rd"),
            "tl": ((m, m), "la"),
            "bl": ((m, h - m), "ld"),
            "tr": ((w - m, m), "ra"),
        }[corner]
        d.text(
            xy,
            text,
            font=ImageFont.truetype(_font_path(), max(8, int(min(w, h) / 28))),
            fill=(255, 255, 255, alpha),
            anchor=anchor,
            stroke_width=1,
            stroke_fill=(0, 0, 0, alpha // 2),
        )

    return _overlay(im, draw)


def diagonal_mark(
    im: Image.Image, text: str = "SAMPLE", angle: float = 30, scale: float = 6, alpha: int = 150
) -> Image.Image:
    """Large translucent text rotated across the middle of the image."""
    w, h = im.size
    big = Image.new("RGBA", (int(w * 1.5), int(h * 1.5)), (0, 0, 0, 0))
    ImageDraw.Draw(big).text(
        (big.width / 2, big.height / 2),
        text,
        font=ImageFont.truetype(_font_path(), int(min(w, h) / scale)),
        fill=(255, 255, 255, alpha),
        anchor="mm",
        stroke_width=2,
        stroke_fill=(0, 0, 0, alpha // 2),
    )
    big = big.rotate(angle, resample=Image.Resampling.BICUBIC)
    left, top = (big.width - w) // 2, (big.height - h) // 2
    layer = big.crop((left, top, left + w, top + h))
    return Image.alpha_composite(im.convert("RGBA"), layer).convert("RGB")


@pytest.fixture(scope="session")
def render() -> SimpleNamespace:
    return SimpleNamespace(
        meme_caption=meme_caption, news_bar=news_bar, corner_mark=corner_mark, diagonal_mark=diagonal_mark
    )


def jpeg_bytes(im: Image.Image, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def make_batch(
    images: dict[str, Image.Image], not_pending: dict[str, str] | None = None, undecodable: tuple[str, ...] = ()
) -> pa.Table:
    """A decoded batch as the decode step leaves it: one row per image, keyed by name.

    ``not_pending``: names of extra rows already ended, with their reason (image still present).
    ``undecodable``: names of extra rows whose decode failed (no image).
    """
    rows = [
        {
            "partition": "p0",
            "key": name,
            "source": f"test://{name}",
            "decode_ok": True,
            "reason": None,
            "image": jpeg_bytes(im),
            "image_ext": "jpg",
            "width": im.width,
            "height": im.height,
        }
        for name, im in images.items()
    ]
    first = next(iter(images.values()))
    for name, reason in (not_pending or {}).items():
        rows.append(
            {
                "partition": "p0",
                "key": name,
                "source": f"test://{name}",
                "decode_ok": True,
                "reason": reason,
                "image": jpeg_bytes(first),
                "width": first.width,
                "height": first.height,
            }
        )
    for name in undecodable:
        rows.append(
            {
                "partition": "p0",
                "key": name,
                "source": f"test://{name}",
                "decode_ok": False,
                "reason": "truncated",
                "error_message": "image file is truncated",
            }
        )
    return pa.Table.from_pylist(rows, schema=pa.schema(BASE_FIELDS))


@pytest.fixture(scope="session")
def batch_of():
    return make_batch


def by_key(table: pa.Table, column: str) -> dict:
    return dict(zip(table.column("key").to_pylist(), table.column(column).to_pylist(), strict=True))


@pytest.fixture(scope="session")
def column_by_key():
    return by_key


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory) -> Path:
    """A random tiny CLIP saved as an open_clip local folder (config + safetensors, the HF layout)."""
    import torch
    from open_clip.model import CLIP
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("tiny_clip")
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CLIP}))
    torch.manual_seed(0)
    model = CLIP(**TINY_CLIP)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
    return folder


@pytest.fixture(scope="session")
def tiny_clip_named(tmp_path_factory) -> tuple[str, Path]:
    """A tiny architecture registered by name with open_clip, and a random checkpoint .pt for it."""
    import open_clip
    import torch
    from open_clip.model import CLIP

    folder = tmp_path_factory.mktemp("tiny_clip_named")
    (folder / "tiny-test-clip.json").write_text(json.dumps(TINY_CLIP))
    open_clip.add_model_config(folder / "tiny-test-clip.json")
    torch.manual_seed(1)
    weights = folder / "tiny_clip.pt"
    torch.save(CLIP(**TINY_CLIP).state_dict(), weights)
    return "tiny-test-clip", weights
