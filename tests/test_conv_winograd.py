"""Winograd convolution paths F(2x2,3x3) and F(4x4,3x3) (native/src/conv_wino.inc) against
the im2col path and torch on the same inputs: forward, dX, dW, dB; odd and non-square
outputs (the last tiles hang over the edge), asymmetric padding, padding 0/1/2 (and
pads > 2, where the dX convolution gets negative padding), batch 0 and 1, channel counts
around the auto-selection threshold, threads, float64 gradcheck through both Winograd
paths, NaN/inf.

Tolerances (float32), measured against a float64 reference as max|err| / max|ref| over
C = M = 8..256: im2col and torch (oneDNN) <= 5e-7; F(2x2) <= 7e-7 (the same order);
F(4x4) <= 1.1e-5 (its transforms carry factors up to 8 and 1/24: ~20x F(2x2)). Tests
compare with atol = tol * max|ref| and rtol = tol, tol = 2e-5 for im2col / F(2x2) and
1e-4 for F(4x4) and for the automatic choice; float64 uses 1e-10 (F(4x4) 1e-9).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ortcpu_torch.kernels import conv as KC
from ortcpu_torch.ops.conv import _Conv

ALGOS = ("im2col", "winograd2", "winograd4")
WINO = ("winograd2", "winograd4")
TOL = {"im2col": 2e-5, "winograd2": 2e-5, "winograd4": 1e-4, "auto": 1e-4}


def _ref(x, w, b, pads, g):
    """torch forward and grads with explicit ONNX pads [top, left, bottom, right]."""
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    br = b.clone().requires_grad_() if b is not None else None
    y = F.conv2d(F.pad(xr, (pads[1], pads[3], pads[0], pads[2])), wr, br)
    if g is None:
        g = torch.randn_like(y)
    y.backward(g)
    return y.detach(), g, xr.grad, wr.grad, (br.grad if br is not None else None)


def _ours(x, w, b, pads, g, algo):
    y = KC.conv_forward("Conv", x, w, b, pads=pads, algo=algo)
    dx, dw, db = KC.conv_backward("ConvGrad", g, x, w, (True, True, b is not None), pads=pads,
                                  algo=algo)
    return y, dx, dw, db


def _close(a, b, algo="im2col"):
    if b is None:
        assert a is None
        return
    if b.dtype == torch.float64:
        tol = 1e-9 if algo == "winograd4" else 1e-10
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    else:
        tol = TOL[algo]
        scale = b.abs().max().item() if b.numel() else 1.0
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(scale, 1e-3))


def _check(n, c, m, h, w, pads, dtype=torch.float32, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, dtype=dtype, generator=gen)
    wt = torch.randn(m, c, 3, 3, dtype=dtype, generator=gen)
    b = torch.randn(m, dtype=dtype, generator=gen) if bias else None
    y, g, dx, dw, db = _ref(x, wt, b, pads, None)
    res = {a: _ours(x, wt, b, pads, g, a) for a in ALGOS}
    for a in ALGOS:
        for got, want in zip(res[a], (y, dx, dw, db), strict=True):
            _close(got, want, a)
    for a in WINO:
        for got, want in zip(res[a], res["im2col"], strict=True):
            _close(got, want, a)


# out sizes 1..9 (odd, non-square) from in sizes with padding 1
@pytest.mark.parametrize("h,w", [(1, 1), (2, 3), (3, 2), (4, 5), (5, 9), (6, 1), (7, 8),
                                 (8, 7), (9, 9), (1, 9)])
def test_winograd_odd_sizes(h, w):
    _check(2, 8, 9, h, w, [1, 1, 1, 1])


@pytest.mark.parametrize("pads", [[0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2], [0, 1, 2, 0],
                                  [2, 0, 1, 1], [1, 2, 0, 0], [3, 1, 0, 4], [0, 0, 3, 2]])
def test_winograd_padding(pads):
    _check(2, 8, 8, 6, 7, pads)


@pytest.mark.parametrize("n", [0, 1])
def test_winograd_batch_0_1(n):
    _check(n, 9, 8, 5, 6, [1, 1, 1, 1])


@pytest.mark.parametrize("c,m", [(7, 7), (7, 8), (8, 7), (8, 8), (9, 9), (8, 3), (8, 4),
                                 (1, 16), (16, 1), (3, 32), (64, 64)])
def test_winograd_channels_around_threshold(c, m):
    """Both paths forced, and the automatic choice, agree on the same inputs."""
    _check(2, c, m, 12, 10, [1, 1, 1, 1])
    x = torch.randn(2, c, 12, 10)
    wt = torch.randn(m, c, 3, 3)
    auto = KC.conv_forward("Conv", x, wt, None, pads=[1, 1, 1, 1])
    _close(auto, KC.conv_forward("Conv", x, wt, None, pads=[1, 1, 1, 1], algo="im2col"),
           "auto")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,c,m,h,w", [
    (64, 32, 64, 14, 14),  # the cnn benchmark's second conv
    (5, 8, 13, 22, 18),    # 13 output channels (tile rows 8 / 6), 150 F(4x4) tiles
    (3, 11, 9, 9, 31),     # tile columns not a multiple of the 32 / 16 lanes
    (1, 8, 17, 3, 3),      # one tile per image
    (2, 4, 5, 7, 70),      # runs of 18 F(4x4) tiles: the vector copies' 4-tile groups + 2
])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_winograd_gemm_tile_tails(n, c, m, h, w, dtype, threads):
    """The per-position GEMMs (on AVX-512 builds our packed register tile, conv.c
    wino_use_pk; the BLAS on AVX2, which ORTCPU_ISA=avx2 test runs cover) over row and
    column tails, several tile blocks and threads: forward, dX, dW, dB vs torch and
    im2col."""
    import ortcpu_torch

    old = ortcpu_torch.get_num_threads()
    try:
        ortcpu_torch.set_num_threads(threads)
        _check(n, c, m, h, w, [1, 1, 1, 1], dtype=dtype)
    finally:
        ortcpu_torch.set_num_threads(old)


def test_winograd_float64_and_threads():
    """float64 through Winograd matches im2col to 1e-10; the threaded split of tile
    blocks (one image split across threads, per-thread dW partials) is exercised with a
    size that makes several blocks."""
    import ortcpu_torch

    old = ortcpu_torch.get_num_threads()
    try:
        for t in (1, 2):
            ortcpu_torch.set_num_threads(t)
            _check(3, 16, 24, 30, 33, [1, 1, 1, 1], dtype=torch.float64)
            _check(1, 16, 8, 40, 41, [0, 2, 1, 0], dtype=torch.float64, bias=False)
            # 128 x 96 kernels: the kernel transforms (U, and dW from dU) split over threads
            _check(2, 128, 96, 6, 5, [1, 1, 1, 1], dtype=torch.float64)
    finally:
        ortcpu_torch.set_num_threads(old)


@pytest.mark.parametrize("algo", WINO)
def test_winograd_no_bias_and_partial_needs(algo):
    x = torch.randn(2, 8, 7, 9)
    wt = torch.randn(8, 8, 3, 3)
    g = torch.randn(2, 8, 7, 9)
    full = KC.conv_backward("ConvGrad", g, x, wt, (True, True, True), pads=[1, 1, 1, 1],
                            algo=algo)
    for need in [(True, False, False), (False, True, False), (False, False, True),
                 (False, True, True)]:
        part = KC.conv_backward("ConvGrad", g, x, wt, need, pads=[1, 1, 1, 1], algo=algo)
        for want, p, got in zip(need, full, part, strict=True):
            if want:
                torch.testing.assert_close(got, p, rtol=0, atol=0)
            else:
                assert got is None


@pytest.mark.parametrize("algo", WINO)
@pytest.mark.parametrize("pads", [[1, 1, 1, 1], [0, 2, 1, 0]])
def test_winograd_gradcheck(pads, algo):
    attrs = {"pads": pads, "strides": [1, 1], "dilations": [1, 1], "group": 1,
             "algo": algo}
    x = torch.randn(2, 3, 7, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, dtype=torch.float64, requires_grad=True)
    plan = KC.conv_plan("conv2d", x, w, b, **attrs)
    assert torch.autograd.gradcheck(lambda x, w, b: _Conv.apply(x, w, b, plan), (x, w, b))


def _same_or_tile_superset(ours, ref, algo):
    """F(2x2): exactly ref's non-finite outputs. F(4x4): a superset within the 4x4 output
    tiles that hold one (its B^T rows mix patch columns 0, 2, 4, so one bad input reaches
    the whole tile); never fewer, and every finite value agrees with ref."""
    bad, rbad = ~ours.isfinite(), ~ref.isfinite()
    if algo == "winograd2":
        assert torch.equal(bad, rbad)
    else:
        assert not (rbad & ~bad).any()
        # grow ref's non-finite set to whole 4x4 tiles (tiles start at output 0)
        h, w = ref.shape[-2:]
        tiles = F.max_pool2d(rbad.float(), 4, 4, ceil_mode=True)
        grown = tiles.repeat_interleave(4, -2).repeat_interleave(4, -1)[..., :h, :w] > 0
        assert not (bad & ~grown).any()
    ok = ~bad
    torch.testing.assert_close(ours[ok], ref[ok], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("algo", WINO)
def test_winograd_nan_inf(algo):
    """NaN in x or dY reaches the outputs / dX entries whose windows hold it (F(2x2):
    exactly those, as im2col and torch; F(4x4): their whole 4x4 tiles); an inf makes
    the same outputs non-finite (Winograd may turn +-inf into NaN: its transforms
    subtract inputs, inf - inf)."""
    x = torch.randn(1, 8, 9, 8)
    wt = torch.randn(8, 8, 3, 3)
    g = torch.randn(1, 8, 9, 8)
    x[0, 2, 4, 3] = float("nan")
    x[0, 5, 0, 7] = float("nan")
    y0 = KC.conv_forward("Conv", x, wt, None, pads=[1, 1, 1, 1], algo="im2col")
    y1 = KC.conv_forward("Conv", x, wt, None, pads=[1, 1, 1, 1], algo=algo)
    yt = F.conv2d(x, wt, padding=1)
    assert torch.equal(y0.isnan(), yt.isnan()) and yt.isnan().any()
    _same_or_tile_superset(y1, yt, algo)
    # dX of a NaN in dY; dW of a NaN in x (every (co, ci) pair that meets it)
    gn = g.clone()
    gn[0, 1, 5, 5] = float("nan")
    dx1, _, _ = KC.conv_backward("ConvGrad", gn, x, wt, (True, False, False),
                                 pads=[1, 1, 1, 1], algo=algo)
    dx0, _, _ = KC.conv_backward("ConvGrad", gn, x, wt, (True, False, False),
                                 pads=[1, 1, 1, 1], algo="im2col")
    assert dx0.isnan().any()
    _same_or_tile_superset(dx1, dx0, algo)
    _, dw1, _ = KC.conv_backward("ConvGrad", g, x, wt, (False, True, False),
                                 pads=[1, 1, 1, 1], algo=algo)
    _, dw0, _ = KC.conv_backward("ConvGrad", g, x, wt, (False, True, False),
                                 pads=[1, 1, 1, 1], algo="im2col")
    # an interior NaN reaches every tap of dW[:, ci] on both paths; one on the image edge
    # reaches only some taps through im2col but all 9 through Winograd (G^T dU G mixes
    # the transformed taps): a superset, never fewer
    assert dw0[:, 2].isnan().all() and dw1[:, 2].isnan().all()
    assert not (dw0.isnan() & ~dw1.isnan()).any()
    assert dw1[:, 5].isnan().all() and not dw0[:, 5].isnan().all()
    keep = torch.ones(8, dtype=torch.bool)
    keep[[2, 5]] = False
    assert not dw1[:, keep].isnan().any()
    torch.testing.assert_close(dw1[:, keep], dw0[:, keep], rtol=1e-4, atol=1e-3)
    # inf: the same outputs go non-finite, the rest agree
    xi = torch.randn(1, 8, 9, 8)
    xi[0, 3, 6, 2] = float("inf")
    yi = KC.conv_forward("Conv", xi, wt, None, pads=[1, 1, 1, 1], algo=algo)
    yti = F.conv2d(xi, wt, padding=1)
    assert (~yti.isfinite()).any()
    _same_or_tile_superset(yi, yti, algo)


@pytest.mark.parametrize("algo", WINO)
def test_winograd_bad_algo(algo):
    x = torch.randn(1, 8, 6, 6)
    for w, kw in ((torch.randn(8, 8, 3, 3), {"strides": [2, 2]}),
                  (torch.randn(8, 8, 3, 3), {"dilations": [2, 2]}),
                  (torch.randn(8, 8, 5, 5), {}),
                  (torch.randn(8, 4, 3, 3), {"group": 2})):
        with pytest.raises(ValueError, match=f"algo='{algo}' needs a 2-D 3x3 kernel"):
            KC.conv_forward("Conv", x, w, None, algo=algo, **kw)
    with pytest.raises(ValueError, match="algo must be one of"):
        KC.conv_forward("Conv", x, torch.randn(8, 8, 3, 3), None, algo="winograd")
    x1 = torch.randn(1, 8, 6)
    with pytest.raises(ValueError, match="needs a 2-D 3x3 kernel"):
        KC.conv_forward("Conv", x1, torch.randn(8, 8, 3), None, algo=algo)
