"""The pre-packed float32 small-batch GEMM (native/src/gemm_p16.c, kernels.gemm.PackedWeight)
vs float64 torch over the micro-kernels' edges (AVX2 4x16: rows 1-4 and 5+; AVX-512 8x32:
row blocks of 8 and remainders, odd panel counts; partial 16-column panels, k not a
multiple of 4), the convolutions on the AVX-512 tile (conv1x1_p16, conv_p16) vs float64
F.conv2d, and the executor's MatMul/Gemm bindings that use it vs ORT."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from ortcpu_torch._native import lib
from ortcpu_torch.graph import InferenceSession
from ortcpu_torch.kernels.gemm import P16_MAX_ROWS, PackedWeight

from .conftest import assert_close

needs_p16 = pytest.mark.skipif(not lib.ortcpu_gemm_p16_available(),
                               reason="gemm_p16 is built at x86-64-v3 and above only")


# m: the AVX-512 tile's 8-row blocks and their remainders; (n, k): one, two and three
# 16-column panels (the AVX-512 tile takes them in pairs), partial last panels; the last
# two are large enough to split the panels over threads
P16_CASES = [*itertools.product((1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 23),
                                ((1, 1), (10, 3), (16, 5), (17, 33), (32, 7), (47, 130))),
             (24, (200, 300)), (37, (96, 200))]


@needs_p16
@pytest.mark.parametrize("trans_b", [False, True])
def test_p16_matches_float64(trans_b):
    g = torch.Generator().manual_seed(0)
    for m, (n, k) in P16_CASES:
        b = torch.randn((n, k) if trans_b else (k, n), generator=g)
        a = torch.randn(m, k, generator=g)
        bias = torch.randn(n, generator=g)
        pw = PackedWeight.pack(b, trans_b)
        before = b.clone()
        bb = (b.t() if trans_b else b).double()
        for bi in (None, bias):
            y = pw.matmul(a, bi)
            want = a.double() @ bb + (0 if bi is None else bi.double())
            # float32 sums of k products of N(0, 1) terms: rounding grows with k
            assert_close(y, want.float(), rtol=1e-5, atol=1e-5 * max(1.0, k / 64),
                         msg=f"m{m} n{n} k{k}")
        assert torch.equal(b, before)


@needs_p16
def test_bound_call_equals_matmul_and_keeps_its_operands_alive():
    """PackedWeight.bind takes the constant operands' C pointers once (the graph's Gemm):
    the same bits as matmul, valid after every other reference to them is gone."""
    import gc

    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 40, generator=g)
    pw = PackedWeight.pack(torch.randn(33, 40, generator=g), True)
    bias = torch.randn(33, generator=g)
    want, want_plain = pw.matmul(a, bias), pw.matmul(a)
    f, plain = pw.bind(bias.clone(), op="Gemm"), pw.bind()
    del pw
    gc.collect()
    torch.randn(33 * 40 * 4)  # reuse of freed memory would show up as wrong values
    assert torch.equal(f(a), want) and torch.equal(plain(a), want_plain)


def test_pack_declines_what_it_cannot_pack():
    assert PackedWeight.pack(torch.randn(3, 4, dtype=torch.float64)) is None
    assert PackedWeight.pack(torch.randn(2, 3, 4)) is None
    assert PackedWeight.pack(torch.empty(0, 4)) is None


@needs_p16
def test_p16_bad_sizes_are_errors():
    from ortcpu_torch._native import ffi

    assert lib.ortcpu_gemm_p16(2, 3, 4, ffi.NULL, 2, ffi.NULL, ffi.NULL, ffi.NULL, 3, 1) != 0
    assert lib.ortcpu_gemm_p16_pack(0, 3, 4, ffi.NULL, 2, ffi.NULL) != 0


def _gemm_model(m, n, k, trans_b=1, c_shape=(None,), beta=1.0, fed_c=False, relu=True):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    ins = [helper.make_tensor_value_info("x", TP.FLOAT, [m, k])]
    gin = ["x", "w"]
    if c_shape != (None,):
        gin.append("c")
        if fed_c:
            ins.append(helper.make_tensor_value_info("c", TP.FLOAT, list(c_shape)))
        else:
            inits.append(numpy_helper.from_array(
                rng.standard_normal(c_shape).astype(np.float32), "c"))
    nodes = [helper.make_node("Gemm", gin, ["g"], transB=trans_b, beta=beta)]
    nodes.append(helper.make_node("Relu" if relu else "Identity", ["g"], ["y"]))
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", TP.FLOAT,
                                                                          [m, n])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("kw", [dict(c_shape=(37,)), dict(c_shape=(1, 37)), dict(),
                                dict(trans_b=0, c_shape=(37,)), dict(c_shape=(5, 37)),
                                dict(c_shape=(37,), beta=0.5), dict(c_shape=(37,), fed_c=True),
                                dict(c_shape=(37,), relu=False)])
def test_gemm_binding_vs_ort(kw):
    ort = pytest.importorskip("onnxruntime")
    m = _gemm_model(5, 37, 70, **kw)
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((5, 70)).astype(np.float32)}
    if kw.get("fed_c"):
        feeds["c"] = rng.standard_normal(kw["c_shape"]).astype(np.float32)
    got = InferenceSession(m).run(None, feeds)[0]
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3, P16_MAX_ROWS, P16_MAX_ROWS + 1])
def test_matmul_weight_binding_vs_ort(rows):
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(2)
    w = rng.standard_normal((45, 19)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT,
                                                                     [1, rows, 45])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [1, rows, 19])],
                          [numpy_helper.from_array(w, "w"),
                           numpy_helper.from_array(rng.standard_normal(19).astype(np.float32),
                                                   "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    feeds = {"x": rng.standard_normal((1, rows, 45)).astype(np.float32)}
    got = InferenceSession(m).run(None, feeds)[0]
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


needs_conv1x1 = pytest.mark.skipif(not lib.ortcpu_conv_p16_available(),
                                   reason="conv1x1_p16 / conv_p16 are built at x86-64-v4 "
                                          "only")


def _conv1x1(x, pw, b, r, relu, threads=2):
    from ortcpu_torch._native import ptr

    nb, cin, h, w = x.shape
    y = torch.empty(nb, pw.n, h, w)
    assert lib.ortcpu_conv1x1_p16(nb, pw.n, cin, h * w, ptr(x), ptr(pw.data), ptr(b), ptr(r),
                                  int(relu), ptr(y), 0, threads) == 0
    return y


@needs_conv1x1
@pytest.mark.parametrize("threads", [1, 2])
def test_conv1x1_p16_matches_float64(threads):
    """The transposed tile over position blocks of 8 and remainders, one and two panels,
    partial panels (17, 40 channels), batches, bias / residual / ReLU epilogues."""
    g = torch.Generator().manual_seed(3)
    for nb, cin, cout, h, w in itertools.product((1, 3), (1, 5, 64), (1, 16, 17, 40, 64),
                                                 (1, 3, 7), (1, 5)):
        x = torch.randn(nb, cin, h, w, generator=g)
        wt = torch.randn(cout, cin, generator=g)
        b, r = torch.randn(cout, generator=g), torch.randn(nb, cout, h, w, generator=g)
        pw = PackedWeight.pack(wt, True)
        for bias, res, relu in itertools.product((None, b), (None, r), (False, True)):
            y = _conv1x1(x, pw, bias, res, relu, threads)
            ref = F.conv2d(x.double(), wt.double()[:, :, None, None],
                           None if bias is None else bias.double())
            ref = ref if res is None else ref + res.double()
            assert_close(y, (ref.relu() if relu else ref).float(), rtol=1e-5, atol=1e-5,
                         msg=f"{nb} {cin}->{cout} {h}x{w} {bias is None} {res is None} {relu}")


@needs_conv1x1
@pytest.mark.parametrize("nb,cout", [(1, 40), (1, 64), (2, 17), (3, 96)])
def test_conv1x1_p16_threads_split_positions(nb, cout):
    """Too few (sample, panel pair) units for two threads: the positions are split into
    chunks of whole tiles too (529 positions: a partial last tile), every epilogue."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(nb, 64, 23, 23, generator=g)
    wt = torch.randn(cout, 64, generator=g)
    b, r = torch.randn(cout, generator=g), torch.randn(nb, cout, 23, 23, generator=g)
    pw = PackedWeight.pack(wt, True)
    ref = F.conv2d(x.double(), wt.double()[:, :, None, None], b.double()) + r.double()
    for threads in (2, 3):
        assert_close(_conv1x1(x, pw, b, r, True, threads), ref.relu().float(), rtol=1e-5,
                     atol=1e-5)


