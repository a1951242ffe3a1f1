"""Layer-wise learning-rate decay (LLRD) and the fine-tuning schedule.

The reference's rule (``sapiens1_reference.json`` ``finetune.common.layer_decay``, mmpose's
``LayerDecayOptimWrapperConstructor``), for a backbone of ``L`` blocks:

- layer id 0: the embeddings (patch embedding, CLS / mask / storage tokens, position table,
  the 4K tokenizer); ``i + 1``: block ``i``; ``L + 1``: everything else (final norm, head).
- ``lr = base_lr * rate ** (L + 1 - layer_id)``: head x1, block ``i`` x rate^(L - i),
  embeddings x rate^(L + 1).
- weight decay 0 for 1-D parameters, biases and the position table; else the base value.

One AdamW parameter group per (layer id, decay); each group carries its ``lr_scale``, and
``set_step_lr`` sets ``lr = schedule(step) * lr_scale`` (the schedule is a pure function of the
step, so a resumed run needs no scheduler state).

Two recipe options for small data sets (``FinetuneOptim``): ``backbone_lr_scale`` (the
backbone's groups x a factor, the head's lr unchanged) and ``freeze_backbone_steps`` (LP-FT:
the head is fitted on the frozen backbone first, so the backbone's first gradients do not come
from a random head; ``backbone_factor``).
"""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from evaluation.finetune.config import FinetuneOptim

EMBEDDING_NAMES = ("patch_embed", "cls_token", "mask_token", "pos_embed", "storage_tokens", "tokenizer", "rope_embed")
_BLOCK = re.compile(r"^(?:blocks|layers)\.(\d+)\.")


def layer_id(name: str, num_layers: int) -> int:
    """The LLRD layer of parameter ``name`` of a ``backbone`` + ``decode_head`` model."""
    if not name.startswith("backbone."):
        return num_layers + 1
    inner = name.removeprefix("backbone.")
    block = _BLOCK.match(inner)
    if block:
        return int(block.group(1)) + 1
    if inner.split(".")[0] in EMBEDDING_NAMES:
        return 0
    return num_layers + 1


def no_weight_decay(name: str, param: torch.Tensor) -> bool:
    return param.ndim == 1 or name.endswith(".bias") or "pos_embed" in name


def lr_scale(layer: int, num_layers: int, rate: float) -> float:
    return rate ** (num_layers + 1 - layer)


def param_groups(model: nn.Module, num_layers: int, cfg: FinetuneOptim) -> list[dict]:
    groups: dict[tuple[int, bool], dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        key = (layer_id(name, num_layers), no_weight_decay(name, p))
        if key not in groups:
            in_backbone = key[0] <= num_layers
            scale = lr_scale(key[0], num_layers, cfg.layer_decay) * (cfg.backbone_lr_scale if in_backbone else 1.0)
            groups[key] = {
                "params": [],
                "layer_id": key[0],
                "apply_decay": not key[1],
                "weight_decay": 0.0 if key[1] else cfg.weight_decay,
                "lr_scale": scale,
                "backbone": in_backbone,
            }
        groups[key]["params"].append(p)
    return [groups[k] for k in sorted(groups)]


def build_optimizer(model: nn.Module, num_layers: int, cfg: FinetuneOptim) -> torch.optim.AdamW:
    """AdamW over LLRD groups, its state created up front (``training.optim.init_state``: a
    sharded checkpoint needs every parameter's state)."""
    from training.optim import init_state

    groups = param_groups(model, num_layers, cfg)
    for g in groups:
        g["lr"] = cfg.lr * g["lr_scale"]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, foreach=True)
    init_state(optimizer)
    return optimizer


def base_lr(step: int, total: int, cfg: FinetuneOptim) -> float:
    """The head's learning rate at 0-based ``step``: linear warm-up from
    ``warmup_start_factor * lr``, then the decay ``schedule`` over the whole run (as mmengine's
    schedulers, which all start at step 0 and multiply with the warm-up)."""
    warm = 1.0
    if step < cfg.warmup_steps:
        warm = cfg.warmup_start_factor + (1 - cfg.warmup_start_factor) * step / cfg.warmup_steps
    progress = min(step / max(total, 1), 1.0)
    if cfg.schedule == "poly":
        decay = (1 - progress) ** cfg.poly_power
    elif cfg.schedule == "cosine":
        decay = 0.5 * (1 + math.cos(math.pi * progress))
    else:
        decay = cfg.gamma ** sum(progress >= m for m in cfg.milestones)
    return cfg.lr * warm * decay


def backbone_factor(step: int, cfg: FinetuneOptim) -> float:
    """LP-FT: the backbone's lr factor at 0-based ``step``: 0 while frozen, then a linear ramp
    over ``warmup_steps`` (1 throughout when ``freeze_backbone_steps`` is 0)."""
    if cfg.freeze_backbone_steps == 0:
        return 1.0
    if step < cfg.freeze_backbone_steps:
        return 0.0
    return min(1.0, (step - cfg.freeze_backbone_steps + 1) / max(cfg.warmup_steps, 1))


def set_step_lr(optimizer: torch.optim.Optimizer, lr: float, backbone: float = 1.0) -> None:
    """Every group at ``lr`` x its LLRD scale, the backbone's (layers 0..L) also x ``backbone``."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"] * (backbone if group.get("backbone") else 1.0)
