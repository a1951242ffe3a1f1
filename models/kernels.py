"""Fused CPU kernels, built from ``csrc/`` by ``infra.native``: the attention's QK-norm + RoPE
(``csrc/qk_norm_rope.c``, below) and the SwiGLU gate's backward (``csrc/swiglu_backward.c``,
``swiglu_backward``: one pass instead of three ops, a few ulp from autograd's).

Why: on CPU in fp32, QK-norm (RMSNorm over each head's channels) followed by RoPE in bf16 is
~20 eager operations per block on q and on k, forward and backward, each a pass over the
activations with bf16 conversions on both ends. Measured on sapiens2_small's step (256x192,
batch 4, 1 thread, 2026-12-01): removing both from the step saves 10% of its time, more than
the whole gap to a plain ``nn.TransformerEncoder`` per FLOP. The kernel does each direction in
one pass over q (or k), with the same roundings as the eager layers, so the forward is bit-identical
(``tests/models/test_kernels.py``); the backward's two row reductions (RMSNorm's) are summed in
another order, a few ulp from the eager backward.

Used by ``models.layers.Attention`` on CPU fp32 eager forward passes with bf16 RoPE tables, when
the library builds; otherwise (no C compiler, other dtypes, CUDA, ``torch.compile``) the eager
layers run and say nothing beyond one warning when a build fails. ``HUMANVISION_NATIVE_KERNELS=0``
turns both kernels off (to compare, or to rule them out).
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
ENV_SWITCH = "HUMANVISION_NATIVE_KERNELS"

_i64, _f32p, _u16p, _f64p = (
    ctypes.c_int64,
    ctypes.POINTER(ctypes.c_float),
    ctypes.POINTER(ctypes.c_uint16),
    ctypes.POINTER(ctypes.c_double),
)
_state: dict[str, object] = {}


def _declare_qk(lib: ctypes.CDLL) -> None:
    lib.hv_qk_norm_rope_fwd.restype = None
    lib.hv_qk_norm_rope_fwd.argtypes = [
        _f32p,
        *[_i64] * 7,
        _f32p,
        *[_i64] * 3,
        _f32p,
        _u16p,
        _u16p,
        _i64,
        _i64,
        _f32p,
        ctypes.c_int,
    ]
    lib.hv_qk_norm_rope_bwd.restype = None
    lib.hv_qk_norm_rope_bwd.argtypes = [
        _f32p,
        *[_i64] * 3,
        _f32p,
        *[_i64] * 7,
        _f32p,
        *[_i64] * 3,
        _f32p,
        _u16p,
        _u16p,
        _i64,
        _i64,
        _f32p,
        _f64p,
        ctypes.c_int,
    ]
    lib.hv_qk_norm_rope_max_k.restype = ctypes.c_int
    _state["max_k"] = lib.hv_qk_norm_rope_max_k()


def _declare_swiglu(lib: ctypes.CDLL) -> None:
    lib.hv_swiglu_bwd.restype = None
    lib.hv_swiglu_bwd.argtypes = [_f32p, _i64, _f32p, _i64, _f32p, _i64, _i64, _i64, ctypes.c_int]


_SOURCES = {"qk_norm_rope": _declare_qk, "swiglu_backward": _declare_swiglu}


def _library(name: str) -> ctypes.CDLL | None:
    """The built kernel library ``csrc/<name>.c``, or None where it cannot be built (warned once per process)."""
    if name not in _state:
        from infra.native import NativeBuildError, load_library

        try:
            lib = load_library(CSRC / f"{name}.c")
            _SOURCES[name](lib)
        except NativeBuildError as exc:
            log.warning("fused CPU kernel %s unavailable, the eager layers run instead: %s", name, exc)
            lib = None
        _state[name] = lib
    return _state[name]  # type: ignore[return-value]


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


def available() -> bool:
    """Switched on and every kernel built (builds them on first call)."""
    return enabled() and all(_library(name) is not None for name in _SOURCES)


def _ptr(t: torch.Tensor, kind):
    return ctypes.cast(t.data_ptr(), kind)


def _tables(sin: torch.Tensor, cos: torch.Tensor, P: int, K: int) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """(sin, cos) as (P, K) shared or (B, 1, P, K) per sample, each (P, K) slab contiguous."""
    if sin.shape != cos.shape or sin.stride() != cos.stride() or sin.shape[-2:] != (P, K):
        return None
    if sin.stride()[-2:] != (K, 1):
        return None
    if sin.dim() == 2:
        return sin, cos, 0
    if sin.dim() == 4 and sin.shape[1] == 1:
        return sin, cos, sin.stride(0)
    return None


def qk_norm_rope_usable(x_BJNK: torch.Tensor, weight: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """Whether ``qk_norm_rope`` runs the kernel for these inputs (see the module docstring)."""
    K = x_BJNK.shape[-1]
    sin, cos = rope
    return (
        enabled()
        and x_BJNK.device.type == "cpu"
        and x_BJNK.dtype == torch.float32
        and x_BJNK.dim() == 4
        and x_BJNK.stride(-1) == 1
        and weight.dtype == torch.float32
        and weight.shape == (K,)
        and weight.is_contiguous()
        and sin.dtype == torch.bfloat16
        and cos.dtype == torch.bfloat16
        and K % 8 == 0
        and x_BJNK.shape[-2] >= sin.shape[-2]
        and _tables(sin, cos, sin.shape[-2], K) is not None
        and (sin.dim() == 2 or sin.shape[0] == x_BJNK.shape[0])
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and _library("qk_norm_rope") is not None
        and K <= int(_state["max_k"])
    )


def rms_rstd(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``1 / sqrt(mean(x^2, -1) + eps)``, (..., 1): the eager RMSNorm's exact reduction and roundings."""
    mean_sq = torch.linalg.vecdot(x, x).unsqueeze_(-1).div_(x.shape[-1])
    return torch.rsqrt(mean_sq.add_(eps))