@needs_conv1x1
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("hw", [(13, 13), (1, 170), (7, 7), (4, 4)])
def test_conv1x1_p16_aligned_copy_of_long_reductions(threads, hw):
    """k >= 128 and n >= 512 with positions not a multiple of 8: X is read from a copy with
    64-byte aligned rows; the results are those of the unaligned read."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 160, *hw, generator=g)
    wt = torch.randn(520, 160, generator=g)
    b, r = torch.randn(520, generator=g), torch.randn(2, 520, *hw, generator=g)
    pw = PackedWeight.pack(wt, True)
    ref = F.conv2d(x.double(), wt.double()[:, :, None, None], b.double()) + r.double()
    # sums of 160 products of magnitude ~13: float32's rounding is ~1e-5 absolute
    assert_close(_conv1x1(x, pw, b, r, True, threads), ref.relu().float(), rtol=1e-5,
                 atol=1e-4)


@needs_conv1x1
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("k,n,hw", [(300, 40, (13, 13)), (513, 520, (1, 200)),
                                    (1100, 17, (16, 8)), (513, 40, (7, 7))])
def test_conv1x1_p16_reduction_in_slices(threads, k, n, hw):
    """Long reductions run in slices, the partial sums carried between them (a remainder
    slice merged, blocks of fewer tiles at the end, a 7x7 map in one block)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, k, *hw, generator=g)
    wt = torch.randn(n, k, generator=g)
    b, r = torch.randn(n, generator=g), torch.randn(2, n, *hw, generator=g)
    pw = PackedWeight.pack(wt, True)
    ref = F.conv2d(x.double(), wt.double()[:, :, None, None], b.double()) + r.double()
    assert_close(_conv1x1(x, pw, b, r, True, threads), ref.relu().float(), rtol=1e-5,
                 atol=1e-5 * k ** 0.5 * 10)


