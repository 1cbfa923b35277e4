"""Convolution, pooling, MatMul/Gemm (issue 5): registry kernels and ops/nn front ends
against torch (float32 with stated tolerances, float64), float64 gradcheck of every
gradient, float32 gradients vs torch autograd over a parameter sweep, edge cases and bad
input.

Tolerances: float32 conv compares against torch's float32 conv (oneDNN, different
summation order): both sides' error is ~eps * sqrt(C*k) * |x||w|; rtol 1e-4 / atol 1e-4
on O(1) data covers the measured worst (3.8e-6 on sums of 576 products) with margin.
Pooling is exact (max) or a few ulp (average); float64 uses 1e-10.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from ortcpu_torch import kernels as K
from ortcpu_torch import nn, ops

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float64: dict(rtol=1e-10, atol=1e-10)}
DT = (torch.float32, torch.float64)
FCONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _close(a, b, dtype):
    torch.testing.assert_close(a, b, **TOL[dtype])


# ---- Conv: registry vs torch -----------------------------------------------------------

# (rank, N, C, M, group, spatial, kernel, stride, pads(begin+end), dilation)
CONV_CASES = [
    (2, 2, 4, 6, 1, (9, 11), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    (2, 3, 4, 6, 2, (9, 7), (3, 2), (2, 1), (1, 0, 2, 1), (1, 2)),  # asymmetric, grouped
    (2, 1, 6, 6, 6, (8, 8), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),  # depthwise
    (2, 2, 3, 4, 1, (5, 13), (5, 1), (3, 2), (2, 0, 2, 0), (1, 1)),
    (2, 0, 3, 4, 1, (6, 6), (3, 3), (1, 1), (0, 0, 0, 0), (1, 1)),  # empty batch
    (2, 2, 8, 4, 1, (7, 5), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),  # pointwise
    (2, 2, 8, 4, 2, (7, 5), (1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),  # strided 1x1
    (1, 3, 4, 4, 2, (17,), (4,), (3,), (2, 1), (2,)),
    (1, 1, 2, 3, 1, (70,), (5,), (1,), (0, 4), (1,)),
    (3, 2, 2, 4, 2, (5, 6, 7), (3, 2, 3), (1, 2, 1), (1, 0, 1, 1, 1, 0), (1, 1, 2)),
    (3, 1, 3, 2, 1, (4, 4, 4), (2, 2, 2), (2, 2, 2), (0, 0, 0, 0, 0, 0), (1, 1, 1)),
]


def _torch_conv(x, w, b, r, stride, pads, dil, group):
    pad = []
    for i in reversed(range(r)):
        pad += [pads[i], pads[r + i]]
    return FCONV[r](F.pad(x, pad), w, b, stride=stride, dilation=dil, groups=group)


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_and_convgrad_vs_torch(case, dtype):
    r, n, c, m, group, sp, k, s, pads, d = case
    x = torch.randn(n, c, *sp, dtype=dtype)
    w = torch.randn(m, c // group, *k, dtype=dtype)
    b = torch.randn(m, dtype=dtype)
    attrs = dict(strides=list(s), pads=list(pads), dilations=list(d), group=group)
    y = K.Conv(x, w, b, **attrs)
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    ref = _torch_conv(xr, wr, br, r, s, pads, d, group)
    _close(y, ref.detach(), dtype)
    g = torch.randn_like(ref)
    ref.backward(g)
    dx, dw, db = K.ConvGrad(g, x, w, **attrs)
    _close(dx, xr.grad, dtype)
    _close(dw, wr.grad, dtype)
    _close(db, br.grad, dtype)
    # needs= skips outputs, the rest are unchanged
    dx2, dw2, db2 = K.ConvGrad(g, x, w, needs=(False, True, False), **attrs)
    assert dx2 is None and db2 is None
    _close(dw2, wr.grad, dtype)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("stride", [1, 2])
def test_conv_auto_pad(auto_pad, stride):
    x = torch.randn(2, 3, 10, 9, dtype=torch.float64)
    w = torch.randn(4, 3, 4, 3, dtype=torch.float64)
    y = K.Conv(x, w, auto_pad=auto_pad, strides=[stride, stride])
    if auto_pad == "VALID":
        pads = [0, 0, 0, 0]
    else:
        pads = []
        for n, kk in zip((10, 9), (4, 3), strict=True):
            o = -(-n // stride)
            tot = max(0, (o - 1) * stride + kk - n)
            lo = tot // 2 if auto_pad == "SAME_UPPER" else tot - tot // 2
            pads.append((lo, tot - lo))
        pads = [pads[0][0], pads[1][0], pads[0][1], pads[1][1]]
        assert tuple(y.shape[2:]) == (-(-10 // stride), -(-9 // stride))
    ref = _torch_conv(x, w, None, 2, (stride, stride), pads, (1, 1), 1)
    _close(y, ref, torch.float64)
    g = torch.randn_like(ref)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    _torch_conv(xr, wr, None, 2, (stride, stride), pads, (1, 1), 1).backward(g)
    dx, dw, _ = K.ConvGrad(g, x, w, auto_pad=auto_pad, strides=[stride, stride])
    _close(dx, xr.grad, torch.float64)
    _close(dw, wr.grad, torch.float64)


# ---- ops.conv*: f32 gradients vs torch over a sweep, f64 gradcheck -----------------------

SWEEP = list(itertools.product(
    [1, 2, 3, 5],        # kernel
    [1, 2, 3],           # stride
    [0, 1, "same"],      # padding
    [1, 2],              # dilation
    ["1", "2", "C"],     # groups
))


def _sweep_cases():
    out = []
    for i, (k, s, p, d, g) in enumerate(SWEEP):
        if p == "same" and s != 1:
            continue
        if i % 3:  # a deterministic third of the grid keeps the suite fast; all axes covered
            continue
        out.append((k, s, p, d, g))
    return out


@pytest.mark.parametrize("k,s,p,d,g", _sweep_cases())
def test_conv2d_f32_grads_vs_torch_sweep(k, s, p, d, g):
    c = 4
    groups = {"1": 1, "2": 2, "C": c}[g]
    m = 2 * groups if g != "1" else 3
    n = 2 if k % 2 else 1
    h, w_ = 11, 8
    if isinstance(p, int) and (h + 2 * p < d * (k - 1) + 1 or w_ + 2 * p < d * (k - 1) + 1):
        pytest.skip("kernel larger than the padded input")
    x = torch.randn(n, c, h, w_, requires_grad=True)
    w = torch.randn(m, c // groups, k, k, requires_grad=True)
    b = torch.randn(m, requires_grad=True)
    y = ops.conv2d(x, w, b, s, p, d, groups)
    x2, w2, b2 = (t.detach().clone().requires_grad_() for t in (x, w, b))
    ref = F.conv2d(x2, w2, b2, s, p, d, groups)
    _close(y, ref, torch.float32)
    g_ = torch.randn_like(ref)
    y.backward(g_)
    ref.backward(g_)
    for a, bb in ((x, x2), (w, w2), (b, b2)):
        torch.testing.assert_close(a.grad, bb.grad, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,c,m,size,k,s,g", [
    (7, 4, 6, (4, 4), (3, 3), 2, 2),      # odd batch split over threads, groups
    (5, 3, 5, (6, 5), (3, 1), 1, 1),      # blocks of samples with a ragged last block
    (3, 512, 4, (2, 2), (3, 3), 1, 1),    # a tall column matrix: the scratch cap binds
    (9, 2, 3, (3, 2, 2), (2, 2, 1), 1, 1),  # 3-D
])
def test_im2col_sample_blocks_vs_torch(threads, n, c, m, size, k, s, g):
    # small output maps put several samples side by side in one GEMM (conv_batch);
    # float64 against torch, forward and every gradient
    from ortcpu_torch import set_num_threads
    set_num_threads(threads)
    x = torch.randn(n, c, *size, dtype=torch.float64, requires_grad=True)
    w = torch.randn(m, c // g, *k, dtype=torch.float64, requires_grad=True)
    b = torch.randn(m, dtype=torch.float64, requires_grad=True)
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[len(size)]
    ours = {1: ops.conv1d, 2: ops.conv2d, 3: ops.conv3d}[len(size)]
    ref, out = conv(x, w, b, s, 1, 1, g), ours(x, w, b, s, 1, 1, g)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    dy = torch.randn_like(ref)
    for a, r in zip(torch.autograd.grad(out, (x, w, b), dy),
                    torch.autograd.grad(ref, (x, w, b), dy), strict=True):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("r", [1, 2, 3])
def test_conv_gradcheck(r):
    sp = {1: (7,), 2: (4, 5), 3: (3, 2, 4)}[r]
    x = torch.randn(2, 2, *sp, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 1, *([2] * r), dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, dtype=torch.float64, requires_grad=True)
    fn = {1: ops.conv1d, 2: ops.conv2d, 3: ops.conv3d}[r]
    assert torch.autograd.gradcheck(lambda x, w, b: fn(x, w, b, 2, 1, 1, 2), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: fn(x, w, None, 1, "same", 2, 2), (x, w))


def test_conv_ops_forms():
    x = torch.randn(2, 3, 10)
    w = torch.randn(5, 3, 3)
    tol = TOL[torch.float32]
    torch.testing.assert_close(ops.conv1d(x, w, padding="valid"), F.conv1d(x, w), **tol)
    torch.testing.assert_close(ops.conv1d(x[0], w, padding=1), F.conv1d(x[0], w, padding=1),
                               **tol)
    # unbatched 2-D, non-contiguous input
    xt = torch.randn(3, 10, 12).transpose(1, 2)
    w2 = torch.randn(4, 3, 3, 3)
    torch.testing.assert_close(ops.conv2d(xt, w2, stride=(2, 1), padding=(1, 0)),
                               F.conv2d(xt, w2, stride=(2, 1), padding=(1, 0)),
                               **TOL[torch.float32])


# ---- pooling ---------------------------------------------------------------------------

# (rank, spatial, kernel, stride, padding, dilation, ceil_mode)
POOL_CASES = [
    (2, (8, 8), 2, 2, 0, 1, False),
    (2, (9, 7), 2, 2, 0, 1, True),
    (2, (9, 11), 3, 2, 1, 1, True),
    (2, (10, 9), (3, 2), (1, 2), (1, 0), 1, False),
    (2, (12, 12), 3, 2, 1, 2, False),
    (1, (70,), 3, 2, 1, 1, True),
    (1, (13,), 4, 1, 2, 1, False),
    (3, (5, 6, 7), 3, 1, 1, 1, False),    # overlapping 3-D windows
    (3, (6, 5, 7), (2, 3, 2), (2, 1, 2), (1, 1, 0), 1, True),
]
MAXF = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
AVGF = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
OMAX = {1: ops.max_pool1d, 2: ops.max_pool2d, 3: ops.max_pool3d}
OAVG = {1: ops.avg_pool1d, 2: ops.avg_pool2d, 3: ops.avg_pool3d}


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool_vs_torch(case, dtype):
    r, sp, k, s, p, d, cm = case
    x = torch.randn(2, 3, *sp, dtype=dtype, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y, idx = OMAX[r](x, k, s, p, d, cm, return_indices=True)
    ref, ridx = MAXF[r](x2, k, s, p, d, cm, return_indices=True)
    assert torch.equal(y, ref) and torch.equal(idx, ridx)
    g = torch.randn_like(ref)
    y.backward(g)
    ref.backward(g)
    _close(x.grad, x2.grad, dtype)


@pytest.mark.parametrize("case", POOL_CASES[:7])
def test_max_pool_indices_with_ties_and_nans_vs_torch(case):
    """Indices of 1-D and 2-D pools come from the argmax-code kernel (every window's taps
    unclipped over a -inf padded plane): ties keep torch's first maximum, a NaN torch's
    (the last NaN in the window), windows overlapping the padding an in-image tap."""
    r, sp, k, s, p, d, cm = case
    torch.manual_seed(0)
    x = torch.randn(2, 3, *sp).round()  # many ties
    x[torch.rand_like(x) < 0.05] = float("nan")
    y, idx = OMAX[r](x, k, s, p, d, cm, return_indices=True)
    ref, ridx = MAXF[r](x, k, s, p, d, cm, return_indices=True)
    assert torch.equal(idx, ridx)
    assert torch.equal(y.isnan(), ref.isnan())
    assert torch.equal(y.nan_to_num(), ref.nan_to_num())


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("case", POOL_CASES + [
    (2, (31, 40), 3, 2, 0, 1, True),      # squeezenet's 3x3/s2 ceil_mode
    (2, (17, 23), 3, 1, 1, 1, False),
    (2, (16, 21), 2, 2, 1, 1, True),
    (2, (19, 25), (2, 5), (3, 2), (1, 2), (1, 2), False),
    (1, (3,), 5, 1, 2, 1, False),
])
def test_max_pool_without_indices_vs_torch(case, dtype):
    """Y alone takes the separable path (column maxima, then window maxima); NaN still
    propagates from any tap."""
    r, sp, k, s, p, d, cm = case
    x = torch.randn(2, 3, *sp, dtype=dtype)
    x.view(-1)[:: max(x.numel() // 5, 1)] = float("nan")
    kw = dict(kernel_shape=[k] * r if isinstance(k, int) else list(k),
              strides=[s] * r if isinstance(s, int) else list(s),
              dilations=[d] * r if isinstance(d, int) else list(d),
              ceil_mode=int(cm), needs=(True, False))
    pp = [p] * r if isinstance(p, int) else list(p)
    y, none = K.MaxPool(x, pads=pp + pp, **kw)
    assert none is None
    ref = MAXF[r](x, k, s, p, d, cm)
    torch.testing.assert_close(y, ref, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("stride,ceil", [(2, False), (2, True), (1, False)])
def test_max_pool_without_indices_beyond_the_cache(stride, ceil, threads):
    """An input over 2 MB (beyond L2) takes the separable path with the input fetched ahead
    across plane ends (resnet's 3x3/s2 stem pool, squeezenet's ceil_mode one, inception's
    3x3/s1): exact, NaN kept."""
    x = torch.randn(2, 64, 97, 97)
    x.view(-1)[::100_003] = float("nan")
    assert x.numel() * 4 > 2 * 1024 * 1024
    pads = [0] * 4 if ceil else [1] * 4
    torch.set_num_threads(threads)
    try:
        y, _ = K.MaxPool(x, kernel_shape=[3, 3], strides=[stride, stride], pads=pads,
                         ceil_mode=int(ceil), needs=(True, False))
    finally:
        torch.set_num_threads(1)
    ref = F.max_pool2d(x, 3, stride, 0 if ceil else 1, ceil_mode=ceil)
    torch.testing.assert_close(y, ref, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("cip", [True, False])
@pytest.mark.parametrize("case", POOL_CASES)
def test_avg_pool_vs_torch(case, cip, dtype):
    r, sp, k, s, p, d, cm = case
    if d != 1:
        pytest.skip("average pooling has no dilation")
    x = torch.randn(2, 3, *sp, dtype=dtype, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y = OAVG[r](x, k, s, p, cm, cip)
    ref = AVGF[r](x2, k, s, p, cm, cip)
    _close(y, ref, dtype)
    g = torch.randn_like(ref)
    y.backward(g)
    ref.backward(g)
    _close(x.grad, x2.grad, dtype)


def test_avg_pool_divisor_override():
    x = torch.randn(2, 3, 9, 8, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y = ops.avg_pool2d(x, 3, 2, 1, divisor_override=5)
    ref = F.avg_pool2d(x2, 3, 2, 1, divisor_override=5)
    _close(y, ref, torch.float32)
    y.sum().backward()
    ref.sum().backward()
    _close(x.grad, x2.grad, torch.float32)
    y = ops.avg_pool2d(x, 2, divisor_override=3)
    _close(y, F.avg_pool2d(x, 2, divisor_override=3), torch.float32)


def test_avgpoolgrad_3d_overlapping_registry():
    """ORT 1.19.2 is wrong here (assigns instead of accumulating); we match torch."""
    x = torch.randn(2, 2, 5, 6, 4, dtype=torch.float64, requires_grad=True)
    ref = F.avg_pool3d(x, 3, 1, 1, count_include_pad=False)
    g = torch.randn_like(ref)
    ref.backward(g)
    dx = K.AveragePoolGrad(g, kernel_shape=[3, 3, 3], strides=[1, 1, 1], pads=[1] * 6,
                           count_include_pad=0, output_shape=list(x.shape))
    _close(dx, x.grad, torch.float64)


@pytest.mark.parametrize("w", [1, 2, 3, 7, 16, 31, 33, 64, 70])
def test_pool_2x2_fast_path_odd_widths(w):
    x = torch.randn(2, 3, 6, w)
    if w < 2:
        with pytest.raises(ValueError):
            ops.max_pool2d(x, 2)
        return
    for fo, ft in ((ops.max_pool2d, F.max_pool2d), (ops.avg_pool2d, F.avg_pool2d)):
        xa = x.clone().requires_grad_()
        xb = x.clone().requires_grad_()
        ya, yb = fo(xa, 2), ft(xb, 2)
        _close(ya, yb, torch.float32)
        g = torch.randn_like(yb)
        ya.backward(g)
        yb.backward(g)
        _close(xa.grad, xb.grad, torch.float32)


def _max_pool_2x2_exact(shape, dtype, threads):
    """ops.max_pool2d(x, 2) and its dX equal torch's bit for bit: ties (first maximum),
    NaN (it wins), +-inf and zero gradients included."""
    torch.set_num_threads(threads)
    try:
        x = torch.randn(*shape, dtype=dtype)
        if x.numel():
            v = x.view(-1)
            k = v[1::7].numel()
            v[: 7 * k : 7] = v[1::7]  # ties
            v[5::97] = float("nan")
            x.view(-1)[3::53] = float("inf")
            x.view(-1)[9::61] = -float("inf")
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ops.max_pool2d(xa, 2), F.max_pool2d(xb, 2)
        torch.testing.assert_close(ya, yb, rtol=0, atol=0, equal_nan=True)
        g = torch.randn_like(yb)
        g.view(-1)[::5] = 0
        ya.backward(g)
        yb.backward(g)
        torch.testing.assert_close(xa.grad, xb.grad, rtol=0, atol=0, equal_nan=True)
    finally:
        torch.set_num_threads(1)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(64, 32, 8, 8), (5, 3, 4, 4), (2, 3, 2, 2), (3, 2, 6, 32),
                                   (1, 1, 2, 34), (0, 3, 4, 4), (2, 3, 8, 9), (2, 3, 9, 8)])
@pytest.mark.parametrize("dtype", DT)
def test_max_pool_2x2_small_maps_exact(shape, dtype, threads):
    """The short-row 2x2 paths (input rows and columns exactly covered by the windows;
    8x9 / 9x8 take the row path)."""
    _max_pool_2x2_exact(shape, dtype, threads)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(64, 32, 28, 28), (64, 64, 14, 14), (3, 5, 10, 10),
                                   (2, 3, 12, 12), (1, 3, 6, 40), (2, 2, 34, 34),
                                   (1, 1, 4, 66), (3, 1, 2, 2050), (1, 7, 2, 2048),
                                   (0, 2, 14, 14), (1, 1, 30, 30), (2, 3, 14, 15)])
@pytest.mark.parametrize("dtype", DT)
def test_max_pool_2x2_vector_rows_exact(shape, dtype, threads):
    """The vector 2x2 path (pool.inc mp2v_*: even planes, 5 to 1024 outputs per row, a
    block's outputs in one flat loop, tails of every vector width); 2x2050 (1025 per
    row) and 14x15 take the row path."""
    _max_pool_2x2_exact(shape, dtype, threads)


def test_max_pool_2x2_vector_rows_gradcheck():
    x = torch.randn(2, 3, 10, 14, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ops.max_pool2d(t, 2), (x,))


def test_max_pool_2x2_small_map_gradcheck():
    x = torch.randn(3, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ops.max_pool2d(t, 2), (x,))
    x = torch.randn(2, 8, 8, dtype=torch.float64, requires_grad=True)  # unbatched
    assert torch.autograd.gradcheck(lambda t: ops.max_pool2d(t, 2), (x,))


def test_pool_gradcheck():
    x = torch.randn(2, 2, 5, 6, dtype=torch.float64, requires_grad=True)
    x3 = torch.randn(1, 2, 4, 5, 4, dtype=torch.float64, requires_grad=True)
    x1 = torch.randn(2, 3, 9, dtype=torch.float64, requires_grad=True)
    checks = [
        (lambda t: ops.max_pool2d(t, 3, 2, 1, ceil_mode=True), x),
        (lambda t: ops.max_pool2d(t, 2, 1, 0, dilation=2), x),
        (lambda t: ops.avg_pool2d(t, 3, 2, 1, ceil_mode=True), x),
        (lambda t: ops.avg_pool2d(t, 3, 1, 1, count_include_pad=False), x),
        (lambda t: ops.max_pool3d(t, 3, 1, 1), x3),
        (lambda t: ops.avg_pool3d(t, 3, 1, 1, count_include_pad=False), x3),
        (lambda t: ops.max_pool1d(t, 3, 2, 1), x1),
        (lambda t: ops.avg_pool1d(t, 4, 2, 2, ceil_mode=True), x1),
        (lambda t: ops.adaptive_avg_pool2d(t, 1), x),
        (lambda t: ops.global_max_pool(t), x3),
        (lambda t: ops.global_avg_pool(t), x1),
    ]
    for fn, t in checks:
        assert torch.autograd.gradcheck(fn, (t,))


@pytest.mark.parametrize("dtype", DT)
def test_global_pools(dtype):
    x = torch.randn(3, 4, 5, 7, dtype=dtype)
    _close(K.GlobalAveragePool(x), x.mean((2, 3), keepdim=True), dtype)
    _close(K.GlobalMaxPool(x), x.amax((2, 3), keepdim=True), dtype)
    xa = x.clone().requires_grad_()
    xb = x.clone().requires_grad_()
    ops.adaptive_avg_pool2d(xa, (1, 1)).sum().backward()
    F.adaptive_avg_pool2d(xb, 1).sum().backward()
    _close(xa.grad, xb.grad, dtype)
    with pytest.raises(ValueError, match="output_size"):
        ops.adaptive_avg_pool2d(x, 2)


def test_maxpool_registry_indices_and_grad():
    x = torch.randn(2, 3, 7, 6)
    y, idx = K.MaxPool(x, kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 0])
    # Indices are flat offsets into the whole tensor
    torch.testing.assert_close(x.reshape(-1)[idx.reshape(-1)].view_as(y), y)
    _, idx_col = K.MaxPool(x, kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 0],
                           storage_order=1)
    plane = idx // 42
    h, w = (idx % 42) // 6, idx % 6
    assert torch.equal(idx_col, plane * 42 + w * 7 + h)
    y2, none = K.MaxPool(x, kernel_shape=[2, 2], needs=(True, False))
    assert none is None and y2.shape == (2, 3, 6, 5)
    g = torch.randn_like(y)
    dx = K.MaxPoolGrad(g, idx, output_shape=[9, 3, 7, 6])  # dim 0 comes from dY
    ref = torch.zeros(x.numel()).index_add_(0, idx.reshape(-1), g.reshape(-1)).view_as(x)
    torch.testing.assert_close(dx, ref)


def test_maxpool_nan_propagates():
    x = torch.randn(1, 2, 6, 6)
    x[0, 0, 1, 1] = float("nan")
    x[0, 1, 3, 2] = float("nan")
    for kw in (dict(kernel_size=2), dict(kernel_size=3, stride=1, padding=1)):
        a = ops.max_pool2d(x, **kw)
        b = F.max_pool2d(x, **kw)
        assert torch.equal(a.isnan(), b.isnan())
        torch.testing.assert_close(a, b, equal_nan=True)
    assert K.GlobalMaxPool(x).isnan().all()
    # gradient through the 2x2 fast path lands on the NaN, as in torch
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ops.max_pool2d(xa, 2).sum().backward()
    F.max_pool2d(xb, 2).sum().backward()
    assert torch.equal(xa.grad, xb.grad)


def test_maxpoolgrad_index_out_of_range():
    g = torch.randn(1, 1, 2, 2)
    idx = torch.tensor([[[[0, 1], [2, 99]]]])
    with pytest.raises(RuntimeError, match="outside"):
        K.MaxPoolGrad(g, idx, output_shape=[1, 1, 4, 4])
    # an index into another plane is legal (applied serially)
    g2 = torch.ones(1, 2, 1, 1)
    dx = K.MaxPoolGrad(g2, torch.tensor([[[[5]], [[5]]]]), output_shape=[1, 2, 2, 2])
    assert dx.reshape(-1)[5] == 2 and dx.sum() == 2


# ---- MatMul / Gemm ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("sa,sb", [
    ((5, 7), (7, 3)), ((2, 1, 5, 7), (3, 7, 4)), ((7,), (7, 4)), ((3, 5, 7), (7,)),
    ((7,), (7,)), ((4, 65, 33), (4, 33, 70)), ((0, 5, 7), (7, 3)), ((5, 0), (0, 3)),
    ((1, 300, 64), (64, 200)),
])
def test_matmul(sa, sb, dtype):
    a, b = torch.randn(*sa, dtype=dtype), torch.randn(*sb, dtype=dtype)
    _close(K.MatMul(a, b), torch.matmul(a, b), dtype)


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("cshape", [None, (), (1,), (40,), (30, 1), (30, 40)])
def test_gemm(ta, tb, cshape, dtype):
    m, n, k = 30, 40, 50
    a = torch.randn(*((k, m) if ta else (m, k)), dtype=dtype)
    b = torch.randn(*((n, k) if tb else (k, n)), dtype=dtype)
    c = None if cshape is None else torch.randn(cshape, dtype=dtype)
    y = K.Gemm(a, b, c, alpha=0.5, beta=1.5, transA=ta, transB=tb)
    ref = 0.5 * (a.T if ta else a) @ (b.T if tb else b)
    if c is not None:
        ref = ref + 1.5 * c
    _close(y, ref, dtype)


def test_gemm_large_split_over_threads():
    # k = 300 float32 dot products: the truth is float64 (ours 8.6e-5 absolute measured on
    # results ~ ±50, torch's own float32 3e-5), not torch's float32 result
    for m, n in ((257, 513), (1025, 20)):
        a, b = torch.randn(m, 300), torch.randn(300, n)
        torch.testing.assert_close(K.Gemm(a, b).double(), a.double() @ b.double(), rtol=0,
                                   atol=4e-4)


# ---- nn modules ----------------------------------------------------------------------

def test_nn_conv_modules_match_torch():
    for ours, theirs, shape in (
        (nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2), torch.nn.Conv1d(4, 6, 3, 2, 1,
                                                                            groups=2), (2, 4, 11)),
        (nn.Conv2d(4, 6, (3, 2), padding="same", dilation=2, bias=False),
         torch.nn.Conv2d(4, 6, (3, 2), padding="same", dilation=2, bias=False), (2, 4, 9, 8)),
        (nn.Conv3d(2, 4, 3, padding=1), torch.nn.Conv3d(2, 4, 3, padding=1), (1, 2, 5, 4, 6)),
    ):
        assert list(ours.state_dict()) == list(theirs.state_dict())
        theirs.load_state_dict(ours.state_dict())
        x = torch.randn(*shape)
        torch.testing.assert_close(ours(x), theirs(x), **TOL[torch.float32])
        ours(x).sum().backward()
        theirs(x).sum().backward()
        torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="padding_mode"):
        nn.Conv2d(2, 2, 3, padding_mode="reflect")


def test_nn_pool_modules_match_torch():
    x = torch.randn(2, 3, 9, 10)
    pairs = [
        (nn.MaxPool2d(3, 2, 1, ceil_mode=True), torch.nn.MaxPool2d(3, 2, 1, ceil_mode=True)),
        (nn.AvgPool2d(2), torch.nn.AvgPool2d(2)),
        (nn.AdaptiveAvgPool2d(1), torch.nn.AdaptiveAvgPool2d(1)),
    ]
    for a, b in pairs:
        torch.testing.assert_close(a(x), b(x))
    x1 = torch.randn(2, 3, 9)
    torch.testing.assert_close(nn.MaxPool1d(2)(x1), torch.nn.MaxPool1d(2)(x1))
    torch.testing.assert_close(nn.AvgPool1d(3, 1, 1)(x1), torch.nn.AvgPool1d(3, 1, 1)(x1))
    x3 = torch.randn(1, 2, 4, 5, 6)
    torch.testing.assert_close(nn.MaxPool3d(2)(x3), torch.nn.MaxPool3d(2)(x3))
    torch.testing.assert_close(nn.AvgPool3d(2, 1)(x3), torch.nn.AvgPool3d(2, 1)(x3))
    y, i = nn.MaxPool2d(2, return_indices=True)(x)
    assert torch.equal(i, torch.nn.MaxPool2d(2, return_indices=True)(x)[1])
    with pytest.raises(ValueError, match="output_size"):
        nn.AdaptiveAvgPool2d(3)


# ---- bad input -------------------------------------------------------------------------

def test_bad_input():
    x = torch.randn(2, 5, 8, 8)
    w = torch.randn(4, 2, 3, 3)
    x_before = x.clone()
    with pytest.raises(ValueError, match="divisible by group"):
        K.Conv(x, w, group=2)
    with pytest.raises(ValueError, match="divisible by group"):
        ops.conv2d(x, w, groups=2)
    with pytest.raises(ValueError, match="larger than the padded input"):
        K.Conv(torch.randn(1, 2, 2, 2), torch.randn(3, 2, 4, 4), pads=[0, 0, 1, 1])
    with pytest.raises(ValueError, match="pads must be >= 0"):
        K.Conv(torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), pads=[-1, 0, 0, 0])
    with pytest.raises(ValueError, match="padding must be >= 0"):
        ops.conv2d(torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), padding=-1)
    with pytest.raises(ValueError, match="same"):
        ops.conv2d(torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), stride=2, padding="same")
    with pytest.raises(TypeError, match="W must have the dtype"):
        K.Conv(x, torch.randn(4, 5, 3, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="int64"):
        K.Conv(x.long(), w)
    with pytest.raises(ValueError, match="dY must have the Conv output shape"):
        K.ConvGrad(torch.randn(2, 4, 5, 5), torch.randn(2, 2, 8, 8), w)
    with pytest.raises(ValueError, match="kernel_shape is required"):
        K.MaxPool(x)
    with pytest.raises(ValueError, match="auto_pad"):
        K.AveragePool(x, kernel_shape=[2, 2], auto_pad="SAME")
    with pytest.raises(ValueError, match="output_shape"):
        K.AveragePoolGrad(torch.randn(1, 1, 2, 2), kernel_shape=[2, 2])
    with pytest.raises(ValueError, match="half of the kernel"):
        ops.max_pool2d(x, 2, padding=2)
    with pytest.raises(ValueError, match="inner dims"):
        K.MatMul(torch.randn(3, 4), torch.randn(5, 6))
    with pytest.raises(ValueError, match="broadcast"):
        K.MatMul(torch.randn(2, 3, 4), torch.randn(3, 4, 6))
    with pytest.raises(ValueError, match="does not broadcast"):
        K.Gemm(torch.randn(3, 4), torch.randn(4, 5), torch.randn(4))
    assert torch.equal(x, x_before)


@pytest.mark.parametrize("n", [1, 3])
def test_conv_threaded_paths(n):
    """Big enough to go parallel: N=1 splits each GEMM over threads, N=3 splits the batch
    unevenly and sums per-thread dW/dB partials."""
    import ortcpu_torch

    ortcpu_torch.set_num_threads(2)
    x = torch.randn(n, 16, 30, 33, dtype=torch.float64)
    w = torch.randn(32, 16, 3, 3, dtype=torch.float64)
    b = torch.randn(32, dtype=torch.float64)
    y = K.Conv(x, w, b, pads=[1, 1, 1, 1])
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    ref = F.conv2d(xr, wr, br, padding=1)
    _close(y, ref.detach(), torch.float64)
    g = torch.randn_like(ref)
    ref.backward(g)
    dx, dw, db = K.ConvGrad(g, x, w, pads=[1, 1, 1, 1])
    _close(dx, xr.grad, torch.float64)
    _close(dw, wr.grad, torch.float64)
    _close(db, br.grad, torch.float64)


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("case", [c for c in POOL_CASES if c[0] < 3] + [
    (2, (32, 32), 3, 2, 1, 1, False),     # resnet's stem pool
    (2, (31, 40), 3, 2, 0, 1, True),
    (2, (17, 23), 3, 1, 1, 1, False),
    (2, (16, 21), 2, 2, 1, 1, True),
    (2, (7, 9), (2, 5), (3, 2), (1, 2), 1, True),
    (2, (20, 18), 16, 1, 0, 1, False),    # 256 taps: the largest window with a code
    (2, (20, 18), (17, 16), 1, 0, 1, False),  # 272 taps: the Indices path
    (1, (3,), 5, 1, 2, 1, False),
])
@pytest.mark.parametrize("values", ["normal", "ties", "special"])
def test_max_pool_code_path_vs_torch(case, dtype, values):
    """Training max pools without return_indices keep a 1-byte argmax code per window
    (1-D/2-D, dilation 1, up to 256 taps): Y, and dX from the code, as torch's (first
    maximum in raster order on ties, NaN wins, -inf inputs, windows over the padding)."""
    r, sp, k, s, p, d, cm = case
    x = torch.randn(2, 3, *sp, dtype=dtype)
    if values == "ties":
        x = x.round().clamp(-1, 1)
    elif values == "special":
        flat = x.view(-1)
        flat[::7] = float("-inf")
        flat[::11] = float("nan")
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = OMAX[r](xa, k, s, p, d, cm), MAXF[r](xb, k, s, p, d, cm)
    torch.testing.assert_close(ya, yb, rtol=0, atol=0, equal_nan=True)
    g = torch.randn_like(yb)
    ya.backward(g)
    yb.backward(g)
    _close(xa.grad, xb.grad, dtype)


def test_max_pool_code_path_gradcheck():
    x = torch.randn(2, 2, 7, 6, dtype=torch.float64, requires_grad=True)
    for fn in (lambda t: ops.max_pool2d(t, 3, 2, 1), lambda t: ops.max_pool2d(t, (2, 3), 1),
               lambda t: ops.max_pool1d(t.flatten(2), 4, 3, 2, ceil_mode=True)):
        assert torch.autograd.gradcheck(fn, (x,))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("pad,ceil", [(0, False), (0, True), (1, False), (1, True)])
def test_max_pool_3x3_rows_exact(pad, ceil, stride, threads):
    """The 3x3 / stride-1 and stride-2 row kernels (16 outputs a step from the column maxima
    of 18 / 33 columns, masked at the row ends; AVX-512 builds): widths across the 16- and
    32-output steps, heights with a partial last window, NaN and infinities in any tap;
    float64 takes the generic rows."""
    g = torch.Generator().manual_seed(11)
    torch.set_num_threads(threads)
    try:
        for dtype in (torch.float32, torch.float64):
            for w in (3, 4, 5, 15, 16, 17, 31, 32, 33, 34, 35, 63, 64, 65, 67):
                h = 7 if w % 2 else 6
                x = torch.randn(2, 3, h, w, generator=g, dtype=dtype)
                flat = x.view(-1)
                flat[::7] = float("nan")
                flat[3::11] = float("inf")
                flat[5::13] = float("-inf")
                y, _ = K.MaxPool(x, kernel_shape=[3, 3], strides=[stride] * 2,
                                 pads=[pad] * 4, ceil_mode=int(ceil), needs=(True, False))
                ref = F.max_pool2d(x, 3, stride, pad, ceil_mode=ceil)
                torch.testing.assert_close(y, ref, equal_nan=True, rtol=0, atol=0,
                                           msg=f"{dtype} {h}x{w}")
    finally:
        torch.set_num_threads(1)
