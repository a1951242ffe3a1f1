"""The fused CPU kernels (``models.kernels``, built from ``models/csrc`` by ``infra.native``).

QK-norm + RoPE: the forward equals the eager layers bit for bit (same roundings, op for op);
the backward replays the rotation's roundings and sums RMSNorm's two row reductions in
another order, so its gradients agree to float32 rounding (measured: max |diff| / max |grad|
6e-8 for x, 2e-7 for the weight; the bound below is 50x that). SwiGLU's backward uses its own
exp (a polynomial), so it agrees to a few ulp (measured max |diff| 4e-6 on gradients up to
~30). Every comparison runs the same model or layer with ``HUMANVISION_NATIVE_KERNELS`` on and off.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from models import kernels
from models import layers as L
from models.registry import build_backbone
from models.rope import RopePositionEmbedding

pytestmark = pytest.mark.skipif(
    kernels._library("qk_norm_rope") is None or kernels._library("swiglu_backward") is None,
    reason="no C compiler: the eager layers run (tests/infra/test_native.py covers that)",
)


@pytest.fixture
def native(monkeypatch):
    def switch(on: bool) -> None:
        monkeypatch.setenv(kernels.ENV_SWITCH, "1" if on else "0")

    return switch


def _grads(fn, leaves, g):
    leaves = [t.detach().clone().requires_grad_(True) for t in leaves]
    out = fn(*leaves)
    out.backward(g)
    return out.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("prefix", [0, 9])
@pytest.mark.parametrize("per_sample", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_qk_norm_rope_matches_the_eager_layers(prefix, per_sample, threads, native):
    torch.manual_seed(0)
    B, H, K = 3, 4, 64
    sin, cos = RopePositionEmbedding(K)(4, 3)
    if per_sample:  # masked input: one (1, V, K) table per sample, as _gather_visible makes
        ids = torch.stack([torch.randperm(12)[:5].sort().values for _ in range(B)])
        sin, cos = sin[ids][:, None], cos[ids][:, None]
    N = prefix + sin.shape[-2]
    qkv = torch.randn(B, N, 3 * H * K) * 3  # q is a strided (B, H, N, K) view of it, as in Attention
    weight = torch.rand(K) + 0.5
    g = torch.randn(B, H, N, K)

    def fused(qkv, w):
        q = qkv[..., : H * K].view(B, N, H, K).transpose(1, 2)
        assert kernels.qk_norm_rope_usable(q, w, (sin, cos))
        return kernels.qk_norm_rope(q, w, 1e-6, sin, cos)

    def eager(qkv, w):
        q = qkv[..., : H * K].view(B, N, H, K).transpose(1, 2)
        return L.apply_rope(L._RMSNormCPU.apply(q, w, 1e-6), (sin, cos))  # RMSNorm's CPU path

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out_f, (dx_f, dw_f) = _grads(fused, [qkv, weight], g)
    finally:
        torch.set_num_threads(saved)
    out_e, (dx_e, dw_e) = _grads(eager, [qkv, weight], g)
    assert torch.equal(out_f, out_e)
    assert out_f.is_contiguous()
    for a, b in ((dx_f, dx_e), (dw_f, dw_e)):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max(), ((a - b).abs().max() / b.abs().max()).item()
    native(False)  # the switch: the eager path (Attention checks qk_norm_rope_usable first)
    assert not kernels.qk_norm_rope_usable(qkv[..., : H * K].view(B, N, H, K).transpose(1, 2), weight, (sin, cos))


def test_qk_norm_rope_refuses_what_it_does_not_cover():
    K = 64
    sin, cos = RopePositionEmbedding(K)(4, 3)
    x = torch.randn(2, 4, 12, K)
    w = torch.ones(K)
    assert kernels.qk_norm_rope_usable(x, w, (sin, cos))
    assert not kernels.qk_norm_rope_usable(x.bfloat16(), w, (sin, cos))  # bf16 activations (autocast): eager
    assert not kernels.qk_norm_rope_usable(x, w, (sin.float(), cos.float()))  # fp32 tables (rope_dtype float32): eager
    assert not kernels.qk_norm_rope_usable(x[..., :8, :], w, (sin, cos))  # fewer tokens than the table
    assert not kernels.qk_norm_rope_usable(
        torch.randn(2, 4, 12, 36), torch.ones(36), RopePositionEmbedding(36)(4, 3)
    )  # K % 8
    with pytest.raises(ValueError, match="rope covers"):
        kernels.qk_norm_rope(x[..., :8, :], w, 1e-6, sin, cos)
    with pytest.raises(ValueError, match="per-sample RoPE tables for 3 samples"):
        kernels.qk_norm_rope(
            x,
            w,
            1e-6,
            sin[None, None].expand(3, 1, -1, -1).contiguous(),
            cos[None, None].expand(3, 1, -1, -1).contiguous(),
        )


@pytest.mark.parametrize("threads", [1, 2])
def test_swiglu_backward_matches_autograd(threads, native):
    torch.manual_seed(0)
    h = torch.randn(3, 67, 2 * 96) * 4
    h[0, 0, :4] = torch.tensor([-120.0, 120.0, 0.0, float("nan")])  # exp's clamps, and NaN passes through
    g = torch.randn(3, 67, 96)

    def reference(h):
        a, b = h.chunk(2, dim=-1)
        return F.silu(a) * b

    out_r, (dh_r,) = _grads(reference, [h], g)
    native(True)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out_f, (dh_f,) = _grads(L._SiluMul.apply, [h], g)
    finally:
        torch.set_num_threads(saved)
    torch.testing.assert_close(out_f, out_r, rtol=0, atol=0, equal_nan=True)  # the forward stays eager
    assert torch.equal(dh_f.isnan(), dh_r.isnan()) and dh_f.isnan().any()
    ok = ~dh_r.isnan()
    assert (dh_f - dh_r)[ok].abs().max() <= 1e-5 * dh_r[ok].abs().max()
    native(False)
    _, (dh_e,) = _grads(L._SiluMul.apply, [h], g)
    assert torch.equal(dh_e.nan_to_num(), dh_r.nan_to_num())  # kernels off: autograd's numbers exactly


@pytest.mark.parametrize("masked", [False, True])
def test_a_sapiens2_step_with_kernels_equals_the_eager_step(masked, native):
    """sapiens2_small (GQA in blocks 4-7, QK-norm, 8 storage tokens): same tokens bit for bit;
    gradients close (the kernels' backward rounds a few ulp apart, and bf16 RoPE's backward
    rounding can turn that into one bf16 step on single elements, so the bound is on the whole
    tensor's largest value)."""
    torch.manual_seed(0)
    model = build_backbone("sapiens2_small").train()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    x = torch.randn(2, 3, 128, 96)
    visible = (torch.rand(2, 48).argsort(1).argsort(1) < 12) if masked else None
    runs = {}
    for on in (False, True):
        native(on)
        model.zero_grad()
        tokens = model(x, visible_mask=visible).tokens
        tokens.square().mean().backward()
        runs[on] = tokens.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
    assert torch.equal(runs[True][0], runs[False][0])
    for name, grad in runs[False][1].items():
        diff = (runs[True][1][name] - grad).abs().max()
        assert diff <= 5e-3 * grad.abs().max() + 1e-12, (name, (diff / grad.abs().max()).item())
