"""The channels-last depthwise kernel (native/src/conv_nhwc.c), which ``ops.conv2d`` runs
for a depthwise 2-D convolution (group == C == M) of a channels_last input: forward, dX,
dW, dB against torch in float64 over 3x3/5x5/7x7 kernels, strides 1/2/3, dilations (the
stride-and-dilation pair takes the per-tap path), pads 0..beyond the kernel's reach,
channel counts that leave a partial register block or only a tail (3, 24, 72, 130), maps
down to 1x1, batch 0/1; float32 against a float64 evaluation; float64 gradcheck; 1 and 2
threads; NaN in a window; outputs and input gradients channels_last, as torch's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ortcpu_torch
from ortcpu_torch import ops
from ortcpu_torch.kernels import conv as KC

CL = torch.channels_last

CASES = [  # n, c, h, w, k, stride, padding, dilation
    (2, 16, 8, 8, 7, 1, 3, 1),       # ConvNeXt
    (3, 64, 4, 4, 7, 1, 3, 1),       # ConvNeXt's last stage: 7x7 over a 4x4 map
    (2, 24, 9, 7, 3, 1, 1, 1),       # a block of 16 lanes and a tail of 8
    (2, 72, 14, 14, 3, 2, 1, 1),     # MobileNet stride 2, a full block and a tail
    (1, 130, 5, 6, 5, 1, 2, 1),      # two full blocks and a 2-channel tail
    (2, 3, 13, 11, 3, 2, 1, 1),      # tail only, stride 2, odd maps
    (1, 5, 15, 9, 5, 3, 2, 1),       # stride 3
    (2, 16, 10, 7, 3, 1, 0, 2),      # dilation, no pads
    (2, 16, 11, 9, 3, 2, 2, 2),      # stride and dilation: the per-tap path
    (2, 16, 1, 1, 3, 1, 1, 1),       # 1x1 map
    (2, 16, 8, 8, 3, 3, 4, 1),       # pads beyond the kernel's reach
    (0, 16, 6, 6, 3, 1, 1, 1),       # empty batch
    (2, 32, 9, 7, 2, 2, 0, 1),       # even kernel
    (1, 16, 7, 7, 1, 2, 0, 1),       # 1x1 kernel, stride 2
]


def _cl(t):
    return t.contiguous(memory_format=CL)


def _run(fn, x, w, b, stride, pad, dil, dy):
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    x_in = xr * 1  # a non-leaf in x's layout: its gradient is what the kernel returns
    seen = {}
    x_in.register_hook(lambda g: seen.setdefault("dx", g))
    y = fn(x_in, wr, br, stride, pad, dil, x.shape[1])
    y.backward(dy)
    return y.detach(), seen["dx"], wr.grad, br.grad


@pytest.fixture
def nhwc_calls(monkeypatch):
    """How many times the channels-last kernel ran, forward and backward."""
    calls = {"fwd": 0, "bwd": 0}
    fwd, bwd = KC.dw_nhwc_forward, KC.dw_nhwc_backward

    def count(name, f):
        def wrapped(*a, **k):
            calls[name] += 1
            return f(*a, **k)
        return wrapped

    monkeypatch.setattr(KC, "dw_nhwc_forward", count("fwd", fwd))
    monkeypatch.setattr(KC, "dw_nhwc_backward", count("bwd", bwd))
    return calls


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_float64_vs_torch(case, threads, nhwc_calls):
    n, c, h, w_, k, s, p, d = case
    torch.manual_seed(hash(case) % 1000)
    x = _cl(torch.randn(n, c, h, w_, dtype=torch.float64))
    w = torch.randn(c, 1, k, k, dtype=torch.float64)
    b = torch.randn(c, dtype=torch.float64)
    with torch.no_grad():
        shape = F.conv2d(x, w, b, s, p, d, c).shape
    dy = _cl(torch.randn(shape, dtype=torch.float64))
    old = ortcpu_torch.get_num_threads()
    ortcpu_torch.set_num_threads(threads)
    try:
        ours = _run(ops.conv2d, x, w, b, s, p, d, dy)
    finally:
        ortcpu_torch.set_num_threads(old)
    ref = _run(F.conv2d, x, w, b, s, p, d, dy)
    assert nhwc_calls == {"fwd": 1, "bwd": 1}
    for name, a, r in zip(("y", "dx", "dw", "db"), ours, ref, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12, msg=name)
    assert ours[0].is_contiguous(memory_format=CL) and ours[1].is_contiguous(memory_format=CL)
    assert ours[2].is_contiguous()  # the weight's gradient in the weight's layout


@pytest.mark.parametrize("case", CASES[:6], ids=[str(c) for c in CASES[:6]])
def test_float32_vs_float64(case, nhwc_calls):
    """float32 to float32 rounding of the float64 result (dW, dB sum per sample in float32,
    over samples in double)."""
    n, c, h, w_, k, s, p, d = case
    torch.manual_seed(1)
    x = _cl(torch.randn(n, c, h, w_))
    w, b = torch.randn(c, 1, k, k), torch.randn(c)
    with torch.no_grad():
        shape = F.conv2d(x, w, b, s, p, d, c).shape
    dy = _cl(torch.randn(shape))
    ours = _run(ops.conv2d, x, w, b, s, p, d, dy)
    ref = _run(F.conv2d, *(t.double() for t in (x, w, b)), s, p, d, dy.double())
    for name, a, r in zip(("y", "dx", "dw", "db"), ours, ref, strict=True):
        scale = max(float(r.abs().max()) if r.numel() else 1.0, 1.0)
        torch.testing.assert_close(a.double(), r, rtol=1e-5, atol=2e-6 * scale, msg=name)
    assert nhwc_calls["fwd"] == 1


@pytest.mark.parametrize(("stride", "dil"), [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_gradcheck_float64(stride, dil):
    torch.manual_seed(0)
    x = _cl(torch.randn(2, 5, 6, 7, dtype=torch.float64)).requires_grad_()
    w = torch.randn(5, 1, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x, w, b: ops.conv2d(x, w, b, stride, 1, dil, 5), (x, w, b))


def test_only_some_gradients(nhwc_calls):
    x = _cl(torch.randn(2, 16, 6, 6, dtype=torch.float64))
    w = torch.randn(16, 1, 3, 3, dtype=torch.float64, requires_grad=True)
    y = ops.conv2d(x, w, None, 1, 1, 1, 16)
    y.sum().backward()
    ref = torch.autograd.grad(F.conv2d(x, w, None, 1, 1, 1, 16).sum(), w)[0]
    torch.testing.assert_close(w.grad, ref)
    xg = x.clone().requires_grad_()
    wc = w.detach()
    (g,) = torch.autograd.grad(ops.conv2d(xg, wc, None, 1, 1, 1, 16).sum(), xg)
    torch.testing.assert_close(g, torch.autograd.grad(F.conv2d(xg, wc, None, 1, 1, 1, 16).sum(),
                                                      xg)[0])
    assert nhwc_calls["bwd"] == 2


def test_nan_stays_in_its_windows():
    x = _cl(torch.zeros(1, 16, 6, 6))
    x[0, 3, 2, 2] = float("nan")
    y = ops.conv2d(x, torch.ones(16, 1, 3, 3), None, 1, 1, 1, 16)
    nan = torch.isnan(y)
    assert nan[0, 3, 1:4, 1:4].all() and int(nan.sum()) == 9


def test_contiguous_input_and_multiplier_keep_the_nchw_kernel(nhwc_calls):
    """An NCHW input, a channel multiplier, a 1-D convolution or a forced lowering do not
    take the channels-last kernel."""
    x = torch.randn(2, 8, 6, 6)
    ops.conv2d(x, torch.randn(8, 1, 3, 3), None, 1, 1, 1, 8)
    ops.conv2d(_cl(x), torch.randn(16, 1, 3, 3), None, 1, 1, 1, 8)
    ops.conv1d(torch.randn(2, 8, 9), torch.randn(8, 1, 3), None, 1, 1, 1, 8)
    assert nhwc_calls == {"fwd": 0, "bwd": 0}
