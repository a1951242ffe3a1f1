"""The synthetic probe set: its labels agree with each other and with the analytic figure."""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from evaluation.synthetic import FOCAL_PX, PART_CLASSES, POSE_CATEGORIES, generate_synthetic_set, render_sample


def test_layout_and_formats(synthetic_root):
    meta = json.loads((synthetic_root / "meta.json").read_text())
    assert meta["part_classes"] == list(PART_CLASSES) and meta["train_images"] == 12
    for split, n in (("train", 12), ("val", 6)):
        base = synthetic_root / split
        assert len(list((base / "images").glob("*.png"))) == n
        for sub, suffix in (
            ("seg", ".png"),
            ("masks", ".png"),
            ("normal", ".npy"),
            ("albedo", ".npy"),
            ("pointmap", ".npy"),
        ):
            assert len(list((base / sub).glob(f"*{suffix}"))) == n
        coco = json.loads((base / "person_keypoints.json").read_text())
        assert len(coco["annotations"]) == n and len(coco["categories"][0]["keypoints"]) == 17
        rows = (base / "labels.csv").read_text().splitlines()
        assert (
            rows[0] == "path,label" and len(rows) == n + 1 and all(r.split(",")[1] in POSE_CATEGORIES for r in rows[1:])
        )


def test_labels_are_consistent():
    s = render_sample(np.random.default_rng([7, 0, 1]), (128, 96))
    mask, seg = s["mask"], s["seg"]
    assert np.array_equal(mask, seg > 0)
    n = s["normal"][mask]
    np.testing.assert_allclose(np.linalg.norm(n, axis=1), 1.0, atol=1e-5)
    assert (n[:, 2] <= 1e-6).all()  # every visible surface faces the camera (z forward)
    assert not s["normal"][~mask].any() and not s["albedo"][~mask].any()
    # Pointmap: a pinhole projection of itself (u = f X / Z + cx).
    ys, xs = np.nonzero(mask)
    X, Y, Z = s["pointmap"][mask].T
    assert (Z > 0).all()
    np.testing.assert_allclose(FOCAL_PX * X / Z + 47.5, xs, atol=1e-3)
    np.testing.assert_allclose(FOCAL_PX * Y / Z + 63.5, ys, atol=1e-3)
    # Keypoints sit on their parts, and the person's left is on the image's right.
    kp = np.round(s["keypoints"]).astype(int)
    part_at = lambda i: seg[kp[i, 1], kp[i, 0]]  # noqa: E731
    assert part_at(0) == PART_CLASSES.index("head")
    assert part_at(13) == PART_CLASSES.index("left_leg") and part_at(14) == PART_CLASSES.index("right_leg")
    assert s["keypoints"][5, 0] > s["keypoints"][6, 0]  # left shoulder right of right shoulder
    left_arm = np.nonzero(seg == PART_CLASSES.index("left_arm"))[1]
    right_arm = np.nonzero(seg == PART_CLASSES.index("right_arm"))[1]
    assert left_arm.mean() > right_arm.mean()


def test_generation_is_deterministic_and_skipped_when_complete(tmp_path, synthetic_root):
    again = generate_synthetic_set(tmp_path / "again", train_images=12, val_images=6, hw=(64, 48), seed=3)
    for rel in ("train/images/000004.png", "val/seg/000002.png"):
        assert np.array_equal(np.asarray(Image.open(again / rel)), np.asarray(Image.open(synthetic_root / rel)))
    assert np.array_equal(np.load(again / "val/normal/000001.npy"), np.load(synthetic_root / "val/normal/000001.npy"))
    stamp = (again / "train/images/000000.png").stat().st_mtime_ns
    generate_synthetic_set(tmp_path / "again", train_images=12, val_images=6, hw=(64, 48), seed=3)
    assert (again / "train/images/000000.png").stat().st_mtime_ns == stamp
