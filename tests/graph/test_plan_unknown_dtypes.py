"""Plans whose value dtypes are unknown at plan time (a value downstream of an op ONNX
inference has no schema for, e.g. a training fusion's private op) but whose shapes are
known: the plan-time fusions still fire (they go by shapes), so each binding must honour
what was fused into its node on its dtype-generic path too. Regression: the MatMul
binding dropped a fused ``ortcpu_out_perm`` there (the Transpose was gone from the graph),
which gave nn.MultiheadAttention's forward wrong values once LinearGemm
(training_fusions.py) left the attention's values untyped."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from ortcpu_torch.graph.executor import Executor
from ortcpu_torch.graph.planner import build_plan
from ortcpu_torch.graph.shapes import infer_value_shapes

_NP = {TP.FLOAT: np.float32, TP.DOUBLE: np.float64}


def _model(nodes, inputs, out, inits, elem):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, elem, s)
                                       for n, s in inputs],
                          [helper.make_empty_tensor_value_info(out)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _untyped_plan(m, feeds):
    """The fused plan built with every static shape known but no dtype."""
    shapes, _ = infer_value_shapes(m, {k: tuple(v.shape) for k, v in feeds.items()},
                                   {i.name: i.type.tensor_type.elem_type for i in m.graph.input})
    consts = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy())
              for t in m.graph.initializer}
    return build_plan(m.graph, {"": 17}, consts, list(feeds), shapes, types=None)


def _check(m, feeds, fused_as, elem):
    tf = {k: torch.from_numpy(v) for k, v in feeds.items()}
    want = Executor(m, fuse=False, check=False).run(tf)
    plan = _untyped_plan(m, tf)
    assert any(fused_as in f for f in plan.fusions), plan.fusions
    got = plan.run(*tf.values())[0]
    ref = next(iter(want.values()))
    assert got.shape == ref.shape
    tol = 1e-5 if elem == TP.FLOAT else 1e-12
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("elem", [TP.FLOAT, TP.DOUBLE])
@pytest.mark.parametrize("scaled", [False, True])
def test_batched_matmul_with_fused_transpose(elem, scaled):
    """Attention's P·V [B, H, T, D] -> Transpose(0, 2, 1, 3) (and a 1/√d scale first)."""
    rng = np.random.default_rng(0)
    t = _NP[elem]
    nodes = [helper.make_node("MatMul", ["p", "v"], ["pv"])]
    mm = "pv"
    if scaled:
        nodes.append(helper.make_node("Mul", ["pv", "scale"], ["pvs"]))
        mm = "pvs"
    nodes.append(helper.make_node("Transpose", [mm], ["y"], perm=[2, 0, 1, 3]))
    inits = [numpy_helper.from_array(np.array(0.25, t), "scale")] if scaled else []
    m = _model(nodes, [("p", [3, 4, 5, 5]), ("v", [3, 4, 5, 6])], "y", inits, elem)
    feeds = {"p": rng.standard_normal((3, 4, 5, 5)).astype(t),
             "v": rng.standard_normal((3, 4, 5, 6)).astype(t)}
    _check(m, feeds, "MatMul+Transpose written transposed", elem)


@pytest.mark.parametrize("elem", [TP.FLOAT, TP.DOUBLE])
def test_matmul_bias_relu_epilogue(elem):
    rng = np.random.default_rng(1)
    t = _NP[elem]
    w = rng.standard_normal((7, 9)).astype(t)
    b = rng.standard_normal(9).astype(t)
    nodes = [helper.make_node("MatMul", ["a", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    m = _model(nodes, [("a", [2, 5, 7])], "y",
               [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")], elem)
    _check(m, {"a": rng.standard_normal((2, 5, 7)).astype(t)}, "MatMul", elem)


@pytest.mark.parametrize("elem", [TP.FLOAT, TP.DOUBLE])
def test_conv_bias_relu_epilogue(elem):
    rng = np.random.default_rng(2)
    t = _NP[elem]
    w = rng.standard_normal((4, 3, 3, 3)).astype(t)
    b = rng.standard_normal(4).astype(t)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    m = _model(nodes, [("x", [2, 3, 6, 6])], "y",
               [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")], elem)
    _check(m, {"x": rng.standard_normal((2, 3, 6, 6)).astype(t)}, "Conv", elem)


def _untyped_reads(model, shapes_in, types_in, *rest):
    """The values a node of ``model`` reads that static inference left without a dtype."""
    _, types = infer_value_shapes(model, shapes_in, types_in, *rest)
    produced = {o for n in model.graph.node for o in n.output if o}
    return sorted({i for n in model.graph.node for i in n.input
                   if i in produced and i not in types})


@pytest.mark.parametrize("name", ["encoder", "cnn", "gpt", "lstm", "gru"])
def test_ortmodule_plans_type_every_value(name, monkeypatch):
    """The forward and backward plans of ORTModule know every value's dtype (the outputs of
    ORT's training ops and of training_fusions.py's private ops are typed and inference
    continues past them), so no binding is left on its dtype-generic path."""
    from ortcpu_torch import ORTModule
    from ortcpu_torch.graph import executor

    from .capture_models import make
    from .test_ortmodule import _Encoder

    if name == "encoder":
        model, args = _Encoder(), (torch.randn(3, 10, 32),)
    else:
        model, args = make(name)
    found = []

    def spy(model, shapes_in, types_in, *rest):
        found.append(_untyped_reads(model, shapes_in, types_in, *rest))
        return infer_value_shapes(model, shapes_in, types_in, *rest)
    monkeypatch.setattr(executor, "infer_value_shapes", spy)
    out = ORTModule(model, fallback="error")(*args)
    out[0].backward()
    assert len(found) == 2 and found == [[], []], found
