"""Executor core: planning, folding, freeing, in-place feeds, errors mapped to nodes."""

import gc
import weakref

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from ortcpu_torch.graph import Executor, FeedError, GraphRunError, InferenceSession, run_model


def _model(nodes, inputs, outputs, inits=(), opset=17, ms=False):
    g = h.make_graph(nodes, "g", inputs, outputs,
                     initializer=[numpy_helper.from_array(v, k) for k, v in inits])
    ops = [h.make_opsetid("", opset)] + ([h.make_opsetid("com.microsoft", 1)] if ms else [])
    return h.make_model(g, opset_imports=ops, ir_version=8)


def _vi(name, dt=TP.FLOAT, shape=None):
    return h.make_tensor_value_info(name, dt, shape)


def test_mlp_matches_torch_and_folds_shape():
    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    b = np.arange(3, dtype=np.float32)
    m = _model([h.make_node("MatMul", ["x", "w"], ["y"]), h.make_node("Add", ["y", "b"], ["z"]),
                h.make_node("Relu", ["z"], ["r"]), h.make_node("Shape", ["r"], ["s"]),
                h.make_node("Reshape", ["r", "s"], ["out"])],
               [_vi("x", shape=["N", 4])], [_vi("out", shape=["N", 3])],
               [("w", w), ("b", b)])
    x = torch.randn(5, 4)
    out = run_model(m, {"x": x})["out"]
    torch.testing.assert_close(out, torch.relu(x @ torch.from_numpy(w) + torch.from_numpy(b)))
    ex = Executor(m)
    ex.run({"x": x})
    plan = ex.plan_for([x])
    assert [n.op_type for n in plan.folded] == ["Shape"]
    assert plan.counts()["MatMul"] == {"kernel": 1, "torch": 0}
    ex.run({"x": torch.randn(2, 4)})
    assert len(ex._plans) == 2  # one plan per input signature


def test_inplace_accumulator_writes_into_fed_tensor():
    m = _model([h.make_node("InPlaceAccumulatorV2", ["buf", "g"], ["flag", "out"],
                            domain="com.microsoft")],
               [_vi("buf", shape=[3]), _vi("g", shape=[3])],
               [_vi("flag", TP.BOOL, [1]), _vi("out", shape=[3])], ms=True)
    buf = torch.ones(3)
    ptr = buf.data_ptr()
    ex = Executor(m)
    res = ex.run({"buf": buf, "g": torch.full((3,), 2.0)})
    ex.run({"buf": buf, "g": torch.full((3,), 2.0)})
    assert buf.data_ptr() == ptr
    torch.testing.assert_close(buf, torch.full((3,), 5.0))
    assert res["out"].data_ptr() == ptr


def test_intermediates_freed_after_last_use():
    n = 30
    nodes = [h.make_node("Mul", ["x" if i == 0 else f"t{i-1}", "two"], [f"t{i}"]) for i in range(n)]
    m = _model(nodes, [_vi("x", shape=[1 << 18])], [_vi(f"t{n-1}", shape=[1 << 18])],
               [("two", np.array(1.0, np.float32))])
    ex = Executor(m, fuse=False)
    x = torch.randn(1 << 18)
    alive = []
    orig = torch.mul

    def spy(a, b):
        r = orig(a, b)
        alive.append(weakref.ref(r))
        live = sum(1 for w in alive if w() is not None)
        assert live <= 3, f"{live} intermediates alive"
        return r
    plan = ex.plan_for([x])
    glb = plan._fn.__globals__
    for k in list(glb):
        if k.startswith("f"):
            glb[k] = spy
    out = plan.run(x)[0]
    torch.testing.assert_close(out, x)
    del out
    gc.collect()


def test_feed_errors_name_input():
    m = _model([h.make_node("Relu", ["x"], ["y"])], [_vi("x", shape=["N", 4])],
               [_vi("y", shape=["N", 4])])
    s = InferenceSession(m)
    with pytest.raises(FeedError, match="'x'.*dimension 1 must be 4"):
        s.run(None, {"x": np.zeros((2, 5), np.float32)})
    with pytest.raises(FeedError, match="'x'.*float.*got double"):
        s.run(None, {"x": np.zeros((2, 4))})
    with pytest.raises(FeedError, match="rank 2"):
        s.run(None, {"x": np.zeros(4, np.float32)})
    with pytest.raises(FeedError, match="unknown input 'z'"):
        s.run(None, {"x": np.zeros((2, 4), np.float32), "z": np.zeros(1)})
    with pytest.raises(FeedError, match="missing"):
        s.run(None, {})
    assert s.run(None, {"x": np.ones((2, 4), np.float32)})[0].sum() == 8


