"""k-NN classification on frozen features with a temperature-weighted vote (DINO's protocol).

Features are L2-normalised; each test sample takes its ``k`` most cosine-similar training
samples, each voting for its class with weight ``exp(similarity / temperature)``; the class
with the largest summed weight wins.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.no_grad()
def knn_predict(
    train_ND: torch.Tensor,
    train_labels_N: torch.Tensor,
    test_MD: torch.Tensor,
    *,
    k: int,
    temperature: float,
    num_classes: int,
    chunk: int = 1024,
) -> torch.Tensor:
    """(M,) predicted class of each test row."""
    if k < 1 or temperature <= 0:
        raise ValueError("k must be >= 1 and temperature > 0")
    k = min(k, train_ND.shape[0])
    train = F.normalize(train_ND.float(), dim=1)
    preds = []
    for start in range(0, test_MD.shape[0], chunk):
        sim_MN = F.normalize(test_MD[start : start + chunk].float(), dim=1) @ train.T
        top_sim_Mk, top_idx_Mk = sim_MN.topk(k, dim=1)
        votes_MkC = F.one_hot(train_labels_N[top_idx_Mk], num_classes).float()
        scores_MC = (votes_MkC * (top_sim_Mk / temperature).exp()[..., None]).sum(dim=1)
        preds.append(scores_MC.argmax(dim=1))
    return torch.cat(preds)


def knn_top1(
    train_ND: torch.Tensor,
    train_labels_N: torch.Tensor,
    test_MD: torch.Tensor,
    test_labels_M: torch.Tensor,
    *,
    k: int,
    temperature: float,
    num_classes: int,
) -> float:
    """Top-1 accuracy (fraction) of the weighted k-NN vote."""
    pred = knn_predict(train_ND, train_labels_N, test_MD, k=k, temperature=temperature, num_classes=num_classes)
    return float((pred == test_labels_M).float().mean())
