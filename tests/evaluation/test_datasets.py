"""Probe data sets: the formats they read, what they give, and the exact error for each
kind of malformed input."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from PIL import Image

from evaluation.coco_keypoints import load_coco_keypoints
from evaluation.datasets import (
    CocoKeypointDataset,
    DenseMapDataset,
    LabeledImageDataset,
    SegmentationDataset,
)
from evaluation.io import read_float_map
from evaluation.metrics.pose import COCO17_SIGMAS, WHOLEBODY133_SIGMAS

HW = (64, 48)


def _image(path, hw=(80, 60), value=100):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((*hw, 3), value, np.uint8)).save(path)
    return path


def _coco(K=17, **ann_changes):
    kps = []
    for i in range(K):
        kps += [20.0 + i % 5, 20.0 + i, 2]
    ann = {"id": 7, "image_id": 1, "category_id": 1, "bbox": [15.0, 15.0, 20.0, 40.0], "keypoints": kps}
    ann.update(ann_changes)
    return {
        "images": [{"id": 1, "file_name": "a.png", "height": 80, "width": 60}],
        "annotations": [ann, dict(ann, id=8, iscrowd=1), dict(ann, id=9, keypoints=[0] * (3 * K), num_keypoints=0)],
        "categories": [
            {"id": 1, "name": "person", "keypoints": [f"k{i}" for i in range(K)], "skeleton": [[1, 2], [2, 3]]}
        ],
    }


def _write_json(path, data):
    path.write_text(json.dumps(data))
    return path


# ---------------------------------------------------------------- COCO keypoints


def test_coco_file_is_read_and_completed(tmp_path):
    coco = load_coco_keypoints(_write_json(tmp_path / "k.json", _coco()))
    ann = coco.gt["annotations"][0]
    assert coco.num_keypoints == 17 and coco.skeleton == [(0, 1), (1, 2)]
    assert ann["area"] == 800.0 and ann["num_keypoints"] == 17 and ann["iscrowd"] == 0  # filled in
    np.testing.assert_array_equal(coco.sigmas, COCO17_SIGMAS)


def test_sigmas_by_keypoint_count_config_or_file(tmp_path):
    assert np.array_equal(
        load_coco_keypoints(_write_json(tmp_path / "w.json", _coco(K=133))).sigmas, WHOLEBODY133_SIGMAS
    )
    with pytest.raises(ValueError, match="5 keypoints has no standard OKS sigmas; set pose.sigmas"):
        load_coco_keypoints(_write_json(tmp_path / "five.json", _coco(K=5)))
    assert load_coco_keypoints(tmp_path / "five.json", sigmas=[0.1] * 5).sigmas.tolist() == [0.1] * 5
    data = _coco(K=5)
    data["categories"][0]["sigmas"] = [0.05] * 5
    assert load_coco_keypoints(_write_json(tmp_path / "own.json", data)).sigmas.tolist() == [0.05] * 5
    with pytest.raises(ValueError, match="sigmas must be 5 positive numbers, got 4"):
        load_coco_keypoints(tmp_path / "five.json", sigmas=[0.1] * 4)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"keypoints": [1.0, 2.0, 2]}, "annotation 7: 'keypoints' must be 51 numbers"),
        ({"keypoints": [10.0, 10.0, 3] * 17}, "annotation 7: keypoint visibility must be 0, 1 or 2"),
        ({"bbox": [0, 0, 0, 10]}, r"annotation 7: 'bbox' must be \[x, y, w, h\] with w, h > 0"),
        ({"bbox": None}, r"annotation 7: 'bbox' must be"),
        ({"image_id": 99}, "annotation 7: 'image_id' missing or not among the images"),
    ],
)
def test_malformed_annotations_name_the_annotation(tmp_path, change, message):
    data = _coco(**change)
    data["annotations"] = data["annotations"][:1]
    with pytest.raises(ValueError, match=message):
        load_coco_keypoints(_write_json(tmp_path / "bad.json", data))


def test_malformed_files(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read COCO keypoint file"):
        load_coco_keypoints(tmp_path / "x.json")
    with pytest.raises(ValueError, match="needs top-level lists 'images', 'annotations' and 'categories'"):
        load_coco_keypoints(_write_json(tmp_path / "y.json", {"images": []}))
    data = _coco()
    data["categories"][0].pop("keypoints")
    with pytest.raises(ValueError, match="exactly one category with a 'keypoints' list, found 0"):
        load_coco_keypoints(_write_json(tmp_path / "z.json", data))
    data = _coco()
    data["categories"][0]["skeleton"] = [[1, 18]]
    with pytest.raises(ValueError, match=r"skeleton entry \[1, 18\]"):
        load_coco_keypoints(_write_json(tmp_path / "s.json", data))
    data = _coco()
    data["annotations"][1]["id"] = 7
    with pytest.raises(ValueError, match="annotation ids are not unique"):
        load_coco_keypoints(_write_json(tmp_path / "d.json", data))


def test_top_down_crops_and_targets(tmp_path):
    _image(tmp_path / "img" / "a.png")
    ds = CocoKeypointDataset(
        tmp_path / "img", _write_json(tmp_path / "k.json", _coco()), image_size=HW, heatmap_sigma=1.0
    )
    assert len(ds) == 1  # the crowd and the unlabelled person are not pose instances
    item = ds[0]
    assert item["image"].shape == (3, *HW) and item["heatmaps"].shape == (17, 16, 12)
    assert item["weights"].tolist() == [1.0] * 17
    # The heatmap peak of keypoint 0 sits where the crop transform puts it (UDP scale).
    from evaluation.heatmaps import apply_affine

    x, y = apply_affine(item["affine"].numpy(), np.array([[20.0, 20.0]]))[0] * [11 / 47, 15 / 63]
    peak = np.unravel_index(item["heatmaps"][0].argmax().item(), (16, 12))
    assert peak == (round(y), round(x))
    ds.with_image = False
    assert "image" not in ds[0] and torch.equal(ds[0]["heatmaps"], item["heatmaps"])


def test_detector_boxes_replace_ground_truth_boxes(tmp_path):
    _image(tmp_path / "img" / "a.png")
    boxes = _write_json(
        tmp_path / "dets.json",
        [
            {"image_id": 1, "category_id": 1, "bbox": [10, 10, 30, 50], "score": 0.9},
            {"image_id": 1, "category_id": 1, "bbox": [0, 0, 5, 5], "score": 0.2},
        ],
    )
    ds = CocoKeypointDataset(
        tmp_path / "img",
        _write_json(tmp_path / "k.json", _coco()),
        image_size=HW,
        person_boxes=boxes,
        box_score_threshold=0.5,
    )
    assert len(ds) == 1 and ds.instances[0].score == 0.9 and ds[0]["weights"].sum() == 0
    with pytest.raises(ValueError, match="entry 0: needs an 'image_id' of the annotation file"):
        CocoKeypointDataset(
            tmp_path / "img",
            tmp_path / "k.json",
            image_size=HW,
            person_boxes=_write_json(tmp_path / "bad.json", [{"image_id": 5, "bbox": [0, 0, 1, 1]}]),
        )


# ---------------------------------------------------------------- segmentation masks


def _seg_set(root, masks: dict):
    for stem, mask in masks.items():
        _image(root / "images" / f"{stem}.png", hw=mask.shape)
        (root / "masks").mkdir(parents=True, exist_ok=True)
        Image.fromarray(mask).save(root / "masks" / f"{stem}.png")


def test_png_class_masks(tmp_path):
    mask = np.zeros((32, 24), np.uint8)
    mask[:16] = 2
    mask[0, 0] = 255
    _seg_set(tmp_path, {"a": mask})
    ds = SegmentationDataset(tmp_path / "images", tmp_path / "masks", image_size=HW, num_classes=3)
    labels = ds[0]["labels"]
    assert labels.shape == HW and labels.dtype == torch.int64
    assert set(labels.unique().tolist()) == {0, 2, 255}  # nearest-neighbour resize keeps indices
    # 16 x 24 pixels of class 2 less the ignored one, 16 x 24 of class 0
    np.testing.assert_allclose(ds.class_frequencies(), [384 / 767, 0, 383 / 767])


def test_segmentation_errors(tmp_path):
    _seg_set(tmp_path, {"a": np.full((8, 8), 5, np.uint8)})
    ds = SegmentationDataset(tmp_path / "images", tmp_path / "masks", image_size=HW, num_classes=3)
    with pytest.raises(ValueError, match=r"a.png: class indices \[5\] outside 0..2"):
        ds[0]
    _image(tmp_path / "images" / "b.png")
    with pytest.raises(ValueError, match=r"1 image\(s\) in .* have no PNG mask in .*e.g. \['b'\]"):
        SegmentationDataset(tmp_path / "images", tmp_path / "masks", image_size=HW, num_classes=3)
    rgb = tmp_path / "rgb"
    _seg_set(rgb, {"c": np.zeros((8, 8), np.uint8)})
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(rgb / "masks" / "c.png")
    with pytest.raises(ValueError, match="mode RGB: a class-index mask must be single-channel"):
        SegmentationDataset(rgb / "images", rgb / "masks", image_size=HW, num_classes=3)[0]
    odd = tmp_path / "odd"
    _seg_set(odd, {"d": np.zeros((8, 8), np.uint8)})
    _image(odd / "images" / "d.png", hw=(9, 8))
    with pytest.raises(ValueError, match=r"d.png is 8x9 but its label .* is 8x8"):
        SegmentationDataset(odd / "images", odd / "masks", image_size=HW, num_classes=3)[0]


# ---------------------------------------------------------------- float maps


def _dense_set(root, target, mask=None, suffix=".npy"):
    _image(root / "images" / "a.png", hw=target.shape[:2])
    (root / "maps").mkdir(parents=True, exist_ok=True)
    np.save(root / "maps" / "a.npy", target) if suffix == ".npy" else (root / "maps" / f"a{suffix}").write_bytes(b"x")
    if mask is not None:
        (root / "masks").mkdir(exist_ok=True)
        Image.fromarray(mask.astype(np.uint8) * 255).save(root / "masks" / "a.png")


def test_float_maps_with_masks_nan_and_zero_normals(tmp_path):
    target = np.zeros((64, 48, 3), np.float32)
    target[..., 2] = -1.0
    target[0, 0] = np.nan  # not finite: invalid
    target[0, 1] = 0.0  # zero-length normal: invalid
    mask = np.ones((64, 48), bool)
    mask[10:, :] = False  # outside the mask file: invalid
    _dense_set(tmp_path, target, mask)
    item = DenseMapDataset(tmp_path / "images", tmp_path / "maps", tmp_path / "masks", image_size=HW, kind="normal")[0]
    assert item["target"].shape == (3, *HW) and item["mask"].shape == HW
    assert int(item["mask"].sum()) == 10 * 48 - 2
    assert not torch.isnan(item["target"]).any()  # invalid pixels are zero-filled
    no_masks = DenseMapDataset(tmp_path / "images", tmp_path / "maps", image_size=HW, kind="albedo")[0]
    assert int(no_masks["mask"].sum()) == 64 * 48 - 1  # only the NaN pixel (albedo: zero is a colour)


def test_depth_is_the_relative_depth_of_the_person_from_a_depth_map_or_a_pointmap(tmp_path):
    z = np.linspace(2.0, 4.0, 64 * 48, dtype=np.float32).reshape(64, 48)  # grows down the image
    z[0, 0] = np.nan
    mask = np.zeros((64, 48), bool)
    mask[:32] = True  # the person: the top half (z 2 .. ~3)
    _dense_set(tmp_path / "map", z[..., None], mask)
    points = np.stack([np.zeros_like(z), np.zeros_like(z), z], axis=2)
    _dense_set(tmp_path / "points", points, mask)
    items = [
        DenseMapDataset(
            tmp_path / d / "images", tmp_path / d / "maps", tmp_path / d / "masks", image_size=HW, kind="depth"
        )[0]
        for d in ("map", "points")
    ]
    assert torch.equal(items[0]["target"], items[1]["target"]) and torch.equal(items[0]["mask"], items[1]["mask"])
    t, m = items[0]["target"][0].numpy(), items[0]["mask"].numpy()
    assert t.shape == HW and (t[32:] == -1).all() and t[0, 0] == -1  # background and NaN: -1
    fg = z[:32].copy()
    fg[0, 0] = np.nan
    expect = (fg - np.nanmin(fg)) / (np.nanmax(fg) - np.nanmin(fg))
    np.testing.assert_allclose(t[:32][~np.isnan(fg)], expect[~np.isnan(fg)], atol=1e-6)
    assert t[0, 1] == 0.0 and t[31, 47] == 1.0  # nearest 0, farthest 1
    assert m.sum() == 32 * 48 - 2 and not m[0, 0] and not m[0, 1]  # counted: valid and > eps


def test_float_map_errors(tmp_path):
    _dense_set(tmp_path / "one", np.zeros((8, 8), np.float32))
    with pytest.raises(ValueError, match="a normal map needs 3 channels, got 1"):
        DenseMapDataset(tmp_path / "one" / "images", tmp_path / "one" / "maps", image_size=HW, kind="normal")[0]
    _dense_set(tmp_path / "exr", np.zeros((8, 8, 3), np.float32), suffix=".exr")
    ds = DenseMapDataset(tmp_path / "exr" / "images", tmp_path / "exr" / "maps", image_size=HW, kind="normal")
    with pytest.raises(ValueError, match="no OpenEXR support .* convert the maps to .npy"):
        ds[0]
    np.save(tmp_path / "int.npy", np.zeros((4, 4, 3), np.int32))
    with pytest.raises(ValueError, match="expected an H x W x C float map"):
        read_float_map(tmp_path / "int.npy")
    _dense_set(tmp_path / "pfm", np.zeros((8, 8, 3), np.float32), suffix=".pfm")
    with pytest.raises(ValueError, match="have no normal map in"):
        DenseMapDataset(tmp_path / "pfm" / "images", tmp_path / "pfm" / "maps", image_size=HW, kind="normal")


# ---------------------------------------------------------------- k-NN labels


def test_class_folders_and_csv_labels(tmp_path):
    for cls, n in (("cat", 2), ("dog", 1)):
        for i in range(n):
            _image(tmp_path / "folders" / cls / f"{i}.png")
    ds = LabeledImageDataset(tmp_path / "folders", image_size=HW)
    assert ds.classes == ["cat", "dog"] and [label for _, label in ds.items] == [0, 0, 1]
    assert ds[2]["image"].shape == (3, *HW) and ds[2]["label"] == 1
    csv = tmp_path / "labels.csv"
    csv.write_text("path,label\ncat/0.png,dog\ndog/0.png,cat\n")
    by_csv = LabeledImageDataset(tmp_path / "folders", csv, image_size=HW, classes=ds.classes)
    assert [label for _, label in by_csv.items] == [1, 0]


@pytest.mark.parametrize(
    "text, message",
    [
        ("file,label\na.png,x\n", "needs a header with 'path' and 'label' columns"),
        ("path,label\nmissing.png,x\n", r"line 2: image .*missing.png does not exist"),
        ("path,label\na.png,\n", "line 2: empty path or label"),
        ("path,label\na.png,zebra\n", r"labels \['zebra'\] .* are not among the training classes"),
    ],
)
def test_label_csv_errors(tmp_path, text, message):
    _image(tmp_path / "a.png")
    (tmp_path / "l.csv").write_text(text)
    with pytest.raises(ValueError, match=message):
        LabeledImageDataset(tmp_path, tmp_path / "l.csv", image_size=HW, classes=["x"])


def test_coco_copy_is_not_mutated(tmp_path):
    data = _coco()
    before = copy.deepcopy(data)
    load_coco_keypoints(_write_json(tmp_path / "k.json", data))
    assert data == before
