"""Prediction-versus-truth overlays: skeletons, colour-mapped part masks, normal, depth and
albedo maps, laid out as titled panels ``input | truth | prediction`` and saved as PNG.

Normals are shown in the common "facing the viewer is blue" colouring: the camera-frame
vector (x right, y down, z forward) is mapped to (x, -y, -z) and then from [-1, 1] to RGB.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

UPSCALE = 2
TRUTH_COLOUR, PRED_COLOUR = (40, 220, 60), (240, 40, 40)


def class_palette(n: int) -> np.ndarray:
    """(n, 3) uint8: black for class 0 (background), then distinct colours."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    colours = [(0, 0, 0)] + [tuple(int(255 * c) for c in cmap(i % 20)[:3]) for i in range(n - 1)]
    return np.array(colours, dtype=np.uint8)


def colorize_labels(labels_HW: np.ndarray, num_classes: int) -> np.ndarray:
    palette = class_palette(max(num_classes, 2))
    out = palette[np.clip(labels_HW, 0, len(palette) - 1)]
    out[labels_HW >= num_classes] = 128  # ignored pixels in grey
    return out


def blend(
    image_HW3: np.ndarray, overlay_HW3: np.ndarray, alpha: float = 0.6, where_HW: np.ndarray | None = None
) -> np.ndarray:
    mixed = (image_HW3 * (1 - alpha) + overlay_HW3 * alpha).astype(np.uint8)
    return mixed if where_HW is None else np.where(where_HW[..., None], mixed, image_HW3)


def normal_to_rgb(normal_3HW: np.ndarray, mask_HW: np.ndarray | None = None) -> np.ndarray:
    n = normal_3HW * np.array([1.0, -1.0, -1.0])[:, None, None]
    rgb = ((np.clip(n, -1, 1) + 1) / 2 * 255).transpose(1, 2, 0).astype(np.uint8)
    return rgb if mask_HW is None else rgb * mask_HW[..., None].astype(np.uint8)


def scalar_to_rgb(
    values_HW: np.ndarray, mask_HW: np.ndarray, vmin: float, vmax: float, cmap: str = "viridis"
) -> np.ndarray:
    import matplotlib

    t = np.clip((values_HW - vmin) / max(vmax - vmin, 1e-9), 0, 1)
    rgb = (matplotlib.colormaps[cmap](t)[..., :3] * 255).astype(np.uint8)
    return rgb * mask_HW[..., None].astype(np.uint8)


def rgb_map(values_3HW: np.ndarray, mask_HW: np.ndarray) -> np.ndarray:
    return (np.clip(values_3HW, 0, 1).transpose(1, 2, 0) * 255).astype(np.uint8) * mask_HW[..., None].astype(np.uint8)


def draw_skeleton(
    image_HW3: np.ndarray,
    xy_K2: np.ndarray,
    show_K: np.ndarray,
    skeleton: list[tuple[int, int]],
    colour: tuple[int, int, int],
) -> np.ndarray:
    """Keypoints and limbs drawn on ``image`` upscaled by ``UPSCALE`` (crisp lines)."""
    import cv2

    out = np.ascontiguousarray(upscale(image_HW3))
    pts = [(int(round(x * UPSCALE)), int(round(y * UPSCALE))) for x, y in xy_K2]
    for a, b in skeleton:
        if show_K[a] and show_K[b]:
            cv2.line(out, pts[a], pts[b], colour, 1, cv2.LINE_AA)
    for p, s in zip(pts, show_K):
        if s:
            cv2.circle(out, p, 2, colour, -1, cv2.LINE_AA)
    return out


def upscale(image_HW3: np.ndarray) -> np.ndarray:
    return np.repeat(np.repeat(image_HW3, UPSCALE, axis=0), UPSCALE, axis=1)


def panel(images: list[np.ndarray], titles: list[str], *, upscaled: bool = False) -> np.ndarray:
    """Images side by side, each under a title bar; upscaled by ``UPSCALE`` unless ``upscaled``."""
    import cv2

    tiles = []
    for img, title in zip(images, titles):
        img = img if upscaled else upscale(img)
        bar = np.full((14, img.shape[1], 3), 255, np.uint8)
        cv2.putText(bar, title, (3, 11), cv2.FONT_HERSHEY_SIMPLEX, 0.38, (0, 0, 0), 1, cv2.LINE_AA)
        tiles.append(np.concatenate([bar, img], axis=0))
    height = max(t.shape[0] for t in tiles)
    tiles = [np.pad(t, ((0, height - t.shape[0]), (0, 2), (0, 0)), constant_values=255) for t in tiles]
    return np.concatenate(tiles, axis=1)


def save_png(path: str | Path, image_HW3: np.ndarray) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image_HW3).save(path)
    return path
