"""The executor's inference Conv (native/src/conv_infer.c, graph/conv_infer.py): the packed
kernel vs torch's conv2d forward in float64 (float32 and float64 inputs; odd channel
counts, strides, pads, dilations, groups, size-1 maps, batch 1 and 8, bias / residual /
ReLU epilogues, NaN), and through whole graphs (Conv+Relu, Conv+Add+Relu, Convs written
into their Concat) with each of the measured candidates forced (row and channel tiles,
the 1x1 GEMM, the training kernel)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from ortcpu_torch._native import KernelError, lib
from ortcpu_torch.graph import InferenceSession, conv_infer
from ortcpu_torch.graph.conv_infer import PackedConv, infer_geometry
from ortcpu_torch.kernels.conv import conv_geometry

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: 2e-6, torch.float64: 1e-13}

# (N, C, H, W, M, kernel, stride, pads (t, l, b, r), dilation, group)
CASES = [
    (1, 3, 224, 224, 64, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), 1),   # squeezenet conv1
    (1, 3, 40, 40, 8, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1),      # resnet conv1 style
    (1, 16, 55, 55, 64, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),    # 1x1 read in place
    (8, 7, 6, 5, 13, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),       # 1x1 stride 2
    (2, 5, 7, 9, 7, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (1, 6, 9, 11, 9, (3, 2), (2, 3), (1, 2, 0, 1), (2, 1), 3),       # asymmetric, groups
    (3, 8, 13, 13, 10, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 2),
    (2, 6, 8, 8, 6, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 6),        # depthwise
    (1, 1, 1, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),        # size-1 everything
    (8, 3, 1, 1, 5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),        # 1x1 map, batch 8
    (1, 2, 5, 5, 3, (3, 3), (3, 3), (4, 4, 4, 4), (2, 2), 1),        # pads beyond the map
    (8, 9, 10, 7, 11, (3, 3), (1, 2), (0, 1, 2, 0), (1, 1), 1),
    (1, 4, 17, 9, 6, (1, 3), (1, 1), (0, 1, 0, 1), (1, 3), 2),
    (1, 33, 14, 14, 40, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),    # taps in 2 slices
    (2, 600, 5, 3, 13, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),     # 3 slices, in place
]


def _reference(x, w, b, r, stride, pads, dil, group, relu):
    t, left, bot, right = pads
    xp = F.pad(x.double(), (left, right, t, bot))
    ref = F.conv2d(xp, w.double(), None if b is None else b.double(), stride, 0, dil, group)
    if r is not None:
        ref = ref + r.double()
    return ref.relu() if relu else ref


def _packed(x, w, stride, pads, dil, group, layout=0):
    geom, out = conv_geometry("Conv", x, w, pads=list(pads), strides=list(stride),
                              dilations=list(dil), group=group)
    g16 = infer_geometry(geom)
    assert g16 is not None
    return PackedConv(w, g16, out, layout), out


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_packed_conv_vs_torch(case, dtype, layout):
    """Row tiles (layout 0; taps read in place and, ``pack_all``, every chunk packed) and
    channel tiles (layout 1, float32 only) against torch."""
    n, c, h, wd, m, k, s, p, d, g = case
    gen = torch.Generator().manual_seed(hash(case) % 1000)
    x = torch.randn(n, c, h, wd, generator=gen, dtype=dtype)
    w = torch.randn(m, c // g, *k, generator=gen, dtype=dtype)
    b = torch.randn(m, generator=gen, dtype=dtype)
    if layout == 1 and dtype == torch.float64:
        with pytest.raises(KernelError, match="float32 only"):
            _packed(x, w, s, p, d, g, layout)
        return
    pc, out = _packed(x, w, s, p, d, g, layout)
    r = torch.randn(out, generator=gen, dtype=dtype)
    for bias, res, relu in [(None, None, False), (b, None, True), (b, r, True), (None, r, False)]:
        ref = _reference(x, w, bias, res, s, p, d, g, relu)
        for pack_all in (False, True) if layout == 0 else (False,):
            y = pc.run(x, bias, res, relu, pack_all=pack_all)
            assert y.shape == ref.shape and y.dtype == dtype
            err = (y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)
            assert err < TOL[dtype], (case, bias is not None, res is not None, relu, pack_all,
                                      float(err))


# small maps, many channels: channel tiles' panels (M not a multiple of 16), position
# tails (OH * OW not a multiple of 6), sliced and unsliced taps, and batch 8
SMALL_MAPS = [
    (1, 64, 7, 7, 40, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (8, 300, 7, 7, 33, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (1, 32, 14, 14, 64, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    (2, 48, 13, 13, 96, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2),
    (1, 17, 5, 3, 16, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
]


@pytest.mark.parametrize("case", SMALL_MAPS)
def test_channel_tiles_vs_row_tiles(case):
    n, c, h, wd, m, k, s, p, d, g = case
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(n, c, h, wd, generator=gen)
    w = torch.randn(m, c // g, *k, generator=gen)
    b = torch.randn(m, generator=gen)
    rows, out = _packed(x, w, s, p, d, g, 0)
    chans, _ = _packed(x, w, s, p, d, g, 1)
    r = torch.randn(out, generator=gen)
    ref = _reference(x, w, b, r, s, p, d, g, True)
    for pc in (rows, chans):
        y = pc.run(x, b, r, True)
        err = (y.double() - ref).abs().max() / ref.abs().max()
        assert err < 1e-5, (case, pc.layout, float(err))
    x[0, 0, 0, 0] = float("nan")
    assert torch.equal(rows.run(x, b).isnan(), chans.run(x, b).isnan())


def test_channel_tiles_routing():
    """Which geometries get the channel-tile candidate: float32, maps up to 28 x 28, at
    least 16 output channels per group."""
    def geom(c, h, m, group=1, k=3):
        g, _ = conv_geometry("Conv", torch.empty(1, c, h, h, device="meta"),
                             torch.empty(m, c // group, k, k, device="meta"),
                             pads=[k // 2] * 4, group=group)
        return infer_geometry(g)
    assert conv_infer.channel_tiles(geom(64, 7, 64), torch.float32)
    assert conv_infer.channel_tiles(geom(64, 28, 16), torch.float32)
    assert not conv_infer.channel_tiles(geom(64, 29, 64), torch.float32)
    assert not conv_infer.channel_tiles(geom(64, 56, 64), torch.float32)
    assert not conv_infer.channel_tiles(geom(64, 7, 64), torch.float64)
    assert not conv_infer.channel_tiles(geom(64, 7, 8), torch.float32)
    assert not conv_infer.channel_tiles(geom(64, 7, 64, group=8), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_propagates(dtype):
    x = torch.randn(2, 4, 6, 6, dtype=dtype)
    x[0, 1, 2, 3] = float("nan")
    x[1, 3, 0, 0] = float("inf")
    w = torch.randn(5, 4, 3, 3, dtype=dtype)
    pc, _ = _packed(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    y = pc.run(x, None, None, True)
    ref = F.conv2d(x, w, padding=1).relu()
    assert torch.equal(y.isnan(), ref.isnan())
    fin = ~ref.isnan()
    torch.testing.assert_close(y[fin], ref[fin])


def test_geometry_outside_the_kernel():
    x, w = torch.empty(1, 2, 3, 4, 5), torch.empty(3, 2, 1, 1, 1)
    geom, _ = conv_geometry("Conv", x, w)
    assert infer_geometry(geom) is None  # 3-D: the training kernel
    x2, w2 = torch.empty(1, 2, 8, 8), torch.empty(3, 2, 3, 3)
    geom, _ = conv_geometry("Conv", x2, w2, pads=[1, 1, 1, 1])
    assert infer_geometry(geom) is not None
    geom[17] = -1  # a negative begin pad (the registry rejects it; the mapping too)
    assert infer_geometry(geom) is None


def test_bad_geometry_is_an_error_not_a_crash():
    w = torch.randn(4, 3, 3, 3)
    bad = [1, 3, 8, 8, 4, 2, 3, 3, 6, 6, 1, 1, 0, 0, 1, 1]  # 3 channels, group 2
    with pytest.raises(KernelError, match="conv_infer"):
        PackedConv(w, bad, (1, 4, 6, 6))


# ---- through the executor ---------------------------------------------------------------


def _conv_graph(dtype, kind, m=6):
    """x -> Conv(3x3) [+ residual Add] + Relu, or two Convs + Relu into a channel Concat;
    ``m`` output channels per Conv."""
    elem = TP.FLOAT if dtype == torch.float32 else TP.DOUBLE
    rng = np.random.default_rng(1)
    npd = np.float32 if dtype == torch.float32 else np.float64
    w = numpy_helper.from_array(rng.standard_normal((m, 5, 3, 3)).astype(npd), "w")
    b = numpy_helper.from_array(rng.standard_normal(m).astype(npd), "b")
    w1 = numpy_helper.from_array(rng.standard_normal((m, 5, 1, 1)).astype(npd), "w1")
    inits = [w, b, w1]
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])
    if kind == "relu":
        nodes = [conv, helper.make_node("Relu", ["c"], ["y"])]
        out = [1, m, 9, 9]
    elif kind == "residual":
        nodes = [helper.make_node("Conv", ["x", "w1", "b"], ["skip"]), conv,
                 helper.make_node("Add", ["c", "skip"], ["s"]),
                 helper.make_node("Relu", ["s"], ["y"])]
        out = [1, m, 9, 9]
    else:
        nodes = [conv, helper.make_node("Relu", ["c"], ["r0"]),
                 helper.make_node("Conv", ["x", "w1", "b"], ["c1"]),
                 helper.make_node("Relu", ["c1"], ["r1"]),
                 helper.make_node("Concat", ["r0", "r1"], ["y"], axis=1)]
        out = [1, 2 * m, 9, 9]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, [1, 5, 9, 9])],
                          [helper.make_tensor_value_info("y", elem, out)], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    t = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in inits}
    return m, t


def _graph_reference(kind, x, t):
    c = F.conv2d(x, t["w"], t["b"], padding=1)
    if kind == "relu":
        return c.relu()
    skip = F.conv2d(x, t["w1"], t["b"])
    if kind == "residual":
        return (c + skip).relu()
    return torch.cat([c.relu(), skip.relu()], 1)


@pytest.mark.parametrize("channels", [6, 20])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["relu", "residual", "concat"])
def test_graph_both_candidates(kind, dtype, channels):
    """Every candidate of each Conv forced in turn (20 float32 channels on a 9x9 map add
    channel tiles)."""
    m, t = _conv_graph(dtype, kind, channels)
    sess = InferenceSession(m)
    x = torch.randn(1, 5, 9, 9, dtype=dtype)
    ref = _graph_reference(kind, x.double(), {k: v.double() for k, v in t.items()})
    ex = sess.executor
    plan = ex.plan_for(ex.positional({"x": x}))
    choosers = [getattr(b.fn, "choice", b.fn) for b in plan.bound if b.node.op_type == "Conv"]
    choosers = [c for c in choosers if hasattr(c, "force")]
    assert choosers, "no Conv bound to the measured choice"
    assert any("Relu" in f for f in plan.fusions)
    names = set().union(*(c.candidates for c in choosers))
    assert ("channels" in names) == (dtype == torch.float32 and channels >= 16)
    # float32 Convs have the GEMM candidate on AVX-512 builds
    assert ("gemm" in names) == (dtype == torch.float32 and
                                 bool(lib.ortcpu_conv_p16_available()))
    for name in sorted(names):
        for c in choosers:
            c.force(name if name in c.candidates else "packed")
        y = sess.run(None, {"x": x})[0]
        torch.testing.assert_close(y.double(), ref, rtol=TOL[dtype] * 10, atol=TOL[dtype] * 10)
    # a run with a different input shape takes another plan; a non-contiguous x the
    # generic path inside the same binding
    xs = torch.randn(1, 5, 9, 18, dtype=dtype)[..., ::2]
    y = sess.run(None, {"x": xs})[0]
    ref = _graph_reference(kind, xs.double(), {k: v.double() for k, v in t.items()})
    torch.testing.assert_close(y.double(), ref, rtol=TOL[dtype] * 10, atol=TOL[dtype] * 10)


def test_measured_choice_decides_once_per_signature():
    m, t = _conv_graph(torch.float32, "residual")
    x = torch.randn(1, 5, 9, 9)
    ref = _graph_reference("residual", x.double(), {k: v.double() for k, v in t.items()})
    conv_infer.set_mode("auto")  # (the conftest fixture restores "packed")
    before = conv_infer.decisions()
    y = InferenceSession(m).run(None, {"x": x})[0]
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    new = {k: v for k, v in conv_infer.decisions().items() if k not in before}
    assert all(v in ("packed", "channels", "gemm", "training") for v in new.values())
    # a second session of the same shapes reuses the decisions (no new keys)
    InferenceSession(m).run(None, {"x": x})
    assert set(conv_infer.decisions()) == set(before) | set(new)
    with pytest.raises(ValueError, match="mode must be one of"):
        conv_infer.set_mode("fastest")


@pytest.mark.parametrize("case", SMALL_MAPS[:4])
@pytest.mark.parametrize("layout", [0, 1])
def test_fused_relu_is_relu_of_the_plain_output(case, layout):
    """The epilogue's ReLU (vector stores and the branch-free scalar stores of tails and
    channel tiles) is exactly max(v, 0) on the same sums: negatives to +0, NaN kept,
    -0.0 kept; random signs (a data-dependent branch there once ran 1.8x slower)."""
    n, c, h, wd, m, k, s, p, d, g = case
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(n, c, h, wd, generator=gen)
    x[0, 0, 0, 0] = float("nan")
    w = torch.randn(m, c // g, *k, generator=gen)
    b = torch.randn(m, generator=gen)
    b[0] = float("-inf")
    pc, _ = _packed(x, w, s, p, d, g, layout)
    plain, fused = pc.run(x, b), pc.run(x, b, None, True)
    want = torch.where(plain < 0, torch.zeros_like(plain), plain)
    assert torch.equal(fused.isnan(), plain.isnan()) and plain.isnan().any()
    assert torch.equal(fused.nan_to_num(7.0), want.nan_to_num(7.0))
    assert torch.equal(fused.signbit(), want.signbit())


@pytest.mark.parametrize("keep", [False, True])
def test_measured_choice_drops_the_losers(keep):
    """In "auto" mode the first run keeps only the chosen candidate (and its packed
    weights); ``keep_candidates(True)`` (benchmarks) keeps them all."""
    m, t = _conv_graph(torch.float32, "relu", 20)
    x = torch.randn(1, 5, 9, 9)
    ref = _graph_reference("relu", x.double(), {k: v.double() for k, v in t.items()})
    conv_infer.set_mode("auto")  # (the conftest fixture restores "packed")
    conv_infer.keep_candidates(keep)
    try:
        sess = InferenceSession(m)
        ex = sess.executor
        plan = ex.plan_for(ex.positional({"x": x}))
        choosers = [getattr(b.fn, "choice", b.fn) for b in plan.bound
                    if b.node.op_type == "Conv"]
        choosers = [c for c in choosers if hasattr(c, "force")]
        every = {"packed", "channels", "training"} | \
            ({"gemm"} if lib.ortcpu_conv_p16_available() else set())
        assert choosers and all(set(c.candidates) == every for c in choosers)
        y = sess.run(None, {"x": x})[0]
    finally:
        conv_infer.keep_candidates(False)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    for c in choosers:
        assert len(c.candidates) == (len(every) if keep else 1)
        if not keep:
            dropped = (every - set(c.candidates)).pop()
            with pytest.raises(KeyError, match="keep_candidates"):
                c.force(dropped)
    torch.testing.assert_close(sess.run(None, {"x": x})[0], y, rtol=0, atol=0)


@pytest.mark.skipif(not lib.ortcpu_conv_p16_available(),
                    reason="the GEMM candidate is built at x86-64-v4 only")
@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("batch", [1, 3])
def test_1x1_gemm_candidate_in_a_graph(stride, batch):
    """A 1x1 Conv (+ residual Add + Relu fused into it) forced onto the GEMM candidate
    (conv1x1_p16 over the flattened positions; a strided one reads X subsampled); 40
    output channels (a partial second panel) on an odd 11x9 map."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((40, 24, 1, 1)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    oh, ow = (11 - 1) // stride + 1, (9 - 1) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[stride, stride]),
             helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    g = helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("x", TP.FLOAT, [batch, 24, 11, 9]),
        helper.make_tensor_value_info("r", TP.FLOAT, [batch, 40, oh, ow])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [batch, 40, oh, ow])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    x, r = torch.randn(batch, 24, 11, 9), torch.randn(batch, 40, oh, ow)
    conv_infer.set_mode("gemm")  # (the conftest fixture restores "packed")
    sess = InferenceSession(m)
    y = sess.run(None, {"x": x, "r": r})[0]
    ex = sess.executor
    plan = ex.plan_for(ex.positional({"x": x, "r": r}))
    chosen = [getattr(bd.fn, "choice", bd.fn).chosen_name() for bd in plan.bound
              if bd.node.op_type == "Conv"]
    assert chosen == ["gemm"]
    ref = F.conv2d(x.double(), torch.from_numpy(w).double(), torch.from_numpy(b).double(),
                   stride) + r.double()
    torch.testing.assert_close(y.double(), ref.relu(), rtol=1e-5, atol=1e-5)
