"""Transformer building blocks shared by the Sapiens2 backbone, its 4K tokenizer and the
MAE decoder.

Attribute names follow the official Sapiens2 state-dict layout (``ln1``, ``attn.wq``,
``attn.q_norm``, ``attn.gamma``, ``ffn.w12``, ...), so checkpoints load without renaming.

Shape legend for tensor names: B batch, N tokens, D model width, H query heads,
G key/value heads, K head dim, F FFN hidden width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

Rope = tuple[torch.Tensor, torch.Tensor]
"""(sin, cos), each (..., P, K) for the P position-carrying tokens at the end of a sequence."""


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` that follows its input's dtype.

    Under bf16 autocast the input is bf16 while the weight stays fp32; casting the weight
    keeps the fused kernel and a bf16 output (the reduction is still accumulated in fp32).
    In fp32 it is exactly ``nn.RMSNorm``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight.to(x.dtype), self.eps)


class LayerScale(nn.Module):
    """Per-channel scale of a residual branch; the parameter is named ``weight``."""

    def __init__(self, dim: int, init_value: float) -> None:
        super().__init__()
        self.init_value = init_value
        self.weight = nn.Parameter(torch.empty(dim))
        self.init_weights()

    def init_weights(self) -> None:
        nn.init.constant_(self.weight, self.init_value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight.to(x.dtype)


class SwiGLU(nn.Module):
    """SwiGLU FFN: ``w3(silu(a) * b)`` with ``a, b`` the two halves of ``w12(x)``."""

    def __init__(self, dim: int, hidden_dim: int, *, bias: bool = True) -> None:
        super().__init__()
        self.w12 = nn.Linear(dim, 2 * hidden_dim, bias=bias)
        self.w3 = nn.Linear(hidden_dim, dim, bias=bias)

    def forward(self, x_BND: torch.Tensor) -> torch.Tensor:
        a_BNF, b_BNF = self.w12(x_BND).chunk(2, dim=-1)
        return self.w3(F.silu(a_BNF) * b_BNF)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x_BHNK: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate the last P tokens of ``x`` (P = rope length); leading (prefix) tokens pass.

    As in the official module, the whole of ``x`` (prefix included) is cast to the
    tables' dtype (bf16 by default), rotated there and cast back: parity depends on it.
    """
    sin, cos = rope
    if x_BHNK.shape[-2] < sin.shape[-2]:
        raise ValueError(f"rope covers {sin.shape[-2]} tokens but the sequence has {x_BHNK.shape[-2]}")
    prefix = x_BHNK.shape[-2] - sin.shape[-2]
    x = x_BHNK.to(sin.dtype)
    head, tail = x[..., :prefix, :], x[..., prefix:, :]
    rotated = tail * cos + rotate_half(tail) * sin
    return torch.cat((head, rotated), dim=-2).to(x_BHNK.dtype)


class Attention(nn.Module):
    """Multi-head (G == H) or grouped-query (G < H) self-attention.

    Optional QK-norm (RMSNorm over each head's channels, before RoPE) and LayerScale
    (``gamma``) on the output. Attention itself runs in
    ``F.scaled_dot_product_attention``.
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        num_kv_heads: int,
        qk_norm: bool,
        layerscale_init: float | None,
        norm_eps: float = 1e-6,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if dim % num_heads or num_heads % num_kv_heads:
            raise ValueError(
                f"dim ({dim}) must be divisible by num_heads ({num_heads}) and num_heads by "
                f"num_kv_heads ({num_kv_heads})"
            )
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = dim // num_heads
        kv_dim = num_kv_heads * self.head_dim
        self.wq = nn.Linear(dim, dim, bias=bias)
        self.wk = nn.Linear(dim, kv_dim, bias=bias)
        self.wv = nn.Linear(dim, kv_dim, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, eps=norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps=norm_eps) if qk_norm else None
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.gamma = LayerScale(dim, layerscale_init) if layerscale_init is not None else None

    def forward(
        self,
        x_BND: torch.Tensor,
        rope: Rope | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``attn_mask``: optional SDPA mask broadcastable to (B, H, N, N), True = attend."""
        B, N, D = x_BND.shape
        q_BHNK = self.wq(x_BND).view(B, N, self.num_heads, self.head_dim).transpose(1, 2)
        k_BGNK = self.wk(x_BND).view(B, N, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v_BGNK = self.wv(x_BND).view(B, N, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q_BHNK, k_BGNK = self.q_norm(q_BHNK), self.k_norm(k_BGNK)
        if rope is not None:
            q_BHNK, k_BGNK = apply_rope(q_BHNK, rope), apply_rope(k_BGNK, rope)
        o_BHNK = F.scaled_dot_product_attention(
            q_BHNK,
            k_BGNK,
            v_BGNK,
            attn_mask=attn_mask,
            enable_gqa=self.num_kv_heads != self.num_heads,
        )
        out_BND = self.proj(o_BHNK.transpose(1, 2).reshape(B, N, D))
        return self.gamma(out_BND) if self.gamma is not None else out_BND


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln1(x))`` then ``x + ffn(ln2(x))``.

    LayerScale sits inside ``attn`` only; the FFN branch has none (official layout).
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        num_kv_heads: int,
        ffn_hidden_dim: int,
        qk_norm: bool,
        layerscale_init: float | None,
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.ln1 = RMSNorm(dim, eps=norm_eps)
        self.attn = Attention(
            dim,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            qk_norm=qk_norm,
            layerscale_init=layerscale_init,
            norm_eps=norm_eps,
        )
        self.ln2 = RMSNorm(dim, eps=norm_eps)
        self.ffn = SwiGLU(dim, ffn_hidden_dim)

    def forward(
        self,
        x_BND: torch.Tensor,
        rope: Rope | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x_BND = x_BND + self.attn(self.ln1(x_BND), rope, attn_mask)
        return x_BND + self.ffn(self.ln2(x_BND))


def init_transformer_weights(module: nn.Module, std: float = 0.02) -> None:
    """Truncated-normal linear/conv weights, zero biases, unit norms, LayerScale at its init."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.RMSNorm):
            nn.init.ones_(m.weight)
        elif isinstance(m, LayerScale):
            m.init_weights()
