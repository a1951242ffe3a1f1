"""Pre- and post-processing of the released Sapiens task models, as plain functions.

Images are (H, W, 3) uint8 arrays (cv2's BGR unless ``bgr=False``); model inputs and
outputs are (B, C, H, W) tensors; sizes are (H, W) unless a name ends in ``_wh``.

Pre-processing:

- ``normalize_image``: RGB, ``(x - mean) / std`` in 0..255 units -> (3, H, W) float32.
- Pose, top-down: ``select_people`` (score above 0.3, then ``nms`` at IoU 0.3, best first;
  ``whole_image_box`` when none is left), ``bbox_center_scale`` (padding 1.25),
  ``fix_aspect_ratio`` (w / h = 0.75), ``udp_warp_matrix`` and ``crop_person``
  (cv2.warpAffine, INTER_AREA when shrinking, INTER_CUBIC when enlarging, zero border).
  Boxes, centres, sizes and the matrix are computed in float32 arithmetic, as released.
- Seg: ``resize_plain`` (aspect not kept). Normal / pointmap / albedo: ``resize_pad``
  (aspect kept, INTER_LINEAR, centred zero padding; returns the ``Padding``).

Post-processing:

- Pose: ``flip_test`` / ``flip_back`` (flipped pass flipped back, channels reordered by the
  vocabulary's ``flip_indices``, no shift), ``udp_decode`` (argmax + DARK-UDP refinement,
  keypoints in crop pixels and the raw maxima as scores), ``keypoints_to_image``.
- Dense: ``seg_labels`` (logits resized bilinearly, then argmax), ``normals_to_image``
  (L2-normalised, clamp 1e-8, before the resize), ``metric_pointmap`` (pointmap / scale
  per sample) and ``pointmap_to_image``, ``albedo_to_image`` (clamped to [0, 1]) and
  ``albedo_to_uint8`` (truncated); each crops the ``Padding`` off, then resizes to the image
  size (bilinear, align_corners=False).

Two scale conventions cancel in pose: ``udp_decode`` maps heatmap to crop pixels by
``input_size / (heatmap_size - 1)`` and ``keypoints_to_image`` divides by ``input_size``;
together they are the exact inverse of the UDP warp, so use both or neither.

Parity with the official demo code is tested on its reference vectors
(``tests/models/test_sapiens2_processing_parity.py``), which also name the two places where
these functions deliberately differ: a heatmap channel with no positive value is not refined
(the released decode reads another channel's memory there), and the pointmap is divided by
each sample's own scale (the released division is right for a batch of one only). The
normal and pointmap maps are resized channels-last (``resize_map_hwc``): the same values up to
float32 rounding, which the released layout would spend a transposed copy on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import torch
import torch.nn.functional as F

MEAN_RGB = (123.675, 116.28, 103.53)
STD_RGB = (58.395, 57.12, 57.375)
INPUT_HW = (1024, 768)
BBOX_PADDING = 1.25
ASPECT_RATIO = 0.75  # crop width / height = 768 / 1024
BLUR_KERNEL = 11
BOX_SCORE_THRESHOLD = 0.3  # the released pose demo's bbox_thr: a box is kept when its score is above it
NMS_IOU = 0.3  # and when it overlaps no better kept box by more than this IoU


def normalize_image(image_HW3: np.ndarray, *, bgr: bool = True) -> torch.Tensor:
    """An (H, W, 3) uint8 image -> the (3, H, W) float32 model input (RGB, mean/std)."""
    rgb = image_HW3[..., ::-1] if bgr else image_HW3
    x = (rgb.astype(np.float32) - np.float32(MEAN_RGB)) / np.float32(STD_RGB)
    return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))


# ---- pose: top-down crop ----------------------------------------------------------------------


def nms(boxes_N4: np.ndarray, scores_N: np.ndarray, iou_threshold: float = NMS_IOU) -> list[int]:
    """Greedy non-maximum suppression as released: boxes by descending score (equal scores:
    the later box first), areas with the +1 pixel convention, a box dropped when its IoU with
    a kept one is above ``iou_threshold``; float32 arithmetic. The kept indices, best first."""
    boxes = np.asarray(boxes_N4, dtype=np.float32).reshape(-1, 4)
    x1, y1, x2, y2 = boxes.T
    one = np.float32(1)
    areas = (x2 - x1 + one) * (y2 - y1 + one)
    order = np.argsort(np.asarray(scores_N, dtype=np.float32), kind="stable")[::-1]
    keep = []
    while order.size:
        i, rest = order[0], order[1:]
        keep.append(int(i))
        w = np.maximum(np.float32(0), np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]) + one)
        h = np.maximum(np.float32(0), np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]) + one)
        inter = w * h
        order = rest[inter / (areas[i] + areas[rest] - inter) <= iou_threshold]
    return keep


def select_people(
    boxes_N4: np.ndarray,
    scores_N: Sequence[float],
    labels_N: Sequence[int] | None = None,
    *,
    score_threshold: float = BOX_SCORE_THRESHOLD,
    iou_threshold: float = NMS_IOU,
    person_label: int = 0,
) -> list[int]:
    """The detections the released pose demo runs on, best first: label ``person_label``
    (all, when ``labels_N`` is None), score above ``score_threshold``, then ``nms``."""
    scores = np.asarray(scores_N, dtype=np.float32).reshape(-1)
    keep = scores > np.float32(score_threshold)
    if labels_N is not None:
        keep &= np.asarray(labels_N).reshape(-1) == person_label
    candidates = np.flatnonzero(keep)
    boxes = np.asarray(boxes_N4, dtype=np.float32).reshape(-1, 4)
    return [int(candidates[j]) for j in nms(boxes[candidates], scores[candidates], iou_threshold)]


def whole_image_box(image_hw: tuple[int, int]) -> np.ndarray:
    """The box the released demo uses when no person is detected: (0, 0, W - 1, H - 1), float32."""
    return np.array([0, 0, image_hw[1] - 1, image_hw[0] - 1], dtype=np.float32)


def bbox_center_scale(bbox_xyxy: Sequence[float], padding: float = BBOX_PADDING) -> tuple[np.ndarray, np.ndarray]:
    """Centre and padded size (w, h) of a box (x1, y1, x2, y2), in float32 arithmetic as released."""
    box = np.asarray(bbox_xyxy, dtype=np.float32).reshape(4)
    return (box[2:] + box[:2]) * np.float32(0.5), (box[2:] - box[:2]) * np.float32(padding)


def fix_aspect_ratio(scale_wh: np.ndarray, aspect_ratio: float = ASPECT_RATIO) -> np.ndarray:
    """Grow the shorter side so that w / h = ``aspect_ratio`` (float32 arithmetic, as released)."""
    w, h = np.asarray(scale_wh, dtype=np.float32).reshape(2)
    ratio = np.float32(aspect_ratio)
    return np.array([w, w / ratio] if w > h * ratio else [h * ratio, h], dtype=np.float32)


def udp_warp_matrix(center: np.ndarray, scale_wh: np.ndarray, output_wh: tuple[int, int]) -> np.ndarray:
    """The (2, 3) UDP affine map from image to crop pixels (no rotation): the box's corner
    pixels go to the crop's, ``(output - 1) / scale`` pixels per image pixel.

    Every entry is computed in float32 arithmetic in the released order (``s = (out - 1) /
    scale``, then ``s * (0.5 * scale - center)``): a float64 computation differs by a few
    float32 ulps in the translation, which moves crop pixels."""
    cx, cy = np.asarray(center, dtype=np.float32).reshape(2)
    sw, sh = np.asarray(scale_wh, dtype=np.float32).reshape(2)
    sx, sy = np.float32(output_wh[0] - 1) / sw, np.float32(output_wh[1] - 1) / sh
    half = np.float32(0.5)
    return np.array([[sx, 0, sx * (half * sw - cx)], [0, sy, sy * (half * sh - cy)]], dtype=np.float32)


def warp_interpolation(matrix: np.ndarray) -> int:
    """INTER_AREA when the warp shrinks (a row of the linear part shorter than 1), else INTER_CUBIC."""
    return cv2.INTER_AREA if float(np.linalg.norm(matrix[:, :2], axis=1).min()) < 1 else cv2.INTER_CUBIC


@dataclass(frozen=True)
class PoseCrop:
    """One person's crop: the warped image and the box (centre, size) that maps it back."""

    image: np.ndarray
    center: np.ndarray
    scale: np.ndarray


