"""Aesthetic score: random weights in the layout of LAION's improved aesthetic predictor (v2),
saved as .pth and .safetensors, loaded back by the step, scored as its own MLP scores them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch import nn

from curation.filters.aesthetic import LOW_AESTHETIC, ContentAesthetic, ContentAestheticConfig
from curation.filters.clip_embedding import ContentEmbeddingConfig
from curation.filters.model import WeightsUnavailableError
from curation.filters.thresholds import NOT_MEASURED
from curation.steps import run_steps_locally
from tests.curation.filters.test_content_nsfw import PortedDetector, table_of, unit_rows, with_embeddings

VIT_L14 = ContentEmbeddingConfig(model="ViT-L-14")


class AestheticMLP(nn.Module):
    """The predictor as improved-aesthetic-predictor's simple_inference.py defines it."""

    def __init__(self, width: int = 768) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(width, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, x):
        return self.layers(x)


@pytest.fixture(scope="module")
def predictor(tmp_path_factory):
    torch.manual_seed(0)
    model = AestheticMLP().eval()
    with torch.no_grad():
        model.layers[7].bias.fill_(5.0)  # ratings around 5, as the real predictor gives
    folder = tmp_path_factory.mktemp("aesthetic")
    torch.save(model.state_dict(), folder / "sac+logos+ava1-l14-linearMSE.pth")
    from safetensors.torch import save_file

    save_file(dict(model.state_dict()), str(folder / "aesthetic.safetensors"))
    return model, folder


def test_the_file_has_the_v2_keys(predictor):
    model, _ = predictor
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == {
        "layers.0.weight": (1024, 768),
        "layers.0.bias": (1024,),
        "layers.2.weight": (128, 1024),
        "layers.2.bias": (128,),
        "layers.4.weight": (64, 128),
        "layers.4.bias": (64,),
        "layers.6.weight": (16, 64),
        "layers.6.bias": (16,),
        "layers.7.weight": (1, 16),
        "layers.7.bias": (1,),
    }


@pytest.mark.parametrize("name", ["sac+logos+ava1-l14-linearMSE.pth", "aesthetic.safetensors"])
def test_the_step_scores_as_the_predictor_does_and_stores_every_score(predictor, name):
    model, folder = predictor
    step = ContentAesthetic(ContentAestheticConfig(weights=str(folder / name), batch_size=4), VIT_L14)
    step.check()
    emb = unit_rows(9, seed=3)
    out = run_steps_locally(with_embeddings(table_of(9), emb, missing=(0,)), [step])
    scores = out.column("aesthetic_score").to_pylist()
    with torch.no_grad():
        expected = model(torch.from_numpy(emb))[:, 0].numpy()
    assert scores[0] is None
    np.testing.assert_allclose(np.array(scores[1:], np.float32), expected[1:], atol=1e-4)
    assert out.column("reason").to_pylist() == [None] * 9  # no min_score: scored, never dropped
    assert out.schema.field("aesthetic_score").type == pa.float32()


def test_min_score_drops_the_rows_below_it(predictor):
    _, folder = predictor
    emb = unit_rows(20, seed=4)
    plain = ContentAesthetic(ContentAestheticConfig(weights=str(folder / "aesthetic.safetensors")), VIT_L14)
    scores = run_steps_locally(with_embeddings(table_of(20), emb), [plain]).column("aesthetic_score").to_pylist()
    floor = float(np.median(scores))
    step = ContentAesthetic(ContentAestheticConfig(weights=plain.cfg.weights, min_score=floor), VIT_L14)
    reasons = run_steps_locally(with_embeddings(table_of(20), emb), [step]).column("reason").to_pylist()
    assert reasons == [LOW_AESTHETIC if s < floor else None for s in scores]
    assert 0 < reasons.count(LOW_AESTHETIC) < 20
    assert step.describe() == {
        "name": "content.aesthetic",
        "applied": True,
        "min_score": floor,
        "weights": step.cfg.weights,
        "threshold_source": NOT_MEASURED,  # a median of random scores: no calibration record
    }


def test_missing_or_mismatched_weights_are_one_line_naming_the_setting_or_file(tmp_path):
    with pytest.raises(WeightsUnavailableError, match=r"^content\.aesthetic\.weights is not set") as err:
        ContentAesthetic(ContentAestheticConfig(), VIT_L14).check()
    assert "\n" not in str(err.value) and "content.aesthetic.enabled=false" in str(err.value)
    nsfw = tmp_path / "clip_autokeras_binary_nsfw.pth"
    torch.save(PortedDetector().state_dict(), nsfw)
    with pytest.raises(ValueError) as err:
        ContentAesthetic(ContentAestheticConfig(weights=str(nsfw)), VIT_L14).check()
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"content.aesthetic.weights={str(nsfw)!r}: not LAION's aesthetic")
    assert "it holds norm.mean [768], norm.variance [768], linear_1.weight [64, 768]" in message
    small = tmp_path / "aesthetic_32.pth"
    torch.save(AestheticMLP(32).state_dict(), small)
    with pytest.raises(
        ValueError, match=r"takes 32-d embeddings, and content\.embedding\.model='ViT-L-14' gives 768-d"
    ):
        ContentAesthetic(ContentAestheticConfig(weights=str(small)), VIT_L14).check()
