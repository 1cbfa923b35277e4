"""LRN in the executor: the native one-pass kernel (native/src/lrn.c) on contiguous
float32 [N, C, ...], torch ops otherwise; vs a float64 evaluation of ONNX's formula and,
where its CPU kernel takes the case (float32, 4-D, odd size), onnxruntime 1.19.2: window
sizes odd and even, channels fewer than the window, beta 0.75 (the square-root path) and
others, NaN/inf, empty batches, 1-D and 3-D maps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper

from ortcpu_torch.graph import InferenceSession


def _model(shape, dtype, **attrs):
    elem = TP.FLOAT if dtype == torch.float32 else TP.DOUBLE
    node = helper.make_node("LRN", ["x"], ["y"], **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, shape)],
                          [helper.make_tensor_value_info("y", elem, [])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _ref(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    xd = x.double()
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = xd * xd
    s = torch.zeros_like(xd)
    for ci in range(c):
        s[:, ci] = sq[:, max(0, ci - lo):min(c, ci + hi + 1)].sum(1)
    return xd / (bias + alpha / size * s) ** beta


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape,size,beta", [
    ((2, 16, 7, 9), 5, 0.75), ((1, 3, 70, 3), 5, 0.75), ((2, 7, 13), 4, 0.75),
    ((1, 2, 3, 4, 5), 3, 0.5), ((3, 1, 65), 1, 1.25), ((0, 4, 5, 5), 3, 0.75),
    ((2, 64, 11, 11), 11, 0.75),
])
def test_lrn_vs_float64_and_onnxruntime(shape, size, beta, dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(*shape, generator=g, dtype=dtype) * 3
    attrs = dict(size=size, alpha=2e-3, beta=beta, bias=1.5)
    sess = InferenceSession(_model(list(shape), dtype, **attrs))
    got = sess.run(None, {"x": x})[0]
    # ONNX float attributes are float32
    want = _ref(x, size, float(np.float32(2e-3)), beta, 1.5)
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    if dtype == torch.float32 and len(shape) == 4 and size % 2:  # what ORT's CPU LRN takes
        import onnxruntime as ort
        o = ort.InferenceSession(_model(list(shape), dtype, **attrs).SerializeToString(),
                                 providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(got.numpy(), o.run(None, {"x": x.numpy()})[0],
                                   rtol=1e-5, atol=1e-6)


def test_lrn_nan_and_inf_and_a_non_contiguous_feed():
    x = torch.randn(1, 6, 4, 5)
    x[0, 2, 1, 1] = float("nan")
    x[0, 4, 2, 3] = float("inf")
    sess = InferenceSession(_model([1, 6, 4, 5], torch.float32, size=3))
    got = sess.run(None, {"x": x})[0]
    want = _ref(x, 3)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6, equal_nan=True)
    xt = x.transpose(2, 3).contiguous().transpose(2, 3)  # the torch-op path
    torch.testing.assert_close(sess.run(None, {"x": xt})[0], got, rtol=1e-6, atol=1e-6,
                               equal_nan=True)
