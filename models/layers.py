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

from models.kernels import qk_norm_rope, qk_norm_rope_usable, rms_rstd, swiglu_backward, swiglu_usable

Rope = tuple[torch.Tensor, torch.Tensor]
"""(sin, cos), each (..., P, K) for the P position-carrying tokens at the end of a sequence."""


class _RMSNormCPU(torch.autograd.Function):
    """``F.rms_norm`` on CPU fp32 in fewer passes over the activations, with a hand-written backward.

    On CPU ``F.rms_norm`` is a composite (pow, mean, add, rsqrt, mul, mul) that autograd
    differentiates op by op: about ten passes over the activations plus a saved
    intermediate per op. Here the sum of squares is one fused reduction
    (``linalg.vecdot(x, x)``: one read, no ``x**2`` written), and the backward is the closed
    form ``dx = rstd * (g w) - x * rstd^3 * <g w, x> / D``, ``dw = sum_rows(g * x * rstd)``
    with its row dot product fused the same way. Measured on sapiens2_small's shapes (1
    thread): fwd+bwd 1.0 ms against 1.3-1.6 ms for the op-by-op replay this replaced.
    Rounding: the forward matched ``F.rms_norm`` bit for bit on every shape tried; the
    gradients differ from autograd's op order by a few ulp.
    ``tests/models/test_fused_layers.py`` checks both against ``F.rms_norm``.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = rms_rstd(x, eps)
        ctx.save_for_backward(x, weight, rstd)
        return torch.mul(x, rstd).mul_(weight)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        grad_weight = (g * x).mul_(rstd).sum_to_size(weight.shape) if ctx.needs_input_grad[1] else None
        g_xhat = g * weight
        coef = torch.linalg.vecdot(g_xhat, x).unsqueeze_(-1).mul_(rstd.pow(3)).div_(-x.shape[-1])
        grad_x = g_xhat.mul_(rstd).addcmul_(x, coef)
        return grad_x, grad_weight, None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; on CPU in fp32 eager mode a matrix product then an in-place bias add.

    ``F.linear`` with a bias is ``addmm``, which on CPU first copies the bias, broadcast,
    into the whole output and then runs the GEMM with beta = 1: for SwiGLU's wide ``w12``
    output that copy alone was ~16 ms of sapiens2_small's ~760 ms step (profile, 1 thread).
    ``matmul`` + ``add_`` writes the product once and adds the bias in one vectorised pass.
    Same autograd (the product's backward does not need its output). Rounding: bit-identical
    to ``F.linear`` where the GEMM does not split the reduction (K <= 384 here); for larger K
    the bias joins the sum at a different point (<= 1 ulp, measured at K = 1024).
    """
    if (
        bias is None
        or x.device.type != "cpu"
        or x.dtype != torch.float32
        or weight.dtype != torch.float32
        or torch.is_autocast_enabled("cpu")
        or torch.compiler.is_compiling()
    ):
        return F.linear(x, weight, bias)
    return torch.matmul(x, weight.t()).add_(bias)


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` that follows its input's dtype.

    Under bf16 autocast the input is bf16 while the weight stays fp32; casting the weight
    keeps the fused kernel and a bf16 output (the reduction is still accumulated in
    fp32). In fp32 it is exactly ``nn.RMSNorm``; on CPU in fp32 it runs ``_RMSNormCPU``
    (same numbers, fewer passes), elsewhere (CUDA's fused kernel, compiled graphs) ``F.rms_norm``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            x.device.type == "cpu"
            and x.dtype == torch.float32
            and self.weight is not None
            and len(self.normalized_shape) == 1
            and self.eps is not None
            and not torch.compiler.is_compiling()
        ):
            return _RMSNormCPU.apply(x, self.weight, self.eps)
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


class _SiluMul(torch.autograd.Function):
    """``silu(a) * b`` for ``a, b = h.chunk(2, -1)``, with the gradient of ``h`` written in place.

    Autograd's version computes the two half-gradients separately and then concatenates
    them (a copy of the whole hidden activation); here they are written straight into
    their halves of one buffer. Same formulas (``silu_backward(g * b, a)``, ``g * silu(a)``),
    so forward and backward are bit-identical to ``F.silu(a) * b``. On CPU in fp32 the
    backward is one fused pass where the kernel builds (``models.kernels.swiglu_backward``:
    a few ulp from autograd's), and ``silu(a)`` is then not kept for it.
    """

    @staticmethod
    def forward(ctx, h_BN2F: torch.Tensor) -> torch.Tensor:
        a_BNF, b_BNF = h_BN2F.chunk(2, dim=-1)
        s_BNF = F.silu(a_BNF)
        ctx.fused = swiglu_usable(h_BN2F)
        ctx.save_for_backward(h_BN2F, *(() if ctx.fused else (s_BNF,)))
        return s_BNF * b_BNF

    @staticmethod
    def backward(ctx, g_BNF: torch.Tensor) -> torch.Tensor:
        if ctx.fused:
            (h_BN2F,) = ctx.saved_tensors
            return swiglu_backward(g_BNF, h_BN2F)
        h_BN2F, s_BNF = ctx.saved_tensors
        a_BNF, b_BNF = h_BN2F.chunk(2, dim=-1)
        grad_BN2F = torch.empty_like(h_BN2F)
        grad_a, grad_b = grad_BN2F.chunk(2, dim=-1)
        torch.ops.aten.silu_backward.grad_input(g_BNF * b_BNF, a_BNF, grad_input=grad_a)
        torch.mul(g_BNF, s_BNF, out=grad_b)
        return grad_BN2F


class SwiGLU(nn.Module):
    """SwiGLU FFN: ``w3(silu(a) * b)`` with ``a, b`` the two halves of ``w12(x)``."""

    def __init__(self, dim: int, hidden_dim: int, *, bias: bool = True) -> None:
        super().__init__()
        self.w12 = nn.Linear(dim, 2 * hidden_dim, bias=bias)
        self.w3 = nn.Linear(hidden_dim, dim, bias=bias)

    def forward(self, x_BND: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # the compiler fuses these itself
            a_BNF, b_BNF = self.w12(x_BND).chunk(2, dim=-1)
            return self.w3(F.silu(a_BNF) * b_BNF)
        h_BNF = _SiluMul.apply(linear(x_BND, self.w12.weight, self.w12.bias))
        return linear(h_BNF, self.w3.weight, self.w3.bias)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x_BHNK: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate the last P tokens of ``x`` (P = rope length); leading (prefix) tokens pass.

    As in the official module, the whole of ``x`` (prefix included) is cast to the
    tables' dtype (bf16 by default), rotated there and cast back: parity depends on it.
    The reference formula is ``tail * cos + rotate_half(tail) * sin`` then
    ``cat((head, rotated))``; ``_Rope`` computes the same numbers with fewer copies.
    """
    sin, cos = rope
    if x_BHNK.shape[-2] < sin.shape[-2]:
        raise ValueError(f"rope covers {sin.shape[-2]} tokens but the sequence has {x_BHNK.shape[-2]}")
    if torch.compiler.is_compiling():  # the compiler fuses the reference formula itself
        return _rope_reference(x_BHNK, sin, cos)
    return _Rope.apply(x_BHNK, sin, cos)


def _rope_reference(x_BHNK: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    prefix = x_BHNK.shape[-2] - sin.shape[-2]
    x = x_BHNK.to(sin.dtype)
    head, tail = x[..., :prefix, :], x[..., prefix:, :]
    rotated = tail * cos + rotate_half(tail) * sin
    return torch.cat((head, rotated), dim=-2).to(x_BHNK.dtype)


def _rotate_into(out: torch.Tensor, t: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor, sign: int) -> None:
    """``out = t * cos + rotate_half(t) * sin`` (``sign`` 1), or its transpose (``sign`` -1:
    the backward, ``rotate_half``'s adjoint being ``cat(x2, -x1)``), op by op in ``t``'s
    dtype with the reference's roundings: ``(-a) * b == -(a * b)`` and ``c + (-d) == c - d``
    exactly in IEEE arithmetic, so no negated copy or concatenation is needed."""
    t1, t2 = t.chunk(2, dim=-1)
    s1, s2 = sin.chunk(2, dim=-1)
    r = t * cos
    r1, r2 = r.chunk(2, dim=-1)
    if sign > 0:
        r1.sub_(t2 * s1)
        r2.add_(t1 * s2)
    else:
        r1.add_(t2 * s2)
        r2.sub_(t1 * s1)
    out.copy_(r)


class _Rope(torch.autograd.Function):
    """``_rope_reference`` with one output buffer instead of neg/cat/cat/cast copies, and
    a backward that replays autograd's formulas for it (grad cast to the tables' dtype,
    rotated back there, cast to x's dtype): bit-identical outputs and gradients."""

    @staticmethod
    def forward(ctx, x_BHNK: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(sin, cos)
        return _Rope._rotate(x_BHNK, sin, cos, 1)

    @staticmethod
    def backward(ctx, g_BHNK: torch.Tensor):
        sin, cos = ctx.saved_tensors
        return _Rope._rotate(g_BHNK, sin, cos, -1), None, None

    @staticmethod
    def _rotate(x_BHNK: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor, sign: int) -> torch.Tensor:
        prefix = x_BHNK.shape[-2] - sin.shape[-2]
        x = x_BHNK.to(sin.dtype)
        out = torch.empty(x_BHNK.shape, dtype=x_BHNK.dtype, device=x_BHNK.device)
        out[..., :prefix, :] = x[..., :prefix, :]  # rounded through the tables' dtype, as in the reference
        _rotate_into(out[..., prefix:, :], x[..., prefix:, :], sin, cos, sign)
        return out


class Attention(nn.Module):
    """Multi-head (G == H) or grouped-query (G < H) self-attention.

    Optional QK-norm (RMSNorm over each head's channels, before RoPE) and LayerScale
    (``gamma``) on the output. Attention itself runs in
    ``F.scaled_dot_product_attention`` so the fused kernels are used where available.
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

    def _qkv(self, x_BND: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v projections as one matrix product over the concatenated weights.

        One (D -> D + 2 G K) GEMM instead of three narrower ones (the parameters stay
        ``wq``/``wk``/``wv``, official layout). Each output column is still the same dot
        product, so q, k and v are bit-identical to three ``nn.Linear`` calls with MKL
        (checked by the parity tests); the input gradient is one product over all three,
        which rounds differently from the sum of three.
        """
        lins = (self.wq, self.wk, self.wv)
        biases = [lin.bias for lin in lins]
        bias = torch.cat(biases) if all(b is not None for b in biases) else None
        if bias is None and any(b is not None for b in biases):
            return tuple(lin(x_BND) for lin in lins)
        qkv = linear(x_BND, torch.cat([lin.weight for lin in lins]), bias)
        return qkv.split([lin.out_features for lin in lins], dim=-1)

    def forward(
        self,
        x_BND: torch.Tensor,
        rope: Rope | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``attn_mask``: optional SDPA mask broadcastable to (B, H, N, N), True = attend."""
        B, N, D = x_BND.shape
        q_BND, k_BNG, v_BNG = self._qkv(x_BND)
        q_BHNK = q_BND.view(B, N, self.num_heads, self.head_dim).transpose(1, 2)
        k_BGNK = k_BNG.view(B, N, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v_BGNK = v_BNG.view(B, N, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if (
            self.q_norm is not None
            and rope is not None
            and self.q_norm.eps is not None
            and self.k_norm.eps is not None
            and qk_norm_rope_usable(q_BHNK, self.q_norm.weight, rope)
        ):
            # One fused pass each way for q and for k (models.kernels): same forward bits.
            q_BHNK = qk_norm_rope(q_BHNK, self.q_norm.weight, self.q_norm.eps, *rope)
            k_BGNK = qk_norm_rope(k_BGNK, self.k_norm.weight, self.k_norm.eps, *rope)
        else:
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
        out_BND = linear(o_BHNK.transpose(1, 2).reshape(B, N, D), self.proj.weight, self.proj.bias)
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
