"""The executor's plan-time Conv / MaxPool / AveragePool bindings (static shapes: geometry
checked once, the native forward called directly) and MaxPool's padded-row kernel (the
Y-only path, native/src/pool.inc): vs the registry kernels (MaxPool's Indices path runs
the general loop, a separate code path) and vs torch in float64, float32 and float64,
with padding, ceil_mode, dilations, 1-D/3-D, odd and tiny maps, NaN."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from ortcpu_torch import kernels
from ortcpu_torch.graph import InferenceSession, conv_infer

_ELEM = {torch.float32: TP.FLOAT, torch.float64: TP.DOUBLE}
DTYPES = [torch.float32, torch.float64]


def _one_node(op, x_shape, dtype, attrs, inits=(), n_out=1):
    elem = _ELEM[dtype]
    names = ["x"] + [t.name for t in inits]
    outs = ["y"] + [f"o{i}" for i in range(1, n_out)]
    node = helper.make_node(op, names, outs, **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, x_shape)],
                          [helper.make_tensor_value_info("y", elem, [])],
                          initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


# (input shape, attributes): squeezenet's / resnet's / inception's pools, ceil_mode, odd
# maps, dilation, asymmetric pads, 1-D, 3-D, windows wider than the map, 1x1 maps
POOLS = [
    ((1, 5, 109, 109), dict(kernel_shape=[3, 3], strides=[2, 2])),
    ((2, 3, 112, 112), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 4, 28, 28), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ((1, 3, 27, 27), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ((2, 2, 14, 13), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 2],
                          ceil_mode=1)),
    ((1, 2, 11, 9), dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
    ((1, 2, 11, 9), dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 1, 1])),
    ((1, 2, 13, 12), dict(kernel_shape=[3, 3], strides=[2, 1], dilations=[2, 2],
                          pads=[2, 1, 2, 2])),
    ((1, 3, 7, 7), dict(kernel_shape=[1, 1], strides=[2, 2])),
    ((1, 2, 3, 2), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[2, 2, 2, 2])),
    ((1, 2, 1, 1), dict(kernel_shape=[2, 2], strides=[1, 1], pads=[1, 1, 0, 0])),
    ((1, 3, 17), dict(kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1)),
    ((1, 2, 5, 6, 7), dict(kernel_shape=[2, 3, 3], strides=[2, 2, 2], pads=[1, 1, 1, 0, 0, 1])),
    ((1, 2, 6, 20), dict(kernel_shape=[5, 5], strides=[3, 3], pads=[2, 2, 2, 2])),
]


def _bound_names(sess, feeds):
    """The names of the callables the plan for these feeds bound (which path ran)."""
    ex = sess.executor
    plan = ex.plan_for(ex.positional(feeds))
    return [getattr(b.fn, "__name__", type(b.fn).__name__) for b in plan.bound]


def _reference_maxpool(x, attrs):
    """MaxPool's Y through the registry's Indices path (the general loop)."""
    return kernels.MaxPool(x, needs=(True, True), **attrs)[0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,attrs", POOLS)
def test_maxpool_rows_match_general_path(shape, attrs, dtype):
    x = torch.randn(shape, dtype=torch.float64).to(dtype)
    ref = _reference_maxpool(x, attrs)
    direct = kernels.MaxPool(x, needs=(True, False), **attrs)[0]
    sess = InferenceSession(_one_node("MaxPool", list(shape), dtype, attrs))
    got = sess.run(None, {"x": x})[0]
    assert _bound_names(sess, {"x": x}) == ["pool"]
    assert torch.equal(direct, ref)
    assert torch.equal(got, ref)


def _torch_expressible(attrs, rank):
    """torch's max_pool2d takes this pool: no ceil_mode, dilation 1, symmetric pads of at
    most half the kernel."""
    pads = attrs.get("pads", [0] * 4)
    return rank == 4 and not attrs.get("ceil_mode") and "dilations" not in attrs and \
        pads[:2] == pads[2:] and all(p <= k // 2 for p, k in zip(pads[:2],
                                                                 attrs["kernel_shape"],
                                                                 strict=True))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,attrs", [p for p in POOLS
                                         if _torch_expressible(p[1], len(p[0]))])
def test_maxpool_rows_match_torch(shape, attrs, dtype):
    pads = attrs.get("pads", [0] * 4)
    k, s = attrs["kernel_shape"], attrs["strides"]
    x = torch.randn(shape, dtype=dtype)
    got = InferenceSession(_one_node("MaxPool", list(shape), dtype, attrs)).run(
        None, {"x": x})[0]
    torch.testing.assert_close(got, F.max_pool2d(x.double(), k, s, pads[:2]).to(dtype),
                               rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_maxpool_rows_nan_and_inf(dtype):
    x = torch.randn(1, 3, 15, 15, dtype=dtype)
    x[0, 0, 4, 5] = float("nan")
    x[0, 1, 0, :] = float("nan")
    x[0, 2, 7, 7] = float("inf")
    x[0, 2, 8, 8] = -float("inf")
    for attrs in (dict(kernel_shape=[3, 3], strides=[2, 2]),
                  dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
                  dict(kernel_shape=[2, 4], strides=[3, 1], ceil_mode=1)):
        ref = _reference_maxpool(x, attrs)
        got = kernels.MaxPool(x, needs=(True, False), **attrs)[0]
        torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)
        assert torch.isnan(got).any()


def test_maxpool_with_indices_output_keeps_the_registry_path():
    x = torch.randn(1, 2, 9, 9)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2])
    m = _one_node("MaxPool", [1, 2, 9, 9], torch.float32, attrs, n_out=2)
    m.graph.output.append(helper.make_tensor_value_info("o1", TP.INT64, []))
    y, idx = InferenceSession(m).run(None, {"x": x})
    ry, ridx = kernels.MaxPool(x, **attrs)
    assert torch.equal(y, ry) and torch.equal(idx, ridx)


def test_static_pool_takes_the_generic_path_for_a_noncontiguous_feed():
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = torch.randn(1, 2, 10, 10).transpose(2, 3)
    got = InferenceSession(_one_node("MaxPool", [1, 2, 10, 10], torch.float32, attrs)).run(
        None, {"x": x})[0]
    assert torch.equal(got, _reference_maxpool(x.contiguous(), attrs))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cip", [0, 1])
@pytest.mark.parametrize("shape,attrs", [p for p in POOLS if "dilations" not in p[1]])
def test_static_averagepool_matches_registry(shape, attrs, cip, dtype):
    x = torch.randn(shape, dtype=dtype)
    a = dict(attrs, count_include_pad=cip)
    sess = InferenceSession(_one_node("AveragePool", list(shape), dtype, a))
    got = sess.run(None, {"x": x})[0]
    assert _bound_names(sess, {"x": x}) == ["pool"]
    torch.testing.assert_close(got, kernels.AveragePool(x, **a), rtol=0, atol=0)


CONVS = [  # (x shape, W shape, attributes, bias)
    ((1, 3, 17, 17), (8, 3, 7, 7), dict(strides=[2, 2]), True),
    ((2, 16, 9, 9), (8, 16, 1, 1), {}, True),
    ((1, 8, 10, 11), (6, 8, 3, 3), dict(pads=[1, 1, 1, 1]), False),
    ((1, 6, 12, 12), (6, 2, 3, 3), dict(group=3, strides=[2, 1], dilations=[2, 1],
                                        pads=[1, 0, 2, 1]), True),
    ((1, 4, 13), (5, 4, 3), dict(auto_pad="SAME_UPPER", strides=[2]), True),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("xs,ws,attrs,bias", CONVS)
def test_static_conv_matches_registry_and_torch(xs, ws, attrs, bias, dtype):
    x = torch.randn(xs, dtype=dtype)
    w = torch.randn(ws, dtype=dtype)
    b = torch.randn(ws[0], dtype=dtype) if bias else None
    inits = [numpy_helper.from_array(w.numpy(), "w")]
    if bias:
        inits.append(numpy_helper.from_array(b.numpy(), "b"))
    ref = kernels.Conv(x, w, b, **attrs)
    # the training kernel's static binding (under the measured choice of conv_infer.py,
    # forced): bit for bit the registry kernel's result
    before = conv_infer.get_mode()
    conv_infer.set_mode("training")
    try:
        sess = InferenceSession(_one_node("Conv", list(xs), dtype, attrs, inits))
        got = sess.run(None, {"x": x})[0]
    finally:
        conv_infer.set_mode(before)
    assert _bound_names(sess, {"x": x}) == ["measured_choice"]
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    if "auto_pad" not in attrs:
        p = attrs.get("pads", [0] * 2 * (len(xs) - 2))
        r = len(xs) - 2
        xp = F.pad(x.double(), [v for i in reversed(range(r)) for v in (p[i], p[i + r])])
        conv = F.conv2d if r == 2 else F.conv1d
        want = conv(xp, w.double(), None if b is None else b.double(),
                    attrs.get("strides", 1), 0, attrs.get("dilations", 1),
                    attrs.get("group", 1))
        tol = 1e-4 if dtype == torch.float32 else 1e-10
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    # a non-contiguous feed of the same shape runs the registry kernel instead
    xt = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    torch.testing.assert_close(sess.run(None, {"x": xt})[0], ref, rtol=0, atol=0)


def test_static_conv_bad_weight_shape_still_reports():
    m = _one_node("Conv", [1, 3, 8, 8], torch.float32, {},
                  [numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float32), "w")])
    with pytest.raises(Exception, match="W.shape\\[1\\]|C/group"):
        InferenceSession(m).run(None, {"x": np.ones((1, 3, 8, 8), np.float32)})


def _fire_model(n, dtype, relu=True, bias=True, extra_use=False):
    """squeezenet's fire module: squeeze 1x1 -> expand 1x1 and expand 3x3 -> Concat."""
    elem = _ELEM[dtype]
    rng = np.random.default_rng(0)
    npt = np.float32 if dtype == torch.float32 else np.float64
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(npt), name) for name, s in
             (("ws", (4, 6, 1, 1)), ("w1", (5, 4, 1, 1)), ("w3", (3, 4, 3, 3)), ("b1", (5,)),
              ("b3", (3,)), ("bs", (4,)))]
    b = (lambda name: [name]) if bias else (lambda name: [])
    nodes = [helper.make_node("Conv", ["x", "ws", *b("bs")], ["s"]),
             helper.make_node("Conv", ["s", "w1", *b("b1")], ["e1"]),
             helper.make_node("Conv", ["s", "w3", *b("b3")], ["e3"], pads=[1, 1, 1, 1])]
    c1, c3 = "e1", "e3"
    if relu:
        nodes += [helper.make_node("Relu", ["e1"], ["r1"]), helper.make_node("Relu", ["e3"],
                                                                             ["r3"])]
        c1, c3 = "r1", "r3"
    nodes.append(helper.make_node("Concat", [c3, c1], ["y"], axis=1))
    outs = [helper.make_tensor_value_info("y", elem, [n, 8, 7, 9])]
    if extra_use:
        outs.append(helper.make_tensor_value_info(c1, elem, [n, 5, 7, 9]))
    g = helper.make_graph(nodes, "fire", [helper.make_tensor_value_info("x", elem,
                                                                        [n, 6, 7, 9])],
                          outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("relu,bias", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("mode", ["training", "packed", "gemm"])
def test_concat_written_in_place_by_convs(n, dtype, relu, bias, mode):
    """Fused and unfused plans agree bit for bit on each Conv kernel (forced: under the
    measured choice the two plans could each pick another); at batch 3 the slices are
    strided (the implicit-GEMM kernel writes them directly, the others through a copy)."""
    from ortcpu_torch.graph.executor import Executor

    m = _fire_model(n, dtype, relu, bias)
    x = torch.randn(n, 6, 7, 9, dtype=dtype)
    before = conv_infer.get_mode()
    conv_infer.set_mode(mode)
    try:
        fused = Executor(m)
        got = fused.run({"x": x})["y"]
        want = Executor(m, fuse=False).run({"x": x})["y"]
    finally:
        conv_infer.set_mode(before)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    plan = fused.plan_for([x])
    ops = [b.node.op_type for b in plan.bound]
    assert "ConcatInPlace" in ops
    # a second run (buffer reused from the arena) and a non-contiguous feed (registry path,
    # the training kernel's rounding)
    torch.testing.assert_close(fused.run({"x": x})["y"], want, rtol=0, atol=0)
    xt = x.transpose(2, 3).contiguous().transpose(2, 3)
    tol = 0 if mode == "training" else 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(fused.run({"x": xt})["y"], want, rtol=tol, atol=tol)


def test_concat_in_place_not_when_a_part_is_used_elsewhere():
    from ortcpu_torch.graph.executor import Executor

    m = _fire_model(1, torch.float32, extra_use=True)
    x = torch.randn(1, 6, 7, 9)
    ex = Executor(m)
    out = ex.run({"x": x})
    want = Executor(m, fuse=False).run({"x": x})
    for k in want:
        torch.testing.assert_close(out[k], want[k], rtol=0, atol=0)
    assert "ConcatInPlace" not in [b.node.op_type for b in ex.plan_for([x]).bound]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spatial", [(1, 1), (1, 7), (13, 13), (3, 5, 67)])
def test_global_average_pool_lane_sums(spatial, dtype):
    x = torch.randn(2, 5, *spatial, dtype=dtype) * 100 + 3
    x[0, 1].view(-1)[0] = float("nan")
    x[1, 2].view(-1)[-1] = float("inf")
    got = kernels.GlobalAveragePool(x)
    want = x.double().mean(dim=tuple(range(2, x.dim())), keepdim=True).to(dtype)
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)
