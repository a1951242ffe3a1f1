"""Per-step schedules, pure functions of the step index (so a resumed run needs no
scheduler state): learning rate (linear warm-up, then cosine), teacher momentum
(cosine towards 1) and teacher temperature (linear warm-up). ``step`` counts from 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from training.config import PretrainConfig, TrainConfig


def cosine(step: int, total: int, start: float, end: float) -> float:
    """``start`` at step 0, ``end`` at step ``total`` (and after), half a cosine between."""
    if total <= 0 or step >= total:
        return end
    return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * step / total))


def warmup_cosine(step: int, *, total: int, warmup: int, peak: float, final: float) -> float:
    """Linear from ``peak / warmup`` (step 0) to ``peak`` (step ``warmup - 1``), then a
    cosine from ``peak`` down to ``final`` at the last step."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return cosine(step - warmup, max(1, total - warmup - 1), peak, final)


def linear_warmup(step: int, *, warmup: int, start: float, end: float) -> float:
    if warmup <= 0 or step >= warmup:
        return end
    return start + (end - start) * step / warmup


@dataclass(frozen=True)
class StepValues:
    lr: float
    weight_decay: float
    momentum: float
    teacher_temp: float
    freeze_last_layer: bool


def values_at(cfg: TrainConfig, step: int) -> StepValues:
    o = cfg.optim
    lr = warmup_cosine(step, total=cfg.steps, warmup=o.warmup_steps, peak=o.lr, final=o.min_lr)
    if not isinstance(cfg, PretrainConfig):  # distillation: a frozen teacher (no EMA), no temperatures
        return StepValues(lr=lr, weight_decay=o.weight_decay, momentum=1.0, teacher_temp=0.0, freeze_last_layer=False)
    t, loss = cfg.teacher, cfg.loss
    return StepValues(
        lr=lr,
        weight_decay=o.weight_decay,
        momentum=cosine(step, cfg.steps - 1, t.momentum, t.final_momentum),
        teacher_temp=linear_warmup(
            step, warmup=loss.teacher_temp_warmup_steps, start=loss.warmup_teacher_temp, end=loss.teacher_temp
        ),
        freeze_last_layer=step < loss.freeze_last_layer_steps,
    )
