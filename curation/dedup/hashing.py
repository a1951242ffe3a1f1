"""Perceptual hashes of decoded images, computed once per image in the decode step.

The hash is imagededup's PHash algorithm (0.3.3): the whole image resized to 32x32 with Lanczos
in RGB, then 8-bit luma (other modes through RGBA -> RGB, alpha dropped), a 2-D DCT-II, and over
the top-left 8x8 coefficients (DC first, row-major, most significant bit first) bit = coefficient
>= the median of the 63 AC ones: the DC bit is always set and distances are even.
``phash_hex_pair`` also hashes the mirrored thumbnail from the same coefficients, so flipped copies
match (``DedupNearConfig.match_mirrored``).

Against imagededup (``tests/curation/dedup/test_dedup_hashing.py``, on real photos):
``phash_hex_pair(img, fast=False)`` is imagededup's PHash of ``img``'s pixels, bit for bit. The
decode step hashes the pixels it hands on (EXIF orientation applied, 16-bit scaled, alpha
composited, CMYK and palettes converted) with two shortcuts, a JPEG draft decode and a box
pre-reduction before the resize (``fast``), which move a few bits on some images (the test's
bound: 4). So a manifest's hashes can be checked against imagededup on the decoded pixels, within
that bound, not recomputed from the files alone.

The pipeline's coefficients are rounded to ``COEFFICIENT_STEP`` before they are compared, far above
the rounding differences between BLAS kernels, so its bits do not follow the CPU (the test perturbs
the products); unrounded, a blank image's bits are the signs of that noise (as with ``fast=False``,
imagededup's own DCT). The thumbnail is Pillow's: equal where the Pillow and libjpeg builds are.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

HASH_HEX_CHARS = 16  # 64 bits
COEFFICIENT_STEP = 2.0**-20  # coefficients reach ~1e6; matrix products differ by ~1e-9 between kernels


def _rgb(img: Image.Image) -> Image.Image:
    return img if img.mode == "RGB" else img.convert("RGBA").convert("RGB")


def _grey_thumbnail(img: Image.Image) -> np.ndarray:
    """imagededup's preprocessing: resize to 32x32 in RGB with Lanczos, then 8-bit luma."""
    return np.array(_rgb(img).resize((32, 32), Image.Resampling.LANCZOS).convert("L")).astype("uint8")


def _bits_hex(bits: np.ndarray) -> str:
    """A boolean matrix as hex, row-major, most significant bit first (imagededup's layout)."""
    return np.packbits(bits).tobytes().hex()


def _phash_of_thumbnail(thumb: np.ndarray) -> str:
    """imagededup's PHash algorithm on a 32x32 uint8 grey thumbnail (scipy.fftpack's unnormalised
    DCT-II), written here because importing imagededup.methods imports torch (seconds per worker)."""
    from scipy.fftpack import dct

    coef = dct(dct(thumb, axis=0), axis=1)[:8, :8]
    return _bits_hex(coef >= np.median(coef.flatten()[1:]))


def phash_hex(img: Image.Image) -> str:
    """imagededup's PHash of ``img`` as 16 hex characters (64 bits)."""
    return _phash_of_thumbnail(_grey_thumbnail(img))


# The top-left 8 rows of scipy.fftpack's unnormalised 32-point DCT-II matrix: the 8x8 corner of
# the 2-D DCT of a 32x32 thumbnail is _DCT8 @ t @ _DCT8.T (two 8x32 products instead of two full
# scipy transforms). Reversing a row multiplies its k-th coefficient by (-1)^k, so the mirror's
# hash comes from the same coefficients.
_DCT8 = 2.0 * np.cos(np.pi * np.arange(8)[:, None] * (2 * np.arange(32)[None, :] + 1) / 64.0)
_MIRROR_SIGNS = (-1.0) ** np.arange(8)


def phash_pair_of_thumbnail(thumb: np.ndarray) -> tuple[str, str]:
    """(PHash, PHash of the horizontal mirror) of a 32x32 grey thumbnail, from one set of
    coefficients rounded to ``COEFFICIENT_STEP``: ``_phash_of_thumbnail`` of the thumbnail and of
    its mirror, but where two coefficients lie within a step of each other across the median."""
    coef = np.rint(_DCT8 @ thumb.astype(np.float64) @ _DCT8.T / COEFFICIENT_STEP)
    mirror = coef * _MIRROR_SIGNS[None, :]
    return tuple(_bits_hex(c >= np.median(c.flatten()[1:])) for c in (coef, mirror))


def phash_hex_pair(img: Image.Image, fast: bool = True) -> tuple[str, str]:
    """(PHash of ``img``, PHash of its horizontal mirror), from one resize: ``fast`` (the pipeline's)
    pre-reduces by a box filter (Pillow's ``reducing_gap=3``) before the Lanczos resize, several
    times faster; ``fast=False`` is imagededup's ``PHash`` bit for bit (module docstring)."""
    if fast:
        small = _rgb(img).resize((32, 32), Image.Resampling.LANCZOS, reducing_gap=3.0)
        return phash_pair_of_thumbnail(np.asarray(small.convert("L")))
    thumb = _grey_thumbnail(img)
    return _phash_of_thumbnail(thumb), _phash_of_thumbnail(np.ascontiguousarray(thumb[:, ::-1]))


def hex_to_uint64(hashes) -> np.ndarray:
    """16-hex-character hashes (a list or a pyarrow string array) as a uint64 array."""
    values = hashes.to_pylist() if hasattr(hashes, "to_pylist") else list(hashes)
    if bad := [h for h in values if h is None or len(h) != HASH_HEX_CHARS][:3]:
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
