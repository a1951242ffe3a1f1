"""MAE reconstruction loss on the masked patches only, against normalised pixels.

L_MAE = (1/V) sum over masked patches p of mean_x (pred_px - target_px)^2, V the number of
masked patches in the batch. As in the MAE reference code, each patch's squared error is
averaged over its X pixel values (so the loss is ~1 for a prediction of zeros and the
1 : 0.4 : 0.04 weights balance); ``pixel_reduction="sum"`` sums them instead.

Shape legend: B batch, C channels, P grid patches, X pixels per patch (stride^2 * C).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from models.pretrain_heads import normalized_pixel_targets, patchify


class MAELoss(nn.Module):
    """``unbiased_var``: normalise each patch by its unbiased variance (Sapiens v1's released
    recipe, ``torch.var``'s default) rather than the population variance."""

    def __init__(
        self,
        stride: int,
        *,
        norm_pix: bool = True,
        pixel_reduction: Literal["mean", "sum"] = "mean",
        eps: float = 1e-6,
        unbiased_var: bool = False,
    ) -> None:
        super().__init__()
        self.stride, self.norm_pix, self.pixel_reduction, self.eps = stride, norm_pix, pixel_reduction, eps
        self.unbiased_var = unbiased_var

    def targets(self, images_BCHW: torch.Tensor) -> torch.Tensor:
        """(B, P, X) fp32 targets: per-patch standardised pixels, or raw pixels."""
        images_BCHW = images_BCHW.float()
        if self.norm_pix:
            return normalized_pixel_targets(images_BCHW, self.stride, eps=self.eps, unbiased=self.unbiased_var)
        return patchify(images_BCHW, self.stride)

    def forward(self, pred_BPX: torch.Tensor, images_BCHW: torch.Tensor, masked_BP: torch.Tensor) -> torch.Tensor:
        target_BPX = self.targets(images_BCHW)
        if pred_BPX.shape != target_BPX.shape:
            raise ValueError(f"prediction {tuple(pred_BPX.shape)} and targets {tuple(target_BPX.shape)} differ")
        err_BPX = (pred_BPX.float() - target_BPX).square()
        err_BP = err_BPX.mean(-1) if self.pixel_reduction == "mean" else err_BPX.sum(-1)
        weight_BP = masked_BP.to(err_BP.dtype)
        return (err_BP * weight_BP).sum() / weight_BP.sum().clamp_min(1.0)