@needs_conv1x1
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("k,n,hw,strides", [(24, 40, (13, 11), (2, 2)),
                                            (160, 520, (9, 14), (2, 2)),
                                            (16, 17, (7, 9), (1, 2)), (32, 64, (10, 5), (3, 1))])
def test_conv1x1s_p16_strided_matches_float64(threads, k, n, hw, strides):
    """A strided 1x1 reads X subsampled natively (odd maps, a remainder row and column,
    the aligned copy from k >= 128 and n >= 512), with bias, residual and ReLU."""
    from ortcpu_torch._native import ffi, ptr

    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, k, *hw, generator=g)
    wt = torch.randn(n, k, generator=g)
    ref = F.conv2d(x.double(), wt.double()[:, :, None, None], stride=strides)
    b, r = torch.randn(n, generator=g), torch.randn(ref.shape, generator=g)
    ref = (ref + b.double()[:, None, None] + r.double()).relu()
    pw = PackedWeight.pack(wt, True)
    y = torch.empty(ref.shape)
    assert lib.ortcpu_conv1x1s_p16(2, n, k, *hw, *strides, ptr(x), ptr(pw.data), ptr(b),
                                   ptr(r.float()), 1, ptr(y), 0, threads) == 0
    assert_close(y, ref.float(), rtol=1e-5, atol=1e-5 * k ** 0.5 * 10)
    assert lib.ortcpu_conv1x1s_p16(2, n, k, 0, 4, 2, 2, ptr(x), ptr(pw.data), ffi.NULL,
                                   ffi.NULL, 0, ptr(y), 0, threads) != 0


