"""The demo corpus: real photos shipped by our dependencies (and ../shared/assets when present),
plus planted cases every curation run must handle: exact duplicates, tiny and panoramic
images, corrupt, truncated and empty files, a decompression-bomb header, and the pixel
formats decode converts on purpose (CMYK, 16-bit, alpha, palette, animation, EXIF rotation).

``build_demo_corpus(folder)`` writes the files and returns what each one is expected to
become (``EXPECTED``), which the tests check against the manifest. It lives outside
``curation/`` so that editing a test case does not change the curation code version (and with
it every dataset version id).
"""

from __future__ import annotations

import importlib.util
import io
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

SHARED_IMAGES = Path(__file__).resolve().parents[1].parent / "shared" / "assets" / "images"


def _ultralytics_asset(name: str) -> Path:
    spec = importlib.util.find_spec("ultralytics")  # its files, without its import-time patches of Pillow
    return Path(spec.submodule_search_locations[0]) / "assets" / name


def _matplotlib_sample(name: str) -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "sample_data" / name


def _skimage(name: str) -> Image.Image:
    import skimage.data

    return Image.fromarray(getattr(skimage.data, name)())


def person_photos() -> dict[str, Image.Image | Path]:
    """Real photos of people, by name: files where they ship as files."""
    photos: dict[str, Image.Image | Path] = {
        "bus": _ultralytics_asset("bus.jpg"),
        "zidane": _ultralytics_asset("zidane.jpg"),
        "grace_hopper": _matplotlib_sample("grace_hopper.jpg"),
        "astronaut": _skimage("astronaut"),
        "camera": _skimage("camera"),
    }
    for name in ("obama.jpg", "obama2.jpg", "franz_kafka.jpg", "basketball1.png"):
        if (SHARED_IMAGES / name).is_file():
            photos[Path(name).stem] = SHARED_IMAGES / name
    return photos


NO_PERSON_DIR = "scenes"  # the corpus' photos without people (also the fine-tune demo's backgrounds)


def non_person_photos() -> dict[str, Image.Image | Path]:
    photos: dict[str, Image.Image | Path] = {
        "coffee": _skimage("coffee"),
        "chelsea": _skimage("chelsea"),
        "rocket": _skimage("rocket"),
    }
    if (SHARED_IMAGES / "starry_night.jpg").is_file():
        photos["starry_night"] = SHARED_IMAGES / "starry_night.jpg"
    return photos


def _save(src: Image.Image | Path, dest: Path) -> None:
    if isinstance(src, Path):
        shutil.copyfile(src, dest)
    else:
        src.convert("RGB").save(dest, quality=95)


