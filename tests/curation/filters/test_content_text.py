"""Text filter: real OCR (rapidocr's bundled models) on real photos and on text rendered onto them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from curation.filters.text import (
    TEXT,
    WATERMARK_TEXT,
    ContentText,
    ContentTextConfig,
    TextMeasures,
    classify_box,
    measure_text,
    text_reason,
)
from curation.schema import DECODE_FAILED, pending_mask
from curation.steps import run_steps_locally

# Real photos with no overlaid text; bus.jpg has real scene text (signs, ads on the bus) and
# starry_night is a painting without text: all must pass the text filter.
CLEAN = ["obama", "obama2", "franz_kafka", "basketball1", "zidane", "grace_hopper", "astronaut", "bus", "starry_night"]


@pytest.fixture(scope="module")
def ocr_result(real_images, render, batch_of):
    """One batch through the step: clean photos, messi5, rendered captions and watermarks,
    plus a row another step already dropped and a row whose decode failed."""
    r, im = render, real_images
    cases = {name: im[name] for name in CLEAN + ["messi5"]}
    cases.update(
        {
            "caption_obama": r.meme_caption(im["obama"]),
            "caption_franz_kafka": r.meme_caption(im["franz_kafka"]),
            "caption_zidane": r.meme_caption(im["zidane"]),
            "newsbar_grace_hopper": r.news_bar(im["grace_hopper"]),
            "newsbar_astronaut": r.news_bar(im["astronaut"]),
            "corner_obama": r.corner_mark(im["obama"]),
            "corner_astronaut": r.corner_mark(im["astronaut"]),
            "corner_tl_zidane": r.corner_mark(im["zidane"], "GettyImages", corner="tl"),
            "corner_tl_franz_kafka": r.corner_mark(im["franz_kafka"], "GettyImages", corner="tl"),
            "diagonal_obama": r.diagonal_mark(im["obama"], "\u00a9 PHOTOSTOCK", angle=40, scale=9),
            "diagonal_grace_hopper": r.diagonal_mark(im["grace_hopper"], "\u00a9 PHOTOSTOCK", angle=40, scale=9),
            "diagonal_zidane": r.diagonal_mark(im["zidane"]),
            "diagonal_franz_kafka": r.diagonal_mark(im["franz_kafka"]),
        }
    )
    batch = batch_of(cases, not_pending={"already_dropped": "no_salient_person"}, undecodable=("broken",))
    step = ContentText(ContentTextConfig())
    return batch, run_steps_locally(batch, [step])


def test_clean_photos_pass(ocr_result, column_by_key):
    _, out = ocr_result
    reason, cov, mark = (column_by_key(out, c) for c in ("reason", "text_coverage", "text_watermark"))
    assert {k: reason[k] for k in CLEAN} == {k: None for k in CLEAN}
    assert all(cov[k] < ContentTextConfig().coverage_threshold for k in CLEAN)
    assert not any(mark[k] for k in CLEAN)


def test_real_watermark_in_messi5(ocr_result, column_by_key):
    _, out = ocr_result
    assert column_by_key(out, "reason")["messi5"] == WATERMARK_TEXT
    assert column_by_key(out, "text_watermark")["messi5"] is True
    # the "unicef" on the shirt is scene text: found, but not what makes it a watermark
    assert column_by_key(out, "text_box_count")["messi5"] >= 2


def test_rendered_text_is_dropped_with_its_reason(ocr_result, column_by_key):
    _, out = ocr_result
    reason = column_by_key(out, "reason")
    got = {k: v for k, v in reason.items() if k.startswith(("caption", "newsbar", "corner", "diagonal"))}
    assert got == {
        "caption_obama": TEXT,
        "caption_franz_kafka": TEXT,
        "caption_zidane": TEXT,
        "newsbar_grace_hopper": TEXT,
        "newsbar_astronaut": TEXT,
        "corner_obama": WATERMARK_TEXT,
        "corner_astronaut": WATERMARK_TEXT,
        "corner_tl_zidane": WATERMARK_TEXT,
        "corner_tl_franz_kafka": WATERMARK_TEXT,
        "diagonal_obama": WATERMARK_TEXT,
        "diagonal_grace_hopper": WATERMARK_TEXT,
        "diagonal_zidane": WATERMARK_TEXT,
        "diagonal_franz_kafka": WATERMARK_TEXT,
    }
    marks = column_by_key(out, "text_watermark")
    assert all(marks[k] for k in got if k.startswith(("corner", "diagonal")))


def test_rows_not_pending_pass_through_untouched(ocr_result, column_by_key):
    batch, out = ocr_result
    assert out.num_rows == batch.num_rows
    assert out.column("key").to_pylist() == batch.column("key").to_pylist()
    for key in ("already_dropped", "broken"):
        assert column_by_key(out, "reason")[key] == column_by_key(batch, "reason")[key]
        for col in ("text_coverage", "text_box_count", "text_watermark"):
            assert column_by_key(out, col)[key] is None
    for name in batch.column_names:  # the step only adds columns and sets reasons
        if name != "reason":
            assert out.column(name).equals(batch.column(name))
    assert out.schema.field("text_coverage").type == pa.float32()
    assert out.schema.field("text_box_count").type == pa.int32()
    assert out.schema.field("text_watermark").type == pa.bool_()


def test_undecodable_image_bytes_become_a_row_error(batch_of, real_images):
    batch = batch_of({"fine": real_images["obama2"], "garbage": real_images["obama2"]})
    images = batch.column("image").to_pylist()
    images[1] = b"\xff\xd8 not really a jpeg"
    batch = batch.set_column(batch.schema.get_field_index("image"), "image", pa.array(images, pa.binary()))
    out = run_steps_locally(batch, [ContentText(ContentTextConfig())])
    assert out.column("reason").to_pylist() == [None, DECODE_FAILED]
    assert out.column("error_message").to_pylist()[1].startswith("content.text: ")
    assert pending_mask(out) == [True, False]


# Box geometry on a 1000 x 800 image (pure logic, no OCR).
W, H = 1000, 800


def _box(x0, y0, x1, y1, angle=0.0):
    """Corners of an axis-aligned box rotated by ``angle`` degrees about its centre, clockwise from top-left."""
    pts = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float32)
    c = pts.mean(axis=0)
    a = np.radians(angle)
    rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]], np.float32)
    return (pts - c) @ rot.T + c


@pytest.mark.parametrize(
    "box, kind",
    [
        (_box(800, 760, 990, 790), "edge_mark"),  # small text in the bottom-right corner
        (_box(10, 10, 200, 40), "edge_mark"),  # top-left corner
        (_box(400, 760, 600, 790), "edge_mark"),  # small credit centred on the bottom edge
        (_box(965, 300, 990, 500), "edge_mark"),  # vertical text along the right edge
        (_box(400, 380, 600, 410), None),  # small text in the middle: scene text
        (_box(10, 300, 200, 330), None),  # near the left edge, mid-height: a sign
        (_box(800, 700, 990, 790), None),  # in the corner but large (90 px tall)
        (_box(50, 700, 950, 760), "caption"),  # one line across 90% of the width
        (_box(300, 300, 700, 400, angle=-35), "diagonal"),
        (_box(450, 390, 530, 410, angle=-35), None),  # tilted but short
        (_box(300, 300, 700, 360, angle=-8), None),  # slightly tilted scene text
    ],
)
def test_box_kinds(box, kind):
    assert classify_box(box, W, H, ContentTextConfig()) == kind


def test_reasons_from_measures():
    cfg = ContentTextConfig()
    assert text_reason(TextMeasures(), cfg) is None
    assert text_reason(TextMeasures(coverage=0.049, box_count=3), cfg) is None
    assert text_reason(TextMeasures(coverage=0.05, box_count=3), cfg) == TEXT
    assert text_reason(TextMeasures(coverage=0.01, box_count=20), cfg) == TEXT
    assert text_reason(TextMeasures(coverage=0.01, box_count=1, caption=True), cfg) == TEXT
    assert text_reason(TextMeasures(coverage=0.01, box_count=1, edge_mark=True), cfg) == WATERMARK_TEXT
    # a large diagonal watermark covers much of the image, yet it is a watermark
    assert text_reason(TextMeasures(coverage=0.2, box_count=1, diagonal=True), cfg) == WATERMARK_TEXT
    # a caption touching the bottom edge is text, not a watermark
    assert text_reason(TextMeasures(coverage=0.1, box_count=2, caption=True, edge_mark=True), cfg) == TEXT
    keep = ContentTextConfig(drop_watermark_text=False)
    assert text_reason(TextMeasures(coverage=0.01, box_count=1, edge_mark=True), keep) is None


def test_coverage_is_the_union_of_boxes():
    cfg = ContentTextConfig()
    a = _box(0, 0, 100, 80)
    m = measure_text([a, a.copy(), _box(500, 400, 600, 480)], W, H, cfg)
    assert m.box_count == 3
    assert m.coverage == pytest.approx(2 * 101 * 81 / (W * H), rel=0.02)  # fillPoly includes edges


def test_running_out_of_memory_while_decoding_fails_the_batch(batch_of, real_images, monkeypatch):
    from PIL import Image

    def out_of_memory(self, *args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(Image.Image, "convert", out_of_memory)
    with pytest.raises(MemoryError):
        run_steps_locally(batch_of({"fine": real_images["obama2"]}), [ContentText(ContentTextConfig())])
