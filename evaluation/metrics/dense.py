"""Dense regression metrics, accumulated over batches on the valid (masked) pixels.

- Pointmap: ``l2`` = mean per-pixel Euclidean distance between predicted and true 3-D points,
  ``rmse`` = sqrt of the mean squared distance (units of the ground truth, e.g. metres).
- Normal: angular error in degrees; ``mean``, ``median`` and the % of pixels within 11.25,
  22.5 and 30 degrees. The median comes from a 0.01-degree histogram (exact to 0.005 deg)
  so memory does not grow with the data set; for an even count it averages the two middle
  values, as ``np.median`` does.
- Albedo: ``mae`` over all valid pixels and channels (pooled), ``psnr`` per image with a
  data range of 1, averaged over images; predictions are clipped to [0, 1] first.
- Depth (Sapiens v1): ``rmse``, ``abs_rel`` and ``delta1`` on the relative depth target.

Shapes: maps are (B, 3, H, W) arrays, masks (B, H, W) bool.
"""

from __future__ import annotations

import numpy as np

from evaluation.depth import DEPTH_EPS

NORMAL_THRESHOLDS = (11.25, 22.5, 30.0)
_HIST_BINS = 18000  # 0.01 degree over [0, 180]


def _check(pred: np.ndarray, gt: np.ndarray, mask: np.ndarray) -> None:
    if pred.shape != gt.shape or pred.ndim != 4 or mask.shape != (gt.shape[0], *gt.shape[2:]):
        raise ValueError(
            f"expected pred/gt (B, C, H, W) and mask (B, H, W); got {pred.shape}, {gt.shape}, {mask.shape}"
        )


class PointmapMetrics:
    def __init__(self) -> None:
        self.dist_sum = self.sq_sum = 0.0
        self.count = 0

    def update(self, pred_B3HW: np.ndarray, gt_B3HW: np.ndarray, mask_BHW: np.ndarray) -> None:
        _check(pred_B3HW, gt_B3HW, mask_BHW)
        d2 = ((pred_B3HW.astype(np.float64) - gt_B3HW) ** 2).sum(axis=1)[mask_BHW]
        self.dist_sum += float(np.sqrt(d2).sum())
        self.sq_sum += float(d2.sum())
        self.count += int(d2.size)

    def compute(self) -> dict[str, float]:
        if not self.count:
            raise ValueError("no valid pointmap pixels were evaluated")
        return {"l2": self.dist_sum / self.count, "rmse": float(np.sqrt(self.sq_sum / self.count))}


def angular_error_deg(pred_B3HW: np.ndarray, gt_B3HW: np.ndarray) -> np.ndarray:
    """(B, H, W) angle between the vectors in degrees (inputs need not be unit length)."""
    p = pred_B3HW / np.maximum(np.linalg.norm(pred_B3HW, axis=1, keepdims=True), 1e-12)
    g = gt_B3HW / np.maximum(np.linalg.norm(gt_B3HW, axis=1, keepdims=True), 1e-12)
    return np.degrees(np.arccos(np.clip((p * g).sum(axis=1), -1.0, 1.0)))


class NormalMetrics:
    def __init__(self) -> None:
        self.hist = np.zeros(_HIST_BINS, dtype=np.int64)
        self.err_sum = 0.0
        self.within = np.zeros(len(NORMAL_THRESHOLDS), dtype=np.int64)
        self.count = 0

    def update(self, pred_B3HW: np.ndarray, gt_B3HW: np.ndarray, mask_BHW: np.ndarray) -> None:
        _check(pred_B3HW, gt_B3HW, mask_BHW)
        err = angular_error_deg(pred_B3HW.astype(np.float64), gt_B3HW.astype(np.float64))[mask_BHW]
        self.err_sum += float(err.sum())
        self.count += int(err.size)
        self.within += np.array([(err < t).sum() for t in NORMAL_THRESHOLDS])
        self.hist += np.bincount(np.minimum((err * 100).astype(np.int64), _HIST_BINS - 1), minlength=_HIST_BINS)

    def compute(self) -> dict[str, float]:
        if not self.count:
            raise ValueError("no valid normal pixels were evaluated")
        # The two middle order statistics (equal for an odd count), as np.median does.
        cdf = np.cumsum(self.hist)
        lo, hi = (int(np.searchsorted(cdf, k + 1)) for k in ((self.count - 1) // 2, self.count // 2))
        out = {"mean_angle": self.err_sum / self.count, "median_angle": (lo + hi + 1) / 200}
        for t, n in zip(NORMAL_THRESHOLDS, self.within):
            out[f"within_{t:g}"] = float(100.0 * n / self.count)
        return out


class AlbedoMetrics:
    def __init__(self) -> None:
        self.abs_sum = 0.0
        self.count = 0
        self.psnrs: list[float] = []

    def update(self, pred_B3HW: np.ndarray, gt_B3HW: np.ndarray, mask_BHW: np.ndarray) -> None:
        _check(pred_B3HW, gt_B3HW, mask_BHW)
        pred = np.clip(pred_B3HW.astype(np.float64), 0.0, 1.0)
        for p, g, m in zip(pred, gt_B3HW.astype(np.float64), mask_BHW):
            diff = (p - g)[:, m]  # (3, valid pixels)
            if not diff.size:
                continue
            self.abs_sum += float(np.abs(diff).sum())
            self.count += int(diff.size)
            mse = float((diff**2).mean())
            self.psnrs.append(10 * np.log10(1.0 / max(mse, 1e-10)))

    def compute(self) -> dict[str, float]:
        if not self.count:
            raise ValueError("no valid albedo pixels were evaluated")
        return {"mae": self.abs_sum / self.count, "psnr": float(np.mean(self.psnrs))}


class DepthMetrics:
    """Sapiens v1 depth metrics on the human pixels: ``rmse`` and ``abs_rel`` (mean
    |pred - gt| / gt) over all valid pixels, ``delta1`` = % of pixels with
    max(pred / gt, gt / pred) < 1.25. Maps are (B, 1, H, W), gt the reference's relative depth
    (``evaluation.depth``: [0, 1] on the person, -1 elsewhere); the pixels that count are the
    SiLog loss's: mask and gt > ``DEPTH_EPS``. Predictions are clamped to >= ``DEPTH_EPS``."""

    def __init__(self) -> None:
        self.sq_sum = self.rel_sum = 0.0
        self.within = self.count = 0

    def update(self, pred_B1HW: np.ndarray, gt_B1HW: np.ndarray, mask_BHW: np.ndarray) -> None:
        _check(pred_B1HW, gt_B1HW, mask_BHW)
        valid = mask_BHW & (gt_B1HW[:, 0] > DEPTH_EPS)
        pred = np.maximum(pred_B1HW[:, 0][valid].astype(np.float64), DEPTH_EPS)
        gt = gt_B1HW[:, 0][valid].astype(np.float64)
        self.sq_sum += float(((pred - gt) ** 2).sum())
        self.rel_sum += float((np.abs(pred - gt) / gt).sum())
        self.within += int((np.maximum(pred / gt, gt / pred) < 1.25).sum())
        self.count += int(gt.size)

    def compute(self) -> dict[str, float]:
        if not self.count:
            raise ValueError("no valid depth pixels were evaluated")
        return {
            "rmse": float(np.sqrt(self.sq_sum / self.count)),
            "abs_rel": self.rel_sum / self.count,
            "delta1": 100.0 * self.within / self.count,
        }
