"""One optimisation step: forward, a global finiteness check, backward, clipping, AdamW,
EMA teacher and DINO centre updates (the latter two only where the objective has a teacher:
Sapiens v1's MAE has none, and its only loss part is ``loss_mae``).

A non-finite loss (any part, on any rank) or gradient norm raises ``NonFiniteLossError``
on every rank, before the optimiser touches the weights: the step is stopped, never
silently skipped. The loss parts are averaged over ranks in one collective, which also
gives every rank the same verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from training.optim import set_hyperparams
from training.schedules import StepValues


class NonFiniteLossError(RuntimeError):
    """The loss or the gradient norm of a step is NaN or infinite."""


@dataclass
class StepResult:
    values: dict[str, float]
    viz: dict[str, torch.Tensor] = field(default_factory=dict)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def clip_gradients(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Global gradient norm over all shards (then clipped to ``max_norm`` if > 0)."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
    if hasattr(norm, "full_tensor"):  # DTensor: partial norms of the shards -> global norm
        norm = norm.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=True)
    return norm


def train_step(
    arch: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch,
    values: StepValues,
    *,
    step: int,
    clip_grad: float,
    return_viz: bool = False,
) -> StepResult:
    """``step``: the 1-based number of this step (for messages). ``arch`` may be the
    FSDP root or a plain module (single process)."""
    optimizer.zero_grad(set_to_none=True)
    out = arch(
        batch.global_crops, batch.local_crops, batch.masks, teacher_temp=values.teacher_temp, return_viz=return_viz
    )
    inner = arch.module if hasattr(arch, "module") else arch
    names = ("loss", *(f"loss_{part}" for part in out.parts))
    stats = torch.stack([out.loss.detach().float(), *out.parts.values()])
    if _distributed():
        dist.all_reduce(stats)
        stats = stats / dist.get_world_size()
    stats_list = stats.tolist()
    if not all(map(_finite, stats_list)):
        raise NonFiniteLossError(
            f"step {step}: non-finite loss (global mean over ranks) "
            f"{dict(zip(names, stats_list))}; the step was stopped before any update"
        )
    out.loss.backward()
    if values.freeze_last_layer and "dino_head" in inner.student:
        for p in inner.student["dino_head"].last_layer.parameters():
            p.grad = None
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grad_norm = float(clip_gradients(params, clip_grad))
    if not _finite(grad_norm):
        raise NonFiniteLossError(
            f"step {step}: non-finite gradient norm {grad_norm} (loss {stats_list[0]}); "
            "the step was stopped before any update"
        )
    set_hyperparams(optimizer, lr=values.lr, weight_decay=values.weight_decay)
    optimizer.step()
    inner.update_teacher(values.momentum)
    if out.teacher_logits is not None:
        inner.dino_loss.update_center(out.teacher_logits)
    result = dict(zip(names, stats_list))
    result.update(grad_norm=grad_norm, lr=values.lr)
    if out.teacher_logits is not None:
        result.update(momentum=values.momentum, teacher_temp=values.teacher_temp)
    return StepResult(values=result, viz=out.viz)


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")
