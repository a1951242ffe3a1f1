"""Feature distillation loss: projected student tokens against the frozen teacher's tokens.

    L = cosine_weight * mean(1 - cos(s, t)) + smooth_l1_weight * mean(smooth_l1(s - t; beta))

over every token (rows of CLS tokens, or every patch token of every image), in fp32. The
cosine term matches directions whatever the scale; the smooth-L1 term (L2 near zero, L1 beyond
``beta``) matches the values themselves, which the teacher's final RMSNorm keeps near unit RMS.

Shape legend: N tokens (any leading shape), D the teacher's width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FeatureDistillLoss(nn.Module):
    def __init__(self, *, cosine_weight: float = 1.0, smooth_l1_weight: float = 1.0, beta: float = 1.0) -> None:
        super().__init__()
        self.cosine_weight, self.smooth_l1_weight, self.beta = cosine_weight, smooth_l1_weight, beta

    def forward(self, student_ND: torch.Tensor, teacher_ND: torch.Tensor) -> torch.Tensor:
        """``student_ND`` (projected to the teacher's width) and ``teacher_ND`` of the same shape."""
        if student_ND.shape != teacher_ND.shape:
            raise ValueError(f"student {tuple(student_ND.shape)} and teacher {tuple(teacher_ND.shape)} tokens differ")
        s, t = student_ND.float(), teacher_ND.float().detach()
        loss = s.new_zeros(())
        if self.cosine_weight:
            loss = loss + self.cosine_weight * (1.0 - F.cosine_similarity(s, t, dim=-1)).mean()
        if self.smooth_l1_weight:
            loss = loss + self.smooth_l1_weight * F.smooth_l1_loss(s, t, beta=self.beta)
        return loss


def token_cosine(student_ND: torch.Tensor, teacher_ND: torch.Tensor) -> float:
    """Mean cosine similarity of matching tokens (a report, not a loss)."""
    return float(F.cosine_similarity(student_ND.float(), teacher_ND.float(), dim=-1).mean())
