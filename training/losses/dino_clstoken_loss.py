"""DINO loss on the [CLS] token: cross-entropy between the centred, sharpened teacher
distribution of each global view and the student distribution of every *other* view.

With teacher probabilities p_i = softmax((t_i - c) / T_t) for global views i and student
log-probabilities log q_j = log_softmax(s_j / T_s) for all views j, the loss is
L_CL = (1/|S|) sum_{(i, j) in S} mean_b H(p_i, q_j), H(p, q) = -sum_k p_k log q_k,
where S pairs every teacher global view with every student view except itself
(global-global and global-local positives).

The centre c (a persistent buffer, so it is checkpointed) follows an EMA of the
teacher's mean logits over the *global* batch (all ranks):
c <- m c + (1 - m) mean(t). ``update_center`` is called after the loss of a step.

Shape legend: B samples per view, K prototypes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class DINOLoss(nn.Module):
    def __init__(self, num_prototypes: int, *, student_temp: float = 0.1, center_momentum: float = 0.9) -> None:
        super().__init__()
        self.student_temp = student_temp
        self.center_momentum = center_momentum
        self.register_buffer("center", torch.zeros(1, num_prototypes))

    @torch.no_grad()
    def teacher_probs(self, teacher_logits_BK: torch.Tensor, teacher_temp: float) -> torch.Tensor:
        return F.softmax((teacher_logits_BK.float() - self.center) / teacher_temp, dim=-1)

    def forward(self, student_logits: list[torch.Tensor], teacher_probs: list[torch.Tensor]) -> torch.Tensor:
        """``student_logits``: one (B, K) tensor per view, the global views first in the
        order of ``teacher_probs`` (one (B, K) per global view)."""
        if len(student_logits) < len(teacher_probs):
            raise ValueError("the student needs at least the teacher's global views")
        total, pairs = 0.0, 0
        log_q = [F.log_softmax(s.float() / self.student_temp, dim=-1) for s in student_logits]
        for i, p_BK in enumerate(teacher_probs):
            for j, log_q_BK in enumerate(log_q):
                if i == j:
                    continue
                total = total + (-(p_BK * log_q_BK).sum(dim=-1)).mean()
                pairs += 1
        if pairs == 0:
            raise ValueError("no (teacher, student) view pairs: give at least two views")
        return total / pairs

    @torch.no_grad()
    def update_center(self, teacher_logits_BK: torch.Tensor) -> None:
        # One collective: the logit sums and the sample count travel together.
        packed = torch.cat(
            (
                teacher_logits_BK.float().sum(dim=0),
                torch.tensor([float(teacher_logits_BK.shape[0])], device=teacher_logits_BK.device),
            )
        )
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(packed)
        mean_1K = (packed[:-1] / packed[-1])[None]
        self.center.mul_(self.center_momentum).add_(mean_1K, alpha=1 - self.center_momentum)
