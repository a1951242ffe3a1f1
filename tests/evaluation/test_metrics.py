"""Every probe metric against values worked out by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from evaluation.metrics import (
    COCO17_SIGMAS,
    WHOLEBODY133_SIGMAS,
    AlbedoMetrics,
    NormalMetrics,
    PointmapMetrics,
    coco_keypoint_ap,
    confusion_matrix,
    knn_predict,
    knn_top1,
    oks,
    segmentation_metrics,
)

# ---------------------------------------------------------------- OKS and COCO keypoint AP


def test_oks_by_hand():
    # sigmas .1 .2 .3, area 100; keypoint 0 off by (3, 4): d^2 = 25, k = 0.2,
    # e = 25 / (2 * 0.2^2 * 100) = 3.125; keypoint 1 exact (e = 0); keypoint 2 unlabelled.
    gt = np.array([[10, 10, 2], [20, 20, 2], [30, 30, 0]], float)
    pred = np.array([[13, 14], [20, 20], [99, 99]], float)
    assert oks(gt, 100.0, pred, np.array([0.1, 0.2, 0.3])) == pytest.approx((math.exp(-3.125) + 1) / 2, abs=1e-12)
    assert (math.exp(-3.125) + 1) / 2 == pytest.approx(0.5219684668, abs=1e-9)


def test_standard_sigma_tables():
    assert len(COCO17_SIGMAS) == 17 and len(WHOLEBODY133_SIGMAS) == 133
    assert WHOLEBODY133_SIGMAS[:17] == COCO17_SIGMAS
    assert WHOLEBODY133_SIGMAS[17:23] == (0.068, 0.066, 0.066, 0.092, 0.094, 0.094)  # feet


AREA = 4000.0
SIGMAS = np.array(COCO17_SIGMAS)


def _person(cx: float, cy: float) -> np.ndarray:
    """17 labelled keypoints spread around (cx, cy)."""
    angles = np.linspace(0, 2 * np.pi, 17, endpoint=False)
    return np.stack([cx + 30 * np.cos(angles), cy + 40 * np.sin(angles), np.full(17, 2.0)], axis=1)


def _at_oks(gt: np.ndarray, target: float) -> np.ndarray:
    """Keypoints moved along x so that every term, hence the OKS, equals ``target``:
    d_i^2 = -2 ln(target) * area * (2 sigma_i)^2."""
    d = np.sqrt(-2 * math.log(target) * AREA * (2 * SIGMAS) ** 2)
    return gt[:, :2] + np.stack([d, np.zeros(17)], axis=1)


def _coco_set():
    gts = {1: _person(100, 100), 2: _person(300, 300), 3: _person(200, 200)}
    image_of = {1: 1, 2: 1, 3: 2}
    gt = {
        "images": [
            {"id": 1, "file_name": "a.png", "height": 400, "width": 400},
            {"id": 2, "file_name": "b.png", "height": 400, "width": 400},
        ],
        "annotations": [
            {
                "id": a,
                "image_id": image_of[a],
                "category_id": 1,
                "iscrowd": 0,
                "area": AREA,
                "num_keypoints": 17,
                "bbox": [k[:, 0].min(), k[:, 1].min(), 60, 80],
                "keypoints": k.ravel().tolist(),
            }
            for a, k in gts.items()
        ],
        "categories": [{"id": 1, "name": "person", "keypoints": [f"k{i}" for i in range(17)], "skeleton": []}],
    }
    return gt, gts


def _result(image_id: int, xy: np.ndarray, score: float) -> dict:
    return {
        "image_id": image_id,
        "category_id": 1,
        "score": score,
        "keypoints": np.concatenate([xy, np.ones((17, 1))], axis=1).ravel().tolist(),
    }


def test_oks_of_constructed_predictions():
    _, gts = _coco_set()
    for target in (0.78, 0.62):
        assert oks(gts[2], AREA, _at_oks(gts[2], target), SIGMAS) == pytest.approx(target, abs=1e-9)


def test_coco_keypoint_ap_matches_hand_computation():
    """Three people; detections in score order: a false positive (0.95), person 1 exact
    (OKS 1, 0.9), person 2 at OKS 0.78 (0.8), person 3 at OKS 0.62 (0.7).

    TP/FP sequence per OKS threshold t, with pycocotools' monotone precision envelope and
    101 recall points:
      t in .50 .55 .60      FP TP TP TP: recall 1/3 2/3 1, precision envelope 3/4     -> AP 0.75
      t in .65 .70 .75      FP TP TP FP: recall up to 2/3 (67 of 101 points) at 2/3   -> AP 134/303
      t in .80 ... .95 (4)  FP TP FP FP: recall up to 1/3 (34 points) at 1/2         -> AP 17/101
    AP = (3 * 0.75 + 3 * 134/303 + 4 * 17/101) / 10 = 0.425;
    AR = (3 * 1 + 3 * 2/3 + 4 * 1/3) / 10 = 19/30.
    """
    gt, gts = _coco_set()
    results = [
        _result(2, gts[3][:, :2] + 150, 0.95),  # far from everyone: OKS ~ 0
        _result(1, gts[1][:, :2], 0.9),
        _result(1, _at_oks(gts[2], 0.78), 0.8),
        _result(2, _at_oks(gts[3], 0.62), 0.7),
    ]
    stats = coco_keypoint_ap(gt, results, SIGMAS)
    assert stats["AP"] == pytest.approx(0.425, abs=1e-9)
    assert stats["AP50"] == pytest.approx(0.75, abs=1e-9)
    assert stats["AP75"] == pytest.approx(134 / 303, abs=1e-9)
    assert stats["AR"] == pytest.approx(19 / 30, abs=1e-9)
    assert stats["AR50"] == pytest.approx(1.0) and stats["AR75"] == pytest.approx(2 / 3)
    assert "APl" not in stats  # no large (> 96^2) people: pycocotools' -1 is left out


def test_coco_keypoint_ap_uses_the_given_sigmas():
    """Doubling every sigma turns OKS 0.62 into 0.62^(1/4) = 0.887 (e scales with 1/sigma^2),
    and 0.78 into 0.940: now every person is found up to t = 0.85."""
    gt, gts = _coco_set()
    results = [
        _result(1, gts[1][:, :2], 0.9),
        _result(1, _at_oks(gts[2], 0.78), 0.8),
        _result(2, _at_oks(gts[3], 0.62), 0.7),
    ]
    base = coco_keypoint_ap(gt, results, SIGMAS)
    wide = coco_keypoint_ap(gt, results, 2 * SIGMAS)
    # base: all 3 found for t <= .60 (3 thresholds), 2 for .65-.75, 1 for .80-.95 -> AR 19/30
    # wide: all found for t <= .85 (8 thresholds), 2 found (OKS .940) at .90, 1 at .95
    assert base["AR"] == pytest.approx(19 / 30)
    assert wide["AR"] == pytest.approx((8 + 2 / 3 + 1 / 3) / 10)


def test_no_detections_score_zero():
    gt, _ = _coco_set()
    assert coco_keypoint_ap(gt, [], SIGMAS)["AP"] == 0.0


# ---------------------------------------------------------------- segmentation


def test_miou_macc_by_hand():
    # valid pixels (255 ignored): gt 0 0 1 / 1 1 ; pred 0 1 1 / 1 0.
    # confusion rows=gt: class 0 -> [1, 1, 0], class 1 -> [1, 2, 0]; class 2 never occurs.
    # IoU0 = 1 / (2 + 2 - 1) = 1/3, IoU1 = 2 / (3 + 3 - 2) = 1/2 -> mIoU 5/12
    # Acc0 = 1/2, Acc1 = 2/3 -> mAcc 7/12; aAcc = 3/5.
    gt = np.array([[0, 0, 1], [1, 1, 255]])
    pred = np.array([[0, 1, 1], [1, 0, 0]])
    conf = confusion_matrix(pred, gt, num_classes=3)
    np.testing.assert_array_equal(conf, [[1, 1, 0], [1, 2, 0], [0, 0, 0]])
    m = segmentation_metrics(conf, ["bg", "arm", "leg"])
    assert m["mIoU"] == pytest.approx(5 / 12) and m["mAcc"] == pytest.approx(7 / 12) and m["aAcc"] == pytest.approx(0.6)
    assert m["iou.bg"] == pytest.approx(1 / 3) and m["iou.arm"] == pytest.approx(0.5) and "iou.leg" not in m


def test_confusion_matrix_rejects_labels_out_of_range():
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        confusion_matrix(np.zeros(2), np.array([0, 7]), num_classes=3)


# ---------------------------------------------------------------- dense maps


def test_pointmap_l2_and_rmse_by_hand():
    # pixel a off by (3, 4, 0) -> 5; pixel b off by (0, 0, 1) -> 1; pixel c invalid.
    # l2 = (5 + 1) / 2 = 3; rmse = sqrt((25 + 1) / 2) = sqrt(13).
    gt = np.zeros((1, 3, 1, 3))
    pred = gt.copy()
    pred[0, :, 0, 0] = [3, 4, 0]
    pred[0, :, 0, 1] = [0, 0, 1]
    pred[0, :, 0, 2] = [100, 100, 100]
    mask = np.array([[[True, True, False]]])
    m = PointmapMetrics()
    m.update(pred, gt, mask)
    assert m.compute() == pytest.approx({"l2": 3.0, "rmse": math.sqrt(13)})
    split = PointmapMetrics()  # accumulating over batches gives the same numbers
    split.update(pred[..., :1], gt[..., :1], mask[..., :1])
    split.update(pred[..., 1:], gt[..., 1:], mask[..., 1:])
    assert split.compute() == pytest.approx(m.compute())


def _normals_at(degrees: list[float]) -> np.ndarray:
    a = np.radians(degrees)
    return np.stack([np.sin(a), np.zeros_like(a), -np.cos(a)])[None, :, None, :]  # (1, 3, 1, N)


def test_normal_angles_by_hand():
    # errors 0, 10, 20, 45 degrees -> mean 18.75, median (10 + 20) / 2 = 15,
    # within 11.25: 2/4, within 22.5: 3/4, within 30: 3/4. The 90-degree pixel is masked out.
    gt = _normals_at([0, 0, 0, 0, 0])
    pred = _normals_at([0, 10, 20, 45, 90]) * 3.0  # length does not matter
    m = NormalMetrics()
    m.update(pred, gt, np.array([[[True, True, True, True, False]]]))
    out = m.compute()
    assert out["mean_angle"] == pytest.approx(18.75, abs=1e-6)
    assert out["median_angle"] == pytest.approx(15.0, abs=0.006)  # 0.01-degree histogram
    assert (out["within_11.25"], out["within_22.5"], out["within_30"]) == pytest.approx((50.0, 75.0, 75.0))


def test_normal_median_odd_count():
    m = NormalMetrics()
    m.update(_normals_at([5, 17, 60]), _normals_at([0, 0, 0]), np.ones((1, 1, 3), bool))
    assert m.compute()["median_angle"] == pytest.approx(17.0, abs=0.006)


def test_albedo_mae_psnr_by_hand():
    # image 1: two valid pixels, every channel off by 0.1 -> |.| sum 0.6, mse 0.01, PSNR 20 dB
    # image 2: one valid pixel, off by 0.2 -> |.| sum 0.6, mse 0.04, PSNR 10 log10(25) = 13.979 dB
    #          (its prediction 1.2 is clipped to 1.0 first: truth 0.8)
    # MAE = 1.2 / 9 pixel-channels; PSNR = mean of the two.
    gt = np.full((2, 3, 1, 2), 0.5)
    gt[1, :, 0, 0] = 0.8
    pred = gt + 0.1
    pred[1, :, 0, 0] = 1.2
    pred[1, :, 0, 1] = 9.0  # masked out
    mask = np.array([[[True, True]], [[True, False]]])
    m = AlbedoMetrics()
    m.update(pred, gt, mask)
    out = m.compute()
    assert out["mae"] == pytest.approx(1.2 / 9)
    assert out["psnr"] == pytest.approx((20.0 + 10 * math.log10(25)) / 2)


# ---------------------------------------------------------------- k-NN


def _unit(deg: list[float]) -> torch.Tensor:
    a = torch.tensor(deg, dtype=torch.float64).deg2rad()
    return torch.stack([a.cos(), a.sin()], dim=1)


def test_knn_temperature_weighted_vote_by_hand():
    # Training: class 0 at 0 deg; class 1 at 60 and 62 deg. Query at 5 deg, k = 3:
    # similarities cos 5 = 0.9962 (class 0), cos 55 = 0.5736, cos 57 = 0.5446 (class 1).
    # T = 0.07: class 0 weight e^(0.9962/0.07) = 1.5e6 > class 1 e^8.19 + e^7.78 = 6.0e3 -> class 0.
    # T = 10: weights ~ 1.10 vs 1.06 + 1.06 -> class 1 (the majority).
    train, labels = _unit([0, 60, 62]), torch.tensor([0, 1, 1])
    query = _unit([5])
    assert knn_predict(train, labels, query, k=3, temperature=0.07, num_classes=2).tolist() == [0]
    assert knn_predict(train, labels, query, k=3, temperature=10.0, num_classes=2).tolist() == [1]
    # scale does not matter (cosine similarity); k larger than the set is clipped
    assert knn_predict(5 * train, labels, query, k=10, temperature=0.07, num_classes=2).tolist() == [0]


def test_knn_top1_by_hand():
    train, labels = _unit([0, 10, 80, 90]), torch.tensor([0, 0, 1, 1])
    queries, truth = _unit([3, 85, 44, 50]), torch.tensor([0, 1, 1, 0])
    # k = 1: nearest of 3 -> 0 (right), 85 -> 80/90 (1, right), 44 -> 10 at 34 deg vs 80 at 36 -> 0 (wrong),
    # 50 -> 80 at 30 deg vs 10 at 40 -> 1 (wrong): top-1 = 2/4.
    assert knn_top1(train, labels, queries, truth, k=1, temperature=0.07, num_classes=2) == 0.5
