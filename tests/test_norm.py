"""LayerNorm / RMSNorm: registry ops (LayerNormalization(+Grad),
InvertibleLayerNormalizationGrad, SimplifiedLayerNormalization(+Grad)), ops.layer_norm /
ops.rms_norm and nn.LayerNorm / nn.RMSNorm, against torch.

Tolerances (float32): forward vs torch rtol 1e-5 / atol 1e-5 (both are ~ulp of the
normalised value; ours accumulates row statistics in double, torch in float: measured
max 2.4e-7 abs on randn rows); gradients vs torch rtol 1e-4 / atol 1e-5 (dX is a
difference of row means, measured 1e-6 worst on 1024-wide rows; dscale/dbias are sums
over 8-64 rows). float64: 1e-10.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ortcpu_torch as ot
from ortcpu_torch import kernels as K

from .conftest import assert_close, assert_unchanged, snapshot

T32 = {"rtol": 1e-5, "atol": 1e-5}
G32 = {"rtol": 1e-4, "atol": 1e-5}
T64 = {"rtol": 1e-10, "atol": 1e-10}


def tl(dtype, grad=False):
    return T64 if dtype == torch.float64 else (G32 if grad else T32)


def _ref_ln(x, w, b, eps, ndim):
    return F.layer_norm(x, x.shape[x.dim() - ndim:], w, b, eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape,axis", [((4, 7), -1), ((3, 5, 6), 1), ((2, 3, 4), -1),
                                        ((5, 1), -1), ((1, 70), -1), ((6,), 0)])
def test_layernormalization_forward(dtype, shape, axis):
    x = torch.randn(shape, dtype=dtype) * 3 + 1
    ax = axis % len(shape)
    ns = shape[ax:]
    w, b = torch.randn(ns, dtype=dtype), torch.randn(ns, dtype=dtype)
    before = snapshot(x, w, b)
    y, mean, inv = K.LayerNormalization(x, w, b, axis=axis, epsilon=1e-5)
    assert_unchanged(before, [x, w, b])
    assert_close(y, _ref_ln(x, w, b, 1e-5, len(ns)), **tl(dtype))
    dims = tuple(range(ax, len(shape)))
    assert mean.dtype == torch.float32 and inv.dtype == torch.float32  # ORT stash_type=1
    assert mean.shape == tuple(shape[:ax]) + (1,) * len(ns)
    assert_close(mean, x.double().mean(dims, keepdim=True), rtol=1e-6, atol=1e-6)
    var = x.double().var(dims, unbiased=False, keepdim=True)
    assert_close(inv, (var + 1e-5).rsqrt(), rtol=1e-5, atol=1e-6)
    # stash_type 11 keeps the statistics in double
    _, m64, _ = K.LayerNormalization(x, w, None, axis=axis, stash_type=11)
    assert m64.dtype == torch.float64


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_simplified_layernormalization(dtype):
    x = torch.randn(9, 33, dtype=dtype)
    w = torch.randn(33, dtype=dtype)
    y, inv = K.SimplifiedLayerNormalization(x, w, epsilon=1e-6)
    assert_close(y, F.rms_norm(x, (33,), w, 1e-6), **tl(dtype))
    assert_close(inv.view(-1), (x.double().pow(2).mean(-1) + 1e-6).rsqrt(), rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape,axis", [((8, 13), -1), ((3, 4, 5), 1), ((2, 64), -1),
                                        ((3, 2, 70), -1)])
def test_layernorm_grads_vs_torch(dtype, shape, axis):
    ax = axis % len(shape)
    ns = shape[ax:]
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    w = torch.randn(ns, dtype=dtype, requires_grad=True)
    b = torch.randn(ns, dtype=dtype, requires_grad=True)
    dy = torch.randn(shape, dtype=dtype)
    _ref_ln(x, w, b, 1e-5, len(ns)).backward(dy)
    y, mean, inv = K.LayerNormalization(x.detach(), w.detach(), b.detach(), axis=axis,
                                        stash_type=11 if dtype == torch.float64 else 1)
    dx, dw, db = K.LayerNormalizationGrad(dy, x.detach(), w.detach(), mean, inv, axis=axis)
    assert_close(dx, x.grad, **tl(dtype, True))
    assert_close(dw, w.grad, **tl(dtype, True))
    assert_close(db, b.grad, **tl(dtype, True))
    # invertible: from Y instead of X
    dx2, dw2, db2 = K.InvertibleLayerNormalizationGrad(dy, y, w.detach(), b.detach(), inv,
                                                       axis=axis)
    inv_tol = tl(dtype, True) if dtype == torch.float64 else {"rtol": 1e-3, "atol": 1e-4}
    assert_close(dx2, x.grad, **inv_tol)
    assert_close(dw2, w.grad, **inv_tol)
    assert_close(db2, b.grad, **inv_tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_simplified_grad_vs_torch(dtype):
    x = torch.randn(10, 24, dtype=dtype, requires_grad=True)
    w = torch.randn(24, dtype=dtype, requires_grad=True)
    dy = torch.randn(10, 24, dtype=dtype)
    F.rms_norm(x, (24,), w, 1e-5).backward(dy)
    _, inv = K.SimplifiedLayerNormalization(x.detach(), w.detach(),
                                            stash_type=11 if dtype == torch.float64 else 1)
    dx, dw = K.SimplifiedLayerNormalizationGrad(dy, x.detach(), w.detach(), inv)
    assert_close(dx, x.grad, **tl(dtype, True))
    assert_close(dw, w.grad, **tl(dtype, True))


def test_float64_registry_gradcheck():
    """The registry gradient kernels, as a function of X, scale (and bias), checked by
    finite differences in float64 (stats recomputed by the forward kernel)."""
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    for simplified in (False, True):
        f = ot.ops.rms_norm if simplified else ot.ops.layer_norm
        args = (x, w) if simplified else (x, w, b)
        assert torch.autograd.gradcheck(lambda *a, f=f: f(a[0], (6,), *a[1:]), args)


@pytest.mark.parametrize("ndim", [1, 2])
def test_ops_gradcheck_float64(ndim):
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    ns = x.shape[3 - ndim:]
    w = torch.randn(ns, dtype=torch.float64, requires_grad=True)
    b = torch.randn(ns, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: ot.ops.layer_norm(x, ns, w, b), (x, w, b))
    assert torch.autograd.gradcheck(lambda x: ot.ops.layer_norm(x, ns), (x,))
    assert torch.autograd.gradcheck(lambda x, w: ot.ops.rms_norm(x, ns, w, 1e-6), (x, w))
    assert torch.autograd.gradcheck(lambda x: ot.ops.rms_norm(x, ns), (x,))


@pytest.mark.parametrize("cols", [1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 70])
def test_ops_odd_rows_float32(cols):
    x = torch.randn(5, cols, requires_grad=True)
    w = torch.randn(cols, requires_grad=True)
    b = torch.randn(cols, requires_grad=True)
    dy = torch.randn(5, cols)
    for f_ours, f_ref, params in (
        (lambda x, w, b: ot.ops.layer_norm(x, (cols,), w, b),
         lambda x, w, b: F.layer_norm(x, (cols,), w, b), (x, w, b)),
        (lambda x, w: ot.ops.rms_norm(x, (cols,), w), lambda x, w: F.rms_norm(x, (cols,), w),
         (x, w)),
    ):
        y = f_ours(*params)
        g_ours = torch.autograd.grad(y, params, dy)
        # the truth is float64 at the same float32 inputs, not torch's float32 result: at
        # cols == 1 the exact LayerNorm dX is 0 and torch returns rounding noise (~3e-5)
        p64 = [p.detach().double().requires_grad_() for p in params]
        y_ref = f_ref(*p64)
        g_ref = torch.autograd.grad(y_ref, p64, dy.double())
        assert_close(y, y_ref, **T32)
        for i, (a, r) in enumerate(zip(g_ours, g_ref, strict=True)):
            gt = G32
            if cols == 1 and i == 0:
                # dX = (b - mean b) / σ-ish with b = dY·w/sqrt(eps) ~ 300: the rounding of
                # b survives in any float32 formula (ours 1.4e-5, torch 3e-5 measured), so
                # a few ulp of that amplified term, absolute
                big = float((dy * w.detach()).abs().max()) / 1e-5 ** 0.5
                gt = {"rtol": 0.0, "atol": 4 * 2.0 ** -23 * big}
            assert_close(a, r, **gt)


def test_normalized_dim_one():
    """LayerNorm over a size-1 dim: y = bias, dx = 0 (ORT's grad op refuses M = 1; ours
    returns the math)."""
    x = torch.randn(6, 1, requires_grad=True)
    w = torch.randn(1, requires_grad=True)
    b = torch.randn(1, requires_grad=True)
    y = ot.ops.layer_norm(x, (1,), w, b)
    assert_close(y, b.detach().expand(6, 1), rtol=0, atol=0)
    y.sum().backward()
    # dX = b - mean(b) with b = dY·w/sqrt(eps) ~ 300: zero up to the rounding of b (FMA)
    big = float(w.detach().abs()) / 1e-5 ** 0.5
    assert_close(x.grad, torch.zeros(6, 1), rtol=0, atol=1e-5 * big)
    assert_close(b.grad, torch.tensor([6.0]), rtol=0, atol=0)


def test_huge_row_and_nan_isolation():
    x = torch.randn(2, 1 << 20) * 2 + 5
    y = ot.ops.layer_norm(x, (1 << 20,))
    # a 2^20-long reduction: against float64 (ours 6e-7 abs measured, torch's float32 as
    # far off), not torch float32 at a loose 1e-4
    assert_close(y, F.layer_norm(x.double(), (1 << 20,)), rtol=0, atol=3e-6)
    z = torch.randn(4, 50)
    z[1, 3] = float("nan")
    for f in (lambda t: ot.ops.layer_norm(t, (50,)), lambda t: ot.ops.rms_norm(t, (50,))):
        out = f(z)
        assert out[1].isnan().all()
        assert not out[[0, 2, 3]].isnan().any()


def test_non_contiguous_and_empty():
    x = torch.randn(20, 12).t()  # (12, 20) non-contiguous
    assert_close(ot.ops.layer_norm(x, (20,)), F.layer_norm(x, (20,)), **T32)
    e = torch.randn(0, 8, requires_grad=True)
    y = ot.ops.layer_norm(e, (8,))
    assert y.shape == (0, 8)
    y.sum().backward()
    assert e.grad.shape == (0, 8)
    y, m, i = K.LayerNormalization(torch.randn(0, 5), torch.ones(5))
    assert y.shape == (0, 5) and m.shape == (0, 1)


def test_bad_input():
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="Scale must have 4 elements"):
        K.LayerNormalization(x, torch.ones(5))
    with pytest.raises(TypeError, match="must have the dtype"):
        K.LayerNormalization(x, torch.ones(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="axis"):
        K.LayerNormalization(x, torch.ones(4), axis=2)
    with pytest.raises(ValueError, match="stash_type"):
        K.LayerNormalization(x, torch.ones(4), stash_type=7)
    with pytest.raises(ValueError, match="mean must have 3 elements"):
        K.LayerNormalizationGrad(x, x, torch.ones(4), torch.zeros(2), torch.ones(3))
    with pytest.raises(TypeError, match="int64"):
        K.LayerNormalization(x.long(), torch.ones(4))
    with pytest.raises(ValueError, match="normalized_shape"):
        ot.ops.layer_norm(x, (3,))
    with pytest.raises(ValueError, match="weight must have shape"):
        ot.ops.rms_norm(x, (4,), torch.ones(3))


def test_needs_skips_outputs():
    x = torch.randn(3, 4)
    y, m, i = K.LayerNormalization(x, torch.ones(4), needs=(True, False, True))
    assert m is None and i is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nn_layernorm_rmsnorm_state_dict(dtype):
    ref = torch.nn.LayerNorm((4, 6), eps=1e-6, bias=False, dtype=dtype)
    with torch.no_grad():
        ref.weight.normal_()
    ours = ot.nn.LayerNorm((4, 6), eps=1e-6, bias=False, dtype=dtype)
    ours.load_state_dict(ref.state_dict())
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert ours.bias is None and ours.normalized_shape == (4, 6) and ours.eps == 1e-6
    x = torch.randn(3, 4, 6, dtype=dtype)
    assert_close(ours(x), ref(x), **tl(dtype))
    r2 = torch.nn.RMSNorm(6, dtype=dtype)
    o2 = ot.nn.RMSNorm(6, dtype=dtype)
    with torch.no_grad():
        r2.weight.normal_()
    o2.load_state_dict(r2.state_dict())
    assert_close(o2(x), r2(x), **tl(dtype))
    assert isinstance(o2, torch.nn.RMSNorm) and repr(o2) == repr(r2)
    ln = ot.nn.LayerNorm(6, elementwise_affine=False)
    assert list(ln.state_dict()) == []
    assert_close(ln(x.float()), F.layer_norm(x.float(), (6,)), **T32)


def test_ops_bad_input_checked_once_per_signature_and_every_time_it_fails():
    x = torch.randn(3, 4)
    for _ in range(2):  # a failed check caches nothing: the second call raises too
        with pytest.raises(TypeError, match="weight must have the dtype"):
            ot.ops.layer_norm(x, (4,), torch.ones(4, dtype=torch.float64))
        with pytest.raises(TypeError, match="input"):
            ot.ops.layer_norm(x.long(), (4,))
        with pytest.raises(ValueError, match="eps must be >= 0"):
            ot.ops.rms_norm(x, (4,), torch.ones(4), -1.0)
    w, b = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    xr = x.clone().requires_grad_(True)
    for _ in range(2):  # the second call takes the checked-signature path
        y = ot.ops.layer_norm(xr, [4], w, b, 1e-5)
        assert_close(y, F.layer_norm(x, (4,), w, b, 1e-5), **T32)
    # bias without weight: its gradient has the normalized shape
    bb = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    x3 = torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, b: ot.ops.layer_norm(x, (2, 4), None, b),
                                    (x3, bb))


@pytest.mark.parametrize("cols", [255, 256, 257, 511, 512, 513, 1041])
@pytest.mark.parametrize("offset", [0.0, 300.0])
def test_float32_wide_rows_vs_float64(cols, offset):
    """float32 rows across the vector and block boundaries of the SIMD rows (16 lanes,
    512-element blocks; masked tails), rows with a large mean (the variance and dX use
    deviations from the row mean), and dscale / dbias summed over 300 rows (float
    partial sums flushed into double every 32 rows): against float64 at the same float32
    inputs, LayerNorm and RMSNorm."""
    g = torch.Generator().manual_seed(cols)
    x = (torch.randn(300, cols, generator=g) + offset).requires_grad_()
    w = torch.randn(cols, generator=g).requires_grad_()
    b = torch.randn(cols, generator=g).requires_grad_()
    dy = torch.randn(300, cols, generator=g)
    cases = [((x, w, b), lambda x, w, b: ot.ops.layer_norm(x, (cols,), w, b),
              lambda x, w, b: F.layer_norm(x, (cols,), w, b)),
             ((x,), lambda x: ot.ops.layer_norm(x, (cols,)),
              lambda x: F.layer_norm(x, (cols,)))]
    if offset == 0.0:  # RMSNorm of rows with a large mean is a different regime
        cases.append(((x, w), lambda x, w: ot.ops.rms_norm(x, (cols,), w, 1e-6),
                      lambda x, w: F.rms_norm(x, (cols,), w, 1e-6)))
    for params, f_ours, f_ref in cases:
        y = f_ours(*params)
        g_ours = torch.autograd.grad(y, params, dy)
        p64 = [p.detach().double().requires_grad_() for p in params]
        y_ref = f_ref(*p64)
        g_ref = torch.autograd.grad(y_ref, p64, dy.double())
        # the row mean is kept in float32 (as the stashed Mean output): its rounding,
        # up to half an ulp of the offset, shifts x̂ by that much (times the scale); the
        # generic rows measured the same 7.0e-5 at offset 300 as the AVX-512 rows
        wmax = float(w.detach().abs().max()) if len(params) > 1 else 1.0
        assert_close(y, y_ref, rtol=1e-5, atol=2e-5 + 2.0 ** -23 * offset * wmax)
        # the mean's rounding (above) moves dX by up to half an ulp of the offset (times
        # the scale), and dscale, a sum of dy·x̂ over the rows, by that times sum |dy| per
        # column (measured 1.1e-5 and 6.5e-4 at offset 300, in the generic rows as in the
        # AVX-512 ones)
        ulp = 2.0 ** -24 * offset
        shift = (ulp * wmax, ulp * float(dy.abs().sum(0).max()))
        for a, r in zip(g_ours, g_ref, strict=True):
            scale = float(r.abs().max())
            assert_close(a, r, rtol=1e-4, atol=2e-6 * max(scale, 1.0) + shift[a.dim() == 1])


def test_float32_nonfinite_rows_isolated_in_backward():
    """An inf or NaN in one row makes that row's y and dX NaN (and dscale / dbias, which
    sum over rows), the other rows' dX stay finite: masked tails and the 16-lane vectors
    of the SIMD rows included (width 37 = 2 vectors + a 5-lane tail)."""
    for bad in (float("nan"), float("inf")):
        x = torch.randn(6, 37)
        x[2, 35] = bad  # in the tail
        x[4, 3] = bad   # in the first vector
        x.requires_grad_()
        w = torch.randn(37, requires_grad=True)
        y = ot.ops.layer_norm(x, (37,), w, None)
        (dx,) = torch.autograd.grad(y, (x,), torch.randn(6, 37))
        for r in (2, 4):
            assert y[r].isnan().any() and dx[r].isnan().any()
        assert torch.isfinite(y[[0, 1, 3, 5]]).all() and torch.isfinite(dx[[0, 1, 3, 5]]).all()
