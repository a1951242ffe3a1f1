"""The Sapiens2 vocabularies (``goliath_308``, ``seg_sapiens2_29``) equal the reference facts
read off the Sapiens2 repository (``sapiens2_heads_reference.json`` ``vocab``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from models.task_models import TASK_MODELS
from models.vocab import keypoint_vocab, seg_vocab


@pytest.fixture(scope="module")
def reference() -> dict:
    repo = Path(__file__).resolve().parents[2]
    candidates = [os.environ.get("SAPIENS2_REFERENCE_DIR"), repo / "shared/reference", repo.parent / "shared/reference"]
    for c in candidates:
        if c and (Path(c) / "sapiens2_heads_reference.json").exists():
            return json.loads((Path(c) / "sapiens2_heads_reference.json").read_text())["vocab"]
    pytest.fail("sapiens2_heads_reference.json not found in shared/reference; set SAPIENS2_REFERENCE_DIR")


def test_goliath_308_equals_the_sapiens2_keypoints308(reference):
    ref, v = reference["keypoints308"], keypoint_vocab("goliath_308")
    assert list(v.keypoint_names) == ref["names"] and v.num_keypoints == ref["num_keypoints"] == 308
    assert list(v.flip_indices) == ref["flip_indices"]
    pairs = {tuple(sorted(p)) for p in ref["flip_pairs"]}
    assert {tuple(sorted((i, j))) for i, j in enumerate(v.flip_indices) if i != j} == pairs and len(pairs) == 146
    assert [i for i, j in enumerate(v.flip_indices) if i == j] == ref["self_symmetric"]
    assert [list(p) for p in v.skeleton] == ref["skeleton_links"]
    assert v.sigmas == pytest.approx(ref["sigmas"], rel=1e-6)  # the reference holds them as float32
    groups = {k: tuple(g["indices"]) for k, g in ref["groups"].items()}
    assert v.part_groups == groups
    assert [len(groups[k]) for k in ("body", "foot", "face", "left_hand", "right_hand", "extra")] == [
        17,
        6,
        238,
        20,
        20,
        7,
    ]
    data = json.loads((Path(__file__).resolve().parents[2] / "models/vocab/goliath_308.json").read_text())
    assert data["flip_pairs"] == ref["flip_pairs"] and data["joint_weights"] == ref["joint_weights"]


def test_seg_sapiens2_29_equals_the_sapiens2_seg29(reference):
    ref, v = reference["seg29"], seg_vocab("seg_sapiens2_29")
    assert list(v.classes) == ref["names"] and v.num_classes == 29
    assert [list(p) for p in v.flip_pairs] == ref["flip_swap_pairs"] and v.flip_map() == ref["flip_indices"]
    assert list(v.class_weights) == ref["class_weight"]
    v1 = seg_vocab("seg_goliath_28").classes  # v1's 28 with Eyeglass inserted at index 2
    assert v.classes == (*v1[:2], "Eyeglass", *v1[2:])


def test_released_heads_name_their_vocabularies():
    for size in ("0.4b", "0.8b", "1b", "5b", "tiny"):
        pose, seg = TASK_MODELS[f"sapiens2_{size}_pose"], TASK_MODELS[f"sapiens2_{size}_seg"]
        assert keypoint_vocab(pose.vocab).num_keypoints == pose.head.out_channels
        assert seg_vocab(seg.vocab).num_classes == seg.head.out_channels
