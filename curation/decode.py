"""Safe decode: raw bytes -> one normalised RGB image per row, or a specific error status.

What is done on purpose (recorded in ``notes``):

- ``exif_rotated``: EXIF orientation applied (``ImageOps.exif_transpose``).
- ``animated_frame0``: animated GIF/WebP/PNG: frame 0 is used.
- ``cmyk_converted``: CMYK converted to RGB.
- ``scaled_16bit``: 16/32-bit integer or float pixels scaled to 8 bits (Pillow's own
  ``convert`` clips them instead).
- ``alpha_composited``: transparency composited onto ``decode.alpha_background``
  (Pillow's ``convert("RGB")`` would drop it, exposing whatever colour hides under it).
- ``palette_converted``, ``grayscale_converted``: expanded to RGB.
- ``resized``: the long side was brought down to ``decode.max_side``.
- ``reencoded``: stored as a fresh JPEG (otherwise untouched JPEG bytes are kept).

Errors (``curation.schema``): ``empty_file``, ``not_an_image``, ``decompression_bomb``
(pixel count from the header, checked before any pixel is decoded), ``truncated`` (only
a full ``load()`` catches it: ``verify()`` passes truncated JPEGs), ``decode_failed``,
``unsupported_mode``. A bad file never raises out of the step. A ``MemoryError`` is not a
bad file: the pixel count was checked against ``decode.max_pixels`` before any pixel was
decoded, so running out of memory is the worker's, and it fails the run (``pillow_error``).
"""

from __future__ import annotations

import hashlib
import io
import re
import warnings

import numpy as np
import pyarrow as pa
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from curation import schema
from curation.config import DecodeConfig
from curation.steps import Resources, RowStep

# Pillow's own bomb guard is a global; ours is the per-run decode.max_pixels, checked first.
Image.MAX_IMAGE_PIXELS = None
ImageFile.LOAD_TRUNCATED_IMAGES = False

# Notes that mark the decoded pixels as a deliberate conversion of the source encoding (the
# ``converted`` column); EXIF rotation, resizing and re-encoding change no source quality.
CONVERSION_NOTES = (
    "palette_converted",
    "grayscale_converted",
    "scaled_16bit",
    "cmyk_converted",
    "alpha_composited",
    "animated_frame0",
)
_ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")
_HIGH_DEPTH_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class DecodeError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        # Messages go into the manifest: no object addresses, so re-runs record the same text.
        super().__init__(_ADDRESS.sub("", message))
        self.reason = reason


def pillow_error(reason: str, err: Exception) -> DecodeError:
    """``err``, raised by Pillow on a file's bytes, as that file's ``DecodeError(reason)``: its
    plugins raise almost any exception type on a malformed file (``OSError``, ``SyntaxError``,
    ``struct.error``, ``ValueError``, ``IndexError``, ...). A ``MemoryError`` is re-raised instead
    (see the module docstring)."""
    if isinstance(err, MemoryError):
        raise err
    return DecodeError(reason, f"{type(err).__name__}: {err}")