@needs_conv1x1
def test_conv1x1_p16_relu_keeps_nan_and_bad_sizes_fail():
    from ortcpu_torch._native import ffi

    x = torch.randn(1, 4, 3, 3)
    x[0, :, 1, 1] = float("nan")
    pw = PackedWeight.pack(torch.randn(20, 4), True)
    for res in (None, torch.randn(1, 20, 3, 3)):
        y = _conv1x1(x, pw, None, res, True)
        assert y[0, :, 1, 1].isnan().all() and (y.nan_to_num(0) >= 0).all()
        assert y.isnan().sum() == 20
    assert lib.ortcpu_conv1x1_p16(1, -1, 4, 9, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 0,
                                  ffi.NULL, 0, 1) != 0
    assert lib.ortcpu_conv1x1_p16(1, 20, 4, 9, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 0,
                                  ffi.NULL, 20 * 9 - 1, 1) != 0  # ystride under a sample


# (N, C, M, H, W, kernel, stride, pad, dilation): first layers, 3x3 stride 1 and 2, 5x5
# dilated, strided 1x1, 7x7 stem, a 1x1 map, a kernel larger than its stride with pads
CONV_P16_CASES = [(1, 3, 64, 30, 31, 3, 2, 0, 1), (1, 16, 64, 15, 15, 3, 1, 1, 1),
                  (2, 5, 40, 9, 11, 3, 1, 1, 1), (1, 8, 17, 7, 7, 3, 2, 1, 1),
                  (1, 4, 33, 13, 12, 5, 1, 2, 2), (3, 6, 8, 10, 9, 1, 2, 0, 1),
                  (1, 3, 64, 20, 20, 7, 2, 3, 1), (1, 64, 64, 7, 7, 3, 1, 1, 1),
                  (1, 2, 5, 1, 1, 3, 1, 1, 1), (2, 7, 50, 6, 5, 2, 3, 2, 1)]


