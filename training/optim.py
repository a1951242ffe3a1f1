"""AdamW over the student's parameters: decay on weight matrices only, fused kernels
where the device has them."""

from __future__ import annotations

import logging

import torch
from torch import nn

from training.config import OptimConfig

log = logging.getLogger(__name__)

NO_DECAY = ("cls_token", "storage_tokens", "mask_token")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices and kernels; none on biases, norms, LayerScale and tokens."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name.split(".")[-1] in NO_DECAY else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay, "apply_decay": True},
        {"params": no_decay, "weight_decay": 0.0, "apply_decay": False},
    ]


def build_optimizer(student: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    groups = param_groups(student, cfg.weight_decay)
    kwargs = dict(lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    optimizer = None
    if cfg.fused:
        try:
            optimizer = torch.optim.AdamW(groups, fused=True, **kwargs)
            init_state(optimizer)  # also proves the fused kernel runs on these tensors
        except (RuntimeError, ValueError) as err:  # no fused kernel for this device / tensor type
            log.warning("fused AdamW unavailable (%s); using the foreach implementation", err)
            optimizer = None
    if optimizer is None:
        optimizer = torch.optim.AdamW(groups, foreach=True, **kwargs)
        init_state(optimizer)
    return optimizer


@torch.no_grad()
def init_state(optimizer: torch.optim.Optimizer) -> None:
    """Create AdamW's state for every parameter now, equal to a fresh state.

    AdamW creates a parameter's state at its first gradient, and the DINO head's last
    layer gets none while it is frozen: a checkpoint from that phase would lack its
    state, which a sharded load requires. One step with zero gradients at lr 0 (no
    update, no decay) creates zero moments; resetting the step counters to 0 then makes
    the state indistinguishable from a lazily created one.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for p in params:
        p.grad = torch.zeros_like(p)
    lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    for state in optimizer.state.values():
        if torch.is_tensor(state.get("step")):
            state["step"].zero_()
        elif "step" in state:
            state["step"] = 0


def set_hyperparams(optimizer: torch.optim.Optimizer, *, lr: float, weight_decay: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
        group["weight_decay"] = weight_decay if group.get("apply_decay", True) else 0.0
