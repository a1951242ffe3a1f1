"""Multi-crop views: ``num_global`` global and ``num_local`` local random resized crops.

A view is planned first (``plan``: crop box, flip and colour operations, drawn from one
``numpy.random.Generator``) and then rendered (``render``), so the randomness of a sample
is a pure function of its seed and a test can check exactly what was drawn. Global views
get crop + flip only: no colour jitter, grayscale or blur (colour carries signal for
albedo, segmentation and skin tone). Local views add colour jitter, grayscale and blur.

JPEGs are decoded at a reduced scale (``Image.draft``) when every crop of the sample is
at least twice as large as its output: a 64x48 view of a 4000 px photo never decodes
the full image.

Shapes: views are float32 (3, H, W), normalised with the ImageNet mean and std.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageFilter

# Imported here, not on first use: forked loader workers then inherit it (seconds each).
from torchvision.transforms.v2 import functional as TF

from training.config import CropConfig

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ColorOps:
    """Colour jitter factors in the order applied, then grayscale and blur radius (0 = none)."""

    order: tuple[str, ...]
    factors: dict[str, float]
    grayscale: bool
    blur_radius: float


@dataclass(frozen=True)
class CropPlan:
    box: tuple[float, float, float, float]  # (left, top, right, bottom) in source pixels
    out_hw: tuple[int, int]
    flip: bool
    color: ColorOps | None  # None for global views


def random_resized_box(
    rng: np.random.Generator,
    width: int,
    height: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    attempts: int = 10,
) -> tuple[float, float, float, float]:
    """torchvision's RandomResizedCrop rule: area fraction in ``scale``, aspect (w/h) in
    ``ratio`` (log-uniform); after ``attempts`` misses, the largest centred crop whose
    aspect lies in ``ratio``."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(attempts):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = math.sqrt(target * aspect)
        h = math.sqrt(target / aspect)
        if 0 < w <= width and 0 < h <= height:
            left = rng.uniform(0, width - w)
            top = rng.uniform(0, height - h)
            return (left, top, left + w, top + h)
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, width / ratio[0]
    elif in_ratio > ratio[1]:
        w, h = height * ratio[1], height
    else:
        w, h = width, height
    left, top = (width - w) / 2, (height - h) / 2
    return (left, top, left + w, top + h)


class MultiCrop:
    """``MultiCrop(cfg)(jpeg_bytes, rng) -> (globals_G3HW, locals_L3hw)``."""

    def __init__(self, cfg: CropConfig) -> None:
        self.cfg = cfg
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def plan(self, rng: np.random.Generator, width: int, height: int) -> tuple[list[CropPlan], list[CropPlan]]:
        c = self.cfg
        globals_ = [
            self._plan_one(rng, width, height, c.global_size, c.global_scale, local=False) for _ in range(c.num_global)
        ]
        locals_ = [
            self._plan_one(rng, width, height, c.local_size, c.local_scale, local=True) for _ in range(c.num_local)
        ]
        return globals_, locals_

    def _plan_one(self, rng, width, height, out_hw, scale, *, local: bool) -> CropPlan:
        c = self.cfg
        out_aspect = out_hw[1] / out_hw[0]
        box = random_resized_box(rng, width, height, scale, (c.ratio[0] * out_aspect, c.ratio[1] * out_aspect))
        flip = bool(rng.random() < c.hflip_prob)
        color = None
        if local:
            factors: dict[str, float] = {}
            order: tuple[str, ...] = ()
            if rng.random() < c.local_jitter_prob:
                order = tuple(np.array(["brightness", "contrast", "saturation", "hue"])[rng.permutation(4)])
                factors = {
                    "brightness": float(rng.uniform(max(0.0, 1 - c.brightness), 1 + c.brightness)),
                    "contrast": float(rng.uniform(max(0.0, 1 - c.contrast), 1 + c.contrast)),
                    "saturation": float(rng.uniform(max(0.0, 1 - c.saturation), 1 + c.saturation)),
                    "hue": float(rng.uniform(-c.hue, c.hue)),
                }
            grayscale = bool(rng.random() < c.local_grayscale_prob)
            blur = float(rng.uniform(*c.blur_sigma)) if rng.random() < c.local_blur_prob else 0.0
            color = ColorOps(order=order, factors=factors, grayscale=grayscale, blur_radius=blur)
        return CropPlan(box=box, out_hw=tuple(out_hw), flip=flip, color=color)

    def __call__(self, data: bytes, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        globals_, locals_ = self.plan(rng, width, height)
        image, sx, sy = decode_for(image, globals_ + locals_)
        g = torch.stack([self.render(image, p, sx, sy) for p in globals_])
        l_ = (
            torch.stack([self.render(image, p, sx, sy) for p in locals_])
            if locals_
            else torch.empty(0, 3, *self.cfg.local_size)
        )
        return g, l_

    def render(self, image: Image.Image, plan: CropPlan, sx: float = 1.0, sy: float = 1.0) -> torch.Tensor:
        """One view from a decoded RGB image (``sx, sy``: its scale relative to the plan's pixels)."""
        left, top, right, bottom = plan.box
        out_h, out_w = plan.out_hw
        crop = image.resize(
            (out_w, out_h), Image.Resampling.BICUBIC, box=(left * sx, top * sy, right * sx, bottom * sy)
        )
        if plan.flip:
            crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if plan.color is not None and plan.color.blur_radius > 0:
            crop = crop.filter(ImageFilter.GaussianBlur(radius=plan.color.blur_radius))
        x = torch.from_numpy(np.asarray(crop, dtype=np.uint8).copy()).permute(2, 0, 1)
        if plan.color is not None:
            x = apply_color(x, plan.color)
        return (x.float() / 255.0 - self.mean) / self.std


def apply_color(x_3HW: torch.Tensor, ops: ColorOps) -> torch.Tensor:
    """Colour jitter (in ``ops.order``) then grayscale, on a uint8 image."""
    for name in ops.order:
        f = ops.factors[name]
        if name == "brightness":
            x_3HW = TF.adjust_brightness(x_3HW, f)
        elif name == "contrast":
            x_3HW = TF.adjust_contrast(x_3HW, f)
        elif name == "saturation":
            x_3HW = TF.adjust_saturation(x_3HW, f)
        else:
            x_3HW = TF.adjust_hue(x_3HW, f)
    if ops.grayscale:
        x_3HW = TF.rgb_to_grayscale(x_3HW, num_output_channels=3)
    return x_3HW


def decode_for(image: Image.Image, plans: list[CropPlan]) -> tuple[Image.Image, float, float]:
    """Decode ``image`` as RGB at the smallest JPEG scale that still gives every crop at
    least its output resolution; returns the image and its scale (x, y) to the original."""
    width, height = image.size
    reduction = min(min((p.box[2] - p.box[0]) / p.out_hw[1], (p.box[3] - p.box[1]) / p.out_hw[0]) for p in plans)
    if image.format == "JPEG" and reduction >= 2:
        image.draft("RGB", (math.ceil(width / reduction), math.ceil(height / reduction)))
    image = image.convert("RGB")
    return image, image.size[0] / width, image.size[1] / height
