"""The executor's direct LayerNormalization binding (Y only, constant Scale/B): vs torch in
float64, vs onnxruntime in float32, odd sizes, axes, no bias, NaN/inf rows; the generic
registry path where Mean/InvStdDev are used or Scale is fed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from ortcpu_torch.graph import InferenceSession

ort = pytest.importorskip("onnxruntime")


def _model(shape, axis, elem, bias=True, outputs=("y",), scale_fed=False, eps=1e-5):
    np_t = np.float32 if elem == TP.FLOAT else np.float64
    norm = shape[axis:] if axis >= 0 else shape[axis:]
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal(norm).astype(np_t), "b")] if bias \
        else []
    ins = [helper.make_tensor_value_info("x", elem, shape)]
    if scale_fed:
        ins.append(helper.make_tensor_value_info("w", elem, norm))
    else:
        inits.append(numpy_helper.from_array(rng.standard_normal(norm).astype(np_t), "w"))
    node = helper.make_node("LayerNormalization", ["x", "w", "b"] if bias else ["x", "w"],
                            list(outputs), axis=axis, epsilon=eps)
    stat = [*shape[:axis if axis >= 0 else len(shape) + axis]] + \
        [1] * len(norm)
    outs = [helper.make_tensor_value_info("y", elem, shape)] + \
        [helper.make_tensor_value_info(o, elem, stat) for o in outputs[1:]]
    g = helper.make_graph([node], "ln", ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _run_both(m, feeds):
    got = InferenceSession(m).run(None, feeds)
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    return got, want


@pytest.mark.parametrize("shape,axis", [([3, 7, 33], -1), ([2, 5, 4, 3], 2), ([1, 1], -1),
                                        ([4, 1000], 1), ([2, 3, 257], -1)])
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_direct_vs_ort_float32(shape, axis, bias):
    m = _model(shape, axis, TP.FLOAT, bias)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 3 + 5
    got, want = _run_both(m, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape,axis", [([3, 7, 33], -1), ([2, 5, 4, 3], 1)])
def test_layernorm_direct_float64_vs_torch(shape, axis):
    m = _model(shape, axis, TP.DOUBLE)
    inits = {t.name: numpy_helper.to_array(t).copy() for t in m.graph.initializer}
    x = np.random.default_rng(0).standard_normal(shape) * 3 + 5
    got = InferenceSession(m).run(None, {"x": x})[0]
    a = axis if axis >= 0 else len(shape) + axis
    want = torch.nn.functional.layer_norm(torch.from_numpy(x), shape[a:],
                                          torch.from_numpy(inits["w"]),
                                          torch.from_numpy(inits["b"]), eps=1e-5)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)


def test_layernorm_direct_nan_inf_rows():
    m = _model([4, 9], -1, TP.FLOAT)
    x = np.random.default_rng(0).standard_normal((4, 9)).astype(np.float32)
    x[0, 3] = np.nan
    x[1, 0] = np.inf
    x[2, :] = 7.0  # constant row: variance 0, y = bias
    got, want = _run_both(m, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
    assert np.isnan(got[0][0]).all() and np.isnan(got[0][1]).all()


@pytest.mark.parametrize("kw", [dict(outputs=("y", "mean", "inv")), dict(scale_fed=True)])
def test_layernorm_generic_path_still_matches(kw):
    m = _model([3, 6, 10], -1, TP.FLOAT, **kw)
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((3, 6, 10)).astype(np.float32)}
    if kw.get("scale_fed"):
        feeds["w"] = rng.standard_normal(10).astype(np.float32)
    got, want = _run_both(m, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_layernorm_direct_noncontiguous_torch_feed():
    m = _model([5, 8], -1, TP.FLOAT)
    x = torch.randn(8, 5).t()  # a transposed view fed as torch: the generic path copes
    got = InferenceSession(m).run(None, {"x": x})[0]
    want = InferenceSession(m).run(None, {"x": x.contiguous()})[0]
    torch.testing.assert_close(got, want)
