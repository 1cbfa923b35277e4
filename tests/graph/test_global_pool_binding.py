"""The executor's plan-time global pools (graph/ops_kernels.py ``_global_static``):
GlobalAveragePool / GlobalMaxPool of a static float X, and AveragePool whose one unpadded
window covers the whole map (resnet50's 7x7 head), on the native global pool called
directly; vs torch in float64 and onnxruntime, NaN/inf, size-1 maps, empty batches, and
the generic path for feeds the plan did not see."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper

from ortcpu_torch.graph import InferenceSession

_ELEM = {torch.float32: TP.FLOAT, torch.float64: TP.DOUBLE}
DTYPES = [torch.float32, torch.float64]


def _one_node(op, x_shape, dtype, **attrs):
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", _ELEM[dtype],
                                                                      x_shape)],
                          [helper.make_tensor_value_info("y", _ELEM[dtype], [])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _bound(sess, x):
    ex = sess.executor
    plan = ex.plan_for(ex.positional({"x": x}))
    return [getattr(b.fn, "__name__", "") for b in plan.bound]


def _ref(x, kind):
    dims = tuple(range(2, x.dim()))
    xd = x.double()
    r = xd.mean(dims, keepdim=True) if kind == 0 else xd.amax(dims, keepdim=True)
    if kind == 1:  # amax drops NaN ordering; ONNX/torch max_pool propagate NaN
        r = torch.where(xd.isnan().flatten(2).any(-1).view(r.shape), float("nan"), r)
    return r


SHAPES = [(1, 1000, 13, 13), (2, 3, 7, 7), (1, 5, 1, 1), (3, 2, 17), (1, 2, 3, 4, 5),
          (0, 4, 6, 6)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op,kind", [("GlobalAveragePool", 0), ("GlobalMaxPool", 1)])
def test_global_pools_vs_torch(op, kind, shape, dtype):
    x = torch.randn(shape, dtype=dtype) * 3
    sess = InferenceSession(_one_node(op, list(shape), dtype))
    got = sess.run(None, {"x": x})[0]
    assert _bound(sess, x) == ["global_pool"]
    assert got.shape == (*shape[:2], *[1] * (len(shape) - 2)) and got.dtype == dtype
    torch.testing.assert_close(got.double(), _ref(x, kind), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attrs", [dict(kernel_shape=[7, 7]),
                                   dict(kernel_shape=[7, 7], strides=[2, 2], ceil_mode=1),
                                   dict(kernel_shape=[7, 7], pads=[0, 0, 0, 0],
                                        count_include_pad=1, auto_pad="VALID")])
def test_whole_map_average_pool_is_the_global_average(attrs, dtype):
    attrs = dict(attrs)
    if attrs.get("auto_pad") == "VALID":
        attrs.pop("pads")
    x = torch.randn(2, 64, 7, 7, dtype=dtype)
    sess = InferenceSession(_one_node("AveragePool", [2, 64, 7, 7], dtype, **attrs))
    got = sess.run(None, {"x": x})[0]
    assert _bound(sess, x) == ["global_pool"]
    torch.testing.assert_close(got.double(), _ref(x, 0), rtol=1e-6, atol=1e-7)
    unfused = torch.nn.functional.avg_pool2d(x.double(), 7)
    torch.testing.assert_close(got.double(), unfused, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("attrs", [dict(kernel_shape=[7, 7], pads=[1, 1, 1, 1]),
                                   dict(kernel_shape=[7, 7], auto_pad="SAME_UPPER"),
                                   dict(kernel_shape=[3, 3])])
def test_other_average_pools_keep_the_window_kernel(attrs):
    x = torch.randn(1, 3, 7, 7)
    sess = InferenceSession(_one_node("AveragePool", [1, 3, 7, 7], torch.float32, **attrs))
    got = sess.run(None, {"x": x})[0]
    assert _bound(sess, x) == ["pool"]  # the windowed kernel's static binding
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    r = ort.InferenceSession(_one_node("AveragePool", [1, 3, 7, 7], torch.float32,
                                       **attrs).SerializeToString(), so,
                             providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got.numpy(), r.run(None, {"x": x.numpy()})[0], rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_global_pools_nan_and_inf(dtype):
    x = torch.randn(1, 4, 5, 5, dtype=dtype)
    x[0, 0, 2, 2] = float("nan")
    x[0, 1, 0, 0] = float("inf")
    x[0, 2, 4, 4] = -float("inf")
    x[0, 3] = -float("inf")
    for op, kind in (("GlobalAveragePool", 0), ("GlobalMaxPool", 1)):
        got = InferenceSession(_one_node(op, [1, 4, 5, 5], dtype)).run(None, {"x": x})[0]
        torch.testing.assert_close(got.double(), _ref(x, kind), equal_nan=True, rtol=1e-6,
                                   atol=0)


def test_global_pools_vs_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(3).standard_normal((1, 1000, 13, 13)).astype(np.float32)
    for op in ("GlobalAveragePool", "GlobalMaxPool"):
        m = _one_node(op, [1, 1000, 13, 13], torch.float32)
        m.ir_version = 8
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        want = ort.InferenceSession(m.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        got = InferenceSession(m).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


def test_unseen_feeds_take_the_generic_path():
    # a symbolic dim: no static shape at plan time, the registry kernel
    m = _one_node("GlobalAveragePool", ["n", 3, 4, 4], torch.float32)
    x = torch.randn(2, 3, 4, 4)
    got = InferenceSession(m).run(None, {"x": x})[0]
    torch.testing.assert_close(got.double(), _ref(x, 0), rtol=1e-6, atol=1e-7)
    # a non-contiguous feed of the planned shape
    m = _one_node("GlobalMaxPool", [1, 3, 4, 4], torch.float32)
    x = torch.randn(1, 3, 4, 4).transpose(2, 3)
    got = InferenceSession(m).run(None, {"x": x})[0]
    torch.testing.assert_close(got.double(), _ref(x, 1), rtol=0, atol=0)
