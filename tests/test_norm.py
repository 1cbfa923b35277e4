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

import ctypes
import importlib
import math
import mmap
import os

import pytest
import torch
import torch.nn.functional as F

import ortcpu_torch as ot
from ortcpu_torch import kernels as K
from ortcpu_torch._native import ffi, lib, loader

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


def _native_builds():
    """The native library builds this CPU runs, by level name, lowest first (only the
    loaded one under ORTCPU_NATIVE_LIB, the sanitizer build)."""
    if os.environ.get("ORTCPU_NATIVE_LIB"):
        return {loader.ISA: lib}
    levels = loader.LEVELS[: loader.LEVELS.index(loader.CPU_ISA) + 1]
    return {lv: importlib.import_module(f"ortcpu_torch._native.{loader.MODULES[lv]}").lib
            for lv in levels}


def _p(t):
    return ffi.NULL if t is None else ffi.cast("void *", t.data_ptr())


def _native_ln(lb, x, w, b, dy, eps, simplified, nthreads=2):
    """y, mean, inv_std, dx, dscale, dbias of one native build's float32 LayerNorm (mode 0)
    or RMSNorm (mode 1) rows; dscale / dbias requested when w / b are given."""
    rows, cols = x.shape
    p = _p
    y, dx = torch.empty_like(x), torch.empty_like(x)
    mean, inv = torch.empty(rows), torch.empty(rows)
    ds = None if w is None else torch.empty(cols)
    db = None if b is None else torch.empty(cols)
    assert lb.ortcpu_layernorm_forward_f32(p(x), p(w), p(b), p(y), p(mean), p(inv), rows,
                                           cols, eps, simplified, nthreads) == 0
    assert lb.ortcpu_layernorm_backward_f32(p(dy), p(x), p(w), p(b), p(mean), p(inv), p(dx),
                                            p(ds), p(db), rows, cols, simplified,
                                            nthreads) == 0
    return y, (mean if not simplified else None), inv, dx, ds, db


def _assert_within(a, r, bound, msg):
    err = (a.double() - r).abs()
    worst = float((err / bound).max()) if err.numel() else 0.0
    assert bool((err <= bound).all()), f"{msg}: max error / bound = {worst:.3g}"


# every row length to 70 (the vector and its masked tail), then across the 16-lane
# vectors and the 512-element blocks of the SIMD rows, and one row wide enough (>= 16384)
# that its rows are split across two threads
_ROW_COLS = [*range(1, 71), 127, 128, 129, 255, 256, 257, 511, 512, 513, 767, 768, 1041,
             4099, 20000]


