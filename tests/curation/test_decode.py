"""Safe decode: every bad-file kind gets its exact status; conversions are deliberate and correct."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from curation import schema
from curation.config import DecodeConfig
from curation.decode import Decode
from pipelines.demo_corpus import _ultralytics_asset, _view, bomb_png, jpeg_bytes, planted_cases


@pytest.fixture(scope="module")
def base() -> Image.Image:
    return Image.open(_ultralytics_asset("bus.jpg")).convert("RGB")


def decode(raw: bytes, **cfg) -> dict:
    step = Decode(DecodeConfig(**cfg))
    return step.decode_row(
        {"partition": "p", "key": "k", "source": "s", "raw": raw, "reason": None, "input_bytes": len(raw)}
    )


def test_every_planted_case_gets_its_exact_outcome(base):
    for name, (raw, status, reason) in planted_cases(base).items():
        row = decode(raw)
        if status == "error":
            assert not row["decode_ok"], name
            assert row["reason"] == reason, (name, row["reason"], row["error_message"])
            assert row["image"] is None
        else:
            assert row["decode_ok"], (name, row["reason"], row["error_message"])
            if reason in ("too_small", "aspect_ratio", "near_duplicate"):
                continue  # decode is fine; a filter or dedup drops these later
            assert reason in row["notes"], (name, row["notes"])
            assert Image.open(io.BytesIO(row["image"])).mode == "RGB"


def test_bomb_is_rejected_from_the_header_without_decoding():
    # 60000 x 60000 RGB would need 10.8 GB if decoded; the file is a few hundred bytes.
    row = decode(bomb_png(60000, 60000))
    assert row["reason"] == schema.DECOMPRESSION_BOMB
    assert "60000x60000" in row["error_message"]
    # The cap is a setting: a normal-size image above a lowered cap is rejected the same way.
    row = decode(jpeg_bytes(Image.new("RGB", (400, 300))), max_pixels=100_000)
    assert row["reason"] == schema.DECOMPRESSION_BOMB


def test_sixteen_bit_is_scaled_not_clipped():
    grey = np.array([[0, 257 * 100, 65535]], dtype=np.uint16).repeat(4, axis=0)
    buf = io.BytesIO()
    Image.fromarray(grey).save(buf, format="PNG")
    row = decode(buf.getvalue(), reencode="always", jpeg_quality=100)
    px = np.asarray(Image.open(io.BytesIO(row["image"])).convert("L"))[1]
    assert "scaled_16bit" in row["notes"]
    assert abs(int(px[0]) - 0) <= 2 and abs(int(px[1]) - 100) <= 2 and abs(int(px[2]) - 255) <= 2


def test_alpha_is_composited_onto_the_background():
    rgba = np.zeros((32, 32, 4), dtype=np.uint8)
    rgba[..., 0] = 255  # red everywhere, but fully transparent on the left half
    rgba[:, 16:, 3] = 255
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buf, format="PNG")
    row = decode(buf.getvalue(), jpeg_quality=100)
    px = np.asarray(Image.open(io.BytesIO(row["image"])))
    assert px[16, 4].tolist() == pytest.approx([255, 255, 255], abs=3)  # background, not hidden red
    assert px[16, 28].tolist() == pytest.approx([255, 0, 0], abs=3)
    row = decode(buf.getvalue(), alpha_background=[0, 0, 0], jpeg_quality=100)
    assert np.asarray(Image.open(io.BytesIO(row["image"])))[16, 4].tolist() == pytest.approx([0, 0, 0], abs=3)


def test_exif_orientation_is_applied(base):
    raw = planted_cases(base)["formats/exif_rotated.jpg"][0]
    row = decode(raw)
    upright = _view(base, 4)
    assert (row["width"], row["height"]) == upright.size != upright.size[::-1]  # stored rotated, shown upright
    assert "exif_rotated" in row["notes"]


def test_animated_takes_frame_zero(base):
    raw = planted_cases(base)["formats/animated.gif"][0]
    row = decode(raw, jpeg_quality=100)
    first = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"), dtype=np.int16)
    got = np.asarray(Image.open(io.BytesIO(row["image"])), dtype=np.int16)
    assert "animated_frame0" in row["notes"]
    assert np.abs(got - first).mean() < 3  # frame 0, not the mirrored frame 1


def test_untouched_jpeg_bytes_are_kept_and_sha256_is_of_the_input(base):
    raw = jpeg_bytes(base, quality=90)
    row = decode(raw)
    assert row["image"] == raw and row["notes"] == []
    import hashlib

    assert row["sha256"] == hashlib.sha256(raw).hexdigest()
    assert len(row["phash"]) == 16
    assert decode(raw, reencode="always")["image"] != raw


def test_reader_errors_pass_through_untouched():
    step = Decode(DecodeConfig())
    row = step.decode_row(
        {
            "partition": "p",
            "key": "k",
            "source": "s",
            "raw": None,
            "reason": "file_too_large",
            "error_message": "big",
            "input_bytes": 10**9,
        }
    )
    assert row["reason"] == "file_too_large" and not row["decode_ok"]


@pytest.mark.parametrize(
    "raised, reason", [(SyntaxError("broken PNG chunk"), schema.DECODE_FAILED), (MemoryError(), None)]
)
def test_what_pillow_raises_while_decoding_is_the_files_fault_unless_it_is_out_of_memory(
    base, monkeypatch, raised, reason
):
    from PIL import ImageFile

    def load(self):
        raise raised

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    raw = jpeg_bytes(base)
    if reason is not None:
        row = decode(raw)
        assert (row["reason"], row["error_message"]) == (reason, "SyntaxError: broken PNG chunk")
        return
    with pytest.raises(MemoryError, match=r"^out of memory decoding input 'k' \(\d+ bytes, within decode.max_pixels="):
        decode(raw)