def crop_person(
    image: np.ndarray,
    bbox_xyxy: Sequence[float] | None = None,
    *,
    input_hw: tuple[int, int] = INPUT_HW,
    padding: float = BBOX_PADDING,
) -> PoseCrop:
    """The top-down pose crop of a person box (the whole image when ``bbox_xyxy`` is None)."""
    if bbox_xyxy is None:
        bbox_xyxy = whole_image_box(image.shape[:2])
    center, scale = bbox_center_scale(bbox_xyxy, padding)
    out_wh = (input_hw[1], input_hw[0])
    scale = fix_aspect_ratio(scale, out_wh[0] / out_wh[1])
    matrix = udp_warp_matrix(center, scale, out_wh)
    crop = cv2.warpAffine(image, matrix, out_wh, flags=warp_interpolation(matrix))
    return PoseCrop(crop, center, scale)


def keypoints_to_image(
    keypoints_NK2: np.ndarray, center: np.ndarray, scale_wh: np.ndarray, input_wh: tuple[int, int]
) -> np.ndarray:
    """Crop-pixel keypoints (as ``udp_decode`` returns them) -> image pixels, float64."""
    kp = np.asarray(keypoints_NK2, dtype=np.float64)
    return kp / np.asarray(input_wh, dtype=np.float64) * scale_wh + center - 0.5 * scale_wh


