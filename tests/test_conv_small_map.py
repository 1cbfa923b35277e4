"""The small-map im2col path (native/src/conv.inc: im2col/col2im through zero-padded
channel planes), forced with algo="small_map" and chosen by auto on small output maps:
forward, dX, dW, dB against torch in float64 over kernels, pads (asymmetric, 0, larger
than the kernel's reach), groups, odd and non-square maps, batch 0/1/odd, 1 and 2
threads; float64 gradcheck; agreement with the generic im2col in float32; a clear error
where the geometry does not fit (stride, dilation, 3-D, big maps); 1-D."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ortcpu_torch
from ortcpu_torch.kernels import conv as KC
from ortcpu_torch.ops.conv import _Conv  # noqa: F401  (the autograd path used by gradcheck)


def _torch_ref(x, w, b, pads, groups, g):
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    br = b.clone().requires_grad_() if b is not None else None
    y = F.conv2d(F.pad(xr, (pads[1], pads[3], pads[0], pads[2])), wr, br, groups=groups)
    y.backward(g)
    return y.detach(), xr.grad, wr.grad, br.grad if br is not None else None


def _ours(x, w, b, pads, groups, g, algo):
    y = KC.conv_forward("Conv", x, w, b, pads=pads, group=groups, algo=algo)
    dx, dw, db = KC.conv_backward("ConvGrad", g, x, w, (True, True, b is not None), pads=pads,
                                  group=groups, algo=algo)
    return y, dx, dw, db


CASES = [  # n, c, m, h, w, kernel (kh, kw), pads [top, left, bottom, right], groups
    (8, 32, 64, 4, 4, (3, 3), [1, 1, 1, 1], 1),   # the case
    (3, 5, 7, 8, 8, (3, 3), [1, 1, 1, 1], 1),
    (1, 4, 6, 5, 7, (3, 3), [0, 2, 1, 0], 1),     # asymmetric pads, odd map
    (2, 6, 4, 3, 9, (2, 3), [1, 0, 0, 2], 2),     # even kernel, groups
    (5, 3, 3, 4, 4, (5, 5), [2, 2, 2, 2], 3),     # kernel as big as the padded map
    (2, 4, 4, 2, 2, (3, 3), [3, 3, 3, 3], 1),     # pads beyond the kernel's reach
    (7, 8, 5, 6, 1, (1, 1), [1, 0, 1, 0], 1),     # 1x1 kernel with padding (not pointwise)
    (1, 2, 3, 1, 1, (1, 3), [0, 1, 0, 1], 1),
    (0, 4, 4, 4, 4, (3, 3), [1, 1, 1, 1], 1),     # empty batch
    # channel chunks of the planes buffer (conv.inc, CONV_SMALL_BUF elements): col2im's
    # kW planes of 100 channels on 4x4 span two chunks; on 16x16 both im2col (25 per
    # chunk) and col2im (8) end on a partial chunk; a 3x9 kernel on a 20x40 map needs
    # more than the buffer per channel for the kW planes (col2im's one-plane fallback)
    (2, 100, 4, 4, 4, (3, 3), [1, 1, 1, 1], 1),
    (2, 30, 3, 16, 16, (3, 3), [1, 1, 1, 1], 1),
    (1, 2, 3, 20, 40, (3, 9), [1, 4, 1, 4], 1),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", CASES)
def test_small_map_float64_vs_torch(case, threads):
    ortcpu_torch.set_num_threads(threads)
    n, c, m, h, w, k, pads, groups = case
    x = torch.randn(n, c, h, w, dtype=torch.float64)
    wt = torch.randn(m, c // groups, *k, dtype=torch.float64)
    b = torch.randn(m, dtype=torch.float64)
    yref = F.conv2d(F.pad(x, (pads[1], pads[3], pads[0], pads[2])), wt, b, groups=groups)
    g = torch.randn_like(yref)
    want = _torch_ref(x, wt, b, pads, groups, g)
    for algo in ("small_map", "auto"):
        got = _ours(x, wt, b, pads, groups, g, algo)
        for a, e in zip(got, want, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", CASES[:6])
def test_small_map_float32_matches_generic_im2col(case):
    n, c, m, h, w, k, pads, groups = case
    x = torch.randn(n, c, h, w)
    wt = torch.randn(m, c // groups, *k)
    b = torch.randn(m)
    yref = KC.conv_forward("Conv", x, wt, b, pads=pads, group=groups, algo="im2col")
    g = torch.randn_like(yref)
    small = _ours(x, wt, b, pads, groups, g, "small_map")
    generic = _ours(x, wt, b, pads, groups, g, "im2col")
    for a, e in zip(small, generic, strict=True):
        scale = e.abs().max().item() if e.numel() else 1.0
        torch.testing.assert_close(a, e, rtol=2e-5, atol=2e-5 * max(scale, 1e-3))


def test_small_map_gradcheck_and_nan():
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    wt = torch.randn(4, 3, 3, 2, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda x, w, b: ortcpu_torch.ops.conv2d(x, w, b, padding=1),
                             (x, wt, b))
    # NaN in one input pixel spreads to exactly the outputs whose window covers it
    xn = torch.zeros(1, 1, 4, 4)
    xn[0, 0, 0, 0] = float("nan")
    y = KC.conv_forward("Conv", xn, torch.ones(1, 1, 3, 3), pads=[1, 1, 1, 1], algo="small_map")
    assert torch.isnan(y[0, 0, :2, :2]).all() and not torch.isnan(y[0, 0, 2:, :]).any()


@pytest.mark.parametrize("shape,kw,msg", [
    ((1, 2, 6, 6), dict(dilations=[2, 2]), "dilation 1"),
    ((1, 2, 80, 80), dict(pads=[1, 1, 1, 1]), "at most 4096"),
])
def test_small_map_refuses_geometries_it_does_not_cover(shape, kw, msg):
    x, wt = torch.randn(*shape), torch.randn(3, 2, 3, 3)
    before = x.clone()
    with pytest.raises(Exception, match=msg):
        KC.conv_forward("Conv", x, wt, algo="small_map", **kw)
    assert torch.equal(x, before)
    with pytest.raises(Exception, match="small-map"):  # 3-D
        KC.conv_forward("Conv", torch.randn(1, 2, 2, 4, 4), torch.randn(3, 2, 1, 3, 3),
                        algo="small_map")


STRIDED = [  # n, c, m, h, w, kernel, strides, pads [top, left, bottom, right], groups
    (3, 5, 7, 16, 16, (3, 3), (2, 2), [1, 1, 1, 1], 1),   # ResNet's downsampling 3x3
    (2, 3, 4, 17, 15, (3, 3), (2, 2), [1, 1, 1, 1], 1),   # odd maps: last row/column
    (2, 4, 6, 16, 16, (1, 1), (2, 2), [0, 0, 0, 0], 1),   # 1x1 stride 2: rows skipped
    (1, 3, 8, 16, 16, (4, 4), (4, 4), [0, 0, 0, 0], 1),   # patchify stem
    (2, 6, 4, 9, 11, (2, 3), (2, 3), [1, 0, 0, 2], 2),    # uneven strides, groups
    (1, 2, 3, 7, 7, (3, 3), (3, 1), [2, 0, 1, 3], 1),     # asymmetric pads and strides
    (2, 4, 4, 5, 5, (5, 5), (2, 2), [2, 2, 2, 2], 1),
    (1, 2, 2, 6, 6, (2, 2), (3, 3), [0, 0, 0, 0], 1),     # windows skip columns
]


def _strided_ref(x, w, b, strides, pads, groups, g):
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    y = F.conv2d(F.pad(xr, (pads[1], pads[3], pads[0], pads[2])), wr, br, stride=strides,
                 groups=groups)
    y.backward(g)
    return y.detach(), xr.grad, wr.grad, br.grad


def float64_case(case):
    """Random float64 input, weight, bias and output gradient for a case tuple."""
    n, c, m, h, w, k, strides, pads, groups = case
    x = torch.randn(n, c, h, w, dtype=torch.float64)
    wt = torch.randn(m, c // groups, *k, dtype=torch.float64)
    b = torch.randn(m, dtype=torch.float64)
    yref = F.conv2d(F.pad(x, (pads[1], pads[3], pads[0], pads[2])), wt, b, stride=strides,
                    groups=groups)
    return x, wt, b, torch.randn_like(yref)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", STRIDED)
def test_small_map_strided_float64_vs_torch(case, threads):
    ortcpu_torch.set_num_threads(threads)
    x, wt, b, g = float64_case(case)
    _, _, _, _, _, _, strides, pads, groups = case
    want = _strided_ref(x, wt, b, strides, pads, groups, g)
    for algo in ("small_map", "auto", "im2col"):
        y = KC.conv_forward("Conv", x, wt, b, pads=pads, strides=list(strides), group=groups,
                            algo=algo)
        grads = KC.conv_backward("ConvGrad", g, x, wt, (True, True, True), pads=pads,
                                 strides=list(strides), group=groups, algo=algo)
        for a, e in zip((y, *grads), want, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10)


def test_small_map_strided_float32_and_gradcheck():
    x = torch.randn(3, 4, 9, 8)
    wt, b = torch.randn(5, 4, 3, 3), torch.randn(5)
    y = KC.conv_forward("Conv", x, wt, b, pads=[1, 1, 1, 1], strides=[2, 2], algo="small_map")
    want = F.conv2d(x.double(), wt.double(), b.double(), stride=2, padding=1)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
    xd = torch.randn(2, 3, 7, 6, dtype=torch.float64, requires_grad=True)
    wd = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    bd = torch.randn(4, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(
        lambda x, w, b: ortcpu_torch.ops.conv2d(x, w, b, stride=2, padding=1), (xd, wd, bd))


def test_small_map_one_dimensional():
    # 1-D runs as 2-D with a height of 1: the small-map path covers it
    x, wt = torch.randn(3, 4, 9, dtype=torch.float64), torch.randn(5, 4, 3, dtype=torch.float64)
    y = KC.conv_forward("Conv", x, wt, pads=[2, 1], algo="small_map")
    torch.testing.assert_close(y, F.conv1d(F.pad(x, (2, 1)), wt), rtol=1e-12, atol=1e-12)