@pytest.mark.parametrize("offset", [0.0, 300.0])
@pytest.mark.parametrize("cols", _ROW_COLS)
def test_float32_rows_of_every_build_vs_float64(cols, offset):
    """float32 LayerNorm / RMSNorm rows of every native build this CPU runs (the generic
    rows of the baseline build, the SIMD rows of norm_simd.h in the AVX2 and AVX-512
    builds), called directly, against float64 at the same float32 inputs: row counts that
    leave 1, 2, 3 and 4 rows in the forward's last four-row group, rows with a large mean
    (the variance and dX use deviations from the row mean), and dscale / dbias summed over
    300 rows (float partial sums flushed into double every 32 rows). The AVX2 and AVX-512
    SIMD rows are one algorithm on the same 16 lanes: their results must be bit-identical.

    Bounds per row, from the float64 reference's mean m and 1/std s (u = 2^-24): the
    float32 mean (stashed, as ORT's Mean output) is off by its rounding and its float-lane
    sum's error, dm <= u (|m| + 4 mean|x|), which shifts x-hat by s dm; dX is a sum of
    terms up to G = s max|g| (1 + max|x-hat|), g = dy * scale, so it carries a few u of G
    (with n = 1, dX = 0 exactly and G is |g| / sqrt(eps) ~ 300 |g|) plus the mean's shift,
    s dm G."""
    builds = _native_builds()
    rows_list = (1, 2, 3, 5, 8) if cols <= 70 else ((3, 300) if cols <= 4099 else (5,))
    u = 2.0 ** -24
    for rows in rows_list:
        x = torch.randn(rows, cols) + offset
        w, b, dy = torch.randn(cols), torch.randn(cols), torch.randn(rows, cols)
        cases = [("LayerNorm", w, b, 1e-5, 0), ("LayerNorm no affine", None, None, 1e-5, 0)]
        if offset == 0.0:  # RMSNorm of rows with a large mean is a different regime
            cases.append(("RMSNorm", w, None, 1e-6, 1))
        for name, cw, cb, eps, simplified in cases:
            x64, dy64 = x.double(), dy.double()
            p64 = [t.double().requires_grad_() for t in (x, cw, cb) if t is not None]
            w64 = p64[1] if cw is not None else None
            b64 = p64[-1] if cb is not None else None
            if simplified:
                y_ref = F.rms_norm(p64[0], (cols,), w64, eps)
                m64 = torch.zeros(rows, 1, dtype=torch.float64)
                s64 = (x64.square().mean(1, keepdim=True) + eps).rsqrt()
            else:
                y_ref = F.layer_norm(p64[0], (cols,), w64, b64, eps)
                m64 = x64.mean(1, keepdim=True)
                s64 = ((x64 - m64).square().mean(1, keepdim=True) + eps).rsqrt()
            grads = torch.autograd.grad(y_ref, p64, dy64)
            g_ref = dict(zip(("dx", "ds", "db")[: len(grads)], grads, strict=True))
            xh = (x64 - m64) * s64
            g = dy64 * (cw.double() if cw is not None else 1.0)
            # x-hat's shift from the float32 mean: its rounding and its float-lane sum's
            # error (relative to the sum of |x|)
            shift = u * s64 * (m64.abs() + 4 * x64.abs().mean(1, keepdim=True))
            big = s64 * g.abs().amax(1, keepdim=True) * (1 + xh.abs().amax(1, keepdim=True))
            wmax = float(cw.abs().max()) if cw is not None else 1.0
            # dscale / dbias: float partial sums over <= 32 rows (a few u of the sum of
            # |terms|); measured worst (8 seeds): below 0.4 of every bound
            bounds = {
                "y": 2e-5 + 1e-5 * y_ref.detach().abs() + shift * wmax,
                "dx": 4 * u * big + shift * big + 1e-4 * g_ref["dx"].abs(),
                "ds": 40 * u * (dy64 * xh).abs().sum(0) + (dy64.abs() * shift).sum(0),
                "db": 12 * u * dy64.abs().sum(0),
            }
            outs = {}
            for lv, lb in builds.items():
                y, mean, inv, dx, ds, db = _native_ln(lb, x, cw, cb, dy, eps, simplified)
                outs[lv] = (y, mean, inv, dx, ds, db)
                msg = f"{lv} {name} rows={rows} cols={cols} offset={offset}"
                _assert_within(y, y_ref.detach(), bounds["y"], f"{msg} y")
                _assert_within(dx, g_ref["dx"], bounds["dx"], f"{msg} dx")
                if cw is not None:
                    _assert_within(ds, g_ref["ds"], bounds["ds"], f"{msg} dscale")
                if cb is not None:
                    _assert_within(db, g_ref["db"], bounds["db"], f"{msg} dbias")
            if "avx2" in outs and "avx512" in outs:
                for i, (a2, a5) in enumerate(zip(outs["avx2"], outs["avx512"], strict=True)):
                    assert (a2 is None and a5 is None) or torch.equal(a2, a5), \
                        f"avx2 != avx512: output {i} of {name} rows={rows} cols={cols}"


def _guarded(shape):
    """A float32 tensor whose last element ends where an inaccessible page begins: a
    kernel that reads or writes one float past it faults."""
    page = mmap.PAGESIZE
    n = math.prod(shape)
    nbytes = -(-n * 4 // page) * page
    m = mmap.mmap(-1, nbytes + page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    assert libc.mprotect(base + nbytes, page, 0) == 0, ctypes.get_errno()  # PROT_NONE
    t = torch.frombuffer(m, dtype=torch.float32, count=n, offset=nbytes - n * 4)
    return t.view(shape)


@pytest.mark.parametrize("cols", [1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 255, 513])
def test_float32_rows_never_read_or_write_past_the_end(cols):
    """Every float32 input and output of the rows ends at an inaccessible page, in every
    native build this CPU runs: the masked tails of the SIMD rows (AVX-512 masks, AVX2
    vmaskmovps) touch nothing past n (a stray access faults)."""
    for rows in (1, 3, 5):
        x, dy, w, b = (_guarded(s) for s in ((rows, cols), (rows, cols), (cols,), (cols,)))
        x.copy_(torch.randn(rows, cols) + 3)
        dy.copy_(torch.randn(rows, cols))
        w.copy_(torch.randn(cols))
        b.copy_(torch.randn(cols))
        want = _native_ln(lib, x.clone(), w.clone(), b.clone(), dy.clone(), 1e-5, 0)
        for lv, lb in _native_builds().items():
            for simplified in (0, 1):
                cb = None if simplified else b
                y, dx = _guarded((rows, cols)), _guarded((rows, cols))
                mean, inv = _guarded((rows,)), _guarded((rows,))
                ds, db = _guarded((cols,)), _guarded((cols,))
                p = _p
                assert lb.ortcpu_layernorm_forward_f32(p(x), p(w), p(cb), p(y), p(mean),
                                                       p(inv), rows, cols, 1e-5,
                                                       simplified, 1) == 0
                assert lb.ortcpu_layernorm_backward_f32(
                    p(dy), p(x), p(w), p(cb), p(mean), p(inv), p(dx), p(ds),
                    p(None if simplified else db), rows, cols, simplified, 1) == 0
                if not simplified and lv == loader.ISA:  # the same rows as in ordinary memory
                    for a, r in zip((y, mean, inv, dx, ds, db), want, strict=True):
                        assert torch.equal(a, r), (lv, rows, cols)


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
