"""Person detection: the salient rule on injected boxes, the real CenterNet on real photos,
and an ultralytics YOLO loaded from a local weights file through the same step."""

from __future__ import annotations

import pyarrow as pa
import pytest

from curation import schema
from curation.config import DecodeConfig
from curation.decode import Decode
from curation.filters.person import Detector, DetectorConfig, check_detector_config, salient_counts, yolo_class
from curation.steps import run_steps_locally
from pipelines.demo_corpus import _skimage, _ultralytics_asset, jpeg_bytes
from tests.conftest import ASSETS


def raw_batch(images: dict[str, bytes]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"partition": "p", "key": k, "source": k, "raw": v, "input_bytes": len(v)} for k, v in images.items()],
        schema=schema.RAW_SCHEMA,
    )


@pytest.mark.parametrize("measure,expected", [("height", 1), ("long_side", 2), ("short_side", 0)])
def test_salient_rule_measures_the_box_as_configured(measure, expected):
    boxes = [(0, 0, 100, 400), (0, 0, 500, 100), (0, 0, 400, 400)]  # tall, wide, big but low score
    scores = [0.95, 0.95, 0.5]
    cfg = DetectorConfig(weights="x", score_threshold=0.9, min_box_size=300, box_size_measure=measure)
    assert salient_counts(boxes, scores, cfg) == (2, expected)


def test_threshold_defaults_per_detector():
    assert DetectorConfig(backend="ultralytics", weights="x").threshold == 0.9  # the Sapiens rule
    assert DetectorConfig(backend="centernet_onnx", weights="x").threshold == 0.3


def test_missing_weights_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="detector.weights"):
        check_detector_config(DetectorConfig(backend="centernet_onnx", weights=str(tmp_path / "nope.onnx")))
    with pytest.raises(FileNotFoundError, match="holds no"):
        check_detector_config(DetectorConfig(backend="ultralytics", weights=str(tmp_path)))


def test_real_centernet_keeps_people_and_drops_non_people(centernet_path):
    images = {
        "zidane": _ultralytics_asset("zidane.jpg").read_bytes(),
        "obama": (ASSETS / "images" / "obama.jpg").read_bytes(),
        "coffee": jpeg_bytes(_skimage("coffee")),
        "rocket": jpeg_bytes(_skimage("rocket")),
    }
    cfg = DetectorConfig(backend="centernet_onnx", weights=str(centernet_path), min_box_size=200, batch_size=4)
    out = run_steps_locally(raw_batch(images), [Decode(DecodeConfig()), Detector(cfg)])
    rows = {r["key"]: r for r in out.to_pylist()}
    assert rows["zidane"]["reason"] is None and rows["obama"]["reason"] is None
    assert rows["coffee"]["reason"] == rows["rocket"]["reason"] == schema.NO_SALIENT_PERSON
    z = rows["zidane"]
    assert z["salient_person_count"] >= 1 and z["person_score_max"] >= 0.3
    for x1, y1, x2, y2 in z["person_boxes"]:  # boxes are in the image's own pixels
        assert 0 <= x1 < x2 <= z["width"] and 0 <= y1 < y2 <= z["height"]


def test_ultralytics_model_from_a_local_weights_file(tmp_path):
    YOLO = yolo_class()
    model = YOLO("yolo11n.yaml")  # untrained, built offline
    for conv in model.model.model[-1].cv3:
        conv[-1].bias.data.fill_(3.0)  # class logits up: the untrained head then emits boxes deterministically
    weights = tmp_path / "yolo_untrained.pt"
    model.save(str(weights))
    cfg = DetectorConfig(
        backend="ultralytics", weights=str(tmp_path), score_threshold=0.5, min_box_size=10, batch_size=2, device="cpu"
    )
    images = {
        "bus": _ultralytics_asset("bus.jpg").read_bytes(),
        "zidane": _ultralytics_asset("zidane.jpg").read_bytes(),
    }
    out = run_steps_locally(raw_batch(images), [Decode(DecodeConfig()), Detector(cfg)])
    for row in out.to_pylist():
        assert len(row["person_boxes"]) == len(row["person_scores"]) > 0
        assert all(s >= cfg.record_threshold for s in row["person_scores"])
        assert row["person_scores"] == sorted(row["person_scores"], reverse=True)
        assert all(
            0 <= b[0] <= b[2] <= row["width"] + 1 and 0 <= b[1] <= b[3] <= row["height"] + 1
            for b in row["person_boxes"]
        )


def test_loading_ultralytics_leaves_pillow_failing_on_bytes_it_cannot_identify():
    """ultralytics patches ``Image.open`` at import to pip-install pi-heif on unknown bytes;
    after our loader, a non-image is Pillow's own ``UnidentifiedImageError`` again."""
    import io

    from PIL import Image, UnidentifiedImageError

    yolo_class()
    with pytest.raises(UnidentifiedImageError):
        Image.open(io.BytesIO(b"\x89PNG\r\n\x1a\n not a png"))
