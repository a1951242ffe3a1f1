"""Artistic filter: zero-shot decisions on injected embeddings, linear heads, and the real CLIP path."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from curation.filters.artistic import (
    ARTISTIC,
    ContentArtistic,
    ContentArtisticConfig,
    PromptSet,
    class_embeddings,
    zero_shot,
)
from curation.filters.clip_embedding import ContentEmbedding, ContentEmbeddingConfig
from curation.filters.model import LinearHead
from curation.schema import BASE_FIELDS
from curation.steps import run_steps_locally

D = 8
NATURAL = {"photo": ["a photo", "a snapshot"]}
NON_NATURAL = {"painting": ["a painting", "an oil painting"], "cartoon": ["a cartoon"], "render": ["a 3D render"]}
AXIS = {"photo": 0, "painting": 1, "cartoon": 2, "render": 3}  # each class along its own direction


def unit(v) -> np.ndarray:
    v = np.asarray(v, np.float32)
    return v / np.linalg.norm(v)


def e(*weights) -> np.ndarray:
    """A unit embedding with the given weights on the first axes."""
    v = np.zeros(D, np.float32)
    v[: len(weights)] = weights
    return unit(v)


def prompt_embeddings(prompts: PromptSet) -> np.ndarray:
    """Prompts of a class scattered around its axis (ensembling must recover the axis)."""
    rng = np.random.default_rng(0)
    out = []
    for owner in prompts.prompt_class:
        v = np.zeros(D, np.float32)
        v[AXIS[prompts.classes[owner]]] = 1.0
        v[4:] = rng.normal(0, 0.3, D - 4)  # off-axis noise in the unused dimensions
        out.append(unit(v))
    return np.stack(out)


@pytest.fixture(scope="module")
def prompts() -> PromptSet:
    return PromptSet.from_groups(NATURAL, NON_NATURAL)


def test_prompt_set_flattens_groups(prompts):
    assert prompts.classes == ("photo", "painting", "cartoon", "render")
    assert prompts.non_natural == (False, True, True, True)
    assert prompts.prompts[:2] == ("a photo", "a snapshot")
    assert prompts.prompt_class == (0, 0, 1, 1, 2, 3)


def test_ensembling_averages_prompts_of_a_class():
    emb = np.stack([e(1, 1), e(1, -1), e(0, 0, 1)])
    classes = class_embeddings(emb, [0, 0, 1], 2)
    np.testing.assert_allclose(classes, np.stack([e(1), e(0, 0, 1)]), atol=1e-6)


def test_zero_shot_decisions_on_injected_embeddings(prompts):
    classes = class_embeddings(prompt_embeddings(prompts), prompts.prompt_class, len(prompts.classes))
    images = np.stack([e(1), e(0, 1), e(0, 0, 1), e(0, 0, 0, 1), e(1, 0.9), e(0.9, 1)])
    score, best = zero_shot(images, classes, prompts.non_natural, logit_scale=100.0)
    labels = [prompts.classes[b] for b in best]
    assert labels == ["photo", "painting", "cartoon", "render", "photo", "painting"]
    assert score.dtype == np.float32 and score.shape == (6,)
    drop = score >= 0.5
    assert drop.tolist() == [False, True, True, True, False, True]
    assert score[0] < 1e-6 and score[1] > 1 - 1e-6


def test_zero_shot_score_is_the_non_natural_softmax_mass():
    classes = np.stack([e(1), e(0, 1)])  # photo, painting
    image = e(0.8, 0.6)  # cos 0.8 to photo, 0.6 to painting
    score, best = zero_shot(image[None], classes, [False, True], logit_scale=10.0)
    want = np.exp(6.0) / (np.exp(8.0) + np.exp(6.0))
    assert score[0] == pytest.approx(want, rel=1e-5)
    assert best[0] == 0
    # several non-natural classes add up: three equally likely ones give 3/4
    classes4 = np.stack([e(1), e(0, 1), e(0, 0, 1), e(0, 0, 0, 1)])
    score, _ = zero_shot(e(1, 1, 1, 1)[None], classes4, [False, True, True, True], logit_scale=100.0)
    assert score[0] == pytest.approx(0.75, rel=1e-5)


def _embedded_batch(embeddings: dict[str, np.ndarray | None], not_pending: dict[str, str]) -> pa.Table:
    rows = [
        {
            "partition": "p0",
            "key": k,
            "source": k,
            "decode_ok": True,
            "reason": None,
            "clip_embedding": None if v is None else v.tolist(),
        }
        for k, v in embeddings.items()
    ]
    rows += [
        {"partition": "p0", "key": k, "source": k, "decode_ok": True, "reason": r, "clip_embedding": e(0, 1).tolist()}
        for k, r in not_pending.items()
    ]
    schema = pa.schema([*BASE_FIELDS, pa.field("clip_embedding", pa.list_(pa.float32()))])
    return pa.Table.from_pylist(rows, schema=schema)


def test_step_annotates_pending_rows_only(prompts):
    cfg = ContentArtisticConfig(enabled=True, natural_prompts=NATURAL, non_natural_prompts=NON_NATURAL, threshold=0.5)
    step = ContentArtistic(cfg, ContentEmbeddingConfig(), prompt_embeddings=prompt_embeddings(prompts))
    batch = _embedded_batch(
        {"photo": e(1), "painting": e(0, 1), "cartoon": e(0, 0, 1), "no_embedding": None},
        not_pending={"ended": "too_small"},
    )
    out = run_steps_locally(batch, [step])
    rows = {r["key"]: r for r in out.to_pylist()}
    assert {k: r["reason"] for k, r in rows.items()} == {
        "photo": None,
        "painting": ARTISTIC,
        "cartoon": ARTISTIC,
        "no_embedding": None,
        "ended": "too_small",
    }
    assert rows["photo"]["artistic_label"] == "photo" and rows["cartoon"]["artistic_label"] == "cartoon"
    assert rows["ended"]["artistic_score"] is None and rows["ended"]["artistic_label"] is None
    assert rows["no_embedding"]["artistic_score"] is None
    assert out.schema.field("artistic_score").type == pa.float32()
    assert step.describe()["score"] == "zero_shot"


def test_step_needs_the_embedding_column(prompts):
    step = ContentArtistic(
        ContentArtisticConfig(natural_prompts=NATURAL, non_natural_prompts=NON_NATURAL),
        ContentEmbeddingConfig(),
        prompt_embeddings=prompt_embeddings(prompts),
    )
    batch = pa.Table.from_pylist(
        [{"partition": "p", "key": "k", "source": "s", "decode_ok": True}], schema=pa.schema(BASE_FIELDS)
    )
    with pytest.raises(ValueError, match="reads the .clip_embedding. column"):
        run_steps_locally(batch, [step])


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_linear_head_file_replaces_the_score(tmp_path, prompts, suffix):
    # P(non-natural) = sigmoid(8 * (x_painting - x_photo)): a head that disagrees with zero-shot on purpose
    weight = torch.zeros(1, D)
    weight[0, 0], weight[0, 1] = -8.0, 8.0
    state = {"linear.weight": weight, "linear.bias": torch.tensor([0.0])}
    path = tmp_path / f"head{suffix}"
    if suffix == ".pt":
        torch.save(state, path)
    else:
        from safetensors.torch import save_file

        save_file(state, str(path))
    cfg = ContentArtisticConfig(
        natural_prompts=NATURAL, non_natural_prompts=NON_NATURAL, head_weights=str(path), threshold=0.9
    )
    step = ContentArtistic(cfg, ContentEmbeddingConfig(), prompt_embeddings=prompt_embeddings(prompts))
    out = run_steps_locally(_embedded_batch({"a": e(1), "b": e(0, 1), "c": e(1, 1)}, {}), [step])
    scores = out.column("artistic_score").to_pylist()
    want = 1 / (1 + np.exp(-8 * (np.array([0, 1, 0]) - np.array([1, 0, 0]))))
    np.testing.assert_allclose(scores, want, rtol=1e-5)
    assert out.column("reason").to_pylist() == [None, ARTISTIC, None]
    assert out.column("artistic_label").to_pylist()[:2] == ["photo", "painting"]  # labels stay zero-shot


def test_two_logit_head_and_bad_heads(tmp_path):
    head = LinearHead(np.stack([np.zeros(D), np.eye(D)[0] * 4]), np.zeros(2))
    np.testing.assert_allclose(head.predict(np.stack([e(1), e(0, 1)])), [1 / (1 + np.exp(-4)), 0.5], rtol=1e-5)
    with pytest.raises(ValueError, match="expects 8-d embeddings"):
        head.predict(np.ones((1, 4), np.float32))
    torch.save({"weight": torch.zeros(3, D), "bias": torch.zeros(3)}, tmp_path / "three.pt")
    with pytest.raises(ValueError, match=r"weight \[1\|2, D\]"):
        LinearHead.load(tmp_path / "three.pt")
    torch.save(
        {
            "0.weight": torch.zeros(4, D),
            "0.bias": torch.zeros(4),
            "2.weight": torch.zeros(1, 4),
            "2.bias": torch.zeros(1),
        },
        tmp_path / "mlp.pt",
    )
    with pytest.raises(ValueError, match="exactly one weight and one bias"):
        LinearHead.load(tmp_path / "mlp.pt")


def test_real_clip_path_scores_real_images(tiny_clip_dir, real_images, batch_of):
    """Prompts encoded by the CLIP text tower loaded from the checkpoint; scores of the right shape."""
    clip = ContentEmbeddingConfig(model=f"local-dir:{tiny_clip_dir}")
    names = ["obama", "starry_night", "zidane", "basketball1"]
    batch = batch_of({k: real_images[k] for k in names}, not_pending={"ended": "too_small"})
    out = run_steps_locally(batch, [ContentEmbedding(clip), ContentArtistic(ContentArtisticConfig(), clip)])
    scores = out.column("artistic_score").to_pylist()
    labels = out.column("artistic_label").to_pylist()
    assert all(0.0 <= s <= 1.0 for s in scores[:4]) and scores[4] is None
    classes = set(ContentArtisticConfig().natural_prompts) | set(ContentArtisticConfig().non_natural_prompts)
    assert set(labels[:4]) <= classes and labels[4] is None
    # a random model decides nothing meaningful; the reasons are exactly those its scores imply
    assert out.column("reason").to_pylist()[:4] == [ARTISTIC if s >= 0.5 else None for s in scores[:4]]
