"""InferenceSession: onnxruntime's API surface (paths with external data, bytes, protos,
providers, NodeArg metadata, output selection, report)."""

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import ortcpu_torch
from ortcpu_torch.graph import InferenceSession, SessionOptions


def _linear_model(w, b):
    g = h.make_graph([h.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, name="fc"),
                      h.make_node("Relu", ["y"], ["r"], name="act")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, ["batch", w.shape[1]])],
                     [h.make_tensor_value_info("r", TP.FLOAT, ["batch", w.shape[0]]),
                      h.make_tensor_value_info("y", TP.FLOAT, ["batch", w.shape[0]])],
                     initializer=[numpy_helper.from_array(w, "w"),
                                  numpy_helper.from_array(b, "b")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_path_with_external_data_bytes_and_proto(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    m = _linear_model(w, b)
    path = tmp_path / "model.onnx"
    ext = onnx.ModelProto()
    ext.CopyFrom(m)  # save_model moves the tensors of the proto it saves to external data
    onnx.save_model(ext, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").exists()
    x = rng.standard_normal((3, 32)).astype(np.float32)
    want = np.maximum(x @ w.T + b, 0)
    for model in (str(path), path, m.SerializeToString(), m):
        r, y = InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
        np.testing.assert_allclose(r, want, rtol=1e-5, atol=1e-5)
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(ortcpu_torch.graph.InvalidModelError, match="external data"):
        InferenceSession(str(path))


def test_metadata_output_selection_and_report():
    w = np.ones((4, 3), np.float32)
    s = ortcpu_torch.InferenceSession(_linear_model(w, np.zeros(4, np.float32)))
    (inp,) = s.get_inputs()
    assert (inp.name, inp.shape, inp.type) == ("x", ["batch", 3], "tensor(float)")
    assert [o.name for o in s.get_outputs()] == ["r", "y"]
    assert s.get_providers() == ["CPUExecutionProvider"]
    x = -np.ones((2, 3), np.float32)
    (y,) = s.run(["y"], {"x": x})
    np.testing.assert_allclose(y, np.full((2, 4), -3.0))
    with pytest.raises(ValueError, match="unknown output"):
        s.run(["nope"], {"x": x})
    rep = s.report()
    assert "Gemm" in rep and "Relu" in rep and "kernel" in rep and "fusions:" in rep
    so = SessionOptions()
    so.graph_optimization_level = 0
    s2 = InferenceSession(_linear_model(w, np.zeros(4, np.float32)), so)
    s2.run(None, {"x": x})
    assert "fusions: none" in s2.report()


def test_sequence_feeds_and_outputs():
    g = h.make_graph([h.make_node("SequenceConstruct", ["a", "b"], ["s"]),
                      h.make_node("SequenceAt", ["s", "i"], ["y"])], "g",
                     [h.make_tensor_value_info("a", TP.FLOAT, [2]),
                      h.make_tensor_value_info("b", TP.FLOAT, [2]),
                      h.make_tensor_value_info("i", TP.INT64, [])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [2])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    s = InferenceSession(m)
    a, b = torch.ones(2), torch.full((2,), 2.0)
    (y,) = s.run(None, {"a": a, "b": b, "i": torch.tensor(1)})
    assert y.data_ptr() == b.data_ptr()  # torch in, torch out, no copy
    (yn,) = s.run(None, {"a": a.numpy(), "b": b.numpy(), "i": np.array(-2)})
    np.testing.assert_array_equal(yn, [1.0, 1.0])


def test_ml_dtypes_feeds_and_outputs_round_trip_bit_for_bit():
    """ml_dtypes' bfloat16 / float8 arrays (what onnx's helpers make) are read bit for bit
    and returned as the same ml_dtypes type; plain numpy dtypes take the fast path."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for elem, ml in ((TP.BFLOAT16, ml_dtypes.bfloat16),
                     (TP.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn)):
        g = h.make_graph([h.make_node("Identity", ["x"], ["y"])], "g",
                         [h.make_tensor_value_info("x", elem, [5])],
                         [h.make_tensor_value_info("y", elem, [5])])
        m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)], ir_version=10)
        x = np.array([0.5, -2.0, 3.25, 0.0, 1.5], dtype=ml)
        (y,) = InferenceSession(m).run(None, {"x": x})
        assert y.dtype == x.dtype and np.array_equal(y.view(np.uint8), x.view(np.uint8))


def test_numpy_outputs_never_alias_feeds_or_constants():
    """An output that is a feed (Identity) or a constant of the model comes back as a
    copy: writing into it leaves the caller's array and the next run alone, as in ORT."""
    c = np.arange(3, dtype=np.float32)
    g = h.make_graph([h.make_node("Identity", ["x"], ["y"]),
                      h.make_node("Identity", ["c"], ["k"])], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [3])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [3]),
                      h.make_tensor_value_info("k", TP.FLOAT, [3])],
                     initializer=[numpy_helper.from_array(c, "c")])
    sess = InferenceSession(h.make_model(g, opset_imports=[h.make_opsetid("", 17)],
                                         ir_version=8))
    x = np.ones(3, dtype=np.float32)
    y, k = sess.run(None, {"x": x})
    y[:] = 7
    k[:] = 9
    assert np.array_equal(x, np.ones(3)) and np.array_equal(sess.run(None, {"x": x})[1], c)
