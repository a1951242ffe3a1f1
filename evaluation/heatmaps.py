"""Top-down pose geometry: person-box crops, UDP heatmap targets and their decoding.

Coordinates are in pixel-index convention (pixel ``i`` is centred on ``i``), the same for
``cv2.warpAffine``, COCO keypoints and the heatmaps. UDP (unbiased data processing): a
heatmap of size (h, w) for an input of (H, W) maps input ``x`` to ``x * (w - 1) / (W - 1)``,
so encoding and decoding are exact inverses. Decoding refines the arg-max with one Newton
step on the log heatmap (DARK), exact for a Gaussian peak.

Shapes: K keypoints, h x w heatmap.
"""

from __future__ import annotations

import numpy as np
import torch


def box_to_affine(box_xywh, out_hw: tuple[int, int], padding: float = 1.25) -> np.ndarray:
    """2x3 matrix from image to crop coordinates: the box grown by ``padding``, centred, is
    scaled to just fit the (H, W) crop (the crop's other side shows more context)."""
    x, y, w, h = (float(v) for v in box_xywh)
    H, W = out_hw
    cx, cy = x + w / 2, y + h / 2
    s = min((W - 1) / max(w * padding, 1e-6), (H - 1) / max(h * padding, 1e-6))
    return np.array([[s, 0.0, (W - 1) / 2 - s * cx], [0.0, s, (H - 1) / 2 - s * cy]], dtype=np.float64)


def apply_affine(M: np.ndarray, xy_K2: np.ndarray) -> np.ndarray:
    return xy_K2 @ M[:, :2].T + M[:, 2]


def invert_affine(M: np.ndarray) -> np.ndarray:
    A = np.vstack([M, [0.0, 0.0, 1.0]])
    return np.linalg.inv(A)[:2]


def encode_heatmaps(
    xy_K2: np.ndarray, valid_K: np.ndarray, in_hw: tuple[int, int], hm_hw: tuple[int, int], sigma: float
) -> tuple[np.ndarray, np.ndarray]:
    """UDP Gaussian targets (K, h, w) float32 and weights (K,) for keypoints in input pixels.

    A keypoint weighs 0 when unlabelled or when its centre falls outside the heatmap.
    """
    H, W = in_hw
    h, w = hm_hw
    mu = xy_K2 * np.array([(w - 1) / (W - 1), (h - 1) / (H - 1)])
    inside = (mu[:, 0] >= 0) & (mu[:, 0] <= w - 1) & (mu[:, 1] >= 0) & (mu[:, 1] <= h - 1)
    weight = (valid_K & inside).astype(np.float32)
    xs, ys = np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32)
    gx = np.exp(-((xs[None] - mu[:, :1]) ** 2) / (2 * sigma**2))
    gy = np.exp(-((ys[None] - mu[:, 1:]) ** 2) / (2 * sigma**2))
    target = (gy[:, :, None] * gx[:, None, :]).astype(np.float32) * weight[:, None, None]
    return target, weight


@torch.no_grad()
def decode_heatmaps(heatmaps_BKhw: torch.Tensor, in_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Keypoints (B, K, 2) in input pixels and their scores (B, K) = the heatmap maxima."""
    B, K, h, w = heatmaps_BKhw.shape
    hm = heatmaps_BKhw.float()
    score, idx = hm.flatten(2).max(dim=2)
    y, x = (idx // w).float(), (idx % w).float()
    offset = _dark_offset(hm, idx // w, idx % w)
    x, y = x + offset[..., 0], y + offset[..., 1]
    H, W = in_hw
    xy = torch.stack([x * (W - 1) / max(w - 1, 1), y * (H - 1) / max(h - 1, 1)], dim=-1)
    return xy, score


def _dark_offset(hm_BKhw: torch.Tensor, iy: torch.Tensor, ix: torch.Tensor) -> torch.Tensor:
    """Newton step ``-H^-1 g`` of the log heatmap at the arg-max, (B, K, 2) as (dx, dy);
    zero at the border or where the Hessian is not negative definite; clamped to a pixel."""
    B, K, h, w = hm_BKhw.shape
    logh = hm_BKhw.clamp_min(1e-10).log()
    pad = torch.nn.functional.pad(logh, (1, 1, 1, 1), mode="replicate")
    yy, xx = iy + 1, ix + 1

    def at(dy: int, dx: int) -> torch.Tensor:
        flat = (yy + dy) * (w + 2) + (xx + dx)
        return pad.flatten(2).gather(2, flat[..., None])[..., 0]

    c = at(0, 0)
    gx, gy = (at(0, 1) - at(0, -1)) / 2, (at(1, 0) - at(-1, 0)) / 2
    hxx, hyy = at(0, 1) - 2 * c + at(0, -1), at(1, 0) - 2 * c + at(-1, 0)
    hxy = (at(1, 1) - at(1, -1) - at(-1, 1) + at(-1, -1)) / 4
    det = hxx * hyy - hxy**2
    ok = (det > 1e-12) & (hxx < 0) & (ix > 0) & (ix < w - 1) & (iy > 0) & (iy < h - 1)
    safe = torch.where(ok, det, torch.ones_like(det))
    dx = -(hyy * gx - hxy * gy) / safe
    dy = -(hxx * gy - hxy * gx) / safe
    off = torch.stack([dx, dy], dim=-1).clamp(-1.0, 1.0)
    return torch.where(ok[..., None], off, torch.zeros_like(off))
