"""Semantic segmentation metrics from a confusion matrix: mIoU, mAcc, aAcc (mmseg definitions).

A class absent from both ground truth and prediction has no IoU (NaN, left out of the mean);
a class absent from the ground truth has no accuracy. Pixels labelled ``ignore_index`` are
not counted.
"""

from __future__ import annotations

import numpy as np


def confusion_matrix(pred: np.ndarray, gt: np.ndarray, num_classes: int, ignore_index: int = 255) -> np.ndarray:
    """(num_classes, num_classes) counts, rows = ground truth, columns = prediction."""
    pred, gt = np.asarray(pred).ravel(), np.asarray(gt).ravel()
    if pred.shape != gt.shape:
        raise ValueError(f"prediction and ground truth differ in size: {pred.shape} vs {gt.shape}")
    keep = gt != ignore_index
    pred, gt = pred[keep].astype(np.int64), gt[keep].astype(np.int64)
    if gt.size and (gt.min() < 0 or gt.max() >= num_classes):
        raise ValueError(
            f"ground-truth labels outside [0, {num_classes}) (and not ignore_index={ignore_index}): "
            f"{sorted(set(np.unique(gt).tolist()) - set(range(num_classes)))}"
        )
    return np.bincount(gt * num_classes + pred, minlength=num_classes**2).reshape(num_classes, num_classes)


def segmentation_metrics(conf: np.ndarray, class_names: list[str] | None = None) -> dict[str, float]:
    """mIoU, mAcc, aAcc (fractions in [0, 1]) and per-class IoU (``iou.<name>``) of a confusion matrix."""
    conf = conf.astype(np.float64)
    inter = np.diag(conf)
    gt_count, pred_count = conf.sum(axis=1), conf.sum(axis=0)
    union = gt_count + pred_count - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, inter / union, np.nan)
        acc = np.where(gt_count > 0, inter / gt_count, np.nan)
    total = conf.sum()
    out = {
        "mIoU": float(np.nanmean(iou)) if np.isfinite(iou).any() else 0.0,
        "mAcc": float(np.nanmean(acc)) if np.isfinite(acc).any() else 0.0,
        "aAcc": float(inter.sum() / total) if total else 0.0,
    }
    names = class_names or [str(i) for i in range(len(iou))]
    out.update({f"iou.{n}": float(v) for n, v in zip(names, iou) if np.isfinite(v)})
    return out
