"""Watermark filter: the LAION-layout classifier loaded from a saved file, and the CLIP head."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from curation.filters.model import WeightsUnavailableError
from curation.filters.watermark import WATERMARK, ContentWatermark, ContentWatermarkConfig, build_classifier
from curation.steps import run_steps_locally

PHOTOS = ["obama", "messi5", "starry_night"]


@pytest.fixture(scope="module")
def laion_layout_weights(tmp_path_factory):
    """A random classifier with the layout of LAION's watermark_model_v1.pt, saved as a state dict."""
    torch.manual_seed(0)
    model = build_classifier("efficientnet_b3", (625, 256)).eval()
    path = tmp_path_factory.mktemp("watermark") / "watermark_model.pt"
    torch.save(model.state_dict(), path)
    return model, path


@pytest.fixture(scope="module")
def small_weights(tmp_path_factory):
    """The same head on a small timm backbone: the decision tests need no big model."""
    torch.manual_seed(0)
    model = build_classifier("mobilenetv3_small_050", (625, 256)).eval()
    path = tmp_path_factory.mktemp("watermark_small") / "small.pt"
    torch.save(model.state_dict(), path)
    return model, path


def test_head_has_the_laion_layout(laion_layout_weights):
    model, _ = laion_layout_weights
    head = {k: tuple(v.shape) for k, v in model.state_dict().items() if k.startswith("classifier.")}
    assert head == {
        "classifier.0.weight": (625, 1536),
        "classifier.0.bias": (625,),
        "classifier.3.weight": (256, 625),
        "classifier.3.bias": (256,),
        "classifier.5.weight": (2, 256),
        "classifier.5.bias": (2,),
    }


def test_classifier_checkpoint_scores_real_images_batched(laion_layout_weights, real_images, batch_of):
    model, path = laion_layout_weights
    cfg = ContentWatermarkConfig(weights=str(path), batch_size=2)  # 3 images: batches of 2 and 1
    ContentWatermark(cfg).check()
    batch = batch_of({k: real_images[k] for k in PHOTOS}, not_pending={"ended": "too_small"}, undecodable=("broken",))
    out = run_steps_locally(batch, [ContentWatermark(cfg)])
    assert out.schema.field("watermark_score").type == pa.float32()
    scores = out.column("watermark_score").to_pylist()
    assert scores[len(PHOTOS) :] == [None, None]
    got = np.array(scores[: len(PHOTOS)], np.float32)
    assert got.shape == (len(PHOTOS),) and np.all((got > 0) & (got < 1))

    # the file's weights were loaded: the model in memory gives the same P(watermark)
    from PIL import Image

    from curation.filters.model import decode_rgb

    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    ims = [
        decode_rgb(b, min_side=256).resize((256, 256), Image.Resampling.BILINEAR)
        for b in batch.column("image").to_pylist()[: len(PHOTOS)]
    ]
    x = torch.tensor(
        np.stack([(np.asarray(im) / 255.0 - mean) / std for im in ims]).transpose(0, 3, 1, 2), dtype=torch.float32
    )
    with torch.no_grad():
        want = torch.softmax(model(x), dim=1)[:, 0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert out.column("reason").to_pylist() == [WATERMARK if s >= 0.8 else None for s in got] + [
        "too_small",
        "truncated",
    ]


def test_threshold_decides(tmp_path, small_weights, real_images, batch_of):
    model, _ = small_weights
    state = model.state_dict()
    state["classifier.5.bias"] = torch.tensor([20.0, -20.0])  # class 0 (watermark) wins on every image
    path = tmp_path / "always.pt"
    torch.save(state, path)
    batch = batch_of({k: real_images[k] for k in ["obama", "zidane"]}, not_pending={"ended": "too_small"})
    small = dict(weights=str(path), backbone="mobilenetv3_small_050")
    out = run_steps_locally(batch, [ContentWatermark(ContentWatermarkConfig(**small))])
    assert out.column("reason").to_pylist() == [WATERMARK, WATERMARK, "too_small"]
    out = run_steps_locally(batch, [ContentWatermark(ContentWatermarkConfig(**small, watermark_class=1))])
    assert out.column("reason").to_pylist() == [None, None, "too_small"]


def test_clip_head_alone_and_combined(tmp_path, small_weights, real_images, batch_of):
    _, classifier = small_weights
    head = tmp_path / "wm_head.pt"
    torch.save({"weight": torch.tensor([[6.0, 0.0, 0.0, 0.0]]), "bias": torch.tensor([-3.0])}, head)
    batch = batch_of({"marked": real_images["obama"], "clean": real_images["zidane"]})
    batch = batch.append_column(
        pa.field("clip_embedding", pa.list_(pa.float32())),
        pa.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0]], pa.list_(pa.float32())),
    )
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731

    out = run_steps_locally(batch, [ContentWatermark(ContentWatermarkConfig(clip_head_weights=str(head)))])
    np.testing.assert_allclose(out.column("watermark_score").to_pylist(), [sig(3.0), sig(-3.0)], rtol=1e-5)
    assert out.column("reason").to_pylist() == [WATERMARK, None]

    small = dict(weights=str(classifier), backbone="mobilenetv3_small_050")
    alone = run_steps_locally(batch, [ContentWatermark(ContentWatermarkConfig(**small))])
    both_cfg = ContentWatermarkConfig(**small, clip_head_weights=str(head))
    both = run_steps_locally(batch, [ContentWatermark(both_cfg)])
    want = np.maximum(alone.column("watermark_score").to_pylist(), [sig(3.0), sig(-3.0)])
    np.testing.assert_allclose(both.column("watermark_score").to_pylist(), want, rtol=1e-5)


def test_mismatched_weights_and_missing_files_are_clear_errors(tmp_path, laion_layout_weights):
    _, path = laion_layout_weights
    step = ContentWatermark(ContentWatermarkConfig(weights=str(path), backbone="resnet18"))
    with pytest.raises(ValueError, match=r"does not fit content\.watermark\.backbone='resnet18'"):
        step.setup()
    with pytest.raises(
        WeightsUnavailableError,
        match=r"content\.watermark\.weights is not set.*"
        r"content\.watermark\.enabled=false",
    ):
        ContentWatermark(ContentWatermarkConfig()).check()
    with pytest.raises(FileNotFoundError, match=r"content\.watermark\.weights='.*nope\.pt': no such file"):
        ContentWatermark(ContentWatermarkConfig(weights=str(tmp_path / "nope.pt"))).check()
