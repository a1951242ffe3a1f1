"""Perceptual hashes of decoded images, computed once per image in the decode step.

``phash_hex`` is imagededup's PHash, bit for bit: it equals
``PHash().encode_image(image_file=path)`` for the file the image came from, so hashes in a
manifest can be checked or recomputed with imagededup alone. What that hash does (0.3.3):

- the whole image (any aspect ratio, no crop, no padding) is resized to 32x32 with Lanczos
  in RGB, then turned into 8-bit grey (Pillow's ITU-R 601-2 luma): colour counts only
  through luma, so a grey copy hashes the same; non-RGB modes go through RGBA -> RGB first
  (alpha dropped), as imagededup's file loader does;
- a 2-D DCT-II of the 32x32 grey thumbnail; bit = coefficient >= median of the 63 AC ones,
  over the top-left 8x8 coefficients (DC first, row-major, most significant bit first).
  So the DC bit is always 1 and (barring ties) exactly 32 AC bits are set: every Hamming
  distance between two hashes is even, and unrelated photos sit around 32 bits apart;
- a horizontal mirror moves about 30 of the 64 bits. ``phash_hex_pair`` also returns the
  hash of the mirrored thumbnail (from the same coefficients); it equalled the hash of the
  mirrored image itself on every real photo we tried, so near-duplicate search can match
  flipped copies (``NearDupConfig.match_mirrored``) without re-reading images.

Almost all of the cost is the Lanczos resize of the full image, not the DCT (figures:
docs/results/curation_design.md).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

HASH_HEX_CHARS = 16  # 64 bits


def _rgb(img: Image.Image) -> Image.Image:
    return img if img.mode == "RGB" else img.convert("RGBA").convert("RGB")


def _grey_thumbnail(img: Image.Image, size: tuple[int, int]) -> np.ndarray:
    """imagededup's preprocessing: resize in RGB with Lanczos, then 8-bit luma."""
    return np.array(_rgb(img).resize(size, Image.Resampling.LANCZOS).convert("L")).astype("uint8")


def _bits_hex(bits: np.ndarray) -> str:
    """A boolean matrix as hex, row-major, most significant bit first (imagededup's layout)."""
    return np.packbits(bits).tobytes().hex()


def _phash_of_thumbnail(thumb: np.ndarray) -> str:
    """imagededup's PHash algorithm on a 32x32 uint8 grey thumbnail: 2-D DCT-II (scipy.fftpack,
    unnormalised), top-left 8x8 coefficients, bit = coefficient >= median of the 63 AC ones.
    Written here rather than called in imagededup: importing imagededup.methods imports torch
    and torchvision (seconds of CPU per fresh worker process), to hash 64 bits.
    tests/curation/dedup/test_dedup_hashing.py checks it against imagededup bit for bit."""
    from scipy.fftpack import dct

    coef = dct(dct(thumb, axis=0), axis=1)[:8, :8]
    return _bits_hex(coef >= np.median(coef.flatten()[1:]))


def phash_hex(img: Image.Image) -> str:
    """imagededup's PHash of ``img`` as 16 hex characters (64 bits)."""
    return _phash_of_thumbnail(_grey_thumbnail(img, (32, 32)))


# The top-left 8 rows of scipy.fftpack's unnormalised 32-point DCT-II matrix: the 8x8 corner of
# the 2-D DCT of a 32x32 thumbnail is _DCT8 @ t @ _DCT8.T (two 8x32 products instead of two full
# scipy transforms, whose per-call overhead dominated at this size). Reversing a row multiplies
# its k-th coefficient by (-1)^k, so the mirror's hash comes from the same coefficients.
_DCT8 = 2.0 * np.cos(np.pi * np.arange(8)[:, None] * (2 * np.arange(32)[None, :] + 1) / 64.0)
_MIRROR_SIGNS = (-1.0) ** np.arange(8)


def phash_pair_of_thumbnail(thumb: np.ndarray) -> tuple[str, str]:
    """(PHash, PHash of the horizontal mirror) of a 32x32 grey thumbnail, from one set of
    coefficients; equal to ``_phash_of_thumbnail`` of the thumbnail and of its mirror (checked in
    tests/curation/dedup/test_dedup_hashing.py) up to exact ties between coefficients."""
    coef = _DCT8 @ thumb.astype(np.float64) @ _DCT8.T
    mirror = coef * _MIRROR_SIGNS[None, :]
    return tuple(_bits_hex(c >= np.median(c.flatten()[1:])) for c in (coef, mirror))


def phash_hex_pair(img: Image.Image, fast: bool = True) -> tuple[str, str]:
    """(PHash of ``img``, PHash of its horizontal mirror), from one resize.

    ``fast`` (the pipeline's choice) first shrinks the image by an integer factor with a box
    filter (Pillow's ``reducing_gap=3``), then applies the same Lanczos resize to 32x32: the
    same algorithm on a pre-reduced image, several times faster (more so on larger images),
    and within a few bits of imagededup's own hash (exactly equal for images under ~100 px). Hashes in
    one manifest are all computed the same way, so distances between them are comparable.
    ``fast=False`` is imagededup's ``PHash`` bit for bit.
    """
    if fast:
        small = _rgb(img).resize((32, 32), Image.Resampling.LANCZOS, reducing_gap=3.0)
        return phash_pair_of_thumbnail(np.asarray(small.convert("L")))
    thumb = _grey_thumbnail(img, (32, 32))
    return _phash_of_thumbnail(thumb), _phash_of_thumbnail(np.ascontiguousarray(thumb[:, ::-1]))


def dhash_hex(img: Image.Image) -> str:
    """imagededup's DHash (9x8 grey thumbnail, horizontal gradient signs) as 16 hex characters."""
    thumb = _grey_thumbnail(img, (9, 8))
    return _bits_hex(thumb[:, 1:] > thumb[:, :-1])


def hex_to_uint64(hashes) -> np.ndarray:
    """16-hex-character hashes (a list or a pyarrow string array) as a uint64 array."""
    values = hashes.to_pylist() if hasattr(hashes, "to_pylist") else list(hashes)
    if any(h is None or len(h) != HASH_HEX_CHARS for h in values):
        bad = [h for h in values if h is None or len(h) != HASH_HEX_CHARS][:3]
        raise ValueError(f"hashes must be {HASH_HEX_CHARS} hex characters (64 bits); got {bad!r}")
    try:
        raw = bytes.fromhex("".join(values))
    except ValueError as exc:
        raise ValueError(f"hashes must be hexadecimal: {exc}") from None
    return np.frombuffer(raw, dtype=">u8").astype(np.uint64)


def uint64_to_hex(values: np.ndarray) -> list[str]:
    """Inverse of ``hex_to_uint64``."""
    return [f"{int(v):016x}" for v in values]


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bitwise Hamming distance between uint64 arrays (broadcasting)."""
    return np.bitwise_count(np.bitwise_xor(a, b))
