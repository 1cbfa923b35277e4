"""The gradient builder's contract: outputs and naming, what is (not) computed, model
metadata and versions, inputs left untouched, and clear errors for bad input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper as h

from ortcpu_torch.graph import FORWARD_NODES_KEY, GradientBuildError, build_gradient_graph
from ortcpu_torch.graph.gradient import gradient_rules, split_training_graph

from .gradient_harness import F32, I64, build, make_model, rand, run_ort, run_ours

N = h.make_node


def _two_layer(opset=17):
    init = {"W1": rand(4, 6), "b1": rand(6), "W2": rand(6, 3), "frozen": rand(3)}
    nodes = [N("MatMul", ["x", "W1"], ["h0"], name="mm1"), N("Add", ["h0", "b1"], ["h1"]),
             N("Sigmoid", ["h1"], ["a"]), N("MatMul", ["a", "W2"], ["o0"], name="mm2"),
             N("Add", ["o0", "frozen"], ["out"]),
             N("ReduceSumSquare", ["out"], ["loss"], keepdims=0)]
    return make_model(nodes, [("x", F32, [5, 4])], [("loss", F32, []), ("out", F32, [5, 3])],
                      init, opset=opset), init


def test_outputs_are_forward_outputs_then_param_grads_in_order():
    model, _ = _two_layer()
    training = build(model, ["W2", "W1", "b1"])
    assert [o.name for o in training.graph.output] == ["loss", "out", "W2_grad", "W1_grad",
                                                       "b1_grad"]
    for o in training.graph.output[2:]:
        assert o.type.tensor_type.elem_type == F32
    shapes = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim]
              for o in training.graph.output}
    assert shapes["W1_grad"] == [4, 6] and shapes["b1_grad"] == [6]


def test_only_needed_gradients_are_computed():
    """W2 alone: nothing below the second MatMul is differentiated, and x (an input not
    asked for) gets no gradient anywhere."""
    model, _ = _two_layer()
    training = build(model, ["W2"])
    n_forward = int(dict((p.key, p.value) for p in training.metadata_props)[FORWARD_NODES_KEY])
    backward = training.graph.node[n_forward:]
    assert not any(n.op_type == "SigmoidGrad" for n in backward)
    assert not any(n.name.startswith(("mm1", "Add_Grad")) for n in backward)
    produced = {o for n in backward for o in n.output}
    assert not {"x_grad", "W1_grad", "a_grad", "frozen_grad"} & produced


def test_forward_part_and_metadata():
    model, init = _two_layer()
    training = build(model, ["W1", "b1", "W2"])
    meta = {p.key: p.value for p in training.metadata_props}
    n_forward = int(meta[FORWARD_NODES_KEY])
    assert [n.op_type for n in training.graph.node[:n_forward]] == [
        n.op_type for n in model.graph.node]
    assert all(n.domain == "" or n.op_type != "MatMul" for n in training.graph.node)
    x = rand(5, 4)
    fwd = run_ort(model, {"x": x})
    got = run_ort(training, {"x": x})
    np.testing.assert_array_equal(got["loss"], fwd["loss"])
    np.testing.assert_array_equal(got["out"], fwd["out"])


def test_the_input_model_is_not_modified_and_paths_and_bytes_load(tmp_path):
    """Completing forward nodes (the LayerNorm's stats outputs) happens on a copy."""
    nodes = [N("LayerNormalization", ["x", "s"], ["y"]), N("ReduceSum", ["y"], ["loss"],
                                                           keepdims=0)]
    model = make_model(nodes, [("x", F32, [2, 5])], [("loss", F32, [])], {"s": rand(5)})
    before = model.SerializeToString()
    a = build_gradient_graph(model, ["s"], "loss")
    assert model.SerializeToString() == before
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    b = build_gradient_graph(str(path), ["s"], "loss")
    c = build_gradient_graph(path, ["s"], "loss")
    d = build_gradient_graph(before, ["s"], "loss")
    for other in (b, c, d):
        assert other.SerializeToString() == a.SerializeToString()


def test_ir_version_and_opsets_stay_loadable_by_ort():
    """onnx 1.23's make_model writes IR 11+, which ORT 1.19.2 refuses: the training graph
    has IR <= 10 and imports com.microsoft 1."""
    model, _ = _two_layer()
    model.ir_version = onnx.IR_VERSION
    training = build(model, ["W1"])
    assert training.ir_version <= 10
    opsets = {o.domain: o.version for o in training.opset_import}
    assert opsets[""] == 17 and opsets["com.microsoft"] == 1
    run_ort(training, {"x": rand(5, 4)})


@pytest.mark.parametrize("opset", [13, 15, 18, 21])
def test_other_opsets(opset):
    model, init = _two_layer(opset)
    training = build(model, ["W1", "b1", "W2"])
    x = rand(5, 4)
    got = run_ort(training, {"x": x})
    mine = run_ours(training, {"x": x})
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in init.items()}
    out = torch.sigmoid(torch.from_numpy(x).double() @ t["W1"] + t["b1"]) @ t["W2"] + t["frozen"]
    loss = (out * out).sum()
    loss.backward()
    for k in ("W1", "b1", "W2"):
        np.testing.assert_allclose(got[f"{k}_grad"], t[k].grad.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(mine[f"{k}_grad"], t[k].grad.numpy(), rtol=1e-4, atol=1e-5)


def test_param_the_loss_does_not_depend_on_gets_zeros():
    init = {"W": rand(3, 3), "unused": rand(2, 7)}
    nodes = [N("MatMul", ["x", "W"], ["y"]), N("ReduceSum", ["y"], ["loss"], keepdims=0),
             N("Relu", ["unused"], ["side"])]
    model = make_model(nodes, [("x", F32, [2, 3])], [("loss", F32, []), ("side", F32, [2, 7])],
                       init)
    training = build(model, ["W", "unused"])
    got = run_ort(training, {"x": rand(2, 3)})
    np.testing.assert_array_equal(got["unused_grad"], np.zeros((2, 7), np.float32))
    assert not any(n.op_type == "ReluGrad" for n in training.graph.node)


def test_graph_input_gradient_and_shared_gradient_values():
    """Add(a, b) hands the same gradient value to both inputs: each output still gets its
    own name (an Identity where they would coincide)."""
    nodes = [N("Add", ["a", "b"], ["y"]), N("ReduceSum", ["y"], ["loss"], keepdims=0)]
    model = make_model(nodes, [("a", F32, [2, 3]), ("b", F32, [2, 3])], [("loss", F32, [])])
    training = build(model, ["a", "b"])
    got = run_ort(training, {"a": rand(2, 3), "b": rand(2, 3)})
    np.testing.assert_array_equal(got["a_grad"], np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(got["b_grad"], np.ones((2, 3), np.float32))


def test_loss_gradient_seed_is_one_and_nonscalar_loss_is_summed():
    nodes = [N("Mul", ["x", "x"], ["loss"])]
    model = make_model(nodes, [("x", F32, [3])], [("loss", F32, [3])])
    training = build(model, ["x"])
    x = rand(3)
    np.testing.assert_allclose(run_ort(training, {"x": x})["x_grad"], 2 * x, rtol=1e-6)


def test_symbolic_batch_loss_shape():
    nodes = [N("Mul", ["x", "x"], ["loss"])]
    model = make_model(nodes, [("x", F32, ["N"])], [("loss", F32, ["N"])])
    training = build(model, ["x"])
    x = rand(7)
    np.testing.assert_allclose(run_ort(training, {"x": x})["x_grad"], 2 * x, rtol=1e-6)


# ---- bad input -------------------------------------------------------------------------------


def test_loss_must_be_a_float_graph_output():
    model, _ = _two_layer()
    with pytest.raises(GradientBuildError, match="loss_name: 'h1' is not an output"):
        build_gradient_graph(model, ["W1"], "h1")
    nodes = [N("ArgMax", ["x"], ["loss"])]
    m = make_model(nodes, [("x", F32, [3])], [("loss", I64, [])])
    with pytest.raises(GradientBuildError, match="not a float tensor"):
        build_gradient_graph(m, ["x"], "loss")
    with pytest.raises(TypeError, match="loss_name"):
        build_gradient_graph(model, ["W1"], 3)


def test_requires_grad_must_name_float_inputs_or_initializers():
    model, _ = _two_layer()
    with pytest.raises(GradientBuildError, match="'h0' is not a graph input or initializer"):
        build_gradient_graph(model, ["W1", "h0"], "loss")
    with pytest.raises(GradientBuildError, match="listed twice"):
        build_gradient_graph(model, ["W1", "W1"], "loss")
    with pytest.raises(GradientBuildError, match="empty"):
        build_gradient_graph(model, [], "loss")
    with pytest.raises(TypeError, match="requires_grad: expected a list"):
        build_gradient_graph(model, "W1", "loss")
    m = make_model([N("Cast", ["i"], ["f"], to=F32), N("ReduceSum", ["f"], ["loss"])],
                   [("i", I64, [3])], [("loss", F32, [])])
    with pytest.raises(GradientBuildError, match="'i' is int64"):
        build_gradient_graph(m, ["i"], "loss")


def test_an_op_without_a_rule_names_op_node_and_input():
    nodes = [N("Tanh", ["x"], ["t"]), N("Det", ["t"], ["d"], name="the_det"),
             N("ReduceSum", ["d"], ["loss"], keepdims=0)]
    model = make_model(nodes, [("x", F32, [2, 3, 3])], [("loss", F32, [])])
    with pytest.raises(GradientBuildError) as e:
        build_gradient_graph(model, ["x"], "loss")
    msg = str(e.value)
    assert "no gradient rule for op Det" in msg and "'the_det'" in msg and "['t']" in msg
    nodes = [N("Foo", ["x"], ["y"], domain="my.ops", name="custom"),
             N("ReduceSum", ["y"], ["loss"], keepdims=0)]
    model = make_model(nodes, [("x", F32, [3])], [("loss", F32, [])])
    model.opset_import.append(h.make_opsetid("my.ops", 1))
    with pytest.raises(GradientBuildError, match=r"op Foo \(domain my.ops\).*'custom'.*\['x'\]"):
        build_gradient_graph(model, ["x"], "loss")


def test_an_op_off_the_gradient_path_needs_no_rule():
    nodes = [N("Det", ["m"], ["d"]), N("Mul", ["x", "x"], ["sq"]),
             N("ReduceSum", ["sq"], ["loss"], keepdims=0)]
    model = make_model(nodes, [("x", F32, [3]), ("m", F32, [2, 2])],
                       [("loss", F32, []), ("d", F32, [])])
    build(model, ["x"])


def test_unsupported_forms_are_clear_errors():
    nodes = [N("LayerNormalization", ["x", "s"], ["y", "mean"]),
             N("ReduceSum", ["mean"], ["loss"], keepdims=0)]
    model = make_model(nodes, [("x", F32, [2, 4])], [("loss", F32, [])], {"s": rand(4)})
    with pytest.raises(GradientBuildError, match="output 1 .'mean'.*no gradient rule"):
        build_gradient_graph(model, ["x"], "loss")
    nodes = [N("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], storage_order=1),
             N("ReduceSum", ["y"], ["loss"], keepdims=0)]
    model = make_model(nodes, [("x", F32, [1, 1, 4, 4])], [("loss", F32, [])])
    with pytest.raises(GradientBuildError, match="storage_order"):
        build_gradient_graph(model, ["x"], "loss")
    nodes = [N("LSTM", ["x", "w", "r", "", "", "", "", "p"], ["y"], hidden_size=2),
             N("ReduceSum", ["y"], ["loss"], keepdims=0)]
    model = make_model(nodes, [("x", F32, [3, 1, 2])], [("loss", F32, [])],
                       {"w": rand(1, 8, 2), "r": rand(1, 8, 2), "p": rand(1, 6)})
    before = model.SerializeToString()
    with pytest.raises(GradientBuildError, match="peephole"):
        build_gradient_graph(model, ["w"], "loss")
    assert model.SerializeToString() == before  # nothing the caller passed is touched


def test_old_opset_and_bad_model_arguments():
    model, _ = _two_layer(opset=12)
    with pytest.raises(GradientBuildError, match="opset 12 is not supported"):
        build_gradient_graph(model, ["W1"], "loss")
    with pytest.raises(TypeError, match="model: expected"):
        build_gradient_graph(42, ["W1"], "loss")
    with pytest.raises(GradientBuildError, match="cannot load"):
        build_gradient_graph("/nonexistent/model.onnx", ["W1"], "loss")


def test_existing_grad_name_collision():
    nodes = [N("Mul", ["x", "x"], ["x_grad"]), N("ReduceSum", ["x_grad"], ["loss"],
                                                 keepdims=0)]
    model = make_model(nodes, [("x", F32, [3])], [("loss", F32, [])])
    with pytest.raises(GradientBuildError, match="already has a value named 'x_grad'"):
        build_gradient_graph(model, ["x"], "loss")


def test_several_losses_are_summed():
    nodes = [N("ReduceSum", ["x"], ["l1"], keepdims=0), N("Mul", ["x", "x"], ["sq"]),
             N("ReduceSum", ["sq"], ["l2"], keepdims=0)]
    model = make_model(nodes, [("x", F32, [4])], [("l1", F32, []), ("l2", F32, [])])
    training = build(model, ["x"], ["l1", "l2"])
    x = rand(4)
    np.testing.assert_allclose(run_ort(training, {"x": x})["x_grad"], 1 + 2 * x, rtol=1e-6)


@pytest.mark.parametrize("batch", [0, 1])
def test_empty_and_size_one_batches(batch):
    """A symbolic batch of 0 or 1 rows: the same graph gives zeros / the exact gradient.
    (ORT's Gemm rejects K = 0, and its own builder emits the same Gemm(transA) for weight
    gradients; ours runs it.)"""
    init = {"W": rand(3, 2), "b": rand(2)}
    nodes = [N("Gemm", ["x", "W", "b"], ["y"]), N("Relu", ["y"], ["r"]),
             N("ReduceSum", ["r"], ["loss"], keepdims=0)]
    model = make_model(nodes, [("x", F32, ["N", 3])], [("loss", F32, [])], init)
    training = build(model, ["W", "b", "x"])
    x = rand(batch, 3)
    runs = [run_ours(training, {"x": x})]
    if batch:
        runs.append(run_ort(training, {"x": x}))
    for got in runs:
        mask = (x @ init["W"] + init["b"] > 0).astype(np.float32)
        np.testing.assert_allclose(got["W_grad"], x.T @ mask, atol=1e-6)
        np.testing.assert_allclose(got["b_grad"], mask.sum(0), atol=1e-6)
        np.testing.assert_allclose(got["x_grad"], mask @ init["W"].T, atol=1e-6)
        assert got["x_grad"].shape == (batch, 3)


def test_split_training_graph_and_rule_listing():
    model, _ = _two_layer()
    training = build(model, ["W1", "W2"])
    forward, backward, saved = split_training_graph(training)
    assert len(forward) == len(model.graph.node)
    assert len(forward) + len(backward) == len(training.graph.node)
    # Sigmoid's output (SigmoidGrad), ReduceSumSquare's input and what the MatMul
    # gradients multiply with; not the loss, not b1 or the MatMul outputs
    assert {"a", "x", "W2", "out"} <= set(saved)
    assert not {"loss", "b1", "h0", "o0"} & set(saved)
    with pytest.raises(ValueError, match="not a graph built by"):
        split_training_graph(model)
    rules = gradient_rules()
    for key in [("", "Conv"), ("", "LSTM"), ("com.microsoft", "Gelu"), ("", "Shape")]:
        assert key in rules


def test_names_inside_subgraphs_are_not_reused():
    """A value named like a gradient inside an If branch (off the gradient path): the
    builder's fresh names avoid it."""
    then = h.make_graph([N("Identity", ["x"], ["y_grad"])], "then", [],
                        [h.make_tensor_value_info("y_grad", F32, [3])])
    other = h.make_graph([N("Neg", ["x"], ["n"])], "else", [],
                         [h.make_tensor_value_info("n", F32, [3])])
    nodes = [N("Relu", ["x"], ["y"]), N("ReduceSum", ["y"], ["loss"], keepdims=0),
             N("If", ["flag"], ["side"], then_branch=then, else_branch=other)]
    model = make_model(nodes, [("x", F32, [3]), ("flag", 9, [])],
                       [("loss", F32, []), ("side", F32, [3])])
    training = build(model, ["x"])
    top = {o for n in training.graph.node for o in n.output}
    assert "y_grad" not in top
    x = rand(3)
    got = run_ort(training, {"x": x, "flag": np.asarray(True)})
    np.testing.assert_array_equal(got["x_grad"], (x > 0).astype(np.float32))
