"""The executor's channel-blocked (NCHW16c) regions (``graph/blocked_layout.py``): a CNN
with a 3-channel stem, residual, a Concat written in place, pools, a layout-free Add and
Concat, 24- and 1000-channel Convs (outputs padded to whole blocks, pooled), global pools
and blocked values that are also graph outputs, against torch in float64, with both
Conv16c kernels and without the layout; a lone Conv stays NCHW; float64 graphs and AVX2
builds keep NCHW."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from ortcpu_torch._native import lib
from ortcpu_torch.graph import InferenceSession, blocked_layout, conv_infer

needs_blocked = pytest.mark.skipif(not lib.ortcpu_conv_p16_available(),
                                   reason="the blocked kernels are AVX-512 builds' only")

def _convs(width):
    """name: (in, out, kernel, stride, pad); ``width``: the stem's output channels (64:
    blocked from its NCHW input on, 32: an NCHW stem and a reorder after its pool)."""
    return {"stem": (3, width, 3, 2, 1), "c1": (width, width, 1, 1, 0),
            "c2": (width, width, 3, 1, 1), "c3": (width, 64, 3, 2, 1),
            "e1": (64, 16, 1, 1, 0), "e2": (64, 64, 3, 1, 1), "odd": (160, 24, 1, 1, 0),
            "cls": (160, 1000, 1, 1, 0)}


def _params(seed=0, width=32):
    g = torch.Generator().manual_seed(seed)
    p = {"convs": _convs(width)}
    for name, (i, o, k, _, _) in p["convs"].items():
        p[name + "_w"] = torch.randn(o, i, k, k, generator=g) * (i * k * k) ** -0.5
        p[name + "_b"] = torch.randn(o, generator=g) * 0.1
    p["bn"] = [torch.rand(width, generator=g) + 0.5, torch.randn(width, generator=g) * 0.1,
               torch.randn(width, generator=g) * 0.1, torch.rand(width, generator=g) + 0.5]
    return p


def _model(p, batch, h, w):
    nodes, inits = [], []

    def init(name, t):
        inits.append(numpy_helper.from_array(t.numpy(), name))

    def conv(name, x, y):
        _, _, k, s, pad = p["convs"][name]
        init(name + "_w", p[name + "_w"])
        init(name + "_b", p[name + "_b"])
        nodes.append(helper.make_node("Conv", [x, name + "_w", name + "_b"], [y], name=name,
                                      kernel_shape=[k, k], strides=[s, s], pads=[pad] * 4))

    def op(kind, ins, out, **kw):
        nodes.append(helper.make_node(kind, ins, [out], name=out, **kw))

    conv("stem", "x", "s")
    for n, t in zip(("scale", "bias", "mean", "var"), p["bn"], strict=True):
        init("bn_" + n, t)
    op("BatchNormalization", ["s", "bn_scale", "bn_bias", "bn_mean", "bn_var"], "sb")
    op("Relu", ["sb"], "sr")
    op("MaxPool", ["sr"], "mp", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    conv("c1", "mp", "a1")
    op("Relu", ["a1"], "r1")
    conv("c2", "r1", "a2")
    op("Add", ["a2", "mp"], "a3")  # the residual
    op("Relu", ["a3"], "r3")
    conv("c3", "r3", "a4")
    op("Relu", ["a4"], "r4")  # also a graph output
    conv("e1", "r4", "f1")
    op("Relu", ["f1"], "g1")
    conv("e2", "r4", "f2")
    op("Relu", ["f2"], "g2")
    op("Concat", ["g1", "g2"], "cat", axis=1)  # written in place
    op("MaxPool", ["cat"], "q1", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    op("AveragePool", ["cat"], "q2", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    op("AveragePool", ["cat"], "q3", kernel_shape=[3, 3], strides=[2, 2],
       pads=[0, 0, 1, 1], count_include_pad=1)
    op("Add", ["q1", "q2"], "q12")
    op("Add", ["q12", "q3"], "q")
    op("Concat", ["q", "q1"], "cat2", axis=-3)  # 160 channels, a copy
    conv("odd", "cat2", "o")  # 24 channels: blocked as 32, the graph output NCHW
    op("GlobalAveragePool", ["cat2"], "gap")
    op("Dropout", ["cat2"], "cd")  # inference: the identity, on blocked values too
    conv("cls", "cd", "k")  # 1000 channels: blocked as 1024
    op("Relu", ["k"], "kr")
    op("MaxPool", ["kr"], "kp", kernel_shape=[2, 2], pads=[0, 0, 1, 1])
    op("GlobalAveragePool", ["kp"], "kg")
    shape = _reference(p, torch.zeros(batch, 3, h, w, dtype=torch.float64))
    outs = [helper.make_tensor_value_info(n, TP.FLOAT, list(t.shape))
            for n, t in zip(("o", "gap", "r4", "kp", "kg"), shape, strict=True)]
    g = helper.make_graph(nodes, "blocked", [helper.make_tensor_value_info(
        "x", TP.FLOAT, [batch, 3, h, w])], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _reference(p, x):
    """The same network on torch ops (float64: ONNX's pads and ceil_mode spelled out)."""
    d = {k: (v.double() if isinstance(v, torch.Tensor) else [t.double() for t in v])
         for k, v in p.items() if k != "convs"}

    def conv(name, t):
        _, _, _, s, pad = p["convs"][name]
        return F.conv2d(t, d[name + "_w"], d[name + "_b"], s, pad)

    scale, bias, mean, var = d["bn"]
    s = conv("stem", x)
    s = (s - mean[:, None, None]) / torch.sqrt(var[:, None, None] + 1e-5) * \
        scale[:, None, None] + bias[:, None, None]
    mp = F.max_pool2d(s.relu(), 3, 2, 1)
    r4 = conv("c3", (conv("c2", conv("c1", mp).relu()) + mp).relu()).relu()
    cat = torch.cat([conv("e1", r4).relu(), conv("e2", r4).relu()], 1)
    q1 = F.max_pool2d(cat, 3, 2, ceil_mode=True)
    q2 = F.avg_pool2d(cat, 3, 2, ceil_mode=True, count_include_pad=False)
    q3 = F.avg_pool2d(F.pad(cat, (0, 1, 0, 1)), 3, 2)  # end pads counted
    cat2 = torch.cat([q1 + q2 + q3, q1], 1)
    kp = F.max_pool2d(F.pad(conv("cls", cat2).relu(), (0, 1, 0, 1), value=-math.inf), 2, 1)
    return conv("odd", cat2), cat2.mean((2, 3), keepdim=True), r4, kp, \
        kp.mean((2, 3), keepdim=True)


def _run(model, x):
    sess = InferenceSession(model)
    return sess, [torch.from_numpy(o) for o in sess.run(None, {"x": x.numpy()})]


@needs_blocked
@pytest.mark.parametrize("batch,h,w,width", [(1, 33, 31, 32), (3, 40, 24, 32),
                                             (2, 21, 30, 64)])
def test_blocked_regions_match_torch_float64_and_the_nchw_plan(batch, h, w, width):
    p = _params(width=width)
    x = torch.randn(batch, 3, h, w, generator=torch.Generator().manual_seed(1))
    model = _model(p, batch, h, w)
    ref = _reference(p, x.double())
    sess, got = _run(model, x)
    counts = sess.executor._plans and next(iter(sess.executor._plans.values())).counts()
    # c1, c2, c3, e1, e2 and the 24- and 1000-channel Convs (outputs padded to blocks);
    # the 3-channel stem of 64 outputs too (NCHW in, blocked out), of 32 on NCHW
    stem_blocked = width % 64 == 0
    assert counts["ortcpu_torch.graph.Conv16c"]["kernel"] == 7 + stem_blocked
    assert counts.get("Conv", {}).get("kernel", 0) == 1 - stem_blocked
    assert counts["ortcpu_torch.graph.Pool16c"]["kernel"] == 6 + stem_blocked
    assert any("NCHW16c" in f for f in sess._last_plan.fusions)
    # reorders: the NCHW stem's pool in; o, r4 and kp out (gap and kg: views)
    assert counts.get("ortcpu_torch.graph.ToNCHW16c", {}).get("kernel", 0) == \
        1 - stem_blocked
    assert counts["ortcpu_torch.graph.FromNCHW16c"]["kernel"] == 5
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-4)
    blocked_layout.set_layout("nchw")
    try:
        plain, nchw = _run(model, x)
    finally:
        blocked_layout.set_layout("auto")
    assert "ortcpu_torch.graph.Conv16c" not in plain._last_plan.counts()
    for g, r in zip(got, nchw, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


@needs_blocked
@pytest.mark.parametrize("choice", ["blocked", "blocked_nofetch", "blocked_nofetch_sliced",
                                    "reordered"])
@pytest.mark.parametrize("width", [32, 64])
def test_both_conv16c_kernels_match_torch(choice, width):
    p = _params(3, width)
    x = torch.randn(3, 3, 29, 27, generator=torch.Generator().manual_seed(4))
    model = _model(p, 3, 29, 27)
    conv_infer.keep_candidates(True)
    try:
        sess, _ = _run(model, x)
    finally:
        conv_infer.keep_candidates(False)
    convs = [b.fn for b in sess._last_plan.bound if b.node.op_type == "Conv16c"]
    for fn in convs:  # (a stem's NCHW X has no "_nofetch" variant)
        fn.choice.force(choice if choice in fn.choice.candidates else "blocked")
    got = [torch.from_numpy(o) for o in sess.run(None, {"x": x.numpy()})]
    for g, r in zip(got, _reference(p, x.double()), strict=True):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-4)


