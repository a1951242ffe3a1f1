"""Training augmentations per task, drawn from a generator the caller seeds (so a resumed run
draws the same ones: ``evaluation.finetune.data`` seeds it with the step and batch slot).

- pose: the person crop's affine gets a random scale, rotation and horizontal flip about the
  crop centre (the flipped keypoints swap through the vocabulary's flip indices), and a
  half-body crop (the box of the visible upper- or lower-body keypoints, x1.5) at
  ``half_body_prob``; heatmaps are encoded after, so they are exact.
- seg / depth / normal / pointmap / albedo: the person is first composited onto a random
  background photo (``backgrounds``), then image and labels are warped together (labels by
  nearest neighbour; flipped part classes swap through the vocabulary; normals and points
  rotate and mirror with the image; a zoom by s brings the person s times nearer: the
  pointmap's Z / s). Depth's target is the reference's relative depth, made again after the
  warp (``evaluation.depth.relative_depth_target`` over the warped foreground, as the reference
  pipeline ends with GenerateDepthTarget), so the zoom does not change it.
- all: photometric jitter (brightness, contrast, saturation, hue) on the image only.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from evaluation.datasets import to_tensor
from evaluation.depth import BACKGROUND, relative_depth_target
from evaluation.finetune.config import AugmentConfig
from evaluation.heatmaps import apply_affine, box_to_affine, encode_heatmaps
from evaluation.io import IMAGE_SUFFIXES, read_rgb

UPPER_BODY = (
    "nose",
    "left_eye",
    "right_eye",
    "left_ear",
    "right_ear",
    "left_shoulder",
    "right_shoulder",
    "left_elbow",
    "right_elbow",
    "left_wrist",
    "right_wrist",
)
LOWER_BODY = ("left_hip", "right_hip", "left_knee", "right_knee", "left_ankle", "right_ankle")


class Backgrounds:
    """Person-free photos to composite people onto (every image file in ``folder``)."""

    def __init__(self, folder: str) -> None:
        if folder and not Path(folder).is_dir():
            raise ValueError(f"augment.backgrounds={folder!r} is not a folder")
        self.files = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES) if folder else []
        if folder and not self.files:
            raise ValueError(f"augment.backgrounds={folder!r} holds no images ({', '.join(IMAGE_SUFFIXES)})")

    def sample(self, rng: np.random.Generator, hw: tuple[int, int]) -> np.ndarray:
        """A random crop of a random photo at the aspect of ``hw``, resized to ``hw``."""
        import cv2

        rgb = read_rgb(self.files[int(rng.integers(len(self.files)))])
        H, W = rgb.shape[:2]
        scale = min(H / hw[0], W / hw[1]) * rng.uniform(0.5, 1.0)
        ch, cw = max(1, int(hw[0] * scale)), max(1, int(hw[1] * scale))
        y, x = int(rng.integers(0, H - ch + 1)), int(rng.integers(0, W - cw + 1))
        return cv2.resize(rgb[y : y + ch, x : x + cw], (hw[1], hw[0]), interpolation=cv2.INTER_LINEAR)


def crop_transform(
    rng: np.random.Generator, aug: AugmentConfig, hw: tuple[int, int]
) -> tuple[np.ndarray, float, float, bool]:
    """(3x3 matrix, angle in radians, scale, flipped): flip, scale and rotate about the centre of an (H, W) image."""
    s = float(rng.uniform(*aug.scale))
    angle = math.radians(rng.uniform(-aug.rotation_deg, aug.rotation_deg)) if rng.random() < aug.rotation_prob else 0.0
    flip = bool(rng.random() < aug.flip_prob)
    cy, cx = (hw[0] - 1) / 2, (hw[1] - 1) / 2
    c, si = math.cos(angle), math.sin(angle)
    R = np.array([[c * s, -si * s, 0.0], [si * s, c * s, 0.0], [0.0, 0.0, 1.0]])
    F = np.diag([-1.0 if flip else 1.0, 1.0, 1.0])
    T, Ti = np.array([[1, 0, cx], [0, 1, cy], [0, 0, 1.0]]), np.array([[1, 0, -cx], [0, 1, -cy], [0, 0, 1.0]])
    return T @ R @ F @ Ti, angle, s, flip


def warp(arr: np.ndarray, M: np.ndarray, hw: tuple[int, int], *, nearest: bool, border: float = 0) -> np.ndarray:
    import cv2

    flags = cv2.INTER_NEAREST if nearest else cv2.INTER_LINEAR
    out = cv2.warpAffine(arr, M[:2], (hw[1], hw[0]), flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=border)
    return out[..., None] if arr.ndim == 3 and out.ndim == 2 else out


def photometric(rgb: np.ndarray, rng: np.random.Generator, aug: AugmentConfig) -> np.ndarray:
    """mmseg's PhotoMetricDistortion: brightness, contrast, saturation and hue, each at random."""
    import cv2

    if rng.random() >= aug.photometric_prob:
        return rgb
    img = rgb.astype(np.float32) + rng.uniform(-aug.brightness_delta, aug.brightness_delta)
    img = img * rng.uniform(*aug.contrast)
    hsv = cv2.cvtColor(np.clip(img, 0, 255).astype(np.uint8), cv2.COLOR_RGB2HSV).astype(np.float32)
    hsv[..., 1] = np.clip(hsv[..., 1] * rng.uniform(*aug.saturation), 0, 255)
    hsv[..., 0] = (hsv[..., 0] + rng.uniform(-aug.hue_delta, aug.hue_delta) / 2) % 180  # OpenCV hue: 0..179
    return cv2.cvtColor(hsv.astype(np.uint8), cv2.COLOR_HSV2RGB)


