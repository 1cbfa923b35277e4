"""MatMul + Mul/Div by a scalar constant runs as the GEMM's alpha (graph/fusions.py), in
2-D and batched MatMuls, float32 and float64; other forms stay unfused; vs onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from ortcpu_torch.graph import InferenceSession

ort = pytest.importorskip("onnxruntime")


def _model(op, scalar_first, a_shape, b_shape, c, elem=TP.FLOAT):
    np_t = np.float32 if elem == TP.FLOAT else np.float64
    ins = ["c", "mm"] if scalar_first else ["mm", "c"]
    nodes = [helper.make_node("MatMul", ["a", "b"], ["mm"]), helper.make_node(op, ins, ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", elem, a_shape),
                                       helper.make_tensor_value_info("b", elem, b_shape)],
                          [helper.make_tensor_value_info("y", elem, [*a_shape[:-1],
                                                                     b_shape[-1]])],
                          [numpy_helper.from_array(np.array(c, np_t), "c")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("elem", [TP.FLOAT, TP.DOUBLE])
@pytest.mark.parametrize("op,scalar_first,fused", [("Mul", False, True), ("Mul", True, True),
                                                   ("Div", False, True),
                                                   ("Div", True, False)])
@pytest.mark.parametrize("shapes", [([5, 7], [7, 3]), ([2, 3, 5, 7], [2, 3, 7, 4])])
def test_matmul_scalar_fusion_vs_ort(elem, op, scalar_first, fused, shapes):
    m = _model(op, scalar_first, *shapes, c=0.37, elem=elem)
    rng = np.random.default_rng(0)
    np_t = np.float32 if elem == TP.FLOAT else np.float64
    feeds = {"a": rng.standard_normal(shapes[0]).astype(np_t),
             "b": rng.standard_normal(shapes[1]).astype(np_t)}
    sess = InferenceSession(m)
    got = sess.run(None, feeds)[0]
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5 if elem == TP.FLOAT else 1e-12,
                               atol=1e-6 if elem == TP.FLOAT else 1e-12)
    assert ("as alpha" in sess.report()) == fused


def test_matmul_output_also_used_elsewhere_is_not_scaled():
    nodes = [helper.make_node("MatMul", ["a", "b"], ["mm"]),
             helper.make_node("Mul", ["mm", "c"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TP.FLOAT, [3, 4]),
                                       helper.make_tensor_value_info("b", TP.FLOAT, [4, 2])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [3, 2]),
                           helper.make_tensor_value_info("mm", TP.FLOAT, [3, 2])],
                          [numpy_helper.from_array(np.array(2.0, np.float32), "c")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    a, b = np.ones((3, 4), np.float32), np.ones((4, 2), np.float32)
    sess = InferenceSession(m)
    y, mm = sess.run(None, {"a": a, "b": b})
    np.testing.assert_array_equal(mm, a @ b)
    np.testing.assert_array_equal(y, 2 * (a @ b))
    assert "as alpha" not in sess.report()
