"""The vocabulary files: consistent with themselves, with the reference facts, and shipped in the wheel."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile

import pytest

from models.vocab import common_keypoints, keypoint_vocab, keypoint_vocab_for, list_vocabs, seg_vocab
from tests.conftest import REPO

REFERENCE = REPO.parent / "shared" / "reference" / "sapiens1_reference.json"


@pytest.mark.parametrize("name", list_vocabs("keypoints"))
def test_keypoint_vocab_is_consistent(name):
    v = keypoint_vocab(name)
    K = v.num_keypoints
    assert len(set(v.keypoint_names)) == K and len(v.sigmas) == len(v.flip_indices) == K
    assert sorted(v.flip_indices) == list(range(K))
    assert all(v.flip_indices[v.flip_indices[i]] == i for i in range(K))  # flipping twice is the identity
    for i, j in enumerate(v.flip_indices):  # a left keypoint's mirror is its right one
        if "left" in v.keypoint_names[i]:
            assert v.keypoint_names[j] == v.keypoint_names[i].replace("left", "right")
    assert all(0 <= a < K and 0 <= b < K for a, b in v.skeleton) and all(s > 0 for s in v.sigmas)


def test_vocabs_equal_the_reference_facts():
    ref = json.loads(REFERENCE.read_text())
    for name, key in (("coco_17", "coco"), ("coco_wholebody_133", "coco_wholebody"), ("goliath_308", "goliath")):
        v, k = keypoint_vocab(name), ref["keypoints"][key]
        assert list(v.keypoint_names) == k["keypoint_names"] and list(v.sigmas) == k["sigmas"]
        assert list(v.flip_indices) == k["flip_indices"] and [list(p) for p in v.skeleton] == k["skeleton_links"]
    assert list(seg_vocab("seg_goliath_28").classes) == ref["seg_classes"]["goliath_28"]["classes"]
    assert list(seg_vocab("seg_lip_20").classes) == ref["seg_classes"]["lip_20"]["classes"]
    assert [keypoint_vocab_for(k).name for k in (17, 133, 308)] == ["coco_17", "coco_wholebody_133", "goliath_308"]
    assert [seg_vocab(n).num_classes for n in ("seg_goliath_28", "seg_cihp_20", "seg_sapiens2_29")] == [28, 20, 29]


def test_segmentation_flip_map_swaps_left_and_right():
    for name in list_vocabs("segmentation"):
        v = seg_vocab(name)
        m = v.flip_map()
        assert [m[c] for c in m] == list(range(v.num_classes))
        for a, b in v.flip_pairs:
            assert v.classes[a].lower().replace("left", "right") == v.classes[b].lower()


def test_common_keypoints_308_to_133_pair_the_same_body_parts():
    g, w = keypoint_vocab("goliath_308"), keypoint_vocab("coco_wholebody_133")
    pairs = common_keypoints(g, w)
    assert len({a for a, _ in pairs}) == len(pairs) == len({b for _, b in pairs}) >= 63
    by_name = {w.keypoint_names[b]: g.keypoint_names[a] for a, b in pairs}
    assert by_name["left_wrist"] == "left_wrist" and by_name["right_thumb1"] == "right_thumb_third_joint"
    assert common_keypoints(w, g) == tuple((b, a) for a, b in pairs)
    with pytest.raises(ValueError, match="unknown vocabulary 'coco_18'"):
        keypoint_vocab("coco_18")


@pytest.mark.slow
def test_wheel_ships_the_vocabulary_files(tmp_path):
    src = tmp_path / "src"  # a copy: building in the repo would leave build/ and egg-info there
    for name in ("curation", "models", "training", "evaluation", "infra", "pipelines"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    names = zipfile.ZipFile(next((tmp_path / "dist").glob("humanvision-*.whl"))).namelist()
    assert {f"models/vocab/{n}.json" for n in list_vocabs()} <= set(names)