def bomb_png(width: int = 60000, height: int = 60000) -> bytes:
    """A tiny PNG whose header declares width x height pixels (a decompression bomb's header)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def jpeg_bytes(im: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="JPEG", **kw)
    return buf.getvalue()


def _view(base: Image.Image, i: int) -> Image.Image:
    """The i-th of several distinct crop windows of ``base`` (each >16% apart: not near-duplicates)."""
    w, h = base.size
    cw, ch = int(w * 0.72), int(h * 0.72)
    dx, dy = [(0, 0), (1, 0), (0, 1), (1, 1), (0.5, 0.5), (0.5, 0), (0, 0.5), (1, 0.5)][i]
    x, y = int(dx * (w - cw)), int(dy * (h - ch))
    return base.crop((x, y, x + cw, y + ch))


Case = tuple[bytes, str, str | None]  # bytes, expected status, expected reason or decode note


def _png(im: Image.Image) -> bytes:
    out = io.BytesIO()
    im.save(out, format="PNG")
    return out.getvalue()


def _animated_gif(im: Image.Image) -> bytes:
    """Two frames: ``im`` and its mirror, 32-colour palettes."""
    frames = [
        im.convert("P", palette=Image.Palette.ADAPTIVE, colors=32),
        im.transpose(Image.Transpose.FLIP_LEFT_RIGHT).convert("P", palette=Image.Palette.ADAPTIVE, colors=32),
    ]
    gif = io.BytesIO()
    frames[0].save(gif, format="GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    return gif.getvalue()


def _exif_rotated(upright: Image.Image) -> bytes:
    """A JPEG stored landscape whose EXIF orientation shows it portrait (``upright``)."""
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display: stored landscape, shown portrait
    return jpeg_bytes(upright.transpose(Image.Transpose.ROTATE_90), quality=92, exif=exif.tobytes())


def _format_cases(base: Image.Image) -> dict[str, Case]:
    """The pixel formats decode converts on purpose, each from its own window of ``base``."""
    alpha = np.array(_view(base, 0).convert("RGBA"))
    alpha[..., 3] = 128
    grey16 = np.asarray(_view(base, 3).convert("L"), dtype=np.uint16) * 257
    return {
        "formats/cmyk.jpg": (jpeg_bytes(_view(base, 5).convert("CMYK")), "kept", "cmyk_converted"),
        "formats/grey16.png": (_png(Image.fromarray(grey16)), "kept", "scaled_16bit"),
        "formats/alpha.png": (_png(Image.fromarray(alpha, "RGBA")), "kept", "alpha_composited"),
        "formats/palette.png": (
            _png(_view(base, 1).convert("P", palette=Image.Palette.ADAPTIVE, colors=64)),
            "kept",
            "palette_converted",
        ),
        "formats/animated.gif": (_animated_gif(_view(base, 2)), "kept", "animated_frame0"),
        "formats/exif_rotated.jpg": (_exif_rotated(_view(base, 4)), "kept", "exif_rotated"),
    }


def _bad_cases(base: Image.Image) -> dict[str, Case]:
    """Files that are not images, or not whole ones."""
    good = jpeg_bytes(base, quality=92)
    return {
        "bad/corrupt.jpg": (np.random.default_rng(0).bytes(2048), "error", "not_an_image"),
        "bad/not_an_image.png": (b"this is a text file, not a picture\n" * 20, "error", "not_an_image"),
        "bad/empty.jpg": (b"", "error", "empty_file"),
        "bad/truncated.jpg": (good[: len(good) // 2], "error", "truncated"),
        "bad/bomb.png": (bomb_png(), "error", "decompression_bomb"),
    }


def _size_cases(base: Image.Image) -> dict[str, Case]:
    w, h = base.size
    return {
        "small/tiny.jpg": (jpeg_bytes(base.resize((max(1, w // 10), max(1, h // 10)))), "dropped", "too_small"),
        "small/panorama.jpg": (jpeg_bytes(base.resize((w * 2, max(1, h // 3)))), "dropped", "aspect_ratio"),
    }


def _repost_cases(base: Image.Image) -> dict[str, Case]:
    """Near-duplicates of the full photo: smaller copies lose to the original (largest resolution wins)."""
    w, h = base.size
    mirror = base.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return {
        "reposts/bus_small.jpg": (
            jpeg_bytes(base.resize((w * 3 // 4, h * 3 // 4)), quality=80),
            "dropped",
            "near_duplicate",
        ),
        "reposts/bus_mirror_small.jpg": (
            jpeg_bytes(mirror.resize((w * 7 // 8, h * 7 // 8)), quality=85),
            "dropped",
            "near_duplicate",
        ),
    }


def planted_cases(base: Image.Image) -> dict[str, Case]:
    """File name -> (bytes, expected status, expected reason or decode note). ``base`` is a person photo.

    Each pixel-format case is cut from its own window of ``base`` so that no two of them
    are near-duplicates; the near-duplicate cases are resized / mirrored copies of ``base``.
    """
    return {**_bad_cases(base), **_size_cases(base), **_format_cases(base), **_repost_cases(base)}


def captioned(im: Image.Image, text: str = "WHEN THE DEMO\nFINALLY RUNS") -> Image.Image:
    """A meme: two lines of large outlined text across the bottom of a photo (text-dominated)."""
    import matplotlib
    from PIL import ImageDraw, ImageFont

    out = im.convert("RGB").copy()
    w, h = out.size
    font = ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans-Bold.ttf"), w // 12)
    ImageDraw.Draw(out).multiline_text(
        (w / 2, h * 0.97),
        text,
        font=font,
        fill="white",
        anchor="md",
        align="center",
        stroke_width=max(2, w // 200),
        stroke_fill="black",
    )
    return out


def build_demo_corpus(folder: str | Path, with_duplicates: bool = True) -> dict[str, tuple[str, str | None]]:
    """Write the demo corpus; returns relative path -> (expected status, expected reason or note).

    Expectations for real photos are 'kept' (people) and 'dropped'/'no_salient_person'
    (no people) under the demo's detector settings; planted cases are exact.
    """
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    expected: dict[str, tuple[str, str | None]] = {}
    people = person_photos()
    for name, src in people.items():
        dest = root / "people" / f"{name}.jpg"
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(src, Path) and src.suffix != ".jpg":
            src = Image.open(src)
        _save(src, dest)
        expected[f"people/{name}.jpg"] = ("kept", None)
    for name, src in non_person_photos().items():
        dest = root / NO_PERSON_DIR / f"{name}.jpg"
        dest.parent.mkdir(parents=True, exist_ok=True)
        _save(src, dest)
        expected[f"{NO_PERSON_DIR}/{name}.jpg"] = ("dropped", "no_salient_person")
    if with_duplicates:
        dup = root / "reposts" / "bus_repost.jpg"
        dup.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / "people" / "bus.jpg", dup)
        # Of two identical files the smaller key is kept: keys start with the relative path.
        expected["reposts/bus_repost.jpg"] = ("dropped", "exact_duplicate")
    # Content-filter cases: a real watermark (messi5.jpg's "WEEK media") and a rendered meme caption.
    if (SHARED_IMAGES / "messi5.jpg").is_file():
        (root / "web").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SHARED_IMAGES / "messi5.jpg", root / "web" / "messi5.jpg")
        expected["web/messi5.jpg"] = ("dropped", "watermark_text")
    (root / "web").mkdir(parents=True, exist_ok=True)
    captioned(Image.open(_matplotlib_sample("grace_hopper.jpg"))).save(root / "web" / "hopper_meme.jpg", quality=92)
    expected["web/hopper_meme.jpg"] = ("dropped", "text")
    # The meme's PHash is 4 bits from the photo it captions: one near-duplicate family, whose
    # representative is chosen before the models see it, by quality (same size, not converted,
    # more bytes per pixel: the meme). The text filter then drops the meme, and the family with
    # it: the price of dedup before the models (README, "Two passes").
    expected["people/grace_hopper.jpg"] = ("dropped", "near_duplicate")
    base = Image.open(_ultralytics_asset("bus.jpg")).convert("RGB")
    for rel, (data, status, reason) in planted_cases(base).items():
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        expected[rel] = (status, reason)
    return expected
