"""Building blocks of real models brought onto our kernels: SiLU / ReLU (modules and
functionals), ``torch.addmm`` (Hugging Face's Conv1D GEMM), tanh-GELU written as a
formula (``NewGELUActivation``) and Llama/T5-style RMSNorm modules, detected by shape and
checked numerically before they are swapped. Forward and backward vs torch in float32,
gradcheck in float64."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ortcpu_torch
from ortcpu_torch import ops, report, wrap


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    ortcpu_torch.set_num_threads(1)


OPS = {
    "silu": (ops.silu, F.silu, lambda d: [torch.randn(7, 33, dtype=d)]),
    "relu": (ops.relu, F.relu, lambda d: [torch.randn(7, 33, dtype=d)]),
    "addmm": (ops.addmm, torch.addmm,
              lambda d: [torch.randn(12, dtype=d), torch.randn(9, 5, dtype=d),
                         torch.randn(5, 12, dtype=d)]),
    "addmm_row_bias": (ops.addmm, torch.addmm,
                       lambda d: [torch.randn(1, 4, dtype=d), torch.randn(3, 6, dtype=d),
                                  torch.randn(6, 4, dtype=d)]),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_forward_backward_float32_vs_torch(name):
    ours, ref, make = OPS[name]
    inputs = make(torch.float32)
    a = [t.clone().requires_grad_(True) for t in inputs]
    b = [t.clone().requires_grad_(True) for t in inputs]
    y, y_r = ours(*a), ref(*b)
    torch.testing.assert_close(y, y_r, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(y)
    y.backward(g)
    y_r.backward(g)
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(OPS))
def test_gradcheck_float64(name):
    ours, _, make = OPS[name]
    inputs = [t.requires_grad_(True) for t in make(torch.float64)]
    if name == "relu":  # away from the kink
        inputs[0].data += torch.sign(inputs[0].data) * 0.1
    assert torch.autograd.gradcheck(ours, inputs)


def test_relu_inplace_and_edge_cases():
    x = torch.tensor([-1.0, 0.0, 2.0, float("nan"), float("inf")])
    torch.testing.assert_close(ops.relu(x), F.relu(x), equal_nan=True)
    y = torch.randn(4, 5, requires_grad=True)
    h = y * 2
    out = ops.relu(h, inplace=True)
    assert out is h
    out.sum().backward()
    torch.testing.assert_close(y.grad, 2.0 * (y.detach() > 0).float())
    with pytest.raises(RuntimeError, match="leaf Variable"):
        ops.relu(torch.randn(3, requires_grad=True), inplace=True)
    assert ops.silu(torch.empty(0, 3)).shape == (0, 3)
    with pytest.raises(ValueError, match="inplace"):
        ops.silu(torch.randn(3), inplace=True)


def test_addmm_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="beta=1"):
        ops.addmm(torch.randn(3), torch.randn(2, 4), torch.randn(4, 3), beta=0.5)
    with pytest.raises(ValueError, match="input must be a bias"):
        ops.addmm(torch.randn(2, 3), torch.randn(2, 4), torch.randn(4, 3))
    with pytest.raises(ValueError, match="mat1"):
        ops.addmm(torch.randn(3), torch.randn(2, 5), torch.randn(4, 3))
    with pytest.raises(TypeError, match="mat2"):
        ops.addmm(torch.randn(3), torch.randn(2, 4), [1, 2])


def test_full_addmm_input_falls_back_to_torch():
    bias, a, b = torch.randn(2, 3), torch.randn(2, 4), torch.randn(4, 3)
    with ortcpu_torch.kernels_enabled(fallback="silent") as ctx:
        y = torch.addmm(bias, a, b)
    torch.testing.assert_close(y, torch.addmm(bias, a, b))
    f = report(ctx, file=None).functionals[0]
    assert f["calls_torch"] == 1 and "input must be a bias" in next(iter(f["reasons"]))


# ---- formula modules ------------------------------------------------------------------


class NewGELUActivation(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x.pow(3))))


class FastGELUActivation(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


class NotAGELU(nn.Module):  # a "GELU" by name whose formula is something else
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class LlamaRMSNorm(nn.Module):
    def __init__(self, h, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        v = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(v + self.variance_epsilon)).to(dtype)


class GemmaRMSNorm(LlamaRMSNorm):  # (1 + weight): must not be swapped
    def forward(self, x):
        v = x.pow(2).mean(-1, keepdim=True)
        return (1.0 + self.weight) * x * torch.rsqrt(v + self.variance_epsilon)


class OuterEpsRMSNorm(LlamaRMSNorm):  # eps outside the square root: must not be swapped
    def forward(self, x):
        return self.weight * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.variance_epsilon)


def _mlp(act, norm):
    return nn.Sequential(nn.Linear(16, 16), act, norm, nn.Linear(16, 4))


@pytest.mark.parametrize("act, norm, swapped", [
    (NewGELUActivation(), LlamaRMSNorm(16), {"1": "GELU", "2": "RMSNorm"}),
    (FastGELUActivation(), GemmaRMSNorm(16), {"1": "GELU"}),
    (NotAGELU(), OuterEpsRMSNorm(16), {}),
])
def test_formula_modules_swapped_only_when_they_compute_our_kernel(act, norm, swapped):
    m = _mlp(act, norm)
    with torch.no_grad():
        m[2].weight.uniform_(0.5, 1.5)
    ref = copy.deepcopy(m)
    wrap(m, fallback="silent")
    rep = report(m, file=None)
    got = {d["name"]: d["ours"].rsplit(".", 1)[1] for d in rep.modules
           if d["name"] in ("1", "2")}
    assert got == swapped
    for name in {"1", "2"} - set(swapped):
        reason = next(d["reason"] for d in rep.skipped if d["name"] == name)
        assert "checked numerically" in reason
    assert list(m.state_dict()) == list(ref.state_dict())
    x = torch.randn(5, 16, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    y, y_r = m(x), ref(xr)
    torch.testing.assert_close(y, y_r, rtol=1e-5, atol=1e-5)
    y.sum().backward()
    y_r.sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)
    for (n, p), q in zip(m.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)
    ortcpu_torch.unwrap(m)
    assert type(m[1]) is type(act) and type(m[2]) is type(norm)


# ---- scaled dot-product attention ------------------------------------------------------

_SDPA = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "causal_wide": dict(is_causal=True),  # 7 queries, 9 keys: the top-left aligned mask
    "scale": dict(scale=0.3),
    "bool_mask": dict(attn_mask=torch.rand(7, 9, generator=torch.Generator().manual_seed(0))
                      > 0.3),
    "float_mask": dict(attn_mask=torch.randn(2, 1, 7, 9)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", sorted(_SDPA))
def test_sdpa_forward_backward(case, dtype):
    kw = {k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
          for k, v in _SDPA[case].items()}
    q = torch.randn(2, 3, 7, 8, dtype=dtype)
    k, v = torch.randn(2, 3, 9, 8, dtype=dtype), torch.randn(2, 3, 9, 5, dtype=dtype)
    if case == "causal":
        k, v = k[..., :7, :], v[..., :7, :]
    a = [t.clone().requires_grad_(True) for t in (q, k, v)]
    b = [t.clone().requires_grad_(True) for t in (q, k, v)]
    y = ops.scaled_dot_product_attention(*a, **kw)
    y_r = F.scaled_dot_product_attention(*b, **kw)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10,
                                                                         atol=1e-12)
    torch.testing.assert_close(y, y_r, **tol)
    g = torch.randn_like(y)
    y.backward(g)
    y_r.backward(g)
    for p, r in zip(a, b, strict=True):
        torch.testing.assert_close(p.grad, r.grad, **{k: 10 * v for k, v in tol.items()})
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(
            lambda *t: ops.scaled_dot_product_attention(*t, **kw),
            [t.detach().requires_grad_(True) for t in (q, k, v)])


@pytest.mark.parametrize("case", ["plain", "causal", "causal_wide", "bool_mask", "scale"])
def test_sdpa_grouped_heads_forward_backward(case):
    """Grouped heads (6 query heads over 2 key/value heads): stacked per key head without
    copies when there is no mask (causal mask repeated per block), repeated heads with a
    mask; a query transposed as Hugging Face passes it; float64 values, gradients and
    gradcheck against torch."""
    g = torch.Generator().manual_seed(1)
    S = 9 if case == "causal_wide" else 7
    q = torch.randn(2, 7, 6, 5, dtype=torch.float64, generator=g).transpose(1, 2)
    k = torch.randn(2, 2, S, 5, dtype=torch.float64, generator=g)
    v = torch.randn(2, 2, S, 4, dtype=torch.float64, generator=g)
    kw = {"enable_gqa": True, **({"is_causal": True} if case.startswith("causal") else {}),
          **({"scale": 0.4} if case == "scale" else {})}
    if case == "bool_mask":
        kw["attn_mask"] = torch.rand(7, S, generator=g) > 0.3
    a = [t.clone().requires_grad_(True) for t in (q, k, v)]
    b = [t.clone().requires_grad_(True) for t in (q, k, v)]
    y, y_r = ops.scaled_dot_product_attention(*a, **kw), F.scaled_dot_product_attention(*b, **kw)
    torch.testing.assert_close(y, y_r, rtol=1e-10, atol=1e-12)
    dy = torch.randn(y.shape, dtype=torch.float64, generator=g)
    y.backward(dy)
    y_r.backward(dy)
    for p, r in zip(a, b, strict=True):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-9, atol=1e-11)
    assert torch.autograd.gradcheck(lambda *t: ops.scaled_dot_product_attention(*t, **kw),
                                    [t.detach().requires_grad_(True) for t in (q, k, v)])


def test_sdpa_grouped_heads_dropout_and_routing():
    q = torch.randn(2, 4, 6, 8)
    k, v = torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    torch.testing.assert_close(ops.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                               F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                               rtol=1e-5, atol=1e-6)
    y = ops.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert y.shape == q.shape and torch.isfinite(y).all()
    with ortcpu_torch.kernels_enabled(select="ours") as ctx:
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, q, q, is_causal=True),
                               rtol=1e-5, atol=1e-6)
    assert report(ctx, file=None).functionals[0]["calls_ours"] == 1
    with pytest.raises(ValueError, match="both"):
        ops.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(6, 6, dtype=torch.bool),
                                         is_causal=True)