@needs_conv1x1
@pytest.mark.parametrize("case", CONV_P16_CASES)
def test_conv_p16_matches_float64(case):
    """The implicit-GEMM convolution (row tiles of 8 positions, padded copies, strided and
    dilated taps) with each epilogue, on 1 and 2 threads."""
    from ortcpu_torch._native import ffi, ptr

    nb, c, m, h, w, k, s, p, d = case
    g = torch.Generator().manual_seed(5)
    x, wt = torch.randn(nb, c, h, w, generator=g), torch.randn(m, c, k, k, generator=g)
    oh, ow = ((n + 2 * p - d * (k - 1) - 1) // s + 1 for n in (h, w))
    b, r = torch.randn(m, generator=g), torch.randn(nb, m, oh, ow, generator=g)
    pw = PackedWeight.pack(wt.reshape(m, -1), True)
    geom = ffi.new("int64_t[]", [nb, c, h, w, m, 1, k, k, oh, ow, s, s, p, p, d, d])
    for bias, res, relu, threads in itertools.product((None, b), (None, r), (0, 1), (1, 2)):
        y = torch.full((nb, m, oh, ow), float("nan"))
        assert lib.ortcpu_conv_p16(ptr(x), ptr(pw.data), ptr(bias), ptr(res), relu, ptr(y),
                                   0, geom, threads) == 0
        ref = F.conv2d(x.double(), wt.double(), None if bias is None else bias.double(), s, p,
                       d)
        ref = ref if res is None else ref + res.double()
        assert_close(y, (ref.relu() if relu else ref).float(), rtol=1e-5,
                     atol=1e-5 * max(1.0, c * k * k / 64), msg=f"{case} {relu} {threads}")


@needs_conv1x1
def test_claimed_units_give_the_same_bits_on_any_thread_count():
    """Threads claim the work units in turn (a thread slowed by other work takes fewer):
    which thread ran a unit never changes its bits, here with many units per claim
    (4 samples x 3 panel pairs x 26 output rows; 1x1: every sample and pair)."""
    from ortcpu_torch._native import ffi, ptr

    g = torch.Generator().manual_seed(9)
    x, wt = torch.randn(4, 24, 28, 28, generator=g), torch.randn(90, 24, 3, 3, generator=g)
    b, r = torch.randn(90, generator=g), torch.randn(4, 90, 26, 26, generator=g)
    pw = PackedWeight.pack(wt.reshape(90, -1), True)
    geom = ffi.new("int64_t[]", [4, 24, 28, 28, 90, 1, 3, 3, 26, 26, 1, 1, 0, 0, 1, 1])
    outs = []
    for threads in (1, 2, 3):
        y = torch.empty(4, 90, 26, 26)
        assert lib.ortcpu_conv_p16(ptr(x), ptr(pw.data), ptr(b), ptr(r), 1, ptr(y), 0, geom,
                                   threads) == 0
        w1 = PackedWeight.pack(wt[:, :, 1, 1].contiguous(), True)
        outs.append((y, _conv1x1(x, w1, b, torch.zeros(4, 90, 28, 28), True, threads)))
    for y, y1 in outs[1:]:
        assert torch.equal(y, outs[0][0]) and torch.equal(y1, outs[0][1])


def _blocked(x):
    n, c, h, w = x.shape
    return x.reshape(n, c // 16, 16, h * w).permute(0, 1, 3, 2).contiguous()


@needs_conv1x1
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("nb,k,n,hw", [(1, 16, 16, (3, 5)), (2, 32, 48, (7, 7)),
                                       (3, 64, 96, (1, 1)), (1, 320, 32, (9, 11)),
                                       (2, 48, 64, (23, 23)), (1, 320, 128, (9, 11)),
                                       (3, 16, 192, (5, 5)), (1, 2320, 64, (5, 7))])
@pytest.mark.parametrize("options", [0, 2, 4, 6])  # NO_FETCH, SLICED
def test_conv1x1_nchw16c_matches_float64(threads, nb, k, n, hw, options):
    """The channel-blocked 1x1 ([N][C/16][P][16] in and out): the 6 x 64 tile where the
    output channels are a multiple of 64 (partial tiles of 1-5 positions, several
    groups of 4 panels; k = 2320 in slices over blocks of tiles), else the 8 x 32 one (one
    panel, odd panel counts, a reduction in slices at k = 320); a 1x1 map, position
    chunks split over threads; bias, residual (blocked too) and ReLU; the 6 x 64 tile
    fetching its weight rows ahead or not (ORTCPU_CONV16C_NO_FETCH), every reduction in
    slices or not (ORTCPU_CONV16C_SLICED)."""
    from ortcpu_torch._native import ptr

    g = torch.Generator().manual_seed(10)
    x = torch.randn(nb, k, *hw, generator=g)
    wt = torch.randn(n, k, generator=g)
    b, r = torch.randn(n, generator=g), torch.randn(nb, n, *hw, generator=g)
    pw = PackedWeight.pack(wt, True)
    full = F.conv2d(x.double(), wt.double()[:, :, None, None], b.double())
    xb, rb = _blocked(x), _blocked(r)  # held: ptr() keeps no reference
    for bias, res, relu in itertools.product((None, b), (None, rb), (0, 1)):
        ref = full - (0 if bias is not None else b.double()[:, None, None])
        ref = ref if res is None else ref + r.double()
        ref = ref.relu() if relu else ref
        y = torch.full((nb, n // 16, hw[0] * hw[1], 16), float("nan"))
        assert lib.ortcpu_conv1x1_nchw16c(nb, n, k, hw[0] * hw[1], ptr(xb), ptr(pw.data),
                                          ptr(bias), ptr(res), relu | options, ptr(y), 0,
                                          threads) == 0
        assert_close(y, _blocked(ref.float()), rtol=1e-5, atol=1e-5 * k ** 0.5,
                     msg=f"{bias is None} {res is None} {relu}")


@needs_conv1x1
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("nb,c,m,h,w,k,s,p,d", [(2, 16, 32, 9, 11, 3, 1, 1, 1),
                                                (1, 32, 48, 14, 14, 3, 2, 1, 1),
                                                (1, 16, 16, 7, 7, 1, 2, 0, 1),
                                                (2, 32, 16, 12, 10, 5, 1, 4, 2),
                                                (1, 48, 32, 6, 6, 3, 1, 0, 1),
                                                (2, 16, 128, 9, 11, 3, 1, 1, 1),
                                                (1, 32, 64, 14, 13, 3, 2, 1, 1),
                                                (1, 64, 64, 8, 8, 5, 1, 4, 2),
                                                (2, 320, 64, 9, 7, 3, 1, 1, 1),
                                                (1, 272, 128, 13, 14, 3, 2, 1, 1)])
@pytest.mark.parametrize("options", [0, 2, 4, 6])  # NO_FETCH, SLICED
def test_conv_nchw16c_matches_float64(threads, nb, c, m, h, w, k, s, p, d, options):
    """The implicit-GEMM convolution on channel-blocked tensors (padded per 16-channel
    plane, the reduction in (block, tap, channel) order), on the 8 x 32 tile and, for
    output channels in groups of 64, the 6 x 64 one (rows of 1-5 leftover positions;
    reductions over 2304 steps in slices over bands of rows, the last band short):
    stride 1 and 2, a strided 1x1, dilated 5x5s, no padding; bias, blocked residual and
    ReLU; weight rows fetched ahead or not, reductions in slices or not."""
    from ortcpu_torch._native import ffi, ptr

    g = torch.Generator().manual_seed(11)
    x, wt = torch.randn(nb, c, h, w, generator=g), torch.randn(m, c, k, k, generator=g)
    ref = F.conv2d(x.double(), wt.double(), None, s, p, d)
    b, r = torch.randn(m, generator=g), torch.randn(ref.shape, generator=g)
    ref = (ref + b.double()[:, None, None] + r.double()).relu()
    oh, ow = ref.shape[2:]
    wb = wt.reshape(m, c // 16, 16, k, k).permute(0, 1, 3, 4, 2).reshape(m, -1)
    pw = PackedWeight.pack(wb.contiguous(), True)
    geom = ffi.new("int64_t[]", [nb, c, h, w, m, 1, k, k, oh, ow, s, s, p, p, d, d])
    y = torch.full((nb, m // 16, oh * ow, 16), float("nan"))
    xb, rb = _blocked(x), _blocked(r)  # held: ptr() keeps no reference
    assert lib.ortcpu_conv_nchw16c(ptr(xb), ptr(pw.data), ptr(b), ptr(rb), 1 | options,
                                   ptr(y), 0, geom, threads) == 0
    assert_close(y, _blocked(ref.float()), rtol=1e-5, atol=1e-5 * (c * k * k) ** 0.5)
    geom[1] = 24  # not whole channel blocks
    assert lib.ortcpu_conv_nchw16c(ptr(x), ptr(pw.data), ptr(b), ffi.NULL, 0, ptr(y), 0,
                                   geom, threads) != 0


@needs_conv1x1
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("nb,k,n,hw,s", [(1, 32, 64, (14, 14), 2), (2, 64, 48, (13, 11), 2),
                                         (3, 16, 128, (9, 10), (3, 2)),
                                         (1, 1024, 128, (7, 7), 2)])
@pytest.mark.parametrize("options", [0, 2, 4, 6])  # NO_FETCH, SLICED
def test_conv1x1s_nchw16c_matches_float64(threads, nb, k, n, hw, s, options):
    """The strided blocked 1x1 (X subsampled per 16-channel plane into a scratch copy):
    both tiles, odd maps, unequal strides; bias, blocked residual and ReLU, and a channel
    slice of a wider output (ystride)."""
    from ortcpu_torch._native import ffi, ptr

    sh, sw = (s, s) if isinstance(s, int) else s
    g = torch.Generator().manual_seed(12)
    x, wt = torch.randn(nb, k, *hw, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g)
    ref = F.conv2d(x.double(), wt.double()[:, :, None, None], b.double(), (sh, sw))
    r = torch.randn(ref.shape, generator=g)
    ref = (ref + r.double()).relu()
    p = ref.shape[2] * ref.shape[3]
    pw = PackedWeight.pack(wt, True)
    xb, rb = _blocked(x), _blocked(r)  # held: ptr() keeps no reference
    wide = torch.full((nb, n // 16 + 2, p, 16), float("nan"))
    y = wide[:, 1:1 + n // 16]
    assert lib.ortcpu_conv1x1s_nchw16c(nb, n, k, *hw, sh, sw, ptr(xb), ptr(pw.data), ptr(b),
                                       ptr(rb), 1 | options, ptr(y), wide[0].numel(),
                                       threads) == 0
    assert_close(y, _blocked(ref.float()), rtol=1e-5, atol=1e-5 * k ** 0.5)
    assert wide[:, 0].isnan().all() and wide[:, -1].isnan().all()
    assert lib.ortcpu_conv1x1s_nchw16c(nb, n, k, *hw, 0, sw, ffi.NULL, ffi.NULL, ffi.NULL,
                                       ffi.NULL, 0, ffi.NULL, 0, threads) != 0


@needs_conv1x1
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("nb,c,m,h,w,k,s,p", [(1, 3, 64, 23, 21, 7, 2, 3),
                                              (2, 3, 128, 15, 17, 3, 2, 0),
                                              (3, 5, 64, 9, 9, 3, 1, 1)])
def test_conv_nchw_to16c_matches_float64(threads, nb, c, m, h, w, k, s, p):
    """A stem: NCHW X of a few channels into channel-blocked Y on the 6 x 64 tile (padded
    and unpadded, strides 1 and 2, one or two 64-channel groups, odd rows); bias, blocked
    residual, ReLU and a channel slice of a wider output."""
    from ortcpu_torch._native import ffi, ptr

    g = torch.Generator().manual_seed(13)
    x, wt = torch.randn(nb, c, h, w, generator=g), torch.randn(m, c, k, k, generator=g)
    b = torch.randn(m, generator=g)
    ref = F.conv2d(x.double(), wt.double(), b.double(), s, p)
    r = torch.randn(ref.shape, generator=g)
    ref = (ref + r.double()).relu()
    oh, ow = ref.shape[2:]
    pw = PackedWeight.pack(wt.reshape(m, -1), True)
    geom = ffi.new("int64_t[]", [nb, c, h, w, m, 1, k, k, oh, ow, s, s, p, p, 1, 1])
    rb = _blocked(r)  # held: ptr() keeps no reference
    wide = torch.full((nb, m // 16 + 1, oh * ow, 16), float("nan"))
    y = wide[:, 1:]
    assert lib.ortcpu_conv_nchw_to16c(ptr(x), ptr(pw.data), ptr(b), ptr(rb), 1, ptr(y),
                                      wide[0].numel(), geom, threads) == 0
    assert_close(y, _blocked(ref.float()), rtol=1e-5, atol=1e-5 * (c * k * k) ** 0.5)
    assert wide[:, 0].isnan().all()
    geom[4] = 48  # not a group of 64 output channels
    assert lib.ortcpu_conv_nchw_to16c(ptr(x), ptr(pw.data), ptr(b), ffi.NULL, 0, ptr(y), 0,
                                      geom, threads) != 0


@needs_conv1x1
def test_blocked_convs_reject_unknown_flags():
    from ortcpu_torch._native import ffi, ptr

    assert (lib.ORTCPU_CONV16C_RELU, lib.ORTCPU_CONV16C_NO_FETCH,
            lib.ORTCPU_CONV16C_SLICED) == (1, 2, 4)
    x, y = torch.zeros(1, 1, 4, 16), torch.full((1, 4, 4, 16), 7.0)
    pw = PackedWeight.pack(torch.zeros(64, 16), True)
    assert lib.ortcpu_conv1x1_nchw16c(1, 64, 16, 4, ptr(x), ptr(pw.data), ffi.NULL, ffi.NULL,
                                      8, ptr(y), 0, 1) != 0
    assert "unknown flags" in ffi.string(lib.ortcpu_last_error()).decode()
    assert (y == 7).all()
    geom = ffi.new("int64_t[]", [1, 16, 2, 2, 64, 1, 1, 1, 2, 2, 1, 1, 0, 0, 1, 1])
    assert lib.ortcpu_conv_nchw16c(ptr(x), ptr(pw.data), ffi.NULL, ffi.NULL, 8, ptr(y), 0,
                                   geom, 1) != 0
    assert lib.ortcpu_conv1x1s_nchw16c(1, 64, 16, 2, 2, 1, 1, ptr(x), ptr(pw.data), ffi.NULL,
                                       ffi.NULL, -1, ptr(y), 0, 1) != 0


@needs_conv1x1
def test_conv1x1_nchw16c_takes_whole_channel_blocks_only():
    from ortcpu_torch._native import ffi

    for n, k in ((17, 16), (16, 40)):
        assert lib.ortcpu_conv1x1_nchw16c(1, n, k, 4, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL,
                                          0, ffi.NULL, 0, 1) != 0


@needs_conv1x1
def test_conv_p16_rejects_groups_and_negative_pads():
    from ortcpu_torch._native import ffi

    for bad in ([1, 4, 3, 3, 4, 2, 1, 1, 3, 3, 1, 1, 0, 0, 1, 1],
                [1, 4, 3, 3, 4, 1, 1, 1, 3, 3, 1, 1, -1, 0, 1, 1]):
        geom = ffi.new("int64_t[]", bad)
        assert lib.ortcpu_conv_p16(ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 0, ffi.NULL, 0,
                                   geom, 1) != 0


@needs_conv1x1
@pytest.mark.parametrize("k", [1, 3])
def test_conv_p16_writes_a_channel_slice_of_a_wider_output(k):
    """``ystride`` > a sample: Y is channels [c0, c0 + M) of an [N, M + 7, OH, OW] buffer
    (a Concat written in place at batch > 1); the rest of the buffer is left alone."""
    from ortcpu_torch._native import ffi, ptr

    g = torch.Generator().manual_seed(7)
    nb, c, m, h, w, c0 = 3, 5, 19, 6, 9, 4
    x, wt = torch.randn(nb, c, h, w, generator=g), torch.randn(m, c, k, k, generator=g)
    b, p = torch.randn(m, generator=g), k // 2
    pw = PackedWeight.pack(wt.reshape(m, -1), True)
    ref = F.conv2d(x.double(), wt.double(), b.double(), 1, p).relu().float()
    for threads in (1, 2):
        buf = torch.full((nb, m + 7, h, w), float("nan"))
        y = buf[:, c0:c0 + m]
        ystride = buf.stride(0)
        if k == 1:
            st = lib.ortcpu_conv1x1_p16(nb, m, c, h * w, ptr(x), ptr(pw.data), ptr(b),
                                        ffi.NULL, 1, ptr(y), ystride, threads)
        else:
            geom = ffi.new("int64_t[]", [nb, c, h, w, m, 1, k, k, h, w, 1, 1, p, p, 1, 1])
            st = lib.ortcpu_conv_p16(ptr(x), ptr(pw.data), ptr(b), ffi.NULL, 1, ptr(y),
                                     ystride, geom, threads)
        assert st == 0
        assert_close(y, ref, rtol=1e-5, atol=1e-5)
        assert buf[:, :c0].isnan().all() and buf[:, c0 + m:].isnan().all()
