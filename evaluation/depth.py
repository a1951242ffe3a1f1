"""The Sapiens v1 depth target: relative depth of the person, per image.

The reference (``sapiens1_reference.json`` ``finetune.depth.target``; sapiens
``seg/mmseg/datasets/transforms/depth_transforms.py`` ``GenerateDepthTarget``) min-max
normalises the foreground depth of each image, ``(z - min) / (max - min)`` with min / max over
that image's foreground pixels, and sets the background to -1. Depth grows away from the
camera, so 0 is the nearest foreground pixel and 1 the farthest. The figure's distance is not
part of the task. The SiLog loss and the metrics count only pixels with target > ``DEPTH_EPS``,
so the nearest pixel(s) (target 0) never count, as in the reference.

A foreground of one depth (max == min) has no shape to learn: its target is 0 everywhere, so
no pixel of that image counts. (The reference leaves such an image's raw depth in place.)
"""

from __future__ import annotations

import numpy as np

DEPTH_EPS = 1e-6  # the reference SiLogLoss's eps: pixels with target <= eps do not count
BACKGROUND = -1.0


def relative_depth_target(depth_HW: np.ndarray, valid_HW: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(target, counted) for an (H, W) depth map and its (H, W) bool foreground mask.

    ``target`` (float32): ``(z - min) / (max - min)`` on the valid, finite pixels (min / max over
    them), -1 elsewhere. ``counted`` (bool): the pixels the loss and metrics use, valid and
    target > ``DEPTH_EPS``.
    """
    depth = np.asarray(depth_HW, dtype=np.float64)
    if depth.shape != valid_HW.shape:
        raise ValueError(f"depth map {depth.shape} and mask {valid_HW.shape} differ in shape")
    valid = valid_HW.astype(bool) & np.isfinite(depth)
    target = np.full(depth.shape, BACKGROUND, dtype=np.float64)
    if valid.any():
        z = depth[valid]
        lo, hi = z.min(), z.max()
        target[valid] = (z - lo) / (hi - lo) if hi > lo else 0.0
    target = target.astype(np.float32)
    return target, valid & (target > DEPTH_EPS)
