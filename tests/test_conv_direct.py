"""The direct forward of first layers (native/src/conv.c, CONV_ALGO_DIRECT: conv_infer.c's
row tiles with the weights packed per call): auto's routing by input channels per group,
forward values against torch in float64 and float32 over strides, dilations, groups,
asymmetric pads, odd maps, batch 0/1, 1 and 2 threads; the backward of a forced "direct"
geometry (its own lowerings); NaN; a clear error where the kernel does not apply."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ortcpu_torch
from ortcpu_torch.kernels import conv as KC

CASES = [  # n, c, m, h, w, kernel, strides, pads [top, left, bottom, right], dilation, groups
    (64, 1, 32, 28, 28, (3, 3), (1, 1), [1, 1, 1, 1], (1, 1), 1),  # the MNIST CNN's first
    (64, 1, 32, 8, 8, (3, 3), (1, 1), [1, 1, 1, 1], (1, 1), 1),    # digits' first
    (2, 3, 64, 37, 41, (7, 7), (2, 2), [3, 3, 3, 3], (1, 1), 1),   # a ResNet stem, odd map
    (3, 3, 7, 9, 11, (5, 3), (1, 2), [2, 1, 0, 2], (1, 1), 1),     # asymmetric pads
    (2, 2, 5, 12, 10, (3, 3), (1, 1), [2, 2, 2, 2], (2, 2), 1),    # dilation 2
    (2, 6, 8, 10, 10, (3, 3), (1, 1), [1, 1, 1, 1], (1, 1), 2),    # 3 channels per group
    (1, 1, 1, 1, 1, (1, 1), (1, 1), [0, 0, 0, 0], (1, 1), 1),      # one output
    (0, 3, 4, 8, 8, (3, 3), (1, 1), [1, 1, 1, 1], (1, 1), 1),      # empty batch
]


def _kw(case):
    _, _, _, _, _, _, s, p, d, g = case
    return dict(pads=p, strides=list(s), dilations=list(d), group=g)


def _ref(x, w, b, case):
    _, _, _, _, _, _, s, p, d, g = case
    return F.conv2d(F.pad(x, (p[1], p[3], p[0], p[2])), w, b, stride=s, dilation=d, groups=g)


def _inputs(case, dtype):
    n, c, m, h, w, k, *_, g = case
    return (torch.randn(n, c, h, w, dtype=dtype), torch.randn(m, c // g, *k, dtype=dtype),
            torch.randn(m, dtype=dtype))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", CASES)
def test_direct_forward_vs_torch(case, threads):
    ortcpu_torch.set_num_threads(threads)
    x, w, b = _inputs(case, torch.float64)
    want = _ref(x, w, b, case)
    for algo in ("direct", "auto"):
        y = KC.conv_forward("Conv", x, w, b, algo=algo, **_kw(case))
        torch.testing.assert_close(y, want, rtol=1e-10, atol=1e-10)
    assert KC.conv_path("Conv", x, w, **_kw(case)) == ("direct" if case[6] != (1, 1) or
                                                       case[5] != (1, 1) else "im2col")
    x, w, b = (t.float() for t in (x, w, b))
    y = KC.conv_forward("Conv", x, w, None, algo="direct", **_kw(case))
    scale = max(want.abs().max().item(), 1.0) if want.numel() else 1.0
    torch.testing.assert_close(y.double(), _ref(x.double(), w.double(), None, case),
                               rtol=1e-5, atol=2e-6 * scale)


def test_direct_routing_and_backward():
    # 4 input channels per group are no first layer; depthwise keeps its own path
    x4, w4 = torch.randn(2, 4, 28, 28), torch.randn(8, 4, 3, 3)
    assert KC.conv_path("Conv", x4, w4, pads=[1, 1, 1, 1]) != "direct"
    xd, wd = torch.randn(2, 3, 16, 16), torch.randn(3, 1, 3, 3)
    assert KC.conv_path("Conv", xd, wd, pads=[1, 1, 1, 1], group=3) == "depthwise"
    # 1-D: a map of one row
    x1, w1, b1 = torch.randn(2, 3, 50, dtype=torch.float64), torch.randn(4, 3, 5,
                                                                         dtype=torch.float64), None
    assert KC.conv_path("Conv", x1, w1, pads=[2, 2]) == "direct"
    torch.testing.assert_close(KC.conv_forward("Conv", x1, w1, b1, pads=[2, 2]),
                               F.conv1d(x1, w1, padding=2), rtol=1e-10, atol=1e-10)
    # a forced "direct" geometry's backward runs the training lowerings
    case = CASES[3]
    x, w, b = _inputs(case, torch.float64)
    g = torch.randn_like(_ref(x, w, b, case))
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    _ref(xr, wr, br, case).backward(g)
    dx, dw, db = KC.conv_backward("ConvGrad", g, x, w, (True, True, True), algo="direct",
                                  **_kw(case))
    for got, want in ((dx, xr.grad), (dw, wr.grad), (db, br.grad)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_direct_gradcheck_through_autograd():
    x = torch.randn(2, 3, 7, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert KC.conv_path("Conv", x.detach(), w.detach(), pads=[1, 1, 1, 1]) == "direct"
    assert torch.autograd.gradcheck(
        lambda x, w, b: ortcpu_torch.ops.conv2d(x, w, b, padding=1), (x, w, b))


def test_direct_nan_propagates_and_padding_stays_zero():
    x = torch.zeros(1, 1, 6, 6)
    x[0, 0, 0, 0] = float("nan")
    y = KC.conv_forward("Conv", x, torch.ones(5, 1, 3, 3), pads=[1, 1, 1, 1])
    assert torch.isnan(y[:, :, :2, :2]).all() and not torch.isnan(y[:, :, 2:, :]).any()
    assert not torch.isnan(y[:, :, :, 2:]).any()


def test_direct_refuses_geometries_it_does_not_cover():
    x, w = torch.randn(1, 2, 4, 4, 4), torch.randn(3, 2, 1, 3, 3)
    with pytest.raises(ValueError, match="direct. needs a 1-D/2-D"):
        KC.conv_forward("Conv", x, w, pads=[0, 1, 1, 0, 1, 1], algo="direct")