def _single_conv(c, m, dtype=TP.FLOAT):
    w = np.random.default_rng(0).standard_normal((m, c, 3, 3)).astype(
        np.float32 if dtype == TP.FLOAT else np.float64)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["y"], ["z"])], "one",
        [helper.make_tensor_value_info("x", dtype, [1, c, 8, 8])],
        [helper.make_tensor_value_info("z", dtype, [1, m, 8, 8])],
        [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.DOUBLE])
def test_a_lone_conv_and_float64_graphs_stay_nchw(dtype):
    """One Conv between the graph's NCHW input and output would pay two reorders;
    float64 has no blocked kernel (and AVX2 builds none at all)."""
    model = _single_conv(32, 32, dtype)
    x = np.random.default_rng(1).standard_normal((1, 32, 8, 8)).astype(
        np.float32 if dtype == TP.FLOAT else np.float64)
    sess = InferenceSession(model)
    (z,) = sess.run(None, {"x": x})
    counts = sess._last_plan.counts()
    assert "ortcpu_torch.graph.Conv16c" not in counts and counts["Conv"]["kernel"] == 1
    ref = F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(
        numpy_helper.to_array(model.graph.initializer[0])).double(), padding=1).relu()
    torch.testing.assert_close(torch.from_numpy(z).double(), ref, rtol=1e-4, atol=1e-4)


def test_set_layout_rejects_unknown_layouts():
    with pytest.raises(ValueError, match="layout must be one of"):
        blocked_layout.set_layout("nhwc")
