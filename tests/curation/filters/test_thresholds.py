"""Where each model step's threshold comes from: a published value for the same model, the
section's calibration record, or a warning at start-up naming the setting and how to calibrate it."""

from __future__ import annotations

import warnings

import pytest

from curation.filters.aesthetic import ContentAesthetic, ContentAestheticConfig
from curation.filters.artistic import ContentArtistic, ContentArtisticConfig
from curation.filters.clip_embedding import ContentEmbeddingConfig
from curation.filters.nsfw import ContentNsfw, ContentNsfwConfig
from curation.filters.person import Detector, DetectorConfig
from curation.filters.thresholds import NOT_MEASURED, Published, UncalibratedThresholdWarning, threshold_source
from curation.filters.watermark import ContentWatermark, ContentWatermarkConfig
from tests.curation.filters.test_content_config import aesthetic_layout, nsfw_layout, random_head


def start_up(step) -> list[str]:
    """The step's start-up check; the texts of the uncalibrated-threshold warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step.check()
    return [str(w.message) for w in caught if issubclass(w.category, UncalibratedThresholdWarning)]


@pytest.fixture(scope="module")
def heads(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("heads")
    return {
        "nsfw": str(random_head(folder / "nsfw.pth", nsfw_layout(32))),
        "aesthetic": str(random_head(folder / "aesthetic.pth", aesthetic_layout(32))),
        "clip_head": str(random_head(folder / "head.pt", {"weight": (1, 32), "bias": (1,)})),
    }


def test_a_source_is_the_record_then_a_published_value():
    laion = Published((0.5,), "LAION")
    assert threshold_source(0.5, "", laion) == "LAION"
    assert threshold_source(0.3, "", laion) is None
    assert threshold_source(0.3, "120 labelled images", laion) == "calibration: 120 labelled images"
    assert threshold_source(0.5, "", None) is None
    assert threshold_source(None, "", None).startswith("no threshold")


def test_nsfw_at_laions_value_is_quiet_and_says_so(heads):
    step = ContentNsfw(ContentNsfwConfig(weights=heads["nsfw"]))
    assert start_up(step) == []
    assert step.describe()["threshold_source"].startswith("LAION's cut-off with this detector")
    step = ContentNsfw(ContentNsfwConfig(weights=heads["nsfw"], threshold=0.3))
    (message,) = start_up(step)
    assert message.startswith("content.nsfw.threshold=0.3 says nowhere what it was measured on")
    assert "python pipelines/calibrate.py nsfw" in message and "content.nsfw.calibration" in message
    assert step.describe()["threshold_source"] == NOT_MEASURED
    step = ContentNsfw(ContentNsfwConfig(weights=heads["nsfw"], threshold=0.3, calibration="200 images, P 0.97"))
    assert start_up(step) == []
    assert step.describe()["threshold_source"] == "calibration: 200 images, P 0.97"


def test_artistic_is_off_by_default_and_warns_when_enabled_uncalibrated(heads):
    assert not ContentArtisticConfig().enabled
    clip = ContentEmbeddingConfig(model="ViT-B-32")
    step = ContentArtistic(ContentArtisticConfig(enabled=True), clip)
    (message,) = start_up(step)
    assert message.startswith("content.artistic.threshold=0.5 says nowhere what it was measured on")
    assert "python pipelines/calibrate.py artistic" in message and "content.artistic.enabled=false" in message
    step = ContentArtistic(ContentArtisticConfig(enabled=True, calibration="x"), clip)
    assert start_up(step) == []


def test_watermark_laions_value_holds_for_its_classifier_only(heads, tmp_path):
    classifier = tmp_path / "watermark_model_v1.pt"
    classifier.write_bytes(b"")  # the start-up check looks for the file; the model loads in setup
    assert start_up(ContentWatermark(ContentWatermarkConfig(weights=str(classifier)))) == []
    with_head = ContentWatermark(ContentWatermarkConfig(weights=str(classifier), clip_head_weights=heads["clip_head"]))
    (message,) = start_up(with_head)
    assert message.startswith("content.watermark.threshold=0.8 says nowhere")


def test_aesthetic_scores_only_by_default_and_knows_laions_cut_offs(heads):
    step = ContentAesthetic(ContentAestheticConfig(weights=heads["aesthetic"]))
    assert start_up(step) == []
    assert step.describe()["threshold_source"].startswith("no threshold")
    assert start_up(ContentAesthetic(ContentAestheticConfig(weights=heads["aesthetic"], min_score=6.5))) == []
    (message,) = start_up(ContentAesthetic(ContentAestheticConfig(weights=heads["aesthetic"], min_score=4.0)))
    assert message.startswith("content.aesthetic.min_score=4.0 says nowhere")


def test_the_detector_threshold_is_per_detector(centernet_path, tmp_path):
    centernet = Detector(DetectorConfig(backend="centernet_onnx", weights=str(centernet_path)))
    assert start_up(centernet) == []
    assert "shared/assets/PROVENANCE.md" in centernet.describe()["threshold_source"]
    yolo = tmp_path / "yolo11x.pt"
    yolo.write_bytes(b"")
    (message,) = start_up(Detector(DetectorConfig(backend="ultralytics", weights=str(yolo))))
    assert message.startswith("detector.score_threshold=0.9 says nowhere what it was measured on")
    assert "person_score_max" in message and "detector.calibration" in message
    cfg = DetectorConfig(backend="ultralytics", weights=str(yolo), score_threshold=0.6, calibration="pilot, 500 images")
    assert start_up(Detector(cfg)) == []


def test_every_model_step_of_the_recipe_traces_the_threshold_it_drops_by():
    """A model step added to the recipe with a score threshold must say where it comes from."""
    from curation.filters.model import ModelStep
    from curation.recipe import HUMANS1B

    exempt = {
        "content.embedding": "drops nothing",
        "backbone_embedding": "drops nothing",
        "content.text": "OCR box geometry and counts, set on the labelled cases of test_content_text.py",
    }
    model_steps = [cls for cls in HUMANS1B.steps if issubclass(cls, ModelStep)]
    assert {cls.name for cls in model_steps} >= set(exempt)
    for cls in model_steps:
        if cls.name not in exempt:
            assert cls.threshold_setting in {s.setting for s in cls.scores}, cls.name
