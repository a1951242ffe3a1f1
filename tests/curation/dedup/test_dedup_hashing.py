import numpy as np
import pytest
from imagededup.methods import PHash
from PIL import Image, ImageOps

from curation.dedup import hashing
from curation.dedup.hashing import (
    hamming,
    hex_to_uint64,
    phash_hex,
    phash_hex_pair,
    phash_pair_of_thumbnail,
    uint64_to_hex,
)
from tests.conftest import IMAGES


@pytest.mark.parametrize("name", ["obama.jpg", "basketball1.png", "messi5.jpg"])
def test_phash_is_imagededups(name):
    path = f"{IMAGES}/{name}"
    img = Image.open(path)
    assert phash_hex(img) == PHash(verbose=False).encode_image(image_file=path)
    assert phash_hex(img) == PHash(verbose=False).encode_image(image_array=np.asarray(img.convert("RGB")))
    assert len(phash_hex(img)) == 16


def test_phash_ignores_colour_and_mode():
    img = Image.open(f"{IMAGES}/obama.jpg").convert("RGB")
    assert phash_hex(img.convert("RGBA")) == phash_hex(img)
    assert phash_hex(img.convert("L")) == phash_hex(img.convert("L").convert("RGB"))


def test_mirror_hash_is_the_hash_of_the_mirrored_image():
    img = Image.open(f"{IMAGES}/franz_kafka.jpg").convert("RGB")
    h, m = phash_hex_pair(img, fast=False)
    assert h == phash_hex(img)
    assert m == phash_hex(ImageOps.mirror(img))
    assert hamming(*hex_to_uint64([h, m])) > 16  # PHash alone does not match a mirror image


def test_fast_pair_stays_within_a_few_bits_of_imagededup():
    for name in ("franz_kafka.jpg", "obama.jpg", "messi5.jpg", "basketball1.png"):
        img = Image.open(f"{IMAGES}/{name}").convert("RGB")
        big = img.resize((img.width * 3, img.height * 3))  # where the pre-reduction actually kicks in
        fh, fm = phash_hex_pair(big)
        eh, em = phash_hex_pair(big, fast=False)
        assert hamming(*hex_to_uint64([fh, eh])) <= 4 and hamming(*hex_to_uint64([fm, em])) <= 4, name
        assert phash_hex_pair(big) == (fh, fm)  # deterministic


def test_the_pipelines_hash_does_not_follow_rounding_noise(monkeypatch):
    """Blank, gradient and faint-noise thumbnails, most of whose AC coefficients are zero, hash the
    same when the DCT's matrix products round differently (as another CPU's BLAS kernel does): the
    coefficients are compared after rounding to ``COEFFICIENT_STEP``."""
    rng = np.random.default_rng(3)
    ramp = np.linspace(0, 40, 32)
    thumbs = [np.full((32, 32), v, np.uint8) for v in (0, 17, 128, 255)]
    thumbs += [np.uint8(90 + ramp)[None, :].repeat(32, 0), np.uint8(90 + ramp)[:, None].repeat(32, 1)]
    thumbs += [np.uint8(90 + ramp[:, None] / 2 + ramp[None, :] / 2), np.uint8(128 + rng.normal(0, 2, (32, 32)))]
    want = [phash_pair_of_thumbnail(t) for t in thumbs]
    assert want[0][0] == "ff" * 8  # all AC coefficients zero: every bit set, whatever the rounding
    dct8 = hashing._DCT8
    for _ in range(20):
        monkeypatch.setattr(hashing, "_DCT8", dct8 * (1 + rng.uniform(-1e-14, 1e-14, dct8.shape)))
        assert [phash_pair_of_thumbnail(t) for t in thumbs] == want


def test_hex_round_trip_and_bad_input():
    values = np.array([0, 1, 2**63, 2**64 - 1], dtype=np.uint64)
    assert (hex_to_uint64(uint64_to_hex(values)) == values).all()
    with pytest.raises(ValueError, match="16 hex"):
        hex_to_uint64(["abc"])
    with pytest.raises(ValueError, match="hexadecimal"):
        hex_to_uint64(["zzzzzzzzzzzzzzzz"])