def composite(
    rgb: np.ndarray, person: np.ndarray, rng: np.random.Generator, aug: AugmentConfig, backgrounds: Backgrounds
) -> np.ndarray:
    """The person's pixels over a random background photo, at ``background_prob``."""
    if not backgrounds.files or not person.any() or rng.random() >= aug.background_prob:
        return rgb
    bg = backgrounds.sample(rng, rgb.shape[:2])
    return np.where(person[..., None], rgb, bg)


def half_body_box(kps_K3: np.ndarray, names: tuple[str, ...], rng: np.random.Generator) -> list[float] | None:
    """The box (x, y, w, h) of the visible upper- or lower-body keypoints grown 1.5x; None when
    either half has fewer than 2 visible keypoints."""
    halves = [[i for i, n in enumerate(names) if n in part and kps_K3[i, 2] > 0] for part in (UPPER_BODY, LOWER_BODY)]
    if min(len(h) for h in halves) < 2:
        return None
    pts = kps_K3[halves[int(rng.integers(2))], :2]
    lo, hi = pts.min(axis=0), pts.max(axis=0)
    centre, size = (lo + hi) / 2, np.maximum(hi - lo, 1.0) * 1.5
    return [float(centre[0] - size[0] / 2), float(centre[1] - size[1] / 2), float(size[0]), float(size[1])]


def pose_item(base, i: int, rng: np.random.Generator, aug: AugmentConfig, vocab) -> dict:
    """A training crop of person ``i`` of a ``CocoKeypointDataset``, augmented."""
    inst = base.instances[i]
    kps = inst.keypoints
    box = inst.box
    if aug.enabled and rng.random() < aug.half_body_prob:
        box = half_body_box(kps, vocab.keypoint_names, rng) or box
    M = np.vstack([box_to_affine(box, base.image_size, base.padding), [0.0, 0.0, 1.0]])
    flip = False
    if aug.enabled:
        A, _, _, flip = crop_transform(rng, aug, base.image_size)
        M = A @ M
    crop = warp(read_rgb(base.images_dir / inst.file_name), M, base.image_size, nearest=False)
    xy, vis = apply_affine(M[:2], kps[:, :2]), kps[:, 2] > 0
    if flip:
        order = list(vocab.flip_indices)
        xy, vis = xy[order], vis[order]
    if aug.enabled:
        crop = photometric(crop, rng, aug)
    target, weight = encode_heatmaps(xy, vis, base.image_size, base.heatmap_size, base.sigma)
    return {
        "index": i,
        "image": to_tensor(crop),
        "heatmaps": torch.from_numpy(target),
        "weights": torch.from_numpy(weight),
    }