# ---- pose: flip test and UDP heatmap decode ------------------------------------------------------


def flip_back(heatmaps_BKHW: torch.Tensor, flip_indices: Sequence[int]) -> torch.Tensor:
    """Heatmaps of a mirrored input -> the unmirrored input's: flipped along W, channel k
    taken from channel ``flip_indices[k]``."""
    return heatmaps_BKHW.flip(-1)[:, list(flip_indices)]


def flip_test(
    model: Callable[[torch.Tensor], torch.Tensor], x_BCHW: torch.Tensor, flip_indices: Sequence[int]
) -> torch.Tensor:
    """The mean of the heatmaps of ``x`` and of its mirror image, flipped back (no shift)."""
    return (model(x_BCHW) + flip_back(model(x_BCHW.flip(-1)), flip_indices)) / 2


def heatmap_maximum(heatmaps_KHW: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer (x, y) of each heatmap's maximum and the maximum; (-1, -1) where it is <= 0."""
    K, _, W = heatmaps_KHW.shape
    flat = heatmaps_KHW.reshape(K, -1)
    idx = flat.argmax(axis=1)
    scores = flat[np.arange(K), idx].astype(np.float32)
    locs = np.stack([idx % W, idx // W], axis=1).astype(np.float32)
    locs[scores <= 0] = -1
    return locs, scores


def blur_heatmaps(heatmaps_KHW: np.ndarray, kernel: int = BLUR_KERNEL) -> np.ndarray:
    """Gaussian blur (cv2, sigma from the kernel size) of each map on a zero border of
    ``(kernel - 1) // 2``, rescaled so that its maximum stays the original maximum (a map
    with no positive value is left as blurred)."""
    border = (kernel - 1) // 2
    out = np.empty_like(heatmaps_KHW, dtype=np.float32)
    for k, hm in enumerate(heatmaps_KHW.astype(np.float32)):
        padded = np.pad(hm, border)
        blurred = cv2.GaussianBlur(padded, (kernel, kernel), 0)[border:-border, border:-border]
        peak = blurred.max()
        out[k] = blurred * (hm.max() / peak) if peak > 0 else blurred  # an empty map stays empty
    return out


def refine_dark_udp(locs_K2: np.ndarray, heatmaps_KHW: np.ndarray, kernel: int = BLUR_KERNEL) -> np.ndarray:
    """One Newton step on the log of the blurred heatmap from each integer maximum: the
    DARK-UDP sub-pixel refinement. Keypoints at (-1, -1) (no maximum) are left as they are."""
    log_KHW = np.log(np.clip(blur_heatmaps(heatmaps_KHW, kernel), 1e-3, 50.0))
    padded = np.pad(log_KHW, ((0, 0), (1, 1), (1, 1)), mode="edge")
    refined = locs_K2.astype(np.float32).copy()
    eps = np.finfo(np.float32).eps
    for k, (x, y) in enumerate(locs_K2.astype(int)):
        if x < 0:
            continue
        p = padded[k, y : y + 3, x : x + 3]  # p[1, 1] is the maximum; p[row, column]
        grad = np.array([0.5 * (p[1, 2] - p[1, 0]), 0.5 * (p[2, 1] - p[0, 1])])
        dxx = p[1, 2] - 2 * p[1, 1] + p[1, 0]
        dyy = p[2, 1] - 2 * p[1, 1] + p[0, 1]
        dxy = 0.5 * (p[2, 2] - p[1, 2] - p[2, 1] + 2 * p[1, 1] - p[1, 0] - p[0, 1] + p[0, 0])
        hessian = np.array([[dxx, dxy], [dxy, dyy]], dtype=np.float64) + eps * np.eye(2)
        refined[k] -= np.linalg.inv(hessian) @ grad
    return refined


def udp_decode(
    heatmaps_KHW: np.ndarray, input_wh: tuple[int, int], blur_kernel: int = BLUR_KERNEL
) -> tuple[np.ndarray, np.ndarray]:
    """One instance's heatmaps -> keypoints (1, K, 2) float64 in crop pixels and scores (1, K).

    Keypoints are ``refined / (heatmap_size - 1) * input_size``; scores are the raw maxima.
    A channel with no positive value keeps the location (-1, -1) unrefined (the released
    decode refines it from the neighbouring channel's memory, an accident not reproduced)."""
    K, H, W = heatmaps_KHW.shape
    locs, scores = heatmap_maximum(heatmaps_KHW)
    refined = refine_dark_udp(locs, heatmaps_KHW, blur_kernel)
    keypoints = refined / np.array([W - 1, H - 1], dtype=np.float64) * np.array(input_wh, dtype=np.float64)
    return keypoints[None], scores[None]


# ---- dense tasks: resizing in, and back out ----------------------------------------------------


@dataclass(frozen=True)
class Padding:
    """Pixels of zero padding around the resized image in the model input."""

    left: int
    right: int
    top: int
    bottom: int


def resize_plain(image: np.ndarray, out_hw: tuple[int, int] = INPUT_HW) -> np.ndarray:
    """Resize to ``out_hw`` ignoring the aspect (seg): INTER_AREA when narrowing, else INTER_CUBIC."""
    flags = cv2.INTER_AREA if out_hw[1] < image.shape[1] else cv2.INTER_CUBIC
    return cv2.resize(image, (out_hw[1], out_hw[0]), interpolation=flags)


def resize_pad(image: np.ndarray, out_hw: tuple[int, int] = INPUT_HW, pad_value: int = 0) -> tuple[np.ndarray, Padding]:
    """Aspect-keeping resize into ``out_hw`` (INTER_LINEAR), centred with ``pad_value`` around it."""
    h, w = image.shape[:2]
    s = min(out_hw[1] / w, out_hw[0] / h)
    new_w, new_h = int(w * s), int(h * s)
    resized = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    left, top = (out_hw[1] - new_w) // 2, (out_hw[0] - new_h) // 2
    pad = Padding(left, out_hw[1] - new_w - left, top, out_hw[0] - new_h - top)
    out = cv2.copyMakeBorder(resized, pad.top, pad.bottom, pad.left, pad.right, cv2.BORDER_CONSTANT, value=pad_value)
    return out, pad


def unpad(map_BCHW: torch.Tensor, padding: Padding | None) -> torch.Tensor:
    """The map without the padding ``resize_pad`` added (None: unchanged)."""
    if padding is None:
        return map_BCHW
    H, W = map_BCHW.shape[-2:]
    return map_BCHW[..., padding.top : H - padding.bottom, padding.left : W - padding.right]


def resize_map(map_BCHW: torch.Tensor, out_hw: tuple[int, int]) -> torch.Tensor:
    return F.interpolate(map_BCHW, size=tuple(out_hw), mode="bilinear", align_corners=False)


def resize_map_hwc(map_BCHW: torch.Tensor, out_hw: tuple[int, int]) -> torch.Tensor:
    """``resize_map`` computed in channels-last memory: the same values, and each sample's
    (H, W, C) view (what dense outputs are stored as) is contiguous, so storing it copies
    nothing transposed."""
    return resize_map(map_BCHW.contiguous(memory_format=torch.channels_last), out_hw)


def seg_labels(logits_BCHW: torch.Tensor, image_hw: tuple[int, int]) -> torch.Tensor:
    """Class ids (B, H, W): the logits resized bilinearly to the image size, then argmax."""
    return resize_map(logits_BCHW, image_hw).argmax(dim=1)


def normals_to_image(
    normal_BCHW: torch.Tensor, image_hw: tuple[int, int], padding: Padding | None = None
) -> torch.Tensor:
    """Unit normals at the image size: L2-normalised (norm clamped at 1e-8) before the
    padding is cropped and the map resized (not normalised again after)."""
    unit = normal_BCHW / normal_BCHW.norm(dim=1, keepdim=True).clamp(min=1e-8)
    return resize_map_hwc(unpad(unit, padding), image_hw)


def metric_pointmap(pointmap_B3HW: torch.Tensor, scale_B1: torch.Tensor) -> torch.Tensor:
    """Canonical-focal XYZ -> metric camera-frame XYZ: each sample divided by its own scale."""
    return pointmap_B3HW / scale_B1.reshape(-1, 1, 1, 1)


def pointmap_to_image(
    pointmap_B3HW: torch.Tensor,
    scale_B1: torch.Tensor,
    image_hw: tuple[int, int],
    padding: Padding | None = None,
    *,
    smooth: bool = True,
) -> torch.Tensor:
    """Metric XYZ at the image size. When enlarging (and ``smooth``), the cropped map is
    first blurred 4 times (3x3 Gaussian, sigma 0.8) to soften the bilinear upsampling."""
    from torchvision.transforms.functional import gaussian_blur

    xyz = unpad(metric_pointmap(pointmap_B3HW, scale_B1), padding)
    if smooth and (image_hw[0] > xyz.shape[-2] or image_hw[1] > xyz.shape[-1]):
        for _ in range(4):
            xyz = gaussian_blur(xyz, kernel_size=[3, 3], sigma=[0.8, 0.8])
    return resize_map_hwc(xyz, image_hw)


def albedo_to_image(
    albedo_B3HW: torch.Tensor, image_hw: tuple[int, int], padding: Padding | None = None
) -> torch.Tensor:
    """RGB albedo in [0, 1] at the image size: clamped, padding cropped, resized in the released
    (NCHW) memory layout, whose values ``albedo_to_uint8``'s truncation keeps bit for bit."""
    return resize_map(unpad(albedo_B3HW.clamp(0, 1), padding).contiguous(), image_hw)


def albedo_to_uint8(albedo: torch.Tensor) -> torch.Tensor:
    """Albedo in [0, 1] -> uint8 as released: ``albedo * 255`` truncated, not rounded."""
    return (albedo * 255).to(torch.uint8)
