"""Piecewise-linear activations of MobileNet-style models: Hardsigmoid, Hardswish, ReLU6
and hardtanh (native HardSigmoid / HardSwish / hardtanh kernels). Forward vs torch,
float64 gradcheck, float32 autograd vs torch, torch's slope at the kinks (-3, 3 and 0, 6
exactly), NaN/inf, SIMD tails, the in-place variants (also after a wrapped op), the
registry ops' attributes and bad input, and the wrap's module swap and functional
routing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ortcpu_torch
from ortcpu_torch import kernels, ops, report, wrap
from ortcpu_torch._native.bridge import KernelError
from ortcpu_torch.kernels.activations import hard_backward, hard_forward

from .conftest import DTYPES, assert_unchanged, snapshot

ONN = ortcpu_torch.nn

# name -> (ours, torch); hardtanh with bounds that are not relu6's
OPS = {
    "hardsigmoid": (ops.hardsigmoid, F.hardsigmoid),
    "hardswish": (ops.hardswish, F.hardswish),
    "relu6": (ops.relu6, F.relu6),
    "hardtanh": (lambda x, inplace=False: ops.hardtanh(x, -0.5, 2.0, inplace),
                 lambda x, inplace=False: F.hardtanh(x, -0.5, 2.0, inplace)),
}
KINKS = {"hardsigmoid": (-3.0, 3.0), "hardswish": (-3.0, 3.0), "relu6": (0.0, 6.0),
         "hardtanh": (-0.5, 2.0)}
# sizes around the vector widths (4/8/16 lanes) and the threading grain (65536)
SIZES = (0, 1, 3, 7, 8, 9, 17, 33, 65, 1000, 65536 + 7)


@pytest.fixture(autouse=True)
def _two_threads():
    torch.set_num_threads(2)
    ortcpu_torch.set_num_threads(2)


def _with_kinks(n, dtype, name, gen=None):
    x = torch.randn(n, dtype=dtype, generator=gen) * 4
    lo, hi = KINKS[name]
    if n >= 4:
        x[::7] = lo
        x[3::11] = hi
    return x


def _fwd_bwd(fn, x, g):
    x = x.clone().requires_grad_(True)
    y = fn(x)
    y.backward(g)
    return y.detach(), x.grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", sorted(OPS))
def test_forward_backward_vs_torch(name, n, dtype):
    ours, ref = OPS[name]
    x = _with_kinks(n, dtype, name)
    g = torch.randn(n, dtype=dtype)
    y, gx = _fwd_bwd(ours, x, g)
    y_r, gx_r = _fwd_bwd(ref, x, g)
    # one rounding of a·x + b against torch's (x + 3) / 6: a few ulp; masks are exact
    tol = {"rtol": 4e-7, "atol": 1e-7} if dtype == torch.float32 else \
        {"rtol": 1e-15, "atol": 1e-15}
    torch.testing.assert_close(y, y_r, **tol)
    if name == "hardsigmoid" and dtype == torch.float64:
        # torch's float64 backward multiplies by float32(1/6) (3e-8 relative off); ours
        # by the double 1/6: compare with the exact slope on torch's mask
        gx_r = torch.where(gx_r != 0, g / 6, gx_r)
    torch.testing.assert_close(gx, gx_r, **tol)
    assert torch.equal(gx == 0, gx_r == 0), "gradient mask differs from torch's"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(OPS))
def test_kinks_and_special_values_match_torch(name, dtype):
    lo, hi = KINKS[name]
    inf, nan = float("inf"), float("nan")
    vals = [lo, hi, -inf, inf, nan, 0.0, -0.0, 1e30, -1e30, 1e-40, lo - 1e-6, lo + 1e-6,
            hi - 1e-6, hi + 1e-6, 6.0, -3.0, 3.0]
    x = torch.tensor(vals * 3, dtype=dtype)  # 51 elements: vector body and tail
    g = torch.ones_like(x)
    ours, ref = OPS[name]
    y, gx = _fwd_bwd(ours, x, g)
    y_r, gx_r = _fwd_bwd(ref, x, g)
    if name == "hardswish":
        # torch computes x·clamp(x+3, 0, 6)/6: -inf·0 = NaN; ours returns the documented
        # piecewise value 0 (x <= -3), the mathematical limit
        neg_inf = x == -inf
        assert (y[neg_inf] == 0).all() and y_r[neg_inf].isnan().all()
        y_r = torch.where(neg_inf, torch.zeros_like(y_r), y_r)
    # backward at NaN: torch's vectorized loop and its scalar tail disagree (hardtanh 0 vs
    # dy, hardswish NaN vs dy); ours is the vectorized loop's everywhere
    is_nan = x.isnan()
    expect_at_nan = float("nan") if name == "hardswish" else 0.0
    torch.testing.assert_close(gx[is_nan], torch.full_like(gx[is_nan], expect_at_nan),
                               equal_nan=True)
    gx_r = torch.where(is_nan, gx, gx_r)
    torch.testing.assert_close(y, y_r, rtol=2e-7, atol=0.0, equal_nan=True)
    torch.testing.assert_close(gx, gx_r, rtol=2e-7, atol=0.0, equal_nan=True)
    # at exactly the kinks the slope is torch's (one-sided or zero), bit for bit
    at = (x == lo) | (x == hi)
    assert torch.equal(gx[at], gx_r[at])


@pytest.mark.parametrize("name", sorted(OPS))
def test_gradcheck_float64(name):
    ours, _ = OPS[name]
    lo, hi = KINKS[name]
    x = torch.linspace(lo - 2, hi + 2, 41, dtype=torch.float64)
    near = ((x - lo).abs() < 1e-3) | ((x - hi).abs() < 1e-3)
    x = (x + near * 0.01).reshape(41, 1).expand(41, 3).contiguous()  # away from kinks
    x = x + torch.linspace(0, 1e-2, 3, dtype=torch.float64)
    assert torch.autograd.gradcheck(ours, [x.requires_grad_(True)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(OPS))
def test_inplace_matches_torch(name, dtype):
    ours, ref = OPS[name]
    base = _with_kinks(200, dtype, name).reshape(10, 20)
    g = torch.randn(10, 20, dtype=dtype)
    results = []
    for fn in (ours, ref):
        leaf = base.clone().requires_grad_(True)
        h = leaf * 1.5
        out = fn(h, inplace=True)
        assert out is h
        out.backward(g)
        results.append((out.detach(), leaf.grad))
    tol = {"rtol": 4e-7, "atol": 1e-7} if dtype == torch.float32 else {}
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("name", sorted(OPS))
def test_inplace_non_contiguous_and_leaf(name):
    ours, ref = OPS[name]
    base = torch.randn(6, 8) * 4
    a, b = base.clone().t(), base.clone().t()  # non-contiguous views
    assert ours(a, inplace=True) is a
    ref(b, inplace=True)
    torch.testing.assert_close(a, b, rtol=4e-7, atol=1e-7)
    leaf = torch.randn(5, requires_grad=True)
    before = snapshot(leaf.detach())
    with pytest.raises(RuntimeError, match="leaf Variable"):
        ours(leaf, inplace=True)
    assert_unchanged(before, [leaf.detach()])
    with torch.no_grad():  # no graph: in place on a leaf is allowed, as in torch
        ours(leaf, inplace=True)


def test_registry_attributes_and_defaults():
    x = torch.randn(5, 13, dtype=torch.float64) * 5
    torch.testing.assert_close(kernels.HardSigmoid(x), torch.clamp(0.2 * x + 0.5, 0, 1),
                               rtol=1e-15, atol=1e-15)
    for alpha, beta in ((0.7, -0.1), (-0.3, 0.2), (0.0, 0.25), (0.0, 3.0), (2, 1)):
        torch.testing.assert_close(kernels.HardSigmoid(x, alpha=alpha, beta=beta),
                                   torch.clamp(alpha * x + beta, 0, 1), rtol=1e-15,
                                   atol=1e-15)
    torch.testing.assert_close(kernels.HardSwish(x), x * torch.clamp(x / 6 + 0.5, 0, 1),
                               rtol=1e-15, atol=1e-15)
    assert kernels.HardSwish(torch.empty(0, 3)).shape == (0, 3)
    assert {"HardSigmoid", "HardSwish"} <= set(kernels.names())


def test_bad_input_names_the_argument():
    with pytest.raises(TypeError, match="X must be float32 or float64"):
        kernels.HardSwish(torch.arange(4))
    with pytest.raises(TypeError, match="alpha must be a float"):
        kernels.HardSigmoid(torch.randn(3), alpha="0.2")
    with pytest.raises(TypeError, match="beta must be a float"):
        kernels.HardSigmoid(torch.randn(3), beta=None)
    with pytest.raises(ValueError, match="min_val cannot be greater than max_val"):
        ops.hardtanh(torch.randn(3), 2.0, 1.0)
    with pytest.raises(ValueError, match="min_val"):
        ONN.Hardtanh(2.0, 1.0)
    with pytest.raises(TypeError, match="inplace must be a bool"):
        ops.hardswish(torch.randn(3), inplace="yes")
    with pytest.raises(ValueError, match="dY"):
        hard_backward("HardSwish", "HardSwish", torch.randn(3), torch.randn(4), 1 / 6, 0.5)
    with pytest.raises(KernelError, match="a > 0"):  # the native code checks it too
        hard_forward("HardSwish", "HardSwish", torch.randn(3), -1.0, 0.5)


def test_modules_are_drop_ins():
    for ours_cls, torch_cls in ((ONN.Hardswish, nn.Hardswish),
                                (ONN.Hardsigmoid, nn.Hardsigmoid), (ONN.ReLU6, nn.ReLU6)):
        for inplace in (False, True):
            m, t = ours_cls(inplace), torch_cls(inplace)
            assert repr(m) == repr(t)
            x = torch.randn(4, 9) * 4
            torch.testing.assert_close(m(x.clone()), t(x.clone()), rtol=4e-7, atol=1e-7)
    r6 = ONN.ReLU6(True)
    assert (r6.min_val, r6.max_val, r6.inplace) == (0.0, 6.0, True)
    assert repr(ONN.Hardtanh(-2.0, 3.0)) == repr(nn.Hardtanh(-2.0, 3.0))
    assert isinstance(r6, ONN.Hardtanh)


class _MobileBlock(nn.Module):
    """torchvision MobileNetV3's pieces: Hardswish(inplace) after a layer, an SE block
    with Hardsigmoid, ReLU6 and the functional spellings."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act1 = nn.Hardswish(inplace=True)
        self.fc2 = nn.Linear(16, 16)
        self.gate = nn.Hardsigmoid(inplace=True)
        self.act2 = nn.ReLU6(inplace=True)
        self.clip = nn.Hardtanh(-1.5, 1.5)

    def forward(self, x):
        h = self.act1(self.fc1(x))
        h = h * self.gate(self.fc2(h))
        h = self.act2(h)
        h = F.hardswish(h) + F.hardsigmoid(h) + F.relu6(h, inplace=False)
        return self.clip(F.hardtanh(h, -3.0, 3.0))