def _scale_high_depth(im: Image.Image) -> Image.Image:
    """Scale 16/32-bit integer or float grey pixels to 8 bits by their nominal range."""
    arr = np.asarray(im)
    if im.mode == "F":
        lo, hi = float(np.nanmin(arr)), float(np.nanmax(arr))
        scaled = (arr - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(arr)
    else:
        top = 65535.0 if im.mode.startswith("I;16") or arr.max() <= 65535 else float(2**32 - 1)
        scaled = arr.astype(np.float64) * (255.0 / top)
    return Image.fromarray(np.clip(np.rint(scaled), 0, 255).astype(np.uint8), "L")


def _composite_alpha(im: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    rgba = im.convert("RGBA")
    canvas = Image.new("RGBA", rgba.size, background + (255,))
    return Image.alpha_composite(canvas, rgba).convert("RGB")


def to_rgb(im: Image.Image, background: tuple[int, int, int], notes: list[str]) -> Image.Image:
    """Convert any Pillow mode to RGB deliberately, noting what was done."""
    mode = im.mode
    if mode == "RGB":
        return im
    if mode == "P":
        notes.append("palette_converted")
        if "transparency" in im.info:
            notes.append("alpha_composited")
            return _composite_alpha(im, background)
        return im.convert("RGB")
    if mode in _ALPHA_MODES:
        notes.append("alpha_composited")
        return _composite_alpha(im, background)
    if mode == "CMYK":
        notes.append("cmyk_converted")
        return im.convert("RGB")
    if mode in _HIGH_DEPTH_MODES:
        notes.append("scaled_16bit")
        return _scale_high_depth(im).convert("RGB")
    if mode in ("L", "1"):
        notes.append("grayscale_converted")
        return im.convert("RGB")
    if mode in ("YCbCr", "LAB", "HSV", "RGBX"):
        return im.convert("RGB")
    raise DecodeError(schema.UNSUPPORTED_MODE, f"pixel mode {mode!r} has no deliberate RGB conversion")


def open_checked(raw: bytes, max_pixels: int) -> Image.Image:
    """Open lazily and reject by header before any pixel is decoded."""
    if not raw:
        raise DecodeError(schema.EMPTY_FILE, "0 bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(raw))
    except UnidentifiedImageError as err:
        raise DecodeError(schema.NOT_AN_IMAGE, str(err)) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise DecodeError(schema.DECOMPRESSION_BOMB, str(err)) from None
    except Exception as err:  # noqa: BLE001 - hostile bytes can break any plugin's header parser
        raise pillow_error(schema.NOT_AN_IMAGE, err) from None
    w, h = im.size
    if w * h > max_pixels:
        raise DecodeError(schema.DECOMPRESSION_BOMB, f"{w}x{h} = {w * h} pixels > decode.max_pixels={max_pixels}")
    if w == 0 or h == 0:
        raise DecodeError(schema.DECODE_FAILED, f"zero-sized image {w}x{h}")
    return im


# A plain RGB JPEG kept as it is needs its pixels only for the 32x32 PHash thumbnail: it is
# decoded in the DCT domain at 1/2..1/8 scale (never below this side), which reads every scan
# (a truncated file still fails) at a fraction of a full decode's cost.
HASH_DRAFT_SIDE = 64
# The short side of the grey thumbnail pass-1 steps measure (``schema.TRANSIENT_FIELDS``): it is
# reduced from the pixels the hash is computed from, which the draft decode never makes smaller.
THUMBNAIL_SIDE = HASH_DRAFT_SIDE


def _draft_factor(w: int, h: int) -> int:
    """The reduction a JPEG draft decode to ``HASH_DRAFT_SIDE`` applies to a ``w`` x ``h`` image
    (Pillow's rule: the largest of 8, 4, 2 that keeps both sides >= it, else 1)."""
    scale = min(w, h) // HASH_DRAFT_SIDE
    return next((f for f in (8, 4, 2) if scale >= f), 1)


def grey_thumbnail(rgb: Image.Image, size: tuple[int, int] | None = None) -> dict:
    """The ``thumbnail`` column's value for an image of ``size`` (default: ``rgb``'s own), decoded
    as ``rgb`` in full or as its JPEG draft: reduced by the draft's factor (a full decode is box-
    reduced by it, which is what the DCT draft computes), then box-resized to short side
    ``THUMBNAIL_SIDE`` (never enlarged), as 8-bit luma. The same computation and size for every
    copy of a picture, whatever its resolution, encoding or decode path, so that measures on it
    compare across a duplicate family."""
    w, h = size or rgb.size
    factor = _draft_factor(w, h)
    if factor > 1 and rgb.size == (w, h):  # the full image: reduce it as the draft would have
        rgb = rgb.reduce(factor)
    scale = min(1.0, THUMBNAIL_SIDE / min(w, h))
    out = (max(1, round(w * scale)), max(1, round(h * scale)))
    # the reduced image's last row / column hold the image's remainder only: map the image exactly
    region = (0, 0, w / factor, h / factor)
    grey = (rgb if rgb.size == out else rgb.resize(out, Image.Resampling.BOX, box=region)).convert("L")
    return {"width": grey.width, "height": grey.height, "luma": grey.tobytes()}


def thumbnail_pixels(value: dict | None) -> np.ndarray | None:
    """A ``thumbnail`` value as a uint8 [height, width] array (None for a row without one)."""
    if value is None:
        return None
    return np.frombuffer(value["luma"], dtype=np.uint8).reshape(value["height"], value["width"])


def _keeps_bytes(im: Image.Image, cfg: DecodeConfig) -> bool:
    """Whether this image's bytes go to the shards untouched (so no full-size pixels are needed)."""
    if im.format != "JPEG" or im.mode != "RGB" or cfg.reencode != "if_needed":
        return False
    if cfg.max_side and max(im.size) > cfg.max_side:
        return False
    try:
        return im.getexif().get(0x0112, 1) in (None, 1)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - a broken EXIF block: the full path records what fails
        return False


def decode_image(raw: bytes, cfg: DecodeConfig, draft_side: int | None = None) -> tuple[Image.Image, dict]:
    """RGB pixels and the facts (format, mode, notes, size of the normalised image). The pixels are
    full size, unless ``draft_side`` is given and the bytes are kept as they are: then they are
    reduced in the DCT domain, to no less than ``draft_side``. Raises DecodeError."""
    im = open_checked(raw, cfg.max_pixels)
    fmt, mode = im.format or "", im.mode
    notes: list[str] = []
    if draft_side and _keeps_bytes(im, cfg):
        size = im.size
        im.draft("RGB", (draft_side, draft_side))
        _load(im)
        return im, {"format": fmt, "mode": mode, "notes": notes, "size": size}
    if getattr(im, "is_animated", False) and getattr(im, "n_frames", 1) > 1:
        im.seek(0)
        notes.append("animated_frame0")
    _load(im)
    try:
        orientation = im.getexif().get(0x0112, 1)
        if orientation not in (None, 1):
            im = ImageOps.exif_transpose(im)
            notes.append("exif_rotated")
        rgb = to_rgb(im, tuple(cfg.alpha_background), notes)
    except DecodeError:
        raise
    except Exception as err:  # noqa: BLE001
        raise pillow_error(schema.DECODE_FAILED, err) from None
    if cfg.max_side and max(rgb.size) > cfg.max_side:
        rgb = ImageOps.contain(rgb, (cfg.max_side, cfg.max_side), Image.Resampling.LANCZOS)
        notes.append("resized")
    return rgb, {"format": fmt, "mode": mode, "notes": notes, "size": rgb.size}


def _load(im: Image.Image) -> None:
    """Decode the pixels (a full ``load`` is what catches truncated data)."""
    try:
        im.load()
    except OSError as err:
        text = str(err)
        reason = (
            schema.TRUNCATED
            if ("truncated" in text or "broken data stream" in text or "unrecognized data stream" in text)
            else schema.DECODE_FAILED
        )
        raise DecodeError(reason, text) from None
    except Exception as err:  # noqa: BLE001
        raise pillow_error(schema.DECODE_FAILED, err) from None


def encode_output(raw: bytes, rgb: Image.Image, facts: dict, cfg: DecodeConfig) -> bytes:
    """Bytes stored in the shards: the original JPEG when nothing changed, else a fresh JPEG."""
    untouched = facts["format"] == "JPEG" and facts["mode"] == "RGB" and not facts["notes"]
    if untouched and cfg.reencode == "if_needed":
        return raw
    facts["notes"].append("reencoded")
    out = io.BytesIO()
    rgb.save(out, format="JPEG", quality=cfg.jpeg_quality, subsampling=0 if cfg.jpeg_quality >= 90 else 2)
    return out.getvalue()


class Decode(RowStep):
    """Raw rows -> decoded rows (``schema.BASE_FIELDS`` and the transient ``thumbnail``); the raw
    bytes are dropped here."""

    section = "decode"
    Config = DecodeConfig
    reasons = schema.ERROR_REASONS
    reads = ("raw",)
    fields = [*schema.BASE_FIELDS, *schema.TRANSIENT_FIELDS]

    def __init__(self, cfg: DecodeConfig) -> None:
        self.cfg = cfg

    def resources(self) -> Resources:
        return Resources(num_cpus=self.cfg.num_cpus, batch_size=self.cfg.batch_size)

    def decode_row(self, row: dict) -> dict:
        out = {
            k: row.get(k)
            for k in ("partition", "key", "source", "source_meta", "input_bytes", "reason", "error_message")
        }
        out.update(
            decode_ok=False,
            width=None,
            height=None,
            format=None,
            mode=None,
            notes=[],
            converted=None,
            image=None,
            image_ext=None,
            phash=None,
            phash_mirror=None,
            sha256=None,
            bytes_uri=None,
            bytes_offset=None,
            thumbnail=None,
        )
        raw = row.get("raw")
        if raw is not None:
            out["sha256"] = hashlib.sha256(raw).hexdigest()
        if out["reason"] is not None:  # the reader already failed this one
            return out
        try:
            rgb, facts, out["image"] = self._decode(raw or b"", out["key"])
            if out["image"] is raw:  # kept as it is: readable again where the reader found it
                out["bytes_uri"], out["bytes_offset"] = row.get("bytes_uri"), row.get("bytes_offset")
        except DecodeError as err:
            out["reason"], out["error_message"] = err.reason, str(err)[:500]
            return out
        out.update(
            decode_ok=True,
            width=facts["size"][0],
            height=facts["size"][1],
            format=facts["format"],
            mode=facts["mode"],
            notes=facts["notes"],
            image_ext="jpg",
            converted=any(n in CONVERSION_NOTES for n in facts["notes"]),
            **self._from_pixels(rgb, facts["size"]),
        )
        return out

    def _decode(self, raw: bytes, key: str) -> tuple[Image.Image, dict, bytes]:
        """``decode_image`` and ``encode_output`` of one input; ``DecodeError`` for a bad file, and a
        ``MemoryError`` naming the input and the setting (see the module docstring)."""
        try:
            rgb, facts = decode_image(raw, self.cfg, draft_side=HASH_DRAFT_SIDE)
            return rgb, facts, encode_output(raw, rgb, facts, self.cfg)
        except MemoryError as err:
            raise MemoryError(
                f"out of memory decoding input {key!r} ({len(raw)} bytes, within decode.max_pixels="
                f"{self.cfg.max_pixels}): give the decode step more memory or lower decode.max_pixels"
            ) from err

    def _from_pixels(self, rgb: Image.Image, size: tuple[int, int]) -> dict:
        """What pass 1 keeps of the pixels (``rgb``: of an image of ``size``, or its draft decode):
        the PHash pair and the grey thumbnail."""
        from curation.dedup.hashing import phash_hex_pair

        phash, mirror = phash_hex_pair(rgb)
        return {"phash": phash, "phash_mirror": mirror, "thumbnail": grey_thumbnail(rgb, size)}

    def process(self, batch: pa.Table) -> pa.Table:
        rows = [self.decode_row(r) for r in batch.to_pylist()]
        return pa.Table.from_pylist(rows, schema=pa.schema(self.fields))
