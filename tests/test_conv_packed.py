"""The packed small-map path (native/src/conv_pk.inc: forward and dX on our register-tile
GEMM against weights packed once per call; dW / dB on the small-map im2col path, dW as
dot products on AVX-512 builds where col has at most 32 rows), forced with
algo="packed" and chosen by auto on small maps with small weights: forward, dX, dW, dB
against torch in float64 and float32 over the small-map geometries (pads, strides,
groups, odd maps), tile tails (output channels not a multiple of the 6 / 8-row tile, maps
not a multiple of the 16 / 32-column tile, the narrow one-vector tile; dW's 4 x 4
dot-product tile), tiny planes (<= 16 positions), batch 0/1/odd, 1 and 2 threads;
float64 gradcheck through the autograd front end; NaN and inf; the routing of auto by
shape and dtype (kernels.conv.conv_path); a clear error where the geometry does not
fit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ortcpu_torch
from ortcpu_torch.kernels import conv as KC

from .test_conv_small_map import CASES, STRIDED, float64_case

TAILS = [  # n, c, m, h, w, kernel, strides, pads [top, left, bottom, right], groups
    (64, 32, 64, 4, 4, (3, 3), (1, 1), [1, 1, 1, 1], 1),   # digits' second conv
    (64, 1, 32, 8, 8, (3, 3), (1, 1), [1, 1, 1, 1], 1),    # digits' first conv
    # the narrow tile (one vector of columns, two row panels): 16 positions with 20
    # output channels (the last pair of panels a single one), and 2x2 maps, whose
    # samples share the vector
    (5, 6, 20, 4, 4, (3, 3), (1, 1), [1, 1, 1, 1], 1),
    (9, 5, 17, 2, 2, (3, 3), (1, 1), [1, 1, 1, 1], 1),
    (1, 3, 7, 5, 7, (3, 3), (1, 1), [1, 1, 1, 1], 1),      # 35 outputs, 7 channels
    (3, 5, 13, 3, 3, (3, 3), (1, 1), [1, 1, 1, 1], 1),     # 9 outputs, 13 channels
    (2, 4, 1, 1, 1, (1, 3), (1, 1), [0, 1, 0, 1], 1),      # one output, one channel
    (5, 6, 12, 2, 9, (1, 3), (1, 1), [0, 1, 0, 1], 3),     # groups of 4 output channels
    (2, 8, 6, 8, 8, (3, 3), (2, 2), [1, 1, 1, 1], 2),      # stride 2 on 8x8
    (1, 2, 5, 28, 28, (3, 3), (1, 1), [1, 1, 1, 1], 1),    # 784 outputs: many tiles
    # dW as dot products (AVX-512 builds, col of <= 32 rows, conv.c conv_dw_dot): one
    # sample at a time from 512 outputs, else the batched block; rows of dW (output
    # channels) and columns (taps x channels) not multiples of the 4 x 4 tile
    (3, 2, 5, 24, 24, (3, 3), (1, 1), [1, 1, 1, 1], 1),    # 576 outputs, 18 columns
    (1, 3, 13, 23, 29, (3, 3), (1, 1), [1, 1, 1, 1], 1),   # 667 outputs, 27 columns
    (7, 1, 9, 6, 10, (3, 3), (1, 1), [1, 1, 1, 1], 1),     # batched, 9 columns
    (4, 32, 6, 5, 5, (1, 1), (1, 1), [1, 1, 1, 1], 1),     # 32 columns: the limit
    (2, 11, 7, 6, 6, (3, 1), (1, 1), [1, 0, 1, 0], 1),     # 33 columns: the BLAS
    (2, 2, 6, 30, 30, (3, 3), (1, 1), [1, 1, 1, 1], 2),    # groups of 3 output channels
]


# float32 maps of at most 16 positions in and out: im2col / col2im as one vector permute per
# kernel tap on AVX-512 builds (conv.c, "tiny planes"): strides, kernels up to 7x7 (49 taps,
# the tables' limit), asymmetric pads, groups, a 1-row map
TINY = [
    (3, 4, 5, 4, 4, (3, 3), (2, 2), [1, 1, 1, 1], 1),
    (2, 3, 4, 4, 4, (5, 5), (1, 1), [2, 2, 2, 2], 1),
    (2, 2, 3, 4, 4, (7, 7), (1, 1), [3, 3, 3, 3], 1),
    (2, 3, 4, 4, 4, (3, 3), (1, 1), [0, 1, 2, 0], 1),
    (2, 6, 4, 3, 5, (3, 3), (1, 1), [1, 1, 1, 1], 2),
    (4, 3, 5, 1, 16, (1, 3), (1, 1), [0, 1, 0, 1], 1),
]


def _run(x, w, b, strides, pads, groups, g, algo):
    y = KC.conv_forward("Conv", x, w, b, pads=pads, strides=list(strides), group=groups,
                        algo=algo)
    grads = KC.conv_backward("ConvGrad", g, x, w, (True, True, b is not None), pads=pads,
                             strides=list(strides), group=groups, algo=algo)
    return (y, *grads)


def _ref(x, w, b, strides, pads, groups, g):
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    br = b.clone().requires_grad_() if b is not None else None
    y = F.conv2d(F.pad(xr, (pads[1], pads[3], pads[0], pads[2])), wr, br, stride=strides,
                 groups=groups)
    y.backward(g)
    return y.detach(), xr.grad, wr.grad, br.grad if br is not None else None


ALL = ([(*c[:6], (1, 1), *c[6:]) for c in CASES] + list(STRIDED) + TAILS)


def _pointwise(case):
    k, s, pads = case[5], case[6], case[7]
    return k == (1, 1) and s == (1, 1) and not any(pads)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", [c for c in ALL if not _pointwise(c)])
def test_packed_float64_vs_torch(case, threads):
    ortcpu_torch.set_num_threads(threads)
    x, wt, b, g = float64_case(case)
    _, _, _, _, _, _, strides, pads, groups = case
    want = _ref(x, wt, b, strides, pads, groups, g)
    for algo in ("packed", "auto"):
        got = _run(x, wt, b, strides, pads, groups, g, algo)
        for a, e in zip(got, want, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10)
    # no bias, only some of the gradients
    y = KC.conv_forward("Conv", x, wt, pads=pads, strides=list(strides), group=groups,
                        algo="packed")
    torch.testing.assert_close(y, want[0] - b.view(1, -1, 1, 1), rtol=1e-10, atol=1e-10)
    dx, dw, db = KC.conv_backward("ConvGrad", g, x, wt, (True, False, False), pads=pads,
                                  strides=list(strides), group=groups, algo="packed")
    assert dw is None and db is None
    torch.testing.assert_close(dx, want[1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", TAILS + TINY + list(STRIDED[:3]))
def test_packed_float32_vs_torch(case, threads):
    ortcpu_torch.set_num_threads(threads)
    n, c, m, h, w, k, strides, pads, groups = case
    x = torch.randn(n, c, h, w)
    wt = torch.randn(m, c // groups, *k)
    b = torch.randn(m)
    yref = F.conv2d(F.pad(x, (pads[1], pads[3], pads[0], pads[2])), wt, b, stride=strides,
                    groups=groups)
    g = torch.randn_like(yref)
    want = _ref(x.double(), wt.double(), b.double(), strides, pads, groups, g.double())
    got = _run(x, wt, b, strides, pads, groups, g, "packed")
    for a, e in zip(got, want, strict=True):
        assert a.dtype == torch.float32
        scale = e.abs().max().item() if e.numel() else 1.0
        torch.testing.assert_close(a.double(), e, rtol=1e-5, atol=2e-6 * max(scale, 1.0))


@pytest.mark.parametrize("shape,wshape,kw", [
    ((2, 3, 4, 5), (7, 3, 3, 3), dict(padding=1)),
    ((1, 4, 8, 8), (6, 2, 3, 3), dict(padding=1, stride=2, groups=2)),
    ((3, 2, 5, 3), (13, 2, 2, 3), dict(padding=(1, 0))),
    ((1, 1, 23, 23), (3, 1, 3, 3), dict(padding=1)),  # dW per sample (529 outputs)
])
def test_packed_gradcheck_through_autograd(shape, wshape, kw):
    # float64 with these weights is under auto's packed limit: the front end runs the
    # packed path (test_auto_routes_small_maps_to_packed checks the routing)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    wt = torch.randn(*wshape, dtype=torch.float64, requires_grad=True)
    b = torch.randn(wshape[0], dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda x, w, b: ortcpu_torch.ops.conv2d(x, w, b, **kw),
                             (x, wt, b))


def test_packed_nan_and_inf():
    xn = torch.zeros(1, 1, 4, 4)
    xn[0, 0, 0, 0] = float("nan")
    y = KC.conv_forward("Conv", xn, torch.ones(7, 1, 3, 3), pads=[1, 1, 1, 1], algo="packed")
    assert torch.isnan(y[:, :, :2, :2]).all() and not torch.isnan(y[:, :, 2:, :]).any()
    wi = torch.ones(7, 1, 3, 3)
    wi[3, 0, 1, 1] = float("inf")
    y = KC.conv_forward("Conv", torch.ones(1, 1, 4, 4), wi, pads=[1, 1, 1, 1], algo="packed")
    assert torch.isinf(y[0, 3]).all() and torch.isfinite(y[0, [0, 1, 2, 4, 5, 6]]).all()
    g = torch.zeros(1, 7, 4, 4)
    g[0, 2, 3, 3] = float("nan")
    dx, _, _ = KC.conv_backward("ConvGrad", g, torch.ones(1, 1, 4, 4), torch.ones(7, 1, 3, 3),
                                (True, False, False), pads=[1, 1, 1, 1], algo="packed")
    assert torch.isnan(dx[0, 0, 2:, 2:]).all() and not torch.isnan(dx[0, 0, :2, :]).any()


@pytest.mark.parametrize("side", [24, 6])  # dW dot products per sample / batched
def test_packed_dw_nan_and_inf(side):
    x = torch.ones(3, 1, side, side)
    g = torch.zeros(3, 5, side, side)
    g[1, 2, 5, 5] = float("nan")
    g[2, 4, 0, 0] = float("inf")
    _, dw, db = KC.conv_backward("ConvGrad", g, x, torch.ones(5, 1, 3, 3),
                                 (False, True, True), pads=[1, 1, 1, 1], algo="packed")
    assert torch.isnan(dw[2]).all() and torch.isnan(db[2])
    # the corner window: taps in the image see inf, the padding's zeros make NaN
    assert torch.isinf(dw[4, 0, 1:, 1:]).all() and torch.isnan(dw[4, 0, 0, :]).all()
    assert torch.isfinite(dw[[0, 1, 3]]).all() and torch.isfinite(db[[0, 1, 3]]).all()


def _path(shape, wshape, dtype=torch.float32, **attrs):
    return KC.conv_path("Conv", torch.empty(shape, dtype=dtype), torch.empty(wshape, dtype=dtype),
                        **attrs)


P1 = dict(pads=[1, 1, 1, 1])


def test_auto_routes_small_maps_to_packed():
    # the digits CNN's two convolutions, in both dtypes (32->64: 73.7 KB of float32
    # weights, 147 KB of float64: over the 128 KB limit)
    # (the first, one input channel, is a first layer: the direct forward, test_conv_direct)
    assert _path((64, 1, 8, 8), (32, 1, 3, 3), **P1) == "direct"
    assert _path((64, 32, 4, 4), (64, 32, 3, 3), **P1) == "packed"
    assert _path((64, 32, 4, 4), (64, 32, 3, 3), torch.float64, **P1) == "small_map"
    assert _path((1, 4, 5, 7), (7, 4, 3, 3), **P1) == "packed"      # batch 1, odd map
    assert _path((2, 8, 8, 8), (6, 4, 3, 3), group=2, strides=[2, 2], **P1) == "packed"
    assert _path((2, 4, 28, 28), (5, 4, 3, 3), **P1) == "packed"    # 784 outputs
    # weights over 128 KB (float32 64 x 576), maps of 1024 outputs and more, pointwise
    # kernels, dilation: not packed
    assert _path((2, 64, 4, 4), (64, 64, 3, 3), **P1) == "small_map"
    assert _path((1, 4, 32, 32), (4, 4, 3, 3), **P1) == "im2col"
    assert _path((2, 8, 4, 4), (8, 8, 1, 1)) == "im2col"
    assert _path((2, 8, 6, 6), (8, 8, 3, 3), dilations=[2, 2], **P1) == "im2col"
    # Winograd and depthwise keep their shapes (an 8x8 map with 16 -> 16 channels)
    assert _path((16, 16, 8, 8), (16, 16, 3, 3), **P1).startswith("winograd")
    assert _path((2, 8, 8, 8), (8, 1, 5, 5), group=8, pads=[2, 2, 2, 2]) == "depthwise"
    # forcing
    assert _path((2, 64, 4, 4), (64, 64, 3, 3), algo="packed", **P1) == "packed"
    assert _path((64, 32, 4, 4), (64, 32, 3, 3), algo="small_map", **P1) == "small_map"


def test_auto_results_follow_the_routing():
    # auto's forward and dX are bit-equal to the forced path it routes to (after a
    # first call: the GEMM backend's first-use timing of a shape class, gemm.h, may run
    # that call on the other backend)
    torch.manual_seed(0)
    for wshape in ((24, 16, 3, 3), (64, 64, 3, 3)):
        x, w = torch.randn(8, wshape[1], 4, 4), torch.randn(*wshape)
        g = torch.randn(8, wshape[0], 4, 4)
        want = _path(tuple(x.shape), wshape, **P1)
        res = {}
        for algo in ("auto", want):
            for _ in range(2):
                y = KC.conv_forward("Conv", x, w, algo=algo, **P1)
                dx, _, _ = KC.conv_backward("ConvGrad", g, x, w, (True, False, False),
                                            algo=algo, **P1)
            res[algo] = (y, dx)
        assert torch.equal(res["auto"][0], res[want][0])
        assert torch.equal(res["auto"][1], res[want][1])


@pytest.mark.parametrize("shape,kw,msg", [
    ((1, 2, 6, 6), dict(dilations=[2, 2]), "dilation 1"),
    ((1, 2, 80, 80), dict(pads=[1, 1, 1, 1]), "at most 4096"),
])
def test_packed_refuses_geometries_it_does_not_cover(shape, kw, msg):
    x, wt = torch.randn(*shape), torch.randn(3, 2, 3, 3)
    with pytest.raises(Exception, match=msg):
        KC.conv_forward("Conv", x, wt, algo="packed", **kw)
    with pytest.raises(Exception, match="packed"):  # 3-D
        KC.conv_forward("Conv", torch.randn(1, 2, 2, 4, 4), torch.randn(3, 2, 1, 3, 3),
                        algo="packed")
