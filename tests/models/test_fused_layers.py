"""The CPU fast paths of ``models.layers`` compute what their reference formulas do.

``_SiluMul`` (with the fused CPU kernels off) and ``_Rope`` replay the reference ops (and autograd's backward formulas for
them) with fewer copies: they agree bit for bit, forward and backward. ``_RMSNormCPU``'s
forward agrees bit for bit with ``F.rms_norm``; its closed-form backward rounds in another
order, so its gradients agree to float32 rounding (a few ulp: max |diff| / max |grad| was
<= 2e-7 over these shapes; the bound below is 50x that). ``linear`` (product, then bias
added in place) equals ``F.linear`` bit for bit for K <= 384 and to 1 ulp beyond. The packed
q/k/v projection must give the same q, k, v as three ``nn.Linear`` calls.
"""

import pytest
import torch
import torch.nn.functional as F

from models import layers as L
from models.rope import RopePositionEmbedding


def _fwd_bwd(fn, inputs, grad=None):
    leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    grad = torch.randn_like(out) if grad is None else grad
    out.backward(grad)
    return out.detach(), [t.grad for t in leaves if t.requires_grad], grad


def assert_same(fast, reference, inputs, grad_rel: float = 0.0):
    """Outputs bit-identical; gradients bit-identical, or within ``grad_rel`` of the largest one."""
    out_f, grads_f, g = _fwd_bwd(fast, inputs)
    out_r, grads_r, _ = _fwd_bwd(reference, inputs, g)
    assert torch.equal(out_f, out_r)
    assert len(grads_f) == len(grads_r)
    for a, b in zip(grads_f, grads_r):
        assert (a - b).abs().max() <= grad_rel * b.abs().max(), (a - b).abs().max() / b.abs().max()


@pytest.mark.parametrize(
    ("shape", "transposed"),
    [((3, 7, 4, 64), False), ((3, 7, 4, 64), True), ((2, 201, 256), False), ((2, 50, 1024), False)],
)
def test_rmsnorm_matches_f_rms_norm(shape, transposed):
    torch.manual_seed(0)
    x = torch.randn(*shape) * 3
    if transposed:  # the QK-norm case: a (B, H, N, K) view of a (B, N, H, K) tensor
        x = x.transpose(1, 2)
    w = torch.randn(shape[-1])
    assert_same(
        lambda x, w: L._RMSNormCPU.apply(x, w, 1e-6),
        lambda x, w: F.rms_norm(x, (shape[-1],), w, 1e-6),
        [x, w],
        grad_rel=1e-5,
    )
    norm = L.RMSNorm(shape[-1], eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(w)
    assert torch.equal(norm(x), F.rms_norm(x, (shape[-1],), w, 1e-6))


@pytest.mark.parametrize(("k", "n"), [(64, 128), (256, 2048), (1024, 256)])
def test_linear_matches_f_linear(k, n):
    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n)
    x = torch.randn(3, 67, k, requires_grad=True)
    y1, y2 = L.linear(x, lin.weight, lin.bias), F.linear(x, lin.weight, lin.bias)
    if k <= 384:
        assert torch.equal(y1, y2)
    torch.testing.assert_close(y1, y2, rtol=1e-6, atol=1e-6)
    g = torch.randn_like(y1)
    grads1 = torch.autograd.grad(y1, (x, lin.weight, lin.bias), g)
    grads2 = torch.autograd.grad(y2, (x, lin.weight, lin.bias), g)
    assert all(torch.equal(a, b) for a, b in zip(grads1, grads2))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # not the fast path: autocast's own linear
        assert L.linear(x, lin.weight, lin.bias).dtype == torch.bfloat16


def test_silu_mul_matches_the_two_op_formula_bit_for_bit(monkeypatch):
    # the eager backward; the fused CPU kernel's (a few ulp apart) is tests/models/test_kernels.py's
    monkeypatch.setenv("HUMANVISION_NATIVE_KERNELS", "0")
    torch.manual_seed(0)
    h = torch.randn(2, 9, 2 * 48) * 4

    def reference(h):
        a, b = h.chunk(2, dim=-1)
        return F.silu(a) * b

    assert_same(L._SiluMul.apply, reference, [h])


@pytest.mark.parametrize("table_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("prefix", [0, 9])
@pytest.mark.parametrize("per_sample", [False, True])
def test_rope_matches_the_reference_formula_bit_for_bit(table_dtype, prefix, per_sample):
    torch.manual_seed(0)
    sin, cos = RopePositionEmbedding(32, table_dtype=table_dtype)(4, 3)
    if per_sample:  # masked input: one (1, V, K) table per sample, as _gather_visible makes
        ids = torch.stack([torch.randperm(12)[:5].sort().values for _ in range(2)])
        sin, cos = sin[ids][:, None], cos[ids][:, None]
    x = torch.randn(2, 3, prefix + sin.shape[-2], 32) * 2
    assert_same(lambda x: L._Rope.apply(x, sin, cos), lambda x: L._rope_reference(x, sin, cos), [x])
    assert torch.equal(L.apply_rope(x, (sin, cos)), L._rope_reference(x, sin, cos))
    with pytest.raises(ValueError, match="rope covers"):
        L.apply_rope(x[..., :2, :], (sin, cos))


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_packed_qkv_projection_equals_three_linears(kv_heads):
    torch.manual_seed(0)
    attn = L.Attention(64, num_heads=4, num_kv_heads=kv_heads, qk_norm=True, layerscale_init=1e-4)
    x = torch.randn(2, 11, 64)
    q, k, v = attn._qkv(x)
    assert torch.equal(q, attn.wq(x)) and torch.equal(k, attn.wk(x)) and torch.equal(v, attn.wv(x))
    # and the gradients agree with three separate products up to the order of the sum
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    sum(t.square().sum() for t in attn._qkv(x1)).backward()
    sum(lin(x2).square().sum() for lin in (attn.wq, attn.wk, attn.wv)).backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-6)
