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


class _RMSNormCPU(torch.autograd.Function):
    """``F.rms_norm`` on CPU fp32: the same forward ops, a shorter hand-written backward.

    On CPU ``F.rms_norm`` is a composite (pow, mean, add, rsqrt, mul, mul) that autograd
    differentiates op by op: about ten passes over the activations plus a saved
    intermediate per op. The forward here runs the same ops, so the output is
    bit-identical; it keeps ``xhat = x * rstd`` and ``rstd`` for ``_rms_norm_backward``
    (about five passes). Gradients match autograd's to float rounding, not bit for bit;
    ``tests/models/test_fused_layers.py`` checks both.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(eps))
        xhat = x * rstd
        ctx.save_for_backward(xhat, weight, rstd)
        return xhat * weight

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        xhat, weight, rstd = ctx.saved_tensors
        grad_x, grad_weight = _rms_norm_backward(g, xhat, weight, rstd, ctx.needs_input_grad[1])
        return grad_x, grad_weight, None


def _rms_norm_backward(g: torch.Tensor, xhat: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
                       weight_grad: bool, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradients of ``y = xhat * weight``, ``xhat = x * rstd``, ``rstd = rsqrt(mean(x^2) + eps)``
    w.r.t. x (into ``out`` when given) and (summed to its shape) the weight:
    ``dx = rstd * (g w - xhat * mean(g xhat w))``, ``dweight = sum(g * xhat)``.

    ``weight`` is (D,) or, for per-head weights, (J, 1, D) against a (B, J, N, D) input.
    ``g * xhat`` is formed once and serves both sums (the second as a matrix-vector product)."""
    g_xhat = g * xhat
    grad_weight = g_xhat.sum_to_size(weight.shape) if weight_grad else None
    w_col = weight.unsqueeze(-1) if weight.dim() == 1 else weight.transpose(-1, -2)
    c = torch.matmul(g_xhat, w_col).mul_(rstd).div_(-xhat.shape[-1])
    g_w = torch.mul(g, weight, out=out) if out is not None else g * weight
    return g_w.mul_(rstd).addcmul_(xhat, c), grad_weight


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` that follows its input's dtype.

    Under bf16 autocast the input is bf16 while the weight stays fp32; casting the weight
    keeps the fused kernel and a bf16 output (the reduction is still accumulated in
    fp32). In fp32 it is exactly ``nn.RMSNorm``; on CPU in fp32 it runs ``_RMSNormCPU``
    (same numbers, fewer passes), elsewhere (CUDA's fused kernel, compiled graphs) ``F.rms_norm``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.device.type == "cpu" and x.dtype == torch.float32 and self.weight is not None
                and len(self.normalized_shape) == 1 and self.eps is not None
                and not torch.compiler.is_compiling()):
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
    so forward and backward are bit-identical to ``F.silu(a) * b``.
    """

    @staticmethod
    def forward(ctx, h_BN2F: torch.Tensor) -> torch.Tensor:
        a_BNF, b_BNF = h_BN2F.chunk(2, dim=-1)
        s_BNF = F.silu(a_BNF)
        ctx.save_for_backward(h_BN2F, s_BNF)
        return s_BNF * b_BNF

    @staticmethod
    def backward(ctx, g_BNF: torch.Tensor) -> torch.Tensor:
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
        h_BN2F = self.w12(x_BND)
        if torch.compiler.is_compiling():  # the compiler fuses these itself
            a_BNF, b_BNF = h_BN2F.chunk(2, dim=-1)
            return self.w3(F.silu(a_BNF) * b_BNF)
        return self.w3(_SiluMul.apply(h_BN2F))


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


class _Rope(torch.autograd.Function):
    """``_rope_reference`` with one output buffer instead of neg/cat/cat/cast copies, and
    a backward that replays autograd's formulas for it (grad cast to the tables' dtype,
    rotated back there, cast to x's dtype): bit-identical outputs and gradients."""

    @staticmethod
    def forward(ctx, x_BHNK: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(sin, cos)
        return _rotate_to(x_BHNK.to(sin.dtype), sin, cos, 1, x_BHNK.dtype)

    @staticmethod
    def backward(ctx, g_BHNK: torch.Tensor):
        sin, cos = ctx.saved_tensors
        return _rotate_to(g_BHNK.to(sin.dtype), sin, cos, -1, g_BHNK.dtype), None, None


class _QKNormRope(torch.autograd.Function):
    """QK-norm then RoPE of q and k in one pass over their (B, N, H + G, K) block of the
    packed q/k/v projection, into one contiguous (B, H + G, N, K) buffer (the layout
    attention reads); q and k are its two head ranges.

    The forward runs ``F.rms_norm``'s ops and the reference rotation's, element by
    element (every rounding to the tables' dtype where the reference has one), so q and
    k are bit-identical to ``apply_rope(q_norm(q))`` and its k twin; it keeps ``xhat``
    and the row scales, not the input. The backward rotates the gradient as the
    reference's autograd does (cast to the tables' dtype), then runs
    ``_rms_norm_backward`` into the projection's layout. Against two norms and two
    rotations: half the calls, no transposed (B, N, H, K) -> (B, H, N, K) norm passes,
    no gradient copy back to the projection's layout.
    ``tests/models/test_fused_layers.py`` checks it against the unfused ops.
    """

    @staticmethod
    def forward(ctx, qk_BNJK: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, sin: torch.Tensor,
                cos: torch.Tensor, eps: float, num_q: int) -> tuple[torch.Tensor, torch.Tensor]:
        B, N, J, K = qk_BNJK.shape
        w_J1K = _head_weights(w_q, w_k, num_q, J)
        x_BJNK = qk_BNJK.transpose(1, 2)
        rstd_BJN1 = torch.rsqrt(x_BJNK.pow(2).mean(-1, keepdim=True).add_(eps))
        xhat_BJNK = torch.mul(x_BJNK, rstd_BJN1, out=qk_BNJK.new_empty((B, J, N, K)))
        # (xhat * w) rounded straight to the tables' dtype, as the reference's cast does.
        y_BJNK = torch.mul(xhat_BJNK, w_J1K, out=qk_BNJK.new_empty((B, J, N, K), dtype=sin.dtype))
        out_BJNK = _rotate_to(y_BJNK, sin, cos, 1, qk_BNJK.dtype)
        ctx.save_for_backward(xhat_BJNK, w_J1K, rstd_BJN1, sin, cos)
        ctx.num_q = num_q
        return out_BJNK[:, :num_q], out_BJNK[:, num_q:]

    @staticmethod
    def backward(ctx, g_q: torch.Tensor, g_k: torch.Tensor):
        xhat_BJNK, w_J1K, rstd_BJN1, sin, cos = ctx.saved_tensors
        H = ctx.num_q
        # The rotation's backward: the grad cast to the tables' dtype (one buffer for q and k).
        g_BJNK = torch.empty(xhat_BJNK.shape, dtype=sin.dtype, device=xhat_BJNK.device)
        g_BJNK[:, :H].copy_(g_q)
        g_BJNK[:, H:].copy_(g_k)
        gy_BJNK = _rotate_to(g_BJNK, sin, cos, -1, xhat_BJNK.dtype)
        # The input grad in the projection's (B, N, H + G, K) layout, so it reaches the q/k/v
        # GEMM's backward without another copy.
        B, J, N, K = xhat_BJNK.shape
        grad_BNJK = xhat_BJNK.new_empty((B, N, J, K))
        _, grad_w_J1K = _rms_norm_backward(gy_BJNK, xhat_BJNK, w_J1K, rstd_BJN1,
                                           ctx.needs_input_grad[1] or ctx.needs_input_grad[2],
                                           out=grad_BNJK.transpose(1, 2))
        grad_wq = grad_wk = None
        if grad_w_J1K is not None:
            grad_wq, grad_wk = grad_w_J1K[:H].sum((0, 1)), grad_w_J1K[H:].sum((0, 1))
        return grad_BNJK, grad_wq, grad_wk, None, None, None, None


def _rotate_to(x_BHNK: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor, sign: int,
               out_dtype: torch.dtype) -> torch.Tensor:
    """``_rope_reference`` (``sign`` 1) or its adjoint (-1) of ``x`` (already in the tables'
    dtype) into a new contiguous ``out_dtype`` tensor: each op rounds in the tables' dtype
    as the reference's does; the last add/sub writes (and casts) into the output."""
    prefix = x_BHNK.shape[-2] - sin.shape[-2]
    out = torch.empty(x_BHNK.shape, dtype=out_dtype, device=x_BHNK.device)
    out[..., :prefix, :] = x_BHNK[..., :prefix, :]
    t1, t2 = x_BHNK[..., prefix:, :].chunk(2, dim=-1)
    s1, s2 = sin.chunk(2, dim=-1)
    r1, r2 = (x_BHNK[..., prefix:, :] * cos).chunk(2, dim=-1)
    o1, o2 = out[..., prefix:, :].chunk(2, dim=-1)
    if sign > 0:
        torch.sub(r1, t2 * s1, out=o1)
        torch.add(r2, t1 * s2, out=o2)
    else:
        torch.add(r1, t2 * s2, out=o1)
        torch.sub(r2, t1 * s1, out=o2)
    return out


def _head_weights(w_q: torch.Tensor, w_k: torch.Tensor, num_q: int, num_heads: int) -> torch.Tensor:
    """Per-head norm weights (J, 1, K): ``w_q`` for the first ``num_q`` heads, ``w_k`` after."""
    K = w_q.shape[-1]
    return torch.cat((w_q.expand(num_q, K), w_k.expand(num_heads - num_q, K)))[:, None]


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
        qkv = self._packed_qkv(x_BND)
        if qkv is None:
            return tuple(lin(x_BND) for lin in (self.wq, self.wk, self.wv))
        return qkv.split([lin.out_features for lin in (self.wq, self.wk, self.wv)], dim=-1)

    def _packed_qkv(self, x_BND: torch.Tensor) -> torch.Tensor | None:
        """(B, N, D + 2 G K): q, k, v side by side; None when only some have a bias."""
        lins = (self.wq, self.wk, self.wv)
        biases = [lin.bias for lin in lins]
        bias = torch.cat(biases) if all(b is not None for b in biases) else None
        if bias is None and any(b is not None for b in biases):
            return None
        return F.linear(x_BND, torch.cat([lin.weight for lin in lins]), bias)

    def forward(
        self,
        x_BND: torch.Tensor,
        rope: Rope | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``attn_mask``: optional SDPA mask broadcastable to (B, H, N, N), True = attend."""
        B, N, D = x_BND.shape
        H, G, K = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self._packed_qkv(x_BND) if self._fused_qk(x_BND, rope) else None
        if qkv is not None:
            qk_BNJ, v_BNG = qkv.split([(H + G) * K, G * K], dim=-1)
            q_BHNK, k_BGNK = _QKNormRope.apply(qk_BNJ.view(B, N, H + G, K), self.q_norm.weight,
                                               self.k_norm.weight, *rope, self.q_norm.eps, H)
        else:
            q_BND, k_BNG, v_BNG = self._qkv(x_BND)
            q_BHNK = q_BND.view(B, N, H, K).transpose(1, 2)
            k_BGNK = k_BNG.view(B, N, G, K).transpose(1, 2)
            if self.q_norm is not None:
                q_BHNK, k_BGNK = self.q_norm(q_BHNK), self.k_norm(k_BGNK)
            if rope is not None:
                q_BHNK, k_BGNK = apply_rope(q_BHNK, rope), apply_rope(k_BGNK, rope)
        v_BGNK = v_BNG.view(B, N, G, K).transpose(1, 2)
        o_BHNK = F.scaled_dot_product_attention(
            q_BHNK,
            k_BGNK,
            v_BGNK,
            attn_mask=attn_mask,
            enable_gqa=G != H,
        )
        out_BND = self.proj(o_BHNK.transpose(1, 2).reshape(B, N, D))
        return self.gamma(out_BND) if self.gamma is not None else out_BND

    def _fused_qk(self, x_BND: torch.Tensor, rope: Rope | None) -> bool:
        """Whether ``_QKNormRope`` runs: CPU fp32 eager, with QK-norm and RoPE."""
        return (rope is not None and self.q_norm is not None and x_BND.device.type == "cpu"
                and x_BND.dtype == torch.float32 and not torch.compiler.is_compiling()
                and rope[0].shape[-2] <= x_BND.shape[1]
                and self.q_norm.weight is not None and self.k_norm.weight is not None
                and self.q_norm.eps is not None and self.q_norm.eps == self.k_norm.eps)


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
