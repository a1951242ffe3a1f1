"""The CPU fast paths of ``models.layers`` compute what their reference formulas do.

Forward outputs must agree bit for bit (or the parity tests' numbers would drift):
``_RMSNormCPU``, ``_QKNormRope``, ``_SiluMul`` and ``_Rope`` run the reference's own ops.
``_SiluMul`` and ``_Rope`` replay autograd's backward formulas too (bit-identical
gradients); ``_RMSNormCPU`` and ``_QKNormRope`` use the closed-form RMSNorm gradient,
which agrees with autograd's to float rounding. The packed q/k/v projection must give
the same q, k, v as three ``nn.Linear`` calls.
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


def assert_same(fast, reference, inputs, grad_tol=None):
    """Outputs bit for bit; gradients too, or to ``grad_tol`` (rtol, atol) when given."""
    out_f, grads_f, g = _fwd_bwd(fast, inputs)
    out_r, grads_r, _ = _fwd_bwd(reference, inputs, g)
    assert torch.equal(out_f, out_r)
    assert len(grads_f) == len(grads_r)
    for a, b in zip(grads_f, grads_r):
        if grad_tol is None:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=grad_tol[0], atol=grad_tol[1])


@pytest.mark.parametrize("transposed", [False, True])
def test_rmsnorm_matches_f_rms_norm(transposed):
    torch.manual_seed(0)
    x = torch.randn(3, 7, 4, 64) * 3
    if transposed:  # the QK-norm case: a (B, H, N, K) view of a (B, N, H, K) tensor
        x = x.transpose(1, 2)
    w = torch.randn(64)
    assert_same(lambda x, w: L._RMSNormCPU.apply(x, w, 1e-6), lambda x, w: F.rms_norm(x, (64,), w, 1e-6), [x, w],
                grad_tol=(1e-5, 1e-5))
    norm = L.RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(w)
    assert torch.equal(norm(x), F.rms_norm(x, (64,), w, 1e-6))


def test_silu_mul_matches_the_two_op_formula_bit_for_bit():
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


def _reference_qk(qk_BNJK, w_q, w_k, sin, cos, num_q):
    """QK-norm then RoPE as the unfused Attention path does it, head range by head range."""
    K = qk_BNJK.shape[-1]
    q = F.rms_norm(qk_BNJK[:, :, :num_q].transpose(1, 2), (K,), w_q, 1e-6)
    k = F.rms_norm(qk_BNJK[:, :, num_q:].transpose(1, 2), (K,), w_k, 1e-6)
    return L._rope_reference(q, sin, cos), L._rope_reference(k, sin, cos)


@pytest.mark.parametrize("table_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize(("num_q", "num_kv", "prefix", "per_sample"),
                         [(4, 4, 9, False), (4, 2, 9, False), (4, 1, 0, False), (4, 2, 3, True)])
def test_fused_qk_norm_rope_matches_norm_then_rope(table_dtype, num_q, num_kv, prefix, per_sample):
    torch.manual_seed(0)
    K, B = 32, 2
    sin, cos = RopePositionEmbedding(K, table_dtype=table_dtype)(4, 3)
    if per_sample:
        ids = torch.stack([torch.randperm(12)[:5].sort().values for _ in range(B)])
        sin, cos = sin[ids][:, None], cos[ids][:, None]
    N = prefix + sin.shape[-2]
    # q and k as a slice of a packed projection, v's columns after them: a strided view
    qkv = torch.randn(B, N, (num_q + 2 * num_kv) * K) * 3
    qk = qkv[..., : (num_q + num_kv) * K].view(B, N, num_q + num_kv, K)
    w_q, w_k = torch.rand(K) + 0.5, torch.rand(K) + 0.5

    def fast(qk, w_q, w_k):
        q, k = L._QKNormRope.apply(qk, w_q, w_k, sin, cos, 1e-6, num_q)
        return torch.cat((q, k), dim=1)

    def reference(qk, w_q, w_k):
        return torch.cat(_reference_qk(qk, w_q, w_k, sin, cos, num_q), dim=1)

    assert_same(fast, reference, [qk, w_q, w_k], grad_tol=(1e-5, 1e-5))


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_attention_fast_path_matches_the_unfused_formula(kv_heads):
    """The whole CPU Attention (packed q/k/v, fused QK-norm + RoPE) against the textbook
    composition of the same parameters: the same outputs bit for bit, gradients to rounding."""
    torch.manual_seed(0)
    H, K, D = 4, 16, 64
    attn = L.Attention(D, num_heads=H, num_kv_heads=kv_heads, qk_norm=True, layerscale_init=0.3)
    with torch.no_grad():
        for p in (attn.q_norm.weight, attn.k_norm.weight, attn.gamma.weight):
            p.copy_(torch.rand_like(p) + 0.5)
    rope = RopePositionEmbedding(K)(3, 4)
    x = torch.randn(2, 5 + 12, D)

    def reference(x):
        B, N, _ = x.shape
        q = F.rms_norm(attn.wq(x).view(B, N, H, K).transpose(1, 2), (K,), attn.q_norm.weight, 1e-6)
        k = F.rms_norm(attn.wk(x).view(B, N, kv_heads, K).transpose(1, 2), (K,), attn.k_norm.weight, 1e-6)
        v = attn.wv(x).view(B, N, kv_heads, K).transpose(1, 2)
        q, k = L._rope_reference(q, *rope), L._rope_reference(k, *rope)
        o = F.scaled_dot_product_attention(q, k, v, enable_gqa=kv_heads != H)
        return attn.proj(o.transpose(1, 2).reshape(B, N, D)) * attn.gamma.weight

    xs = [x.clone().requires_grad_() for _ in range(2)]
    g = torch.randn(2, 17, D)
    outs = []
    for fn, xi in zip((attn, reference), xs):
        attn.zero_grad()
        out = fn(xi) if fn is reference else fn(xi, rope)
        out.backward(g)
        outs.append((out.detach(), xi.grad, {n: p.grad.clone() for n, p in attn.named_parameters()}))
    (out_f, dx_f, dp_f), (out_r, dx_r, dp_r) = outs
    assert torch.equal(out_f, out_r)
    torch.testing.assert_close(dx_f, dx_r, rtol=1e-4, atol=1e-6)
    for name in dp_r:
        torch.testing.assert_close(dp_f[name], dp_r[name], rtol=1e-4, atol=1e-6, msg=name)