def seg_item(base, i: int, rng: np.random.Generator, aug: AugmentConfig, vocab, backgrounds: Backgrounds) -> dict:
    """Item ``i`` of a ``SegmentationDataset`` (built with ``with_image=False``), augmented."""
    labels = base[i]["labels"].numpy()
    rgb = base.display_image(i)
    if aug.enabled:
        rgb = composite(rgb, (labels > 0) & (labels != base.ignore_index), rng, aug, backgrounds)
        M, _, _, flip = crop_transform(rng, aug, base.image_size)
        rgb = warp(rgb, M, base.image_size, nearest=False)
        labels = warp(labels.astype(np.int32), M, base.image_size, nearest=True, border=0)
        if flip:  # left/right classes swap; every other id (ignore included) stays
            lut = np.arange(max(256, vocab.num_classes, base.ignore_index + 1))
            lut[: vocab.num_classes] = vocab.flip_map()
            labels = lut[labels]
        rgb = photometric(rgb, rng, aug)
    return {"index": i, "image": to_tensor(rgb), "labels": torch.from_numpy(labels.astype(np.int64))}


def dense_values(kind: str, target_HWC: np.ndarray, angle: float, scale: float, flip: bool) -> np.ndarray:
    """Targets after the image was flipped, then scaled by ``scale`` and rotated by ``angle``."""
    t = target_HWC.copy()
    if kind in ("normal", "pointmap"):
        if flip:
            t[..., 0] = -t[..., 0]
        c, s = math.cos(angle), math.sin(angle)
        x, y = t[..., 0].copy(), t[..., 1].copy()
        t[..., 0], t[..., 1] = c * x - s * y, s * x + c * y
    if kind == "pointmap":
        t[..., -1] = t[..., -1] / scale  # s x larger on the image = s x nearer, same lateral position
    return t


def dense_item(base, i: int, rng: np.random.Generator, aug: AugmentConfig, backgrounds: Backgrounds) -> dict:
    """Item ``i`` of a ``DenseMapDataset`` (built with ``with_image=False``), augmented."""
    item = base[i]
    target, mask = item["target"].numpy().transpose(1, 2, 0), item["mask"].numpy()
    depth = base.kind == "depth"
    if depth:  # the foreground: every pixel with a relative depth (>= 0), the nearest included
        mask = target[..., 0] >= 0
    rgb = base.display_image(i)
    if aug.enabled:
        rgb = composite(rgb, mask, rng, aug, backgrounds)
        M, angle, scale, flip = crop_transform(rng, aug, base.image_size)
        rgb = warp(rgb, M, base.image_size, nearest=False)
        border = BACKGROUND if depth else 0
        target = dense_values(
            base.kind, warp(target, M, base.image_size, nearest=True, border=border), angle, scale, flip
        )
        mask = warp(mask.astype(np.uint8), M, base.image_size, nearest=True).astype(bool)
        rgb = photometric(rgb, rng, aug)
    if depth:  # normalised again over the foreground left after the warp
        rel, mask = relative_depth_target(target[..., 0], mask)
        target = rel[..., None]
    return {
        "index": i,
        "image": to_tensor(rgb),
        "target": torch.from_numpy(np.ascontiguousarray(target.transpose(2, 0, 1))),
        "mask": torch.from_numpy(mask),
    }
