"""The PHash pass 1 records for a JPEG kept as it is comes from a reduced-scale DCT (draft) decode
and a pre-reduced resize (``curation.decode``, ``phash_hex_pair(fast=True)``), not from
imagededup's full decode: how far it lands from imagededup's own PHash of the same file.

Measured on the 6 shared photos and 8 re-encodes / resizes of each (JPEG quality 50, 75, 95,
progressive, 4:4:4 at 90; 0.25x, 0.5x, 1.5x at 90), 54 files: Hamming distance 0 for 27, 2 for 26,
4 for 1 (messi5 at 1.5x); mean 1.04. The bound asserted is that measurement: never more than 4
bits (the default ``dedup.near.max_distance``: a manifest's hash and imagededup's hash of the same
file always match at it), mean under 1.5 bits, and at least 40% of them bit-identical.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from curation.config import DecodeConfig
from curation.decode import HASH_DRAFT_SIDE, Decode, decode_image
from curation.dedup.hashing import hamming, hex_to_uint64
from tests.conftest import IMAGES


def variants(photo: Path) -> dict[str, bytes]:
    """The file itself, four re-encodes and three resizes of it, as JPEG bytes (the original as stored)."""
    im = Image.open(photo).convert("RGB")
    out = {"original": photo.read_bytes()}

    def jpeg(img: Image.Image, **kw) -> bytes:
        buf = io.BytesIO()
        img.save(buf, "JPEG", **kw)
        return buf.getvalue()

    for q in (50, 75, 95):
        out[f"jpeg_q{q}"] = jpeg(im, quality=q)
    out["progressive"] = jpeg(im, quality=85, progressive=True)
    out["q90_444"] = jpeg(im, quality=90, subsampling=0)
    for s in (0.25, 0.5, 1.5):
        out[f"resize_{s}"] = jpeg(im.resize((round(im.width * s), round(im.height * s)), Image.BICUBIC), quality=90)
    return out


@pytest.fixture(scope="module")
def distances(tmp_path_factory) -> dict[tuple[str, str], int]:
    from imagededup.methods import PHash

    folder, imagededup = tmp_path_factory.mktemp("phash"), PHash(verbose=False)
    files = {(p.stem, name): data for p in sorted(IMAGES.iterdir()) for name, data in variants(p).items()}
    decoded = Decode(DecodeConfig()).process(
        pa.table({"key": [f"{s}__{n}" for s, n in files], "raw": list(files.values()), "reason": [None] * len(files)})
    )
    out = {}
    for (stem, name), data, ours in zip(files, files.values(), decoded.column("phash").to_pylist(), strict=True):
        path = folder / f"{stem}__{name}.img"
        path.write_bytes(data)
        theirs = imagededup.encode_image(image_file=str(path))
        out[stem, name] = int(hamming(hex_to_uint64([ours]), hex_to_uint64([theirs]))[0])
    print("\ndraft-decode PHash vs imagededup's, bits:", np.bincount(list(out.values())).tolist(), "(0, 1, 2, ...)")
    return out


def test_the_jpegs_are_hashed_from_a_draft_decode():
    """The path under test is taken: a JPEG kept as it is is decoded well below its full size."""
    for photo in sorted(IMAGES.iterdir()):
        for name, data in variants(photo).items():
            if Image.open(io.BytesIO(data)).format != "JPEG":
                continue
            draft, facts = decode_image(data, DecodeConfig(), draft_side=HASH_DRAFT_SIDE)
            assert facts["size"] == Image.open(io.BytesIO(data)).size
            assert max(draft.size) <= max(facts["size"]) / 2 or max(facts["size"]) < 4 * HASH_DRAFT_SIDE, (photo, name)


def test_the_draft_phash_stays_within_the_near_threshold_of_imagededups(distances):
    d = np.array(list(distances.values()))
    assert len(d) == 6 * 9
    assert d.max() <= 4, {k: v for k, v in distances.items() if v > 4}  # measured max 4 (1 of 54)
    assert d.mean() <= 1.5  # measured 1.04
    assert (d == 0).mean() >= 0.4  # measured 0.50
    assert (d % 2 == 0).all()  # both set the DC bit and 32 AC bits: distances are even
