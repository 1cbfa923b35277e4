"""The erf GELU's value and slope in float32 against a float64 evaluation: the AVX2
build's piecewise polynomials (native/src/gelu_avx2.h, |x| < 4), the generic formula it
falls back to per 8-lane vector (|x| >= 4, inf, NaN) and the baseline build's, over the
whole range including the left tail, lanes of both kinds mixed in one vector, every tail
length, bias, and the special values."""

from __future__ import annotations

import math

import pytest
import torch

from ortcpu_torch import kernels as K
from ortcpu_torch._native import lib, loader, ptr

from .conftest import assert_close


def _ref(x: torch.Tensor):
    xd = x.double()
    cdf = 0.5 * torch.erfc(-xd / math.sqrt(2))
    return xd * cdf, cdf + xd * torch.exp(-0.5 * xd * xd) / math.sqrt(2 * math.pi)


def _ulps(got, ref, floor=0.0):
    mag = torch.clamp(ref.abs(), min=floor).float()
    spacing = (torch.nextafter(mag, torch.tensor(math.inf)) - mag).double()
    return float(((got.double() - ref).abs() / spacing).max())


# (lo, hi, max ulps of the value, of the slope) on the AVX2 build and on the baseline
# build (the generic erfc formula everywhere, as before the AVX2 pieces); the slope's root
# (-0.7518) counts ulps of max(|slope|, 0.05); torch's float32 GELU is off by 3.6-49 ulps
# on |x| < 3 and by 1e4 or more below -3 (its 1 + erf cancels)
AVX2 = loader.ISA != "baseline"
RANGES = [(-13.0, -4.0, 6.0, 6.0, 6.0, 4.0), (-4.0, -0.5, 3.0, 3.0, 6.0, 30.0),
          (-0.5, 0.5, 2.0, 2.0, 8.0, 10.0), (0.5, 4.0, 1.5, 1.5, 3.0, 3.0),
          (4.0, 30.0, 1.0, 1.0, 1.0, 1.0)]


@pytest.mark.parametrize("lo,hi,fwd_avx2,slope_avx2,fwd_generic,slope_generic", RANGES)
def test_gelu_float32_within_ulps_of_float64(lo, hi, fwd_avx2, slope_avx2, fwd_generic,
                                             slope_generic):
    fwd_ulps, slope_ulps = (fwd_avx2, slope_avx2) if AVX2 else (fwd_generic, slope_generic)
    x = torch.linspace(lo, hi, 60001, dtype=torch.float32)
    ref, ref_slope = _ref(x)
    y = K.Gelu(x)
    slope = K.GeluGrad(torch.ones_like(x), x)
    floor = 0.05 if lo < -0.7518 < hi else 0.0
    assert _ulps(y, ref) <= fwd_ulps
    assert _ulps(slope, ref_slope, floor) <= slope_ulps


def test_gelu_far_left_tail_is_tiny_not_garbage():
    x = torch.linspace(-30.0, -13.0, 1001)
    ref, ref_slope = _ref(x)
    y, s = K.Gelu(x), K.GeluGrad(torch.ones_like(x), x)
    assert (y <= 0).all() and (s <= 0).all()
    assert (y.double() - ref).abs().max() < 1e-36
    assert (s.double() - ref_slope).abs().max() < 1e-35


@pytest.mark.parametrize("n", [1, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100])
def test_gelu_mixed_fast_and_fallback_lanes_every_length(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(3, n, generator=g) * 3  # about 1 in 5 lanes beyond |x| = 4
    x[0, ::3] *= 4
    b = torch.randn(n, generator=g)
    dy = torch.randn(3, n, generator=g)
    v = x + b
    ref, ref_slope = _ref(v)
    assert_close(K.Gelu(v), ref.float(), rtol=1e-6, atol=1e-30)
    assert_close(K.BiasGelu(x, b), ref.float(), rtol=1e-6, atol=1e-30)
    want_dx = (dy.double() * ref_slope).float()
    assert_close(K.GeluGrad(dy, v), want_dx, rtol=2e-6, atol=1e-6)
    assert_close(K.BiasGeluGrad_dX(dy, x, b), want_dx, rtol=2e-6, atol=1e-6)


def test_gelu_special_values():
    tiny = 1e-40  # a denormal
    vals = [0.0, -0.0, tiny, -tiny, 1e-30, -1e-30, 3.9999998, -3.9999998, 4.0, -4.0,
            1e30, -1e30, 3.4e38, -3.4e38, math.inf, -math.inf, math.nan]
    # one vector of the fast range around each special, so every special also shares an
    # 8-lane vector with fast lanes (and in the second half, stands in one of its own)
    x = torch.tensor([v for s in vals for v in (0.5, s, -1.5, 0.25, 2.0, -3.0, 1.0, -0.5)]
                     + vals, dtype=torch.float32)
    y = K.Gelu(x)
    s = K.GeluGrad(torch.ones_like(x), x)
    ref, ref_slope = _ref(x)
    finite = torch.isfinite(x)
    assert_close(y[finite], ref[finite].float(), rtol=5e-7, atol=1e-45)
    assert_close(s[finite], ref_slope[finite].float(), rtol=5e-7, atol=1e-30)
    assert torch.equal(torch.signbit(y[x == 0]), torch.signbit(x[x == 0]))  # -0 stays -0
    assert (y[x == math.inf] == math.inf).all() and (y[x == -math.inf] == 0).all()
    assert (s[x == math.inf] == 1).all() and (s[x == -math.inf] == 0).all()
    assert torch.isnan(y[torch.isnan(x)]).all() and torch.isnan(s[torch.isnan(x)]).all()


def test_gelu_float32_agrees_with_torch_where_torch_is_accurate():
    x = torch.randn(4097) * 2
    assert_close(K.Gelu(x), torch.nn.functional.gelu(x), rtol=1e-5, atol=1e-6)
    dy = torch.randn(4097)
    xt = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(torch.nn.functional.gelu(xt), xt, dy)
    assert_close(K.GeluGrad(dy, x), g, rtol=1e-5, atol=1e-6)


def test_gelu_native_kernels_in_place():
    """The executor may hand the native kernels an output that is an input's buffer:
    y = x (forward), dx = dy or dx = x (backward), with fast and fallback vectors."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 37, generator=g) * 3
    dy = torch.randn(4, 37, generator=g)
    ref, ref_slope = _ref(x)
    want_dx = (dy.double() * ref_slope).float()
    y = x.clone()
    assert lib.ortcpu_gelu_forward_f32(ptr(y), ptr(None), ptr(y), 4, 37, 0, 1) == 0
    assert_close(y, ref.float(), rtol=1e-6, atol=1e-30)
    for alias in ("dy", "x"):
        xx, dd = x.clone(), dy.clone()
        out = dd if alias == "dy" else xx
        assert lib.ortcpu_gelu_backward_f32(ptr(dd), ptr(xx), ptr(None), ptr(out), ptr(None),
                                            4, 37, 0, 1) == 0
        assert_close(out, want_dx, rtol=2e-6, atol=1e-6, msg=alias)
