"""The depthwise convolution kernel (native/src/conv_dw.inc), forced with
algo="depthwise" and chosen by auto: forward, dX, dW, dB against torch in float64 over
3x3/5x5/7x7 kernels, strides 1/2/3 with odd maps, asymmetric and zero pads, dilation,
channel multipliers, sizes that break the register tiles (1x1, 7x7, 9x13 maps), batch
0/1, 1 and 2 threads; float64 gradcheck through ops.conv2d; float32 against torch and
against the grouped im2col path; 1-D; clear errors where the geometry does not fit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ortcpu_torch
from ortcpu_torch import ops
from ortcpu_torch.kernels import conv as KC


def _ours(x, w, b, stride, pads, dil, algo, need=(True, True, True)):
    attrs = {"strides": [stride] * (x.dim() - 2), "pads": pads,
             "dilations": [dil] * (x.dim() - 2), "group": x.shape[1], "algo": algo}
    y, geom = KC.conv_forward_geom("Conv", x, w, b, **attrs)
    g = torch.randn_like(y)
    return (y, *KC.conv_backward("ConvGrad", g, x, w, need, geom=geom)), g


def _torch(x, w, b, stride, pads, dil, g):
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    conv = F.conv2d if x.dim() == 4 else F.conv1d
    half = len(pads) // 2
    pad = [v for i in reversed(range(half)) for v in (pads[i], pads[i + half])]
    y = conv(F.pad(xr, pad), wr, br, stride, 0, dil, x.shape[1])
    y.backward(g)
    return y.detach(), xr.grad, wr.grad, br.grad


CASES = [  # n, c, mult, h, w, k, stride, pads [top, left, bottom, right], dilation
    (2, 3, 1, 7, 9, 3, 1, [1, 1, 1, 1], 1),
    (2, 16, 1, 14, 14, 3, 2, [1, 1, 1, 1], 1),     # MobileNet stride 2
    (3, 4, 1, 13, 11, 3, 2, [1, 1, 1, 1], 1),      # stride 2, odd maps
    (1, 5, 1, 15, 9, 5, 2, [2, 2, 2, 2], 1),       # 5x5 stride 2, odd
    (2, 6, 1, 14, 14, 7, 1, [3, 3, 3, 3], 1),      # ConvNeXt 7x7
    (1, 4, 1, 9, 13, 5, 1, [2, 2, 2, 2], 1),
    (2, 3, 1, 10, 7, 3, 1, [0, 0, 0, 0], 2),       # dilation, no pads
    (1, 3, 1, 8, 8, 3, 1, [0, 2, 1, 0], 1),        # asymmetric pads
    (2, 4, 2, 9, 8, 3, 2, [1, 1, 1, 1], 1),        # channel multiplier 2
    (1, 2, 3, 5, 5, 3, 1, [1, 1, 1, 1], 1),        # multiplier 3, stride 1
    (2, 4, 1, 1, 1, 3, 1, [1, 1, 1, 1], 1),        # 1x1 map
    (2, 3, 1, 8, 8, 3, 3, [4, 4, 4, 4], 1),        # pads beyond the kernel's reach
    (1, 3, 1, 17, 17, 3, 1, [1, 1, 1, 1], 1),      # one row/column past the tiles
    (0, 4, 1, 6, 6, 3, 1, [1, 1, 1, 1], 1),        # empty batch
    (2, 3, 1, 9, 7, 2, 2, [0, 1, 1, 0], 1),        # even kernel: phases with one tap
    (1, 3, 1, 7, 7, 1, 2, [0, 0, 0, 0], 1),        # 1x1 stride 2: phases with no tap
    (1, 3, 1, 20, 20, 3, 2, [1, 1, 1, 1], 1),      # stride 2, 10x10 output
    # outputs of at most 4x4: the 4x4 register tiles
    (3, 8, 1, 4, 4, 7, 1, [3, 3, 3, 3], 1),        # ConvNeXt's last stage
    (2, 5, 1, 3, 2, 3, 1, [1, 1, 1, 1], 1),        # 3x2 output
    (2, 4, 1, 8, 8, 3, 2, [1, 1, 1, 1], 1),        # stride 2 down to 4x4
    (1, 3, 2, 4, 4, 3, 1, [0, 1, 2, 0], 1),        # multiplier 2, asymmetric pads
    (2, 3, 1, 6, 6, 3, 1, [1, 1, 1, 1], 2),        # dilation 2, 4x4 output
    (1, 2, 1, 1, 9, 1, 1, [0, 0, 0, 0], 1),        # 1x9 map, 1x1 kernel
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", CASES)
def test_float64_vs_torch(case, threads):
    ortcpu_torch.set_num_threads(threads)
    n, c, mult, h, w, k, stride, pads, dil = case
    x = torch.randn(n, c, h, w, dtype=torch.float64)
    wt = torch.randn(c * mult, 1, k, k, dtype=torch.float64)
    b = torch.randn(c * mult, dtype=torch.float64)
    for algo in ("depthwise", "auto"):
        got, g = _ours(x, wt, b, stride, pads, dil, algo)
        want = _torch(x, wt, b, stride, pads, dil, g)
        for name, a, e in zip(("y", "dx", "dw", "db"), got, want, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12, msg=f"{algo} {name}")


@pytest.mark.parametrize("case", CASES[:9] + CASES[-6:-4])
def test_float32_vs_torch_and_im2col(case):
    n, c, mult, h, w, k, stride, pads, dil = case
    x = torch.randn(n, c, h, w)
    wt = torch.randn(c * mult, 1, k, k)
    b = torch.randn(c * mult)
    got, g = _ours(x, wt, b, stride, pads, dil, "depthwise")
    ref = _torch(x.double(), wt.double(), b.double(), stride, pads, dil, g.double())
    tor = _torch(x, wt, b, stride, pads, dil, g)
    im2col = _ours(x, wt, b, stride, pads, dil, "im2col")[0]
    for a, e, t in zip(got, ref, tor, strict=True):
        scale = max(1.0, float(e.abs().max())) if e.numel() else 1.0
        err = float((a.double() - e).abs().max()) if e.numel() else 0.0
        err_t = float((t.double() - e).abs().max()) if e.numel() else 0.0
        assert err <= 4 * err_t + 1e-6 * scale, (err, err_t)
    torch.testing.assert_close(got[0], im2col[0], rtol=1e-5, atol=1e-5)


def test_only_some_gradients():
    x, w, b = torch.randn(2, 6, 9, 9, dtype=torch.float64), \
        torch.randn(6, 1, 3, 3, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    full, g = _ours(x, w, b, 1, [1] * 4, 1, "depthwise")
    for need in ((True, False, False), (False, True, False), (False, False, True)):
        _, geom = KC.conv_forward_geom("Conv", x, w, b, pads=[1] * 4, group=6,
                                       algo="depthwise")
        part = KC.conv_backward("ConvGrad", g, x, w, need, geom=geom)
        for want, got, n in zip(full[1:], part, need, strict=True):
            if n:
                torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
            else:
                assert got is None


@pytest.mark.parametrize("stride, k", [(1, 3), (2, 3), (2, 5), (1, 7)])
def test_gradcheck_float64(stride, k):
    x = torch.randn(2, 3, 7, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 1, k, k, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x, w, b: ops.conv2d(x, w, b, stride, k // 2, 1, 3), (x, w, b))


def test_1d_depthwise():
    x = torch.randn(3, 4, 19, dtype=torch.float64)
    w = torch.randn(8, 1, 5, dtype=torch.float64)
    b = torch.randn(8, dtype=torch.float64)
    got, g = _ours(x, w, b, 2, [2, 1], 1, "depthwise")
    want = _torch(x, w, b, 2, [2, 1], 1, g)
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


def test_nan_propagates_within_the_windows():
    x = torch.randn(1, 2, 6, 6)
    x[0, 0, 2, 3] = float("nan")
    w = torch.randn(2, 1, 3, 3)
    y = KC.conv_forward("Conv", x, w, pads=[1] * 4, group=2, algo="depthwise")
    y_r = F.conv2d(x, w, padding=1, groups=2)
    assert torch.equal(y.isnan(), y_r.isnan())


def test_geometry_that_does_not_fit_is_refused():
    x = torch.randn(1, 4, 5, 5)
    with pytest.raises(ValueError, match="depthwise"):  # not depthwise: group 2
        KC.conv_forward("Conv", x, torch.randn(4, 2, 3, 3), group=2, algo="depthwise")
    with pytest.raises(ValueError, match="depthwise"):  # 3-D
        KC.conv_forward("Conv", torch.randn(1, 2, 4, 4, 4), torch.randn(2, 1, 3, 3, 3),
                        group=2, algo="depthwise")
    with pytest.raises(ValueError, match="pads"):  # negative pads (refused for every conv)
        KC.conv_forward("Conv", x, torch.randn(4, 1, 3, 3), group=4, pads=[-1, 0, 0, 0],
                        algo="depthwise")


def test_random_geometries_float64():
    """Random kernels 1-7, strides 1-3, dilations 1-2, pads 0-4, multipliers 1-2 and maps
    1-20 (every dX path: rotated-kernel correlation, stride phases, scatter)."""
    gen = torch.Generator().manual_seed(7)

    def pick(*v):
        return v[int(torch.randint(len(v), (1,), generator=gen))]

    done = 0
    while done < 40:
        c, mult, k = pick(2, 3, 5), pick(1, 1, 2), pick(1, 2, 3, 5, 7)
        s, d, p = pick(1, 2, 3), pick(1, 1, 2), pick(0, 1, 2, 3, 4)
        h, w = pick(1, 4, 7, 9, 13, 20), pick(1, 5, 8, 11, 20)
        if min(h, w) + 2 * p - d * (k - 1) - 1 < 0 or p > d * (k - 1):
            continue  # no output, or windows entirely inside the padding
        x = torch.randn(2, c, h, w, dtype=torch.float64, generator=gen)
        wt = torch.randn(c * mult, 1, k, k, dtype=torch.float64, generator=gen)
        b = torch.randn(c * mult, dtype=torch.float64, generator=gen)
        got, g = _ours(x, wt, b, s, [p] * 4, d, "depthwise")
        want = _torch(x, wt, b, s, [p] * 4, d, g)
        for a, e in zip(got, want, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12,
                                       msg=str((c, mult, k, s, d, p, h, w)))
        done += 1
