"""Pictures of what the pretraining model does: the MAE reconstruction grid rank 0 logs
every ``metrics.images_every`` steps (through ``infra.tracking.MetricsLogger``)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from models.pretrain_heads import patchify, unpatchify
from training.augment import MEAN, STD


def reconstruction_grid(viz: dict[str, torch.Tensor], stride: int, *, scale: int = 1) -> Image.Image:
    """One row per sample: input | masked input | reconstruction.

    The decoder predicts per-patch normalised pixels; each masked patch is shown
    de-normalised with the mean and std of the true patch (as in the MAE paper's
    figures); visible patches are shown as they were. ``viz``: ``images`` (N, 3, H, W)
    normalised, ``masks`` (N, P) True = masked, ``preds`` (N, P, X).
    """
    images, masks, preds = viz["images"], viz["masks"], viz["preds"]
    _, _, H, W = images.shape
    grid = (H // stride, W // stride)
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    pixels = (images * std + mean).clamp(0, 1)
    patches_NPX = patchify(pixels, stride)
    mu = patches_NPX.mean(-1, keepdim=True)
    sigma = (patches_NPX.var(-1, keepdim=True, unbiased=False) + 1e-6).sqrt()
    masked = masks[..., None]
    recon_NPX = torch.where(masked, preds * sigma + mu, patches_NPX).clamp(0, 1)
    hidden_NPX = torch.where(masked, torch.full_like(patches_NPX, 0.5), patches_NPX)
    rows = torch.cat([pixels, unpatchify(hidden_NPX, stride, grid), unpatchify(recon_NPX, stride, grid)], dim=3)
    sheet = torch.cat(list(rows), dim=1)  # (3, N*H, 3W)
    array = (sheet.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    out = Image.fromarray(array)
    if scale > 1:
        out = out.resize((out.width * scale, out.height * scale), Image.Resampling.NEAREST)
    return out
