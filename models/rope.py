"""2-D rotary position embedding for patch grids (DINOv3 style).

A head of K channels uses K/4 periods: the angles are [row x periods, column x periods]
(K/2 values), tiled twice to pair channel i with channel i + K/2 (rotate-half). Coordinates are patch centres normalised to
[-1, 1] separately on each axis, so any grid size works and no position table is learnt.

The official module holds ``periods`` in bf16 and computes the sin/cos tables in bf16;
``table_dtype`` reproduces that; parity needs it (``tests/models/test_sapiens2_parity.py``
checks that fp32 tables miss the reference outputs).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.layers import Rope

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(_DTYPES)}")
    return _DTYPES[name]


class RopePositionEmbedding(nn.Module):
    """Produces (sin, cos) tables of shape (h*w, K) for an h x w grid, row-major."""

    def __init__(self, head_dim: int, *, base: float = 100.0, table_dtype: str = "bfloat16") -> None:
        super().__init__()
        if head_dim % 4:
            raise ValueError(f"2-D RoPE needs a head dim divisible by 4, got {head_dim}")
        self.head_dim = head_dim
        self.base = base
        self.table_dtype = resolve_dtype(table_dtype)
        # Persistent: the official checkpoints carry it as `rope_embed.periods`.
        self.register_buffer("periods", torch.empty(head_dim // 4), persistent=True)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        exponents = torch.arange(self.head_dim // 4, device=self.periods.device, dtype=self.table_dtype)
        periods = self.base ** (2 * exponents / (self.head_dim // 2))
        self.periods.copy_(periods)

    def forward(self, h: int, w: int) -> Rope:
        # Always compute in table_dtype, whatever dtype a `.to()` gave the buffer.
        dd = {"device": self.periods.device, "dtype": self.table_dtype}
        coords_h = torch.arange(0.5, h, **dd) / h
        coords_w = torch.arange(0.5, w, **dd) / w
        coords_P2 = torch.stack(torch.meshgrid(coords_h, coords_w, indexing="ij"), dim=-1).flatten(0, 1)
        coords_P2 = 2.0 * coords_P2 - 1.0
        angles = 2 * math.pi * coords_P2[:, :, None] / self.periods.to(self.table_dtype)[None, None, :]
        angles_PK = angles.flatten(1, 2).tile(2)
        return torch.sin(angles_PK), torch.cos(angles_PK)