class _QKNormRope(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x_BJNK: torch.Tensor, weight: torch.Tensor, eps: float, sin: torch.Tensor, cos: torch.Tensor
    ) -> torch.Tensor:
        B, J, N, K = x_BJNK.shape
        sin, cos, stb = _tables(sin, cos, sin.shape[-2], K)
        rstd_BJN1 = rms_rstd(x_BJNK, eps)
        out = torch.empty((B, J, N, K), dtype=torch.float32)
        sx, sr = x_BJNK.stride(), rstd_BJN1.stride()
        _state["qk_norm_rope"].hv_qk_norm_rope_fwd(
            _ptr(x_BJNK, _f32p),
            B,
            J,
            N,
            K,
            sx[0],
            sx[1],
            sx[2],
            _ptr(rstd_BJN1, _f32p),
            sr[0],
            sr[1],
            sr[2],
            _ptr(weight, _f32p),
            _ptr(sin, _u16p),
            _ptr(cos, _u16p),
            sin.shape[-2],
            stb,
            _ptr(out, _f32p),
            torch.get_num_threads(),
        )
        ctx.save_for_backward(x_BJNK, weight, rstd_BJN1, sin, cos)
        ctx.stb = stb
        return out

    @staticmethod
    def backward(ctx, g_BJNK: torch.Tensor):
        x_BJNK, weight, rstd_BJN1, sin, cos = ctx.saved_tensors
        B, J, N, K = x_BJNK.shape
        if g_BJNK.stride(-1) != 1:
            g_BJNK = g_BJNK.contiguous()
        threads = torch.get_num_threads()
        grad_x = torch.empty((B, J, N, K), dtype=torch.float32)
        partial_w = torch.zeros((threads, K), dtype=torch.float64)
        sg, sx, sr = g_BJNK.stride(), x_BJNK.stride(), rstd_BJN1.stride()
        _state["qk_norm_rope"].hv_qk_norm_rope_bwd(
            _ptr(g_BJNK, _f32p),
            sg[0],
            sg[1],
            sg[2],
            _ptr(x_BJNK, _f32p),
            B,
            J,
            N,
            K,
            sx[0],
            sx[1],
            sx[2],
            _ptr(rstd_BJN1, _f32p),
            sr[0],
            sr[1],
            sr[2],
            _ptr(weight, _f32p),
            _ptr(sin, _u16p),
            _ptr(cos, _u16p),
            sin.shape[-2],
            ctx.stb,
            _ptr(grad_x, _f32p),
            _ptr(partial_w, _f64p),
            threads,
        )
        grad_w = partial_w.sum(0).to(torch.float32) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None, None, None