def test_wrap_swaps_modules_and_routes_functionals():
    torch.manual_seed(0)
    ref = _MobileBlock()
    m = _MobileBlock()
    m.load_state_dict(ref.state_dict())
    wrap(m, select="ours")
    for name in ("act1", "gate", "act2", "clip"):
        assert type(getattr(m, name)).__mro__[1].__module__ == "ortcpu_torch.nn.activations"
    assert m.act1.inplace and m.gate.inplace and m.act2.inplace
    x = torch.randn(32, 8)
    y, y_r = m(x), ref(x)
    torch.testing.assert_close(y, y_r, rtol=1e-5, atol=1e-6)
    y.sum().backward()
    y_r.sum().backward()
    for (n, p), q in zip(m.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=n)
    rep = report(m, file=None)
    routed = {f["name"]: f for f in rep.functionals}
    for fname in ("F.hardswish", "F.hardsigmoid", "F.relu6", "F.hardtanh"):
        assert routed[fname]["calls_ours"] >= 1, fname


def test_inplace_after_a_wrapped_op():
    """Issue 14 defect 1 with the new modules: in place right after a wrapped Linear."""
    torch.manual_seed(1)
    for act in (nn.Hardswish(inplace=True), nn.Hardsigmoid(inplace=True),
                nn.ReLU6(inplace=True)):
        for rows in (4, 70000 // 16):  # small and arena-sized outputs
            ref = nn.Sequential(nn.Linear(8, 16), act)
            m = nn.Sequential(nn.Linear(8, 16), type(act)(inplace=True))
            m.load_state_dict(ref.state_dict())
            wrap(m, select="ours")
            x = torch.randn(rows, 8)
            y, y_r = m(x), ref(x)
            y.sum().backward()
            y_r.sum().backward()
            torch.testing.assert_close(y, y_r, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(m[0].weight.grad, ref[0].weight.grad, rtol=1e-4,
                                       atol=1e-4)
