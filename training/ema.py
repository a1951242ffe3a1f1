"""The EMA teacher update: t <- m t + (1 - m) s, in place, on local shards.

Student and teacher are sharded identically by FSDP, so the update is elementwise on each
rank's local shards and needs no communication. ``momentum = 1`` leaves the teacher as
it is.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


@torch.no_grad()
def update_ema(teacher: Iterable[torch.Tensor], student: Iterable[torch.Tensor], momentum: float) -> None:
    t = [_local(p) for p in teacher]
    s = [_local(p) for p in student]
    if len(t) != len(s) or any(a.shape != b.shape for a, b in zip(t, s)):
        raise ValueError("teacher and student parameters differ in number or (local) shape")
    if momentum == 1.0:
        return
    torch._foreach_mul_(t, momentum)
    torch._foreach_add_(t, s, alpha=1.0 - momentum)


@torch.no_grad()
def copy_params(teacher: nn.Module, student: nn.Module) -> None:
    """Teacher := student, parameters (local shards) and buffers (e.g. RoPE periods)."""
    for t, s in zip(teacher.parameters(), student.parameters(), strict=True):
        _local(t).copy_(_local(s))
    for t, s in zip(teacher.buffers(), student.buffers(), strict=True):
        t.copy_(s)