def test_kernel_error_names_node_and_session_survives():
    m = _model([h.make_node("Gather", ["x", "i"], ["y"], name="the_gather")],
               [_vi("x", shape=[3, 2]), _vi("i", TP.INT64, [2])], [_vi("y", shape=[2, 2])])
    s = InferenceSession(m)
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    with pytest.raises(GraphRunError, match="Gather node 'the_gather'.*index 7"):
        s.run(None, {"x": x, "i": np.array([0, 7])})
    y = s.run(None, {"x": x, "i": np.array([-1, 0])})[0]
    np.testing.assert_array_equal(y, x[[2, 0]])


def test_unsupported_op_named_at_creation():
    m = _model([h.make_node("Unique", ["x"], ["y"], name="u1")], [_vi("x", shape=[3])],
               [_vi("y", shape=["M"])])
    with pytest.raises(NotImplementedError, match=r"Unique.*ai\.onnx.*opset 17.*'u1'"):
        InferenceSession(m)


def test_malformed_model_gives_checker_message(tmp_path):
    from ortcpu_torch.graph import InvalidModelError
    m = _model([h.make_node("Relu", ["x"], ["y"])], [_vi("x", shape=[2])], [_vi("y", shape=[2])])
    data = m.SerializeToString()
    with pytest.raises(InvalidModelError, match="not a valid ONNX model"):
        InferenceSession(data[: len(data) // 2])
    bad = onnx.ModelProto()
    bad.CopyFrom(m)
    bad.graph.node[0].input[0] = "nope"
    with pytest.raises(InvalidModelError, match="checker"):
        InferenceSession(bad)
    p = tmp_path / "m.onnx"
    p.write_bytes(b"\x00garbage\xff" * 10)
    with pytest.raises(InvalidModelError):
        InferenceSession(str(p))


def test_torch_in_torch_out_numpy_in_numpy_out():
    m = _model([h.make_node("Identity", ["x"], ["y"])], [_vi("x", shape=[2])],
               [_vi("y", shape=[2])])
    s = InferenceSession(m)
    t = torch.ones(2)
    (y,) = s.run(None, {"x": t})
    assert isinstance(y, torch.Tensor) and y.data_ptr() == t.data_ptr()
    a = np.ones(2, np.float32)
    (ya,) = s.run(["y"], {"x": a})
    assert isinstance(ya, np.ndarray) and not np.shares_memory(a, ya)
    with pytest.raises(ValueError, match="providers"):
        InferenceSession(m, providers=["CUDAExecutionProvider"])
    assert s.get_inputs()[0].type == "tensor(float)" and s.get_outputs()[0].shape == [2]


def test_fusions_gelu_bias_relu_match_unfused():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 6)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    nodes = [h.make_node("MatMul", ["x", "w"], ["mm"]), h.make_node("Add", ["mm", "b"], ["y"]),
             h.make_node("Div", ["y", "sqrt2"], ["d"]), h.make_node("Erf", ["d"], ["e"]),
             h.make_node("Add", ["e", "one"], ["a"]), h.make_node("Mul", ["y", "a"], ["m"]),
             h.make_node("Mul", ["m", "half"], ["g"]), h.make_node("MatMul", ["g", "w2"], ["z"]),
             h.make_node("Relu", ["z"], ["out"])]
    m = _model(nodes, [_vi("x", shape=[3, 4, 8])], [_vi("out", shape=[3, 4, 5])],
               [("w", w), ("b", b), ("sqrt2", np.array(2 ** 0.5, np.float32)),
                ("one", np.array(1.0, np.float32)), ("half", np.array(0.5, np.float32)),
                ("w2", rng.standard_normal((6, 5)).astype(np.float32))])
    x = torch.randn(3, 4, 8)
    fused = Executor(m)
    out = fused.run({"x": x})["out"]
    ref = Executor(m, fuse=False).run({"x": x})["out"]
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    plan = fused.plan_for([x])
    assert sorted(plan.fusions) == ["Erf subgraph -> Gelu x1", "MatMul+Add(bias) in place x1",
                                    "MatMul+Relu in place x1"]
    assert [b.node.op_type for b in plan.bound] == ["MatMul", "Gelu", "MatMul"]


def test_residual_add_fuses_into_conv_only_when_computed_before():
    """ResNet's skip connection: Conv -> Add(residual) -> Relu runs as one Conv node with an
    in-place add+relu epilogue when the residual exists before the Conv; a residual
    produced after it (node order) is left unfused."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((3, 3, 3, 3)).astype(np.float32)
    inits = [("w", w), ("b", rng.standard_normal(3).astype(np.float32))]
    x = torch.randn(2, 3, 6, 6)
    before = [h.make_node("Relu", ["x"], ["r"]),
              h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
              h.make_node("Sum", ["c", "r"], ["s"]), h.make_node("Relu", ["s"], ["out"])]
    after = [before[1], before[0], h.make_node("Add", ["r", "c"], ["s"]), before[3]]
    for nodes, fused_ops in ((before, ["Relu", "Conv"]), (after, ["Conv", "Relu", "Add",
                                                                   "Relu"])):
        m = _model(nodes, [_vi("x", shape=[2, 3, 6, 6])], [_vi("out", shape=[2, 3, 6, 6])],
                   inits)
        ex = Executor(m)
        out = ex.run({"x": x})["out"]
        ref = torch.relu(F.conv2d(x, torch.from_numpy(w), torch.from_numpy(inits[1][1]),
                                  padding=1) + torch.relu(x))
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        assert [b.node.op_type for b in ex.plan_for([x]).bound] == fused_ops


def test_static_slice_is_a_view_and_matches_the_kernel():
    nodes = [h.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"]),
             h.make_node("Slice", ["x", "st2", "en2"], ["z"])]
    m = _model(nodes, [_vi("x", shape=[4, 10])], [_vi("y", shape=[2, 3]), _vi("z", shape=[0, 10])],
               [("st", np.array([1, -9], np.int64)), ("en", np.array([100, 9], np.int64)),
                ("ax", np.array([0, 1], np.int64)), ("sp", np.array([2, 3], np.int64)),
                ("st2", np.array([3], np.int64)), ("en2", np.array([1], np.int64))])
    x = torch.randn(4, 10)
    y, z = Executor(m).run({"x": x}).values()
    torch.testing.assert_close(y, x[1::2, 1:9:3])
    assert y.data_ptr() != x.data_ptr() and y.untyped_storage().data_ptr() == \
        x.untyped_storage().data_ptr()
    assert z.shape == (0, 10)


def test_elementwise_in_place_only_on_private_intermediates():
    # t1 = x + 1 (x is a feed: never written); t2 = t1 * 2 runs in place on t1 (used once);
    # t3 = t2 - 1 and t2 is also a graph output: not in place
    nodes = [h.make_node("Add", ["x", "one"], ["t1"]), h.make_node("Mul", ["t1", "two"], ["t2"]),
             h.make_node("Sub", ["t2", "one"], ["t3"])]
    m = _model(nodes, [_vi("x", shape=[4])], [_vi("t3", shape=[4]), _vi("t2", shape=[4])],
               [("one", np.array(1.0, np.float32)), ("two", np.array(2.0, np.float32))])
    x = torch.arange(4.0)
    t3, t2 = InferenceSession(m).run(None, {"x": x})
    torch.testing.assert_close(x, torch.arange(4.0))
    torch.testing.assert_close(t2, (torch.arange(4.0) + 1) * 2)
    torch.testing.assert_close(t3, (torch.arange(4.0) + 1) * 2 - 1)


def test_every_registry_op_is_bound_to_its_kernel():
    from ortcpu_torch import kernels
    from ortcpu_torch.graph import op_table

    for name in kernels.names():
        e = op_table.lookup("com.microsoft", name, 1) or op_table.lookup("", name, 17)
        assert e is not None and e.kind == "kernel", name
    torch_ops = [t for d, t, lo, hi, kind in op_table.supported() if kind == "torch"]
    assert "Reshape" in torch_ops and "MatMul" not in torch_ops


def test_commutative_ops_in_place_on_their_second_input():
    """Add / Mul whose second input is the private fresh intermediate (a residual gradient
    Add reading LayerNormalizationGrad's dX) run in place on it; Sub never does; a feed
    is never written; a broadcast first input leaves the second's shape the output's."""
    nodes = [h.make_node("Relu", ["y"], ["r"]), h.make_node("Add", ["x", "r"], ["s"]),
             h.make_node("Relu", ["y"], ["r2"]), h.make_node("Mul", ["v", "r2"], ["p"]),
             h.make_node("Relu", ["y"], ["r3"]), h.make_node("Sub", ["x", "r3"], ["d"])]
    m = _model(nodes, [_vi("x", shape=[3, 4]), _vi("y", shape=[3, 4]), _vi("v", shape=[4])],
               [_vi("s", shape=[3, 4]), _vi("p", shape=[3, 4]), _vi("d", shape=[3, 4])], [])
    x, y, v = torch.randn(3, 4), torch.randn(3, 4), torch.randn(4)
    keep = [t.clone() for t in (x, y, v)]
    ex = Executor(m)
    out = ex.run({"x": x, "y": y, "v": v})
    for t, k in zip((x, y, v), keep, strict=True):
        torch.testing.assert_close(t, k, rtol=0, atol=0)
    torch.testing.assert_close(out["s"], x + y.relu(), rtol=0, atol=0)
    torch.testing.assert_close(out["p"], v * y.relu(), rtol=0, atol=0)
    torch.testing.assert_close(out["d"], x - y.relu(), rtol=0, atol=0)
    fns = {b.node.op_type: b.fn for b in ex.plan_for([x, y, v]).bound}
    assert fns["Add"].__name__ == fns["Mul"].__name__ == "<lambda>"
    assert fns["Sub"].__name__ != "<lambda>"
