"""Probe metrics: pose (OKS, pycocotools AP/AR), segmentation (mIoU/mAcc), dense maps
(pointmap L2/RMSE, normal angles, albedo MAE/PSNR, depth RMSE/AbsRel/delta1) and k-NN top-1."""

from evaluation.metrics.dense import AlbedoMetrics, DepthMetrics, NormalMetrics, PointmapMetrics, angular_error_deg
from evaluation.metrics.knn import knn_predict, knn_top1
from evaluation.metrics.pose import COCO17_SIGMAS, KNOWN_SIGMAS, WHOLEBODY133_SIGMAS, coco_keypoint_ap, oks
from evaluation.metrics.segmentation import confusion_matrix, segmentation_metrics

__all__ = [
    "COCO17_SIGMAS",
    "KNOWN_SIGMAS",
    "WHOLEBODY133_SIGMAS",
    "AlbedoMetrics",
    "DepthMetrics",
    "NormalMetrics",
    "PointmapMetrics",
    "angular_error_deg",
    "coco_keypoint_ap",
    "confusion_matrix",
    "knn_predict",
    "knn_top1",
    "oks",
    "segmentation_metrics",
]