def qk_norm_rope(
    x_BJNK: torch.Tensor, weight: torch.Tensor, eps: float, sin: torch.Tensor, cos: torch.Tensor
) -> torch.Tensor:
    """RMSNorm over the last dim (``weight``, ``eps``) then RoPE on the last P tokens, fused.

    ``x``: (B, J, N, K) fp32 on CPU, channels contiguous (any other strides); tables (P, K) or
    (B, 1, P, K) bf16. Call only where ``qk_norm_rope_usable`` holds. Returns a contiguous (B, J, N, K)."""
    if _library("qk_norm_rope") is None:
        raise RuntimeError(
            "the fused QK-norm + RoPE kernel did not build (see the warning above); check qk_norm_rope_usable() first"
        )
    if _tables(sin, cos, sin.shape[-2], x_BJNK.shape[-1]) is None:
        raise ValueError(
            f"RoPE tables must be (P, K) or (B, 1, P, K) with contiguous rows; got {tuple(sin.shape)} "
            f"strides {sin.stride()}"
        )
    if sin.dim() == 4 and sin.shape[0] != x_BJNK.shape[0]:
        raise ValueError(f"per-sample RoPE tables for {sin.shape[0]} samples, but the batch has {x_BJNK.shape[0]}")
    if x_BJNK.shape[-2] < sin.shape[-2]:
        raise ValueError(f"rope covers {sin.shape[-2]} tokens but the sequence has {x_BJNK.shape[-2]}")
    return _QKNormRope.apply(x_BJNK, weight, eps, sin, cos)


def swiglu_usable(h: torch.Tensor) -> bool:
    """Whether ``swiglu_backward`` runs the kernel for this (..., 2F) input of the gate."""
    return (
        enabled()
        and h.device.type == "cpu"
        and h.dtype == torch.float32
        and h.stride(-1) == 1
        and h.shape[-1] % 2 == 0
        and not torch.compiler.is_compiling()
        and _library("swiglu_backward") is not None
    )


def swiglu_backward(g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Gradient of ``silu(a) * b`` (``a, b = h.chunk(2, -1)``) with respect to ``h``, given the output's ``g``.

    One pass (``csrc/swiglu_backward.c``); a few ulp from autograd's. ``h``'s rows must be
    contiguous; returns a contiguous tensor of ``h``'s shape."""
    if _library("swiglu_backward") is None:
        raise RuntimeError("the fused SwiGLU backward kernel did not build (see the warning above)")
    F = h.shape[-1] // 2
    h2 = h.reshape(-1, 2 * F) if h.is_contiguous() else h.contiguous().view(-1, 2 * F)
    g2 = g.reshape(-1, F)
    if g2.stride(-1) != 1:
        g2 = g2.contiguous()
    dh = torch.empty(h2.shape, dtype=torch.float32)
    _state["swiglu_backward"].hv_swiglu_bwd(
        _ptr(g2, _f32p),
        g2.stride(0),
        _ptr(h2, _f32p),
        h2.stride(0),
        _ptr(dh, _f32p),
        dh.stride(0),
        h2.shape[0],
        F,
        torch.get_num_threads(),
    )
    return dh.view(h.shape)
