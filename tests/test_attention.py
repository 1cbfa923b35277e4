"""The fused attention node behind ``ops.scaled_dot_product_attention`` (ops/attention.py):
which cases take it (one ``_AttentionBackward`` node) and which the unfused path, and
forward / gradients vs torch on what the common tests of SDPA do not cover (boolean
masks with batch dims, head-split views read in place, empty and size-1 dims, float32
vs a float64 evaluation, in-place use of the output)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ortcpu_torch import ops


def _qkv(shape_q, shape_kv, ev=None, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape_q, dtype=dtype, generator=g)
    k = torch.randn(*shape_kv, dtype=dtype, generator=g)
    v = torch.randn(*shape_kv[:-1], ev or shape_kv[-1], dtype=dtype, generator=g)
    return q, k, v


def _node(y) -> str:
    return type(y.grad_fn).__name__


def _check(q, k, v, rtol=1e-10, atol=1e-12, **kw):
    a = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    b = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    y = ops.scaled_dot_product_attention(*a, **kw)
    y_r = F.scaled_dot_product_attention(*b, **kw)
    torch.testing.assert_close(y, y_r, rtol=rtol, atol=atol)
    dy = torch.randn_like(y_r)
    y.backward(dy)
    y_r.backward(dy)
    for p, r in zip(a, b, strict=True):
        torch.testing.assert_close(p.grad, r.grad, rtol=10 * rtol, atol=10 * atol)
    return y


@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"scale": 0.25},
                                {"attn_mask": "bool2d"}, {"attn_mask": "bool4d"},
                                {"attn_mask": "float"}])
def test_fused_node_taken_and_matches_torch(kw):
    q, k, v = _qkv((2, 3, 6, 4), (2, 3, 6, 4), ev=5)
    g = torch.Generator().manual_seed(3)
    if kw.get("attn_mask") == "bool2d":
        kw = {"attn_mask": torch.rand(6, 6, generator=g) > 0.3}
        kw["attn_mask"][:, 0] = True  # no fully masked row (torch's kernels differ there)
    elif kw.get("attn_mask") == "bool4d":
        m = torch.rand(2, 1, 6, 6, generator=g) > 0.4
        m[..., 0] = True
        kw = {"attn_mask": m}
    elif kw.get("attn_mask") == "float":
        kw = {"attn_mask": torch.randn(2, 3, 6, 6, dtype=torch.float64, generator=g)}
    y = _check(q, k, v, **kw)
    assert _node(y) == "_AttentionBackward"
    assert torch.autograd.gradcheck(lambda *t: ops.scaled_dot_product_attention(*t, **kw),
                                    [t.requires_grad_(True) for t in (q, k, v)])


def test_head_split_views_as_transformers_pass_them_float32():
    """[B, L, H, E] projections viewed as [B, H, L, E] (not contiguous): read in place;
    float32 against a float64 evaluation."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 16, 3 * 4 * 8, generator=g)
    q, k, v = (t.view(3, 16, 4, 8).transpose(1, 2) for t in x.split(32, dim=-1))
    assert not q.is_contiguous()
    for causal in (False, True):
        y = ops.scaled_dot_product_attention(q, k, v, is_causal=causal)
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                             is_causal=causal)
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=2e-6)
        xr = x.clone().requires_grad_(True)
        qr, kr, vr = (t.view(3, 16, 4, 8).transpose(1, 2) for t in xr.split(32, dim=-1))
        out = ops.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
        assert _node(out) == "_AttentionBackward"
        dy = torch.randn(out.shape, generator=g)
        out.backward(dy)
        x64 = x.double().requires_grad_(True)
        q6, k6, v6 = (t.view(3, 16, 4, 8).transpose(1, 2) for t in x64.split(32, dim=-1))
        F.scaled_dot_product_attention(q6, k6, v6, is_causal=causal).backward(dy.double())
        torch.testing.assert_close(xr.grad.double(), x64.grad, rtol=1e-4, atol=1e-5)


def test_grouped_heads_fused_with_a_causal_mask():
    q, k, v = _qkv((2, 6, 7, 4), (2, 2, 7, 4))
    y = _check(q, k, v, is_causal=True, enable_gqa=True)
    assert _node(y) == "_AttentionBackward" and y.shape == (2, 6, 7, 4)
    y.add_(1)  # the output is not a view: autograd lets the user modify it in place


def test_unfused_where_the_fused_node_does_not_apply():
    q, k, v = _qkv((2, 2, 5, 4), (2, 2, 5, 4))
    mask = torch.randn(5, 5, dtype=torch.float64, requires_grad=True)
    a = [t.clone().requires_grad_(True) for t in (q, k, v)]
    y = ops.scaled_dot_product_attention(*a, attn_mask=mask)
    assert _node(y) != "_AttentionBackward"
    y.sum().backward()
    assert mask.grad is not None  # the additive mask's gradient, as torch computes it
    torch.testing.assert_close(y, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    y = ops.scaled_dot_product_attention(*a, dropout_p=0.3)
    assert _node(y) != "_AttentionBackward"


@pytest.mark.parametrize("shape_q,shape_kv", [((2, 1, 1, 4), (2, 1, 1, 4)),
                                              ((2, 3, 0, 4), (2, 3, 5, 4)),
                                              ((0, 3, 4, 4), (0, 3, 4, 4)),
                                              ((3, 1, 4), (3, 6, 4))])
def test_size_one_and_empty_dims(shape_q, shape_kv):
    q, k, v = _qkv(shape_q, shape_kv)
    _check(q, k, v)
    if shape_q[-2] <= shape_kv[-2]:
        _check(q, k, v, is_causal=True)


def test_bad_mask_shape_is_a_clear_error():
    q, k, v = _qkv((2, 2, 5, 4), (2, 2, 5, 4))
    with pytest.raises(ValueError, match="attn_mask"):
        ops.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(3, 5, dtype=torch.bool))


def test_batched_matmul_reads_views_in_place_and_matches_torch():
    """``q @ k.transpose(-2, -1)`` and ``p @ v`` on head-split views (the explicit
    attention of hand-written transformers): values and float64 gradients vs torch;
    int tensors still raise a clear error."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 3 * 2 * 4, dtype=torch.float64, generator=g)
    q, k, v = (t.view(2, 5, 2, 4).transpose(1, 2) for t in x.split(8, dim=-1))
    for a, b in ((q, k.transpose(-2, -1)), (torch.randn(2, 2, 5, 5, dtype=torch.float64), v),
                 (q[:, :, 1:], k.transpose(-2, -1)), (torch.randn(3, 0, 4), torch.randn(3, 4, 2))):
        a, b = a.detach().requires_grad_(True), b.detach().requires_grad_(True)
        y = ops.matmul(a, b)
        torch.testing.assert_close(y, torch.matmul(a, b), rtol=1e-12, atol=1e-12)
        if y.numel():
            assert torch.autograd.gradcheck(ops.matmul, (a, b))
    with pytest.raises(TypeError, match="float32 or float64"):
        ops.matmul(torch.ones(2, 3, 3, dtype=torch.int64), torch.ones(2, 3, 3, dtype=torch.int64))