def test_the_pipelines_pair_hash_equals_two_scipy_dcts():
    """The decode step's (hash, mirror hash) from one matrix product equals imagededup's algorithm
    (scipy's DCT) run on the thumbnail and on its mirror, on smooth and on noisy thumbnails."""
    import numpy as np

    from curation.dedup.hashing import _phash_of_thumbnail, phash_pair_of_thumbnail

    rng = np.random.default_rng(7)
    thumbs = [rng.integers(0, 256, (32, 32), dtype=np.uint8) for _ in range(300)]
    thumbs += [(rng.normal(128, 40, (32, 32)).cumsum(0).cumsum(1) % 256).astype(np.uint8) for _ in range(300)]
    for t in thumbs:
        assert phash_pair_of_thumbnail(t) == (
            _phash_of_thumbnail(t),
            _phash_of_thumbnail(np.ascontiguousarray(t[:, ::-1])),
        )


# decode's normalisations that change the pixels imagededup's own loader would read from the file
# (it applies no EXIF orientation, clips 16-bit values, drops alpha)
PIXELS_CHANGED = {"exif_rotated", "scaled_16bit", "alpha_composited"}
SHORTCUT_BITS = 4  # the most bits the manifest hash's two shortcuts (draft decode, pre-reduction) may move


def test_the_manifest_hash_and_imagededups_as_measured_on_real_photos(tmp_path):
    """What a manifest's ``phash`` is, measured on the demo corpus' sources (its real photos and its
    planted formats) and the shared photos, against imagededup's ``PHash().encode_image``:

    1. imagededup's algorithm, bit for bit, on the pixels decode hands on (``fast=False``);
    2. the manifest's hash (``Decode``: a JPEG kept as it is decoded as a draft, then the box
       pre-reduction of ``phash_hex_pair``) within SHORTCUT_BITS of that, and equal to it on most;
    3. imagededup's hash of the *file* equal to (1) exactly where decode changed no pixel imagededup
       reads (no EXIF rotation, 16-bit scaling or alpha compositing), far from it where it did."""
    import logging
    import shutil

    from imagededup.methods import PHash

    from curation.config import DecodeConfig
    from curation.decode import Decode, decode_image
    from pipelines.demo_corpus import build_demo_corpus

    logging.getLogger("imagededup").setLevel(logging.WARNING)
    build_demo_corpus(tmp_path / "demo")
    for f in IMAGES.iterdir():
        shutil.copy(f, tmp_path / f.name)
    step, imagededup = Decode(DecodeConfig()), PHash(verbose=False)
    seen, equal, changed = 0, 0, []
    for path in sorted(p for p in tmp_path.rglob("*") if p.is_file()):
        raw = path.read_bytes()
        row = step.decode_row({"key": path.name, "source": str(path), "raw": raw, "reason": None})
        if not row["decode_ok"]:
            continue
        pixels, facts = decode_image(raw, DecodeConfig())  # normalised, full size, no draft
        ours = phash_hex_pair(pixels, fast=False)[0]
        assert ours == imagededup.encode_image(image_array=np.asarray(pixels)), path  # (1)
        shortcut = int(hamming(*hex_to_uint64([row["phash"], ours])))
        assert shortcut <= SHORTCUT_BITS, (path, shortcut)  # (2)
        normalised = bool(PIXELS_CHANGED & set(facts["notes"]))
        assert (ours == imagededup.encode_image(image_file=str(path))) == (not normalised), path  # (3)
        seen, equal = seen + 1, equal + (shortcut == 0)
        changed += [path.name] if normalised else []
    assert seen >= 30 and equal >= seen * 2 // 3, (seen, equal)
    assert sorted(changed) == ["alpha.png", "exif_rotated.jpg", "grey16.png"]
