"""KoLeo regulariser (Sablayrolles et al. 2019; DINOv2 ``koleo_loss.py``).

Spreads features uniformly on the sphere: with x_i L2-normalised and
d_i = ||x_i - x_nn(i)|| the distance to its nearest neighbour in the batch,
L = -(1/n) sum_i log(d_i + eps). The neighbour search takes no gradient (it is an
argmax); the distance does.

Shape legend: B samples, D features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class KoLeoLoss(nn.Module):
    def __init__(self, eps: float = 1e-8) -> None:
        super().__init__()
        self.eps = eps

    @staticmethod
    def nearest_neighbours(x_BD: torch.Tensor) -> torch.Tensor:
        """Index of each row's nearest other row (max cosine similarity), (B,)."""
        with torch.no_grad():
            sim_BB = x_BD @ x_BD.t()
            sim_BB.fill_diagonal_(-2.0)  # below any cosine similarity: never oneself
            return sim_BB.argmax(dim=1)

    def forward(self, features_BD: torch.Tensor) -> torch.Tensor:
        if features_BD.shape[0] < 2:
            raise ValueError("KoLeo needs at least 2 samples")
        x_BD = F.normalize(features_BD.float(), dim=-1, eps=self.eps)
        nn_B = self.nearest_neighbours(x_BD)
        dist_B = F.pairwise_distance(x_BD, x_BD[nn_B], p=2, eps=self.eps)
        return -torch.log(dist_B + self.eps).mean()
