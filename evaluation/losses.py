"""Probe losses, one per task, as in Sapiens/Sapiens2 (SPEC section 4).

- pose: MSE between predicted and UDP Gaussian heatmaps, weighted per keypoint.
- seg: class-weighted cross-entropy plus soft Dice over the valid pixels.
- pointmap: the head predicts scale-normalised points ``xyz`` and one ``scale`` per image
  (points = xyz * scale). Target scale = mean valid depth; loss = L1(xyz, gt / scale_gt)
  + |log scale - log scale_gt|.
- normal: (1 - cosine) + L1 on the valid pixels.
- depth (Sapiens v1 fine-tuning): scale-invariant log loss on the human pixels with target >
  eps (the target is the per-image relative depth, ``evaluation.depth``), per image
  sqrt(mean(d^2) - 0.5 * mean(d)^2) with d = log(gt) - log(pred), averaged over the batch.
- albedo: L1 plus mean-aligned L1 (the prediction shifted so its per-image, per-channel
  mean over the valid pixels equals the target's): the aligned term weighs structure, the
  plain term keeps the absolute level that MAE/PSNR measure.

Shapes: B batch, K keypoints, C classes, H x W pixels; masks (B, H, W) bool.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from evaluation.depth import DEPTH_EPS


def heatmap_loss(pred_BKhw: torch.Tensor, target_BKhw: torch.Tensor, weight_BK: torch.Tensor) -> torch.Tensor:
    se = (pred_BKhw - target_BKhw) ** 2 * weight_BK[..., None, None]
    return se.mean()


def segmentation_loss(
    logits_BCHW: torch.Tensor,
    labels_BHW: torch.Tensor,
    *,
    class_weights: torch.Tensor | None,
    dice_weight: float,
    ignore_index: int,
) -> torch.Tensor:
    if logits_BCHW.shape[-2:] != labels_BHW.shape[-2:]:
        logits_BCHW = F.interpolate(logits_BCHW, size=labels_BHW.shape[-2:], mode="bilinear", align_corners=False)
    ce = F.cross_entropy(logits_BCHW, labels_BHW, weight=class_weights, ignore_index=ignore_index)
    if dice_weight == 0:
        return ce
    valid = (labels_BHW != ignore_index)[:, None]
    probs = logits_BCHW.softmax(dim=1) * valid
    onehot = F.one_hot(labels_BHW.clamp(0, logits_BCHW.shape[1] - 1), logits_BCHW.shape[1]).permute(0, 3, 1, 2) * valid
    inter = (probs * onehot).sum(dim=(0, 2, 3))
    denom = probs.sum(dim=(0, 2, 3)) + onehot.sum(dim=(0, 2, 3))
    present = onehot.sum(dim=(0, 2, 3)) > 0
    dice = 1 - (2 * inter + 1) / (denom + 1)
    return ce + dice_weight * dice[present].mean()


def _masked_mean(x_BCHW: torch.Tensor, mask_BHW: torch.Tensor) -> torch.Tensor:
    m = mask_BHW[:, None].to(x_BCHW.dtype)
    return (x_BCHW * m).sum() / (m.sum() * x_BCHW.shape[1]).clamp_min(1)


def depth_scale(points_B3HW: torch.Tensor, mask_BHW: torch.Tensor) -> torch.Tensor:
    """(B,) mean depth (Z) over the valid pixels: the pointmap's per-image scale."""
    m = mask_BHW.to(points_B3HW.dtype)
    return ((points_B3HW[:, 2] * m).sum(dim=(1, 2)) / m.sum(dim=(1, 2)).clamp_min(1)).clamp_min(1e-6)


def pointmap_loss(
    xyz_B3HW: torch.Tensor, scale_B1: torch.Tensor, gt_B3HW: torch.Tensor, mask_BHW: torch.Tensor
) -> torch.Tensor:
    s_gt = depth_scale(gt_B3HW, mask_BHW)
    norm_gt = gt_B3HW / s_gt[:, None, None, None]
    return _masked_mean((xyz_B3HW - norm_gt).abs(), mask_BHW) + (scale_B1[:, 0].log() - s_gt.log()).abs().mean()


def normal_loss(pred_B3HW: torch.Tensor, gt_B3HW: torch.Tensor, mask_BHW: torch.Tensor) -> torch.Tensor:
    cos = F.cosine_similarity(pred_B3HW, gt_B3HW, dim=1, eps=1e-6)
    m = mask_BHW.to(cos.dtype)
    return ((1 - cos) * m).sum() / m.sum().clamp_min(1) + _masked_mean((pred_B3HW - gt_B3HW).abs(), mask_BHW)


def albedo_loss(pred_B3HW: torch.Tensor, gt_B3HW: torch.Tensor, mask_BHW: torch.Tensor) -> torch.Tensor:
    m = mask_BHW[:, None].to(pred_B3HW.dtype)
    count = m.sum(dim=(2, 3), keepdim=True).clamp_min(1)
    shift = ((gt_B3HW - pred_B3HW) * m).sum(dim=(2, 3), keepdim=True) / count
    aligned = _masked_mean((pred_B3HW + shift - gt_B3HW).abs(), mask_BHW)
    return aligned + _masked_mean((pred_B3HW - gt_B3HW).abs(), mask_BHW)


def silog_loss(
    pred_B1HW: torch.Tensor, gt_B1HW: torch.Tensor, mask_BHW: torch.Tensor, eps: float = DEPTH_EPS
) -> torch.Tensor:
    valid = (mask_BHW & (gt_B1HW[:, 0] > eps)).to(pred_B1HW.dtype)
    d = (gt_B1HW[:, 0].clamp_min(eps).log() - pred_B1HW[:, 0].clamp_min(eps).log()) * valid
    n = valid.sum(dim=(1, 2)).clamp_min(1)
    mean, mean_sq = d.sum(dim=(1, 2)) / n, (d**2).sum(dim=(1, 2)) / n
    return (mean_sq - 0.5 * mean**2).clamp_min(1e-12).sqrt()[valid.sum(dim=(1, 2)) > 0].sum() / valid.shape[0]
