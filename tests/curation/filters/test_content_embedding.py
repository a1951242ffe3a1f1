"""CLIP embedding step: real checkpoint files (random weights) loaded through the step's code."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from curation.filters.clip_embedding import (
    ClipModel,
    ContentEmbedding,
    ContentEmbeddingConfig,
    check_clip_config,
    encode_prompts,
)
from curation.filters.model import WeightsUnavailableError
from curation.steps import run_steps_locally

PHOTOS = ["obama", "franz_kafka", "messi5", "starry_night", "bus", "zidane", "astronaut"]


def _expected(model_name, weights, images):
    """Embeddings from open_clip directly (the reference the step must reproduce)."""
    import open_clip
    import torch

    model, _, preprocess = open_clip.create_model_and_transforms(model_name, pretrained=weights)
    with torch.no_grad():
        emb = model.eval().encode_image(torch.stack([preprocess(im) for im in images])).numpy()
    return emb / np.linalg.norm(emb, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def photos(real_images):
    return {k: real_images[k] for k in PHOTOS}


def test_local_dir_checkpoint_batched(tiny_clip_dir, photos, batch_of, column_by_key):
    cfg = ContentEmbeddingConfig(model=f"local-dir:{tiny_clip_dir}", batch_size=3)  # 7 images: chunks of 3
    check_clip_config(cfg)
    batch = batch_of(photos, not_pending={"dropped_earlier": "too_small"}, undecodable=("broken",))
    out = run_steps_locally(batch, [ContentEmbedding(cfg)])

    assert out.schema.field("clip_embedding").type == pa.list_(pa.float32())
    emb = column_by_key(out, "clip_embedding")
    assert emb["dropped_earlier"] is None and emb["broken"] is None
    got = np.array([emb[k] for k in PHOTOS], np.float32)
    assert got.shape == (len(PHOTOS), 32)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # the weights in the file were loaded (not a fresh random init); decode uses JPEG draft
    # scaling, so compare against open_clip on the same decoded JPEGs at tolerance
    from curation.filters.model import decode_rgb

    decoded = [decode_rgb(b, min_side=64) for b in batch.column("image").to_pylist()[: len(PHOTOS)]]
    want = _expected(f"local-dir:{tiny_clip_dir}", None, decoded)
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert out.column("reason").to_pylist() == batch.column("reason").to_pylist()


def test_named_architecture_with_pt_file(tiny_clip_named, photos, batch_of):
    name, weights = tiny_clip_named
    cfg = ContentEmbeddingConfig(model=name, weights=str(weights), batch_size=4)
    check_clip_config(cfg)
    out = run_steps_locally(batch_of(photos), [ContentEmbedding(cfg)])
    got = np.array(out.column("clip_embedding").to_pylist(), np.float32)
    assert got.shape == (len(PHOTOS), 32)
    # same image, same embedding, whatever its batch neighbours
    again = run_steps_locally(batch_of({"obama": photos["obama"]}), [ContentEmbedding(cfg)])
    np.testing.assert_allclose(again.column("clip_embedding").to_pylist()[0], got[0], atol=1e-5)


def test_prompt_embeddings(tiny_clip_dir):
    cfg = ContentEmbeddingConfig(model=f"local-dir:{tiny_clip_dir}")
    emb = encode_prompts(cfg, ["a photo of a person", "an oil painting", "a cartoon"])
    assert emb.shape == (3, 32) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert ClipModel(cfg).input_side == 64


def test_missing_or_unset_weights_are_startup_errors(tmp_path, tiny_clip_named):
    name, _ = tiny_clip_named
    with pytest.raises(
        WeightsUnavailableError,
        match=r"content\.embedding\.weights is not set.*"
        r"content\.embedding\.enabled=false",
    ):
        check_clip_config(ContentEmbeddingConfig(model="ViT-B-32"))
    with pytest.raises(FileNotFoundError, match="no such file"):
        check_clip_config(ContentEmbeddingConfig(model=name, weights=str(tmp_path / "missing.pt")))
    with pytest.raises(ValueError, match="no open_clip_config.json"):
        check_clip_config(ContentEmbeddingConfig(model=f"local-dir:{tmp_path}"))
    with pytest.raises(ValueError, match="not an open_clip architecture"):
        check_clip_config(ContentEmbeddingConfig(model="ViT-Q-99", weights="x.pt"))
    # a known pretrained tag passes the start-up check (each worker downloads it where it can)
    check_clip_config(ContentEmbeddingConfig(model="ViT-B-32", weights="openai"))
