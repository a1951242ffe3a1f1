"""NSFW filter: random weights in the layout of LAION's detector (NeMo Curator's PyTorch port),
saved as .pth and .safetensors, loaded back by the step, scored as the port scores them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch import nn

from curation.filters.clip_embedding import ContentEmbeddingConfig
from curation.filters.model import WeightsUnavailableError
from curation.filters.nsfw import NSFW, ContentNsfw, ContentNsfwConfig
from curation.filters.thresholds import NOT_MEASURED
from curation.schema import BASE_FIELDS
from curation.steps import run_steps_locally

VIT_L14 = ContentEmbeddingConfig(model="ViT-L-14")  # its width, 768, comes from open_clip's config


class Normalization(nn.Module):
    """The port's first layer: the Keras normalisation's mean and variance as buffers."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.randn(width) * 0.01)
        self.register_buffer("variance", torch.rand(width) * 0.01 + 1e-3)

    def forward(self, x):
        return (x - self.mean) / self.variance.sqrt()


class PortedDetector(nn.Module):
    """The detector as the port defines it: norm, then linear_1..4 with ReLU, then a sigmoid."""

    def __init__(self, widths=(768, 64, 512, 256, 1)) -> None:
        super().__init__()
        self.norm = Normalization(widths[0])
        self.depth = len(widths) - 1
        for i in range(self.depth):
            setattr(self, f"linear_{i + 1}", nn.Linear(widths[i], widths[i + 1]))

    def forward(self, x):
        x = self.norm(x)
        for i in range(1, self.depth + 1):
            x = getattr(self, f"linear_{i}")(x)
            x = torch.relu(x) if i < self.depth else torch.sigmoid(x)
        return x


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    torch.manual_seed(0)
    model = PortedDetector().eval()
    folder = tmp_path_factory.mktemp("nsfw")
    torch.save(model.state_dict(), folder / "clip_autokeras_binary_nsfw.pth")
    from safetensors.torch import save_file

    save_file(dict(model.state_dict()), str(folder / "nsfw.safetensors"))
    return model, folder


def with_embeddings(batch: pa.Table, emb_ND: np.ndarray, missing: tuple[int, ...] = ()) -> pa.Table:
    values = [None if i in missing else e.tolist() for i, e in enumerate(emb_ND)]
    return batch.append_column(
        pa.field("clip_embedding", pa.list_(pa.float32())), pa.array(values, pa.list_(pa.float32()))
    )


def unit_rows(n: int, width: int = 768, seed: int = 0) -> np.ndarray:
    e = np.random.default_rng(seed).normal(size=(n, width)).astype(np.float32)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def table_of(n: int) -> pa.Table:
    rows = [{"partition": "p", "key": f"k{i}", "source": "s", "decode_ok": True} for i in range(n)]
    return pa.Table.from_pylist(rows, schema=pa.schema(BASE_FIELDS))


@pytest.mark.parametrize("name", ["clip_autokeras_binary_nsfw.pth", "nsfw.safetensors"])
def test_the_step_scores_as_the_port_does(detector, name):
    model, folder = detector
    cfg = ContentNsfwConfig(weights=str(folder / name), batch_size=3, threshold=0.5)
    step = ContentNsfw(cfg, VIT_L14)
    step.check()
    emb = unit_rows(7)
    batch = with_embeddings(table_of(7), emb, missing=(5,))
    out = run_steps_locally(batch, [step])
    scores = out.column("nsfw_score").to_pylist()
    with torch.no_grad():
        expected = model(torch.from_numpy(emb))[:, 0].numpy()
    assert scores[5] is None
    got = np.array([s for i, s in enumerate(scores) if i != 5], np.float32)
    np.testing.assert_allclose(got, np.delete(expected, 5), atol=1e-5)
    reasons = out.column("reason").to_pylist()
    assert reasons == [NSFW if s is not None and s >= 0.5 else None for s in scores]
    assert out.schema.field("nsfw_score").type == pa.float32()


def test_enabled_without_weights_is_one_line_naming_the_setting():
    with pytest.raises(WeightsUnavailableError) as err:
        ContentNsfw(ContentNsfwConfig(), VIT_L14).check()
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("content.nsfw.weights is not set")
    assert "content.nsfw.enabled=false" in message


def test_a_file_of_another_layout_is_named_with_what_it_holds(tmp_path):
    aesthetic = nn.Sequential(nn.Linear(768, 1024), nn.Dropout(0.2), nn.Linear(1024, 128))
    path = tmp_path / "sac+logos+ava1-l14-linearMSE.pth"
    torch.save({f"layers.{k}": v for k, v in aesthetic.state_dict().items()}, path)  # its Sequential is `layers`
    with pytest.raises(ValueError) as err:
        ContentNsfw(ContentNsfwConfig(weights=str(path)), VIT_L14).check()
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"content.nsfw.weights={str(path)!r}: not LAION's CLIP NSFW detector")
    assert "it holds layers.0.weight [1024, 768], layers.0.bias [1024]" in message


def test_a_head_for_another_clip_width_is_refused_at_start_up(tmp_path):
    torch.manual_seed(1)
    path = tmp_path / "nsfw_b32.pth"
    torch.save(PortedDetector((512, 32, 32, 1)).state_dict(), path)  # LAION's ViT-B/32 port: same keys
    cfg = ContentNsfwConfig(weights=str(path))
    with pytest.raises(
        ValueError, match=r"takes 512-d embeddings, and content\.embedding\.model='ViT-L-14' gives 768-d"
    ):
        ContentNsfw(cfg, VIT_L14).check()
    ContentNsfw(cfg, ContentEmbeddingConfig(model="ViT-B-32")).check()


def test_settings_and_the_disabled_report(detector):
    _, folder = detector
    cfg = ContentNsfwConfig(weights=str(folder / "nsfw.safetensors"), threshold=0.3)
    assert ContentNsfw(cfg).describe() == {
        "name": "content.nsfw",
        "applied": True,
        "threshold": 0.3,
        "weights": cfg.weights,
        "threshold_source": NOT_MEASURED,  # not LAION's 0.5, and no calibration record
    }
    off = ContentNsfw(ContentNsfwConfig(enabled=False)).describe()
    assert off["applied"] is False and off["disabled_by"] == "content.nsfw.enabled=false"
    with pytest.raises(ValueError, match=r"content\.nsfw\.threshold=1\.5: a probability"):
        ContentNsfw(ContentNsfwConfig(weights=cfg.weights, threshold=1.5)).check()
