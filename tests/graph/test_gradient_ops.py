"""Per-rule tests of the gradient builder: each op's training graph is full-checked, run in
onnxruntime-training 1.19.2 and every gradient compared with torch autograd (float64
reference; float32 graphs unless a case says otherwise). The loss is sum(op(...) · w)
with a random w, so every gradient sees a non-uniform upstream gradient."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import helper as h

from ortcpu_torch.graph import GradientBuildError, build_gradient_graph

from .gradient_harness import (
    F32,
    F64,
    I64,
    build,
    check_against_torch,
    make_model,
    rand,
    run_ort,
    run_ours,
    torch_reference,
)

B = 1e-5  # float32 kernels vs a float64 reference: absolute tolerance for O(1) values


def weighted_loss(nodes, out: str, out_shape, inputs, outputs_extra=(), init=None,
                  dtype=F32, opset=17):
    """The model ``nodes`` + loss = ReduceSum(out · w)."""
    nodes = list(nodes) + [h.make_node("Mul", [out, "upstream"], ["weighted"]),
                           h.make_node("ReduceSum", ["weighted"], ["loss"], keepdims=0)]
    return make_model(nodes, list(inputs) + [("upstream", dtype, out_shape)],
                      [("loss", dtype, [])] + list(outputs_extra), init or {}, opset=opset)


def run_case(nodes, out, out_shape, feeds: dict, requires_grad, fn, *, types=None,
             atol=B, rtol=1e-4, init=None, dtype=F32, opset=17, outputs_extra=(), ours=True):
    """``feeds``: name -> array (graph inputs, besides w); ``fn(**feeds)`` is the torch
    forward of ``out``."""
    np_dtype = np.float32 if dtype == F32 else np.float64
    w = rand(*out_shape, dtype=np_dtype)
    types = types or {}
    inputs = [(k, types.get(k, dtype if np.asarray(v).dtype.kind == "f" else I64),
               list(np.asarray(v).shape)) for k, v in feeds.items()]
    model = weighted_loss(nodes, out, out_shape, inputs, outputs_extra, init, dtype, opset)

    try:  # fn gets the graph inputs, and the initializers it names
        params = inspect.signature(fn).parameters
        wanted = set(feeds) | set(params)
        if any(p.kind == p.VAR_KEYWORD for p in params.values()):
            wanted |= set(init or {})
        positional = False
    except ValueError:  # a builtin such as torch.tanh: the graph inputs, in order
        positional = True

    def loss_fn(upstream, **kw):
        if positional:
            return (fn(*[kw[k] for k in feeds]) * upstream).sum()
        return (fn(**{k: v for k, v in kw.items() if k in wanted}) * upstream).sum()

    return check_against_torch(model, loss_fn, {**feeds, "upstream": w}, requires_grad,
                               atol=atol, rtol=rtol, init=init, ours=ours)


N = h.make_node

# ---- elementwise and broadcasting ----------------------------------------------------------


@pytest.mark.parametrize("op,fn", [("Add", torch.add), ("Sub", torch.sub), ("Mul", torch.mul),
                                   ("Div", torch.div)])
@pytest.mark.parametrize("shapes", [((2, 3, 4), (3, 1)), ((4,), (2, 3, 4)), ((2, 1, 4), (1, 3, 1)),
                                    ((3, 4), (3, 4))])
def test_binary_broadcast(op, fn, shapes):
    a, b = rand(*shapes[0]), rand(*shapes[1]) + (3.0 if op == "Div" else 0.0)
    out_shape = list(np.broadcast_shapes(shapes[0], shapes[1]))
    run_case([N(op, ["a", "b"], ["y"])], "y", out_shape, {"a": a, "b": b}, ["a", "b"],
             lambda a, b: fn(a, b))


def test_binary_broadcast_dynamic_shapes_use_broadcast_gradient_args():
    """Symbolic dims that shape inference cannot compare: the reduction axes come from
    BroadcastGradientArgs at run time."""
    nodes = [N("Mul", ["a", "b"], ["y"]), N("ReduceSum", ["y"], ["loss"], keepdims=0)]
    model = make_model(nodes, [("a", F32, ["N", 3, 4]), ("b", F32, ["M", 1])],
                       [("loss", F32, [])])
    training = build(model, ["a", "b"])
    assert "BroadcastGradientArgs" in {n.op_type for n in training.graph.node}
    for bs in ((3, 1), (1, 1)):
        feeds = {"a": rand(2, 3, 4), "b": rand(*bs)}
        want = torch_reference(lambda a, b: (a * b).sum(), feeds, ["a", "b"])
        for got in (run_ort(training, feeds), run_ours(training, feeds)):
            for k in ("a_grad", "b_grad"):
                np.testing.assert_allclose(got[k], want[k], atol=1e-5, rtol=1e-5)


def test_pow_constant_and_tensor_exponent():
    x = np.abs(rand(3, 4)) + 0.5
    for p in (2.0, 3.0, 0.5, 1.0):
        init = {"e": np.asarray(p, dtype=np.float32)}
        run_case([N("Pow", ["x", "e"], ["y"])], "y", [3, 4], {"x": x}, ["x"],
                 lambda x, p=p: x ** p, init=init)
    e = rand(4)
    run_case([N("Pow", ["x", "e"], ["y"])], "y", [3, 4], {"x": x, "e": e}, ["x", "e"],
             lambda x, e: x ** e)


UNARY = [
    ("Sqrt", torch.sqrt, "pos"), ("Exp", torch.exp, None), ("Log", torch.log, "pos"),
    ("Neg", torch.neg, None), ("Reciprocal", torch.reciprocal, "pos"), ("Abs", torch.abs, None),
    ("Erf", torch.erf, None), ("Sin", torch.sin, None), ("Cos", torch.cos, None),
    ("Identity", lambda x: x, None), ("Relu", torch.relu, None), ("Sigmoid", torch.sigmoid, None),
    ("Tanh", torch.tanh, None), ("Softplus", lambda x: F.softplus(x), None),
    ("Elu", lambda x: F.elu(x), None),
    ("Tan", torch.tan, "small"), ("Asin", torch.asin, "unit"), ("Acos", torch.acos, "unit"),
    ("Atan", torch.atan, None), ("Sinh", torch.sinh, None), ("Cosh", torch.cosh, None),
    ("Asinh", torch.asinh, None), ("Acosh", torch.acosh, "above1"), ("Atanh", torch.atanh, "unit"),
    ("HardSigmoid", lambda x: torch.clamp(0.2 * x + 0.5, 0, 1), "wide"),
    ("HardSwish", lambda x: F.hardswish(x), "wide"), ("Selu", lambda x: F.selu(x), None),
    ("Softsign", lambda x: F.softsign(x), None),
]


@pytest.mark.parametrize("op,fn,domain", UNARY, ids=[u[0] for u in UNARY])
def test_unary(op, fn, domain):
    x = rand(3, 5)
    x = {"pos": np.abs(x) + 0.3, "small": 0.5 * x, "unit": np.tanh(x) * 0.9,
         "above1": np.abs(x) + 1.2, "wide": 3 * x}.get(domain, x)
    run_case([N(op, ["x"], ["y"])], "y", [3, 5], {"x": x}, ["x"], fn)


def test_hard_swish_gradient_at_its_kinks_is_torchs():
    """torch's slope is 0 at exactly -3 and 1 at exactly 3 (the outer pieces' slopes)."""
    x = np.array([[-3.0, 3.0, -4.0, 4.0, 0.0], [1.5, -1.5, -2.999, 2.999, -3.001]],
                 dtype=np.float32)
    run_case([N("HardSwish", ["x"], ["y"])], "y", [2, 5], {"x": x}, ["x"], lambda x: F.hardswish(x))


@pytest.mark.parametrize("op,fn", [
    ("Gelu", lambda x: F.gelu(x)), ("QuickGelu", lambda x: x * torch.sigmoid(1.702 * x)),
    ("FastGelu", lambda x: F.gelu(x, approximate="tanh"))])
def test_contrib_activations(op, fn):
    run_case([N(op, ["x"], ["y"], domain="com.microsoft")], "y", [4, 6], {"x": rand(4, 6)},
             ["x"], fn)


@pytest.mark.parametrize("op,fn", [
    ("BiasGelu", lambda x, b: F.gelu(x + b)),
    ("FastGelu", lambda x, b: F.gelu(x + b, approximate="tanh"))])
def test_bias_gelus_give_the_bias_gradient(op, fn):
    run_case([N(op, ["x", "b"], ["y"], domain="com.microsoft")], "y", [2, 3, 6],
             {"x": rand(2, 3, 6), "b": rand(6)}, ["x", "b"], fn)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_onnx_gelu_20_follows_approximate(approximate):
    """ai.onnx Gelu-20 (what torch.onnx emits): tanh GELU must get FastGeluGrad (ORT's own
    builder gives it GeluGrad, a wrong gradient)."""
    got = run_case([N("Gelu", ["x"], ["y"], approximate=approximate)], "y", [4, 6],
                   {"x": rand(4, 6, scale=2.0)}, ["x"],
                   lambda x: F.gelu(x, approximate=approximate), opset=20)
    assert got


@pytest.mark.parametrize("alpha", [0.1, -0.5])
def test_leaky_relu(alpha):
    run_case([N("LeakyRelu", ["x"], ["y"], alpha=alpha)], "y", [3, 5], {"x": rand(3, 5)}, ["x"],
             lambda x: torch.where(x > 0, x, alpha * x))


def test_where_clip_cast_sum_mean():
    cond = np.random.rand(3, 4) > 0.5
    a, b = rand(3, 4), rand(4)
    run_case([N("Where", ["c", "a", "b"], ["y"])], "y", [3, 4],
             {"c": cond, "a": a, "b": b}, ["a", "b"], lambda c, a, b: torch.where(c, a, b),
             types={"c": 9})
    x = rand(3, 4, scale=2.0)
    init = {"lo": np.asarray(-0.5, np.float32), "hi": np.asarray(0.7, np.float32)}
    run_case([N("Clip", ["x", "lo", "hi"], ["y"])], "y", [3, 4], {"x": x}, ["x"],
             lambda x: torch.clamp(x, -0.5, 0.7), init=init)
    run_case([N("Cast", ["x"], ["x64"], to=F64), N("Mul", ["x64", "x64"], ["sq"]),
              N("Cast", ["sq"], ["y"], to=F32)], "y", [3, 4], {"x": x}, ["x"], lambda x: x * x)
    c = rand(1, 4)
    run_case([N("Sum", ["a", "b", "c"], ["y"])], "y", [3, 4], {"a": a, "b": b, "c": c},
             ["a", "b", "c"], lambda a, b, c: a + b + c)
    run_case([N("Mean", ["a", "b"], ["y"])], "y", [3, 4], {"a": a, "b": b}, ["a", "b"],
             lambda a, b: (a + b) / 2)


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_max_min_split_ties_like_torch(op):
    a = rand(3, 4)
    b = a.copy()
    b[0] += 1.0
    b[1] -= 1.0  # row 2: ties
    fn = torch.maximum if op == "Max" else torch.minimum
    run_case([N(op, ["a", "b"], ["y"])], "y", [3, 4], {"a": a, "b": b}, ["a", "b"],
             lambda a, b: fn(a, b))
    run_case([N(op, ["a", "c"], ["y"])], "y", [3, 4], {"a": a, "c": rand(4)}, ["a", "c"],
             lambda a, c: fn(a, c))


def test_softmax_cross_entropy_loss_internal():
    scores, labels = rand(6, 5), np.array([0, 2, 4, 1, 2, 3], dtype=np.int64)
    run_case([N("SoftmaxCrossEntropyLossInternal", ["scores", "labels", "", "ig"], ["l", "lp"],
                domain="com.microsoft")], "l", [], {"scores": scores, "labels": labels},
             ["scores"], lambda scores, labels: F.cross_entropy(scores, labels, ignore_index=2),
             init={"ig": np.asarray(2, np.int64)})


def test_prelu_mod_cumsum_trilu():
    x, slope = rand(3, 4), rand(4)
    run_case([N("PRelu", ["x", "slope"], ["y"])], "y", [3, 4], {"x": x, "slope": slope},
             ["x", "slope"], lambda x, slope: torch.where(x > 0, x, slope * x))
    a, b = rand(3, 4, scale=3.0), np.abs(rand(4)) + 0.5
    run_case([N("Mod", ["a", "b"], ["y"], fmod=1)], "y", [3, 4], {"a": a, "b": b}, ["a", "b"],
             lambda a, b: torch.fmod(a, b))
    for exclusive in (0, 1):
        for reverse in (0, 1):
            def ref(x, exclusive=exclusive, reverse=reverse):
                t = x.flip(1) if reverse else x
                c = t.cumsum(1)
                if exclusive:
                    c = c - t
                return c.flip(1) if reverse else c
            run_case([N("CumSum", ["x", "ax"], ["y"], exclusive=exclusive, reverse=reverse)],
                     "y", [3, 4], {"x": x}, ["x"], ref, init={"ax": np.asarray(1, np.int64)})
    m = rand(4, 4)
    run_case([N("Trilu", ["m", "k"], ["y"], upper=0)], "y", [4, 4], {"m": m}, ["m"],
             lambda m: torch.tril(m, 1), init={"k": np.asarray(1, np.int64)})


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("axes,keepdims", [([1], 0), ([0, 1], 1), (None, 0)])
def test_reduce_max_min_split_ties(op, axes, keepdims):
    x = np.round(rand(3, 4), 0)  # many ties
    dims = (0, 1) if axes is None else tuple(axes)
    fn = torch.amax if op == "ReduceMax" else torch.amin
    out_shape = list(fn(torch.from_numpy(x), dims, keepdim=bool(keepdims)).shape)
    init = {} if axes is None else {"axes": np.asarray(axes, np.int64)}
    run_case([N(op, ["x"] + (["axes"] if axes else []), ["y"], keepdims=keepdims)], "y",
             out_shape, {"x": x}, ["x"], lambda x: fn(x, dims, keepdim=bool(keepdims)),
             init=init, opset=18)


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_elements_and_nd(reduction):
    data, upd = rand(4, 5), rand(2, 5)
    idx = np.array([[0, 1, 2, 3, 0], [3, 2, 1, 0, 1]], dtype=np.int64)
    if reduction == "none":
        def ref(data, upd, idx):
            return data.scatter(0, idx, upd)
    else:
        def ref(data, upd, idx):
            return data.scatter_add(0, idx, upd)
    run_case([N("ScatterElements", ["data", "idx", "upd"], ["y"], axis=0, reduction=reduction)],
             "y", [4, 5], {"data": data, "idx": idx, "upd": upd}, ["data", "upd"], ref,
             opset=18)
    nidx = np.array([[1], [3]], dtype=np.int64)

    def ref_nd(data, upd, nidx):
        out = data.clone()
        if reduction == "none":
            out[nidx[:, 0]] = upd
        else:
            out[nidx[:, 0]] += upd
        return out

    run_case([N("ScatterND", ["data", "nidx", "upd"], ["y"], reduction=reduction)], "y", [4, 5],
             {"data": data, "nidx": nidx, "upd": upd}, ["data", "upd"], ref_nd, opset=18)


def test_shared_input_accumulates():
    """x used by three consumers (one of them twice): contributions are summed."""
    nodes = [N("Mul", ["x", "x"], ["sq"]), N("Tanh", ["x"], ["t"]), N("Add", ["sq", "t"], ["y"])]
    run_case(nodes, "y", [3, 4], {"x": rand(3, 4)}, ["x"], lambda x: x * x + torch.tanh(x))


# ---- matrix products --------------------------------------------------------------------------


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)),
                                   ((2, 1, 3, 4), (5, 4, 6)), ((4,), (4, 5)), ((3, 4), (4,)),
                                   ((4,), (4,)), ((4,), (2, 4, 5)), ((2, 3, 4), (4,)),
                                   ((3, 4), (2, 4, 5))])
def test_matmul(sa, sb):
    a, b = rand(*sa), rand(*sb)
    out_shape = list(np.matmul(a, b).shape)
    run_case([N("MatMul", ["a", "b"], ["y"])], "y", out_shape, {"a": a, "b": b}, ["a", "b"],
             torch.matmul)


def test_matmul_float64():
    a, b = rand(2, 3, 4, dtype=np.float64), rand(4, 5, dtype=np.float64)
    run_case([N("MatMul", ["a", "b"], ["y"])], "y", [2, 3, 5], {"a": a, "b": b}, ["a", "b"],
             torch.matmul, dtype=F64, atol=1e-12)


@pytest.mark.parametrize("eq,shapes", [("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
                                       ("ij,jk->ik", [(3, 4), (4, 5)]),
                                       ("ij,j->i", [(3, 4), (4,)]),
                                       ("ij->ji", [(3, 4)])])
def test_einsum(eq, shapes):
    feeds = {f"x{i}": rand(*s) for i, s in enumerate(shapes)}
    out_shape = list(torch.einsum(eq, *[torch.from_numpy(v) for v in feeds.values()]).shape)
    run_case([N("Einsum", list(feeds), ["y"], equation=eq)], "y", out_shape, feeds, list(feeds),
             lambda **kw: torch.einsum(eq, *kw.values()))


def test_einsum_unsupported_form_is_a_clear_error():
    nodes = [N("Einsum", ["a"], ["y"], equation="ij->i"), N("ReduceSum", ["y"], ["loss"])]
    model = make_model(nodes, [("a", F32, [3, 4])], [("loss", F32, [])])
    with pytest.raises(GradientBuildError, match="no Einsum gradient rule for operand 0"):
        build_gradient_graph(model, ["a"], "loss")


@pytest.mark.parametrize("ta", [0, 1])
@pytest.mark.parametrize("tb", [0, 1])
@pytest.mark.parametrize("c_shape", [(5,), (3, 1), (), None])
def test_gemm(ta, tb, c_shape):
    a = rand(*((4, 3) if ta else (3, 4)))
    b = rand(*((5, 4) if tb else (4, 5)))
    feeds = {"a": a, "b": b}
    ins = ["a", "b"]
    if c_shape is not None:
        feeds["c"] = rand(*c_shape)
        ins.append("c")

    def fn(a, b, c=None):
        y = 0.7 * ((a.T if ta else a) @ (b.T if tb else b))
        return y if c is None else y + 1.3 * c

    run_case([N("Gemm", ins, ["y"], transA=ta, transB=tb, alpha=0.7, beta=1.3)], "y", [3, 5],
             feeds, ins, fn)


# ---- reductions -------------------------------------------------------------------------------


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axes", [[1], [0, 2], [-1], None])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL2",
                                "ReduceLogSumExp"])
def test_reductions(op, axes, keepdims):
    x = rand(2, 3, 4)
    dims = tuple(range(3)) if axes is None else tuple(axes)
    torch_fn = {
        "ReduceSum": lambda x: x.sum(dims, keepdim=bool(keepdims)),
        "ReduceMean": lambda x: x.mean(dims, keepdim=bool(keepdims)),
        "ReduceSumSquare": lambda x: (x * x).sum(dims, keepdim=bool(keepdims)),
        "ReduceL2": lambda x: torch.sqrt((x * x).sum(dims, keepdim=bool(keepdims))),
        "ReduceLogSumExp": lambda x: torch.logsumexp(x, dims, keepdim=bool(keepdims)),
    }[op]
    out_shape = list(torch_fn(torch.from_numpy(x)).shape)
    opset = 18  # axes as an input for every reduction
    init = {}
    ins = ["x"]
    if axes is not None:
        init["axes"] = np.asarray(axes, dtype=np.int64)
        ins.append("axes")
    run_case([N(op, ins, ["y"], keepdims=keepdims)], "y", out_shape, {"x": x}, ["x"], torch_fn,
             init=init, opset=opset)


@pytest.mark.parametrize("axes", [[1], None])
def test_reduce_prod_with_zeros(axes):
    x = rand(4, 3)
    x[1, 0] = 0.0  # one zero in the row
    x[2, :2] = 0.0  # two zeros in the row
    init = {} if axes is None else {"axes": np.asarray(axes, np.int64)}
    out_shape = [4] if axes else []

    def fn(x):
        return x.prod(1) if axes else x.prod()

    run_case([N("ReduceProd", ["x"] + (["axes"] if axes else []), ["y"], keepdims=0)], "y",
             out_shape, {"x": x}, ["x"], fn, init=init, opset=18)


def test_reduce_mean_axes_attribute_opset17_and_dynamic_shape():
    nodes = [N("ReduceMean", ["x"], ["m"], axes=[1], keepdims=0),
             N("ReduceSum", ["m"], ["loss"], keepdims=0)]
    model = make_model(nodes, [("x", F32, ["N", 5])], [("loss", F32, [])])
    training = build(model, ["x"])
    for got in (run_ort(training, {"x": rand(3, 5)}), run_ours(training, {"x": rand(3, 5)})):
        np.testing.assert_allclose(got["x_grad"], np.full((3, 5), 0.2, np.float32), rtol=1e-6)


def test_reduce_sum_axes_from_a_graph_input():
    nodes = [N("ReduceSum", ["x", "axes"], ["y"], keepdims=0)]
    run_case(nodes, "y", [2, 4], {"x": rand(2, 3, 4), "axes": np.asarray([1])}, ["x"],
             lambda x, axes: x.sum(1))


# ---- softmax, dropout ---------------------------------------------------------------------------


@pytest.mark.parametrize("op,fn", [("Softmax", torch.softmax), ("LogSoftmax", torch.log_softmax)])
@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax(op, fn, axis):
    run_case([N(op, ["x"], ["y"], axis=axis)], "y", [2, 3, 4], {"x": rand(2, 3, 4)}, ["x"],
             lambda x: fn(x, axis))


@pytest.mark.parametrize("op,fn", [("Sigmoid", torch.sigmoid), ("Tanh", torch.tanh)])
def test_activation_float64(op, fn):
    """(ORT 1.19.2 has no float64 SoftmaxGrad_13/ReluGrad/GeluGrad kernels; ours run them.)"""
    run_case([N(op, ["x"], ["y"])], "y", [2, 3, 4], {"x": rand(2, 3, 4, dtype=np.float64)},
             ["x"], fn, dtype=F64, atol=1e-12)


def test_dropout_training_uses_the_forward_mask():
    """ORT draws the mask; the model outputs it, and torch replays it."""
    init = {"ratio": np.asarray(0.3, np.float32), "train": np.asarray(True)}
    nodes = [N("Dropout", ["x", "ratio", "train"], ["y", "mask"]),
             N("Mul", ["y", "w"], ["weighted"]), N("ReduceSum", ["weighted"], ["loss"], keepdims=0)]
    model = make_model(nodes, [("x", F32, [6, 7]), ("w", F32, [6, 7])],
                       [("loss", F32, []), ("mask", 9, [6, 7])], init)
    training = build(model, ["x"])
    assert "DropoutGrad" in {n.op_type for n in training.graph.node}
    w = rand(6, 7)
    for got in (run_ort(training, {"x": rand(6, 7), "w": w}),
                run_ours(training, {"x": rand(6, 7), "w": w})):
        np.testing.assert_allclose(got["x_grad"], got["mask"] * w / 0.7, rtol=1e-6, atol=1e-7)
        assert 0 < got["mask"].sum() < 42


def test_dropout_mask_added_when_missing_and_inference_is_identity():
    init = {"ratio": np.asarray(0.5, np.float32)}
    x = rand(4, 5)
    for mode_init, expect_grad_op in ((np.asarray(True), True), (np.asarray(False), False)):
        nodes = [N("Dropout", ["x", "ratio", "train"], ["y"]),
                 N("ReduceSum", ["y"], ["loss"], keepdims=0)]
        model = make_model(nodes, [("x", F32, [4, 5])], [("loss", F32, [])],
                           {**init, "train": mode_init})
        training = build(model, ["x"])
        ops = {n.op_type for n in training.graph.node}
        assert ("DropoutGrad" in ops) == expect_grad_op
        for got in (run_ort(training, {"x": x}), run_ours(training, {"x": x})):
            if not expect_grad_op:
                np.testing.assert_array_equal(got["x_grad"], np.ones_like(x))
            else:  # kept elements get 1/(1-0.5), dropped ones 0
                assert set(np.unique(got["x_grad"]).tolist()) <= {0.0, 2.0}


def test_dropout_run_time_training_mode():
    """training_mode fed at run time: DropoutGrad in training, dY in inference (ORT's
    DropoutGrad ignores the flag, so the builder selects)."""
    nodes = [N("Dropout", ["x", "ratio", "train"], ["y"]),
             N("ReduceSum", ["y"], ["loss"], keepdims=0)]
    model = make_model(nodes, [("x", F32, [4, 5]), ("train", 9, [])], [("loss", F32, [])],
                       {"ratio": np.asarray(0.5, np.float32)})
    training = build(model, ["x"])
    x = rand(4, 5)
    for run in (run_ort, run_ours):
        got = run(training, {"x": x, "train": np.asarray(False)})
        np.testing.assert_array_equal(got["x_grad"], np.ones_like(x))
        got = run(training, {"x": x, "train": np.asarray(True)})
        assert set(np.unique(got["x_grad"]).tolist()) <= {0.0, 2.0}


# ---- normalization ----------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("stats_outputs", [True, False])
def test_layer_norm(axis, bias, stats_outputs):
    """torch-style LayerNormalization with one output (ORT's generator fails on it, ORT
    issue #19427) gets its Mean/InvStdDev outputs added."""
    x = rand(2, 3, 4, scale=2.0) + 0.5
    norm = (3, 4) if axis == 1 else (4,)
    feeds = {"x": x, "s": rand(*norm)}
    ins = ["x", "s"]
    if bias:
        feeds["b"] = rand(*norm)
        ins.append("b")
    outs = ["y", "mean", "inv"] if stats_outputs else ["y"]
    extra = [("mean", F32, [2, 1, 1] if axis == 1 else [2, 3, 1]),
             ("inv", F32, [2, 1, 1] if axis == 1 else [2, 3, 1])] if stats_outputs else []

    def fn(x, s, b=None):
        return F.layer_norm(x, norm, s, b, eps=1e-5)

    run_case([N("LayerNormalization", ins, outs, axis=axis, epsilon=1e-5)], "y", [2, 3, 4],
             feeds, ins, fn, atol=2e-5, outputs_extra=extra)


def test_layer_norm_float64():
    x = rand(3, 8, dtype=np.float64)
    run_case([N("LayerNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)], "y", [3, 8],
             {"x": x, "s": rand(8, dtype=np.float64), "b": rand(8, dtype=np.float64)},
             ["x", "s", "b"], lambda x, s, b: F.layer_norm(x, (8,), s, b), dtype=F64,
             atol=1e-6)  # ORT keeps the stats in float32 (stash_type 1)


def test_simplified_layer_norm():
    x = rand(3, 8)

    def rms(x, s):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * s

    run_case([N("SimplifiedLayerNormalization", ["x", "s"], ["y"], axis=-1, epsilon=1e-6)],
             "y", [3, 8], {"x": x, "s": rand(8)}, ["x", "s"], rms, atol=2e-5)


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (6, 3), (2, 3, 7)])
def test_batch_norm_training(shape):
    """Training BatchNormalization becomes BatchNormInternal (saved mean/inv_std) +
    BatchNormalizationGrad; running statistics stay outputs."""
    c = shape[1]
    init = {"rm": rand(c), "rv": np.abs(rand(c)) + 0.5}
    feeds = {"x": rand(*shape, scale=2.0) + 1.0, "s": rand(c), "b": rand(c)}
    nodes = [N("BatchNormalization", ["x", "s", "b", "rm", "rv"], ["y", "nrm", "nrv"],
               training_mode=1, momentum=0.9, epsilon=1e-5)]

    def fn(x, s, b, rm, rv):
        return F.batch_norm(x, rm.detach().clone(), rv.detach().clone(), s, b, training=True,
                            momentum=0.1, eps=1e-5)

    got = run_case(nodes, "y", list(shape), feeds, ["x", "s", "b"], fn, atol=3e-5, init=init,
                   outputs_extra=[("nrm", F32, [c]), ("nrv", F32, [c])])
    axes = (0,) + tuple(range(2, len(shape)))
    mean = feeds["x"].astype(np.float64).mean(axes)
    np.testing.assert_allclose(got["nrm"], 0.9 * init["rm"] + 0.1 * mean, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [17, 18])
def test_instance_norm(opset):
    x = rand(2, 3, 4, 5, scale=2.0) + 0.3
    run_case([N("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)], "y",
             [2, 3, 4, 5], {"x": x, "s": rand(3), "b": rand(3)}, ["x", "s", "b"],
             lambda x, s, b: F.instance_norm(x, weight=s, bias=b, eps=1e-5), atol=2e-5,
             opset=opset)


def test_batch_norm_inference_mode():
    c = 3
    init = {"rm": rand(c), "rv": np.abs(rand(c)) + 0.5}
    nodes = [N("BatchNormalization", ["x", "s", "b", "rm", "rv"], ["y"], epsilon=1e-5)]

    def fn(x, s, b, rm, rv):
        return F.batch_norm(x, rm, rv, s, b, training=False, eps=1e-5)

    run_case(nodes, "y", [2, 3, 4, 4], {"x": rand(2, 3, 4, 4), "s": rand(c), "b": rand(c)},
             ["x", "s", "b"], fn, init=init)


# ---- convolution and pooling -----------------------------------------------------------------


@pytest.mark.parametrize("kw", [
    dict(pads=[1, 1, 1, 1]), dict(strides=[2, 2], pads=[0, 1, 1, 0]),
    dict(group=2, dilations=[2, 1]), dict(auto_pad="SAME_UPPER", strides=[2, 2])])
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d(kw, bias):
    x, w = rand(2, 4, 7, 6), rand(6, 4 // kw.get("group", 1), 3, 3)
    feeds = {"x": x, "w": w}
    ins = ["x", "w"]
    if bias:
        feeds["b"] = rand(6)
        ins.append("b")
    tx = torch.from_numpy(x)
    ref = _torch_conv(kw)
    out_shape = list(ref(tx, torch.from_numpy(w)).shape)
    run_case([N("Conv", ins, ["y"], kernel_shape=[3, 3], **kw)], "y", out_shape, feeds, ins,
             lambda x, w, b=None: ref(x, w, b), atol=5e-5)


def _torch_conv(kw):
    def conv(x, w, b=None):
        strides = kw.get("strides", [1, 1])
        if kw.get("auto_pad") == "SAME_UPPER":
            pads = []
            for n, k, s in zip(x.shape[2:], w.shape[2:], strides, strict=True):
                total = max(0, (math.ceil(n / s) - 1) * s + k - n)
                pads.append((total // 2, total - total // 2))
            x = F.pad(x, (pads[1][0], pads[1][1], pads[0][0], pads[0][1]))
            padding = 0
        else:
            p = kw.get("pads", [0, 0, 0, 0])
            x = F.pad(x, (p[1], p[3], p[0], p[2]))
            padding = 0
        return F.conv2d(x, w, b, stride=strides, padding=padding,
                        dilation=kw.get("dilations", [1, 1]), groups=kw.get("group", 1))

    return conv


def test_conv1d_and_conv_transpose():
    x, w, b = rand(2, 3, 9), rand(4, 3, 3), rand(4)
    run_case([N("Conv", ["x", "w", "b"], ["y"], pads=[1, 1], strides=[2])], "y", [2, 4, 5],
             {"x": x, "w": w, "b": b}, ["x", "w", "b"],
             lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1), atol=3e-5)
    x, w, b = rand(2, 4, 5, 5), rand(4, 3, 3, 3), rand(3)
    ref = F.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w), stride=2, padding=1)
    run_case([N("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])],
             "y", list(ref.shape), {"x": x, "w": w, "b": b}, ["x", "w", "b"],
             lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1), atol=5e-5)


@pytest.mark.parametrize("kw,torch_kw", [
    (dict(kernel_shape=[2, 2], strides=[2, 2]), dict(kernel_size=2, stride=2)),
    (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
     dict(kernel_size=3, stride=2, padding=1)),
    (dict(kernel_shape=[3, 3], strides=[1, 1]), dict(kernel_size=3, stride=1))])
def test_max_pool(kw, torch_kw):
    x = rand(2, 3, 8, 8)
    out = F.max_pool2d(torch.from_numpy(x), **torch_kw)
    run_case([N("MaxPool", ["x"], ["y"], **kw)], "y", list(out.shape), {"x": x}, ["x"],
             lambda x: F.max_pool2d(x, **torch_kw))


@pytest.mark.parametrize("cip", [0, 1])
@pytest.mark.parametrize("kw,torch_kw", [
    (dict(kernel_shape=[2, 2], strides=[2, 2]), dict(kernel_size=2, stride=2)),
    (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
     dict(kernel_size=3, stride=2, padding=1))])
def test_average_pool(kw, torch_kw, cip):
    x = rand(2, 3, 8, 8)
    out = F.avg_pool2d(torch.from_numpy(x), **torch_kw)
    run_case([N("AveragePool", ["x"], ["y"], count_include_pad=cip, **kw)], "y",
             list(out.shape), {"x": x}, ["x"],
             lambda x: F.avg_pool2d(x, count_include_pad=bool(cip), **torch_kw))


def test_global_average_pool():
    run_case([N("GlobalAveragePool", ["x"], ["y"])], "y", [2, 3, 1, 1], {"x": rand(2, 3, 4, 5)},
             ["x"], lambda x: x.mean((2, 3), keepdim=True))


# ---- losses ---------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 2])
def test_softmax_cross_entropy_loss(reduction, weighted, ignore):
    scores = rand(6, 5, scale=2.0)
    labels = np.array([0, 2, 4, 1, 2, 3], dtype=np.int64)
    feeds = {"scores": scores, "labels": labels}
    ins = ["scores", "labels"]
    if weighted:
        feeds["cw"] = np.abs(rand(5)) + 0.1
        ins.append("cw")
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    nodes = [N("SoftmaxCrossEntropyLoss", ins, ["l"], **attrs)]
    out_shape = [6] if reduction == "none" else []

    def fn(scores, labels, cw=None):
        return F.cross_entropy(scores, labels, weight=cw, reduction=reduction,
                               ignore_index=-100 if ignore is None else ignore)

    run_case(nodes, "l", out_shape, feeds, ["scores"], fn)


def test_softmax_cross_entropy_loss_spatial():
    scores, labels = rand(2, 4, 3, 3), np.random.randint(0, 4, (2, 3, 3)).astype(np.int64)
    run_case([N("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["l"])], "l", [],
             {"scores": scores, "labels": labels}, ["scores"],
             lambda scores, labels: F.cross_entropy(scores, labels))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_negative_log_likelihood_loss(reduction, weighted):
    x = rand(5, 4)
    labels = np.array([0, 3, 1, 3, 2], dtype=np.int64)
    feeds = {"x": x, "labels": labels}
    ins = ["x", "labels"]
    if weighted:
        feeds["cw"] = np.abs(rand(4)) + 0.1
        ins.append("cw")
    nodes = [N("LogSoftmax", ["x"], ["lp"], axis=1),
             N("NegativeLogLikelihoodLoss", ["lp"] + ins[1:], ["l"], reduction=reduction,
               ignore_index=1)]

    def fn(x, labels, cw=None):
        return F.nll_loss(torch.log_softmax(x, 1), labels, weight=cw, reduction=reduction,
                          ignore_index=1)

    run_case(nodes, "l", [5] if reduction == "none" else [], feeds, ["x"], fn)


# ---- shapes and indexing ----------------------------------------------------------------------


def test_views_and_transpose():
    x = rand(2, 3, 4)
    init = {"shape": np.asarray([4, 6], np.int64), "ax": np.asarray([0], np.int64)}
    nodes = [N("Reshape", ["x", "shape"], ["r"]), N("Transpose", ["r"], ["t"], perm=[1, 0]),
             N("Unsqueeze", ["t", "ax"], ["u"]), N("Flatten", ["u"], ["f"], axis=1),
             N("Squeeze", ["f", "ax"], ["s"]), N("Transpose", ["s"], ["y"])]
    run_case(nodes, "y", [24], {"x": x}, ["x"], lambda x: x.reshape(4, 6).T.reshape(24),
             init=init)


def test_expand_tile_pad():
    x = rand(3, 1)
    init = {"shape": np.asarray([2, 3, 4], np.int64)}
    run_case([N("Expand", ["x", "shape"], ["y"])], "y", [2, 3, 4], {"x": x}, ["x"],
             lambda x: x.expand(2, 3, 4), init=init)
    x = rand(2, 3)
    run_case([N("Tile", ["x", "reps"], ["y"])], "y", [4, 9], {"x": x}, ["x"],
             lambda x: x.repeat(2, 3), init={"reps": np.asarray([2, 3], np.int64)})
    run_case([N("Pad", ["x", "pads"], ["y"])], "y", [3, 7], {"x": x}, ["x"],
             lambda x: F.pad(x, (1, 3, 0, 1)),
             init={"pads": np.asarray([0, 1, 1, 3], np.int64)})


@pytest.mark.parametrize("static", [True, False])
def test_concat(static):
    a, b = rand(2, 3), rand(2, 5)
    nodes = [N("Concat", ["a", "b"], ["c"], axis=1), N("Mul", ["c", "c"], ["y"])]
    if static:
        run_case(nodes, "y", [2, 8], {"a": a, "b": b}, ["a", "b"],
                 lambda a, b: torch.cat([a, b], 1) ** 2)
        return
    nodes += [N("ReduceSum", ["y"], ["loss"], keepdims=0)]
    model = make_model(nodes, [("a", F32, [2, "A"]), ("b", F32, [2, "B"])], [("loss", F32, [])])
    training = build(model, ["a", "b"])
    ops = [n.op_type for n in training.graph.node]
    assert "ConcatTraining" in ops and "SplitTraining" in ops
    for got in (run_ort(training, {"a": a, "b": b}), run_ours(training, {"a": a, "b": b})):
        np.testing.assert_allclose(got["a_grad"], 2 * a, rtol=1e-6)
        np.testing.assert_allclose(got["b_grad"], 2 * b, rtol=1e-6)


def test_split_with_an_unused_output():
    x = rand(4, 6)
    nodes = [N("Split", ["x", "split"], ["p", "q", "r"], axis=1), N("Mul", ["p", "r"], ["y"])]
    run_case(nodes, "y", [4, 2], {"x": x}, ["x"], lambda x: x[:, :2] * x[:, 4:],
             init={"split": np.asarray([2, 2, 2], np.int64)})


def test_slice_gather_family():
    x = rand(5, 6)
    init = {"st": np.asarray([1, 0], np.int64), "en": np.asarray([4, 6], np.int64),
            "ax": np.asarray([0, 1], np.int64), "sp": np.asarray([2, 2], np.int64)}
    run_case([N("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], "y", [2, 3], {"x": x}, ["x"],
             lambda x: x[1:4:2, 0:6:2], init=init)
    idx = np.array([[0, 4], [4, 2], [0, 0]], dtype=np.int64)
    run_case([N("Gather", ["x", "idx"], ["y"], axis=0)], "y", [3, 2, 6], {"x": x, "idx": idx},
             ["x"], lambda x, idx: x[idx])
    run_case([N("Gather", ["x", "idx"], ["y"], axis=1)], "y", [5, 3, 2], {"x": x, "idx": idx},
             ["x"], lambda x, idx: x[:, idx])
    eidx = np.random.randint(0, 6, (5, 3)).astype(np.int64)
    run_case([N("GatherElements", ["x", "eidx"], ["y"], axis=1)], "y", [5, 3],
             {"x": x, "eidx": eidx}, ["x"], lambda x, eidx: torch.gather(x, 1, eidx))
    nidx = np.array([[0, 1], [4, 5], [0, 1]], dtype=np.int64)
    run_case([N("GatherND", ["x", "nidx"], ["y"])], "y", [3], {"x": x, "nidx": nidx}, ["x"],
             lambda x, nidx: x[nidx[:, 0], nidx[:, 1]])


def test_top_k():
    x = rand(3, 7)
    run_case([N("TopK", ["x", "k"], ["y", "i"], axis=1)], "y", [3, 3], {"x": x}, ["x"],
             lambda x: torch.topk(x, 3, 1).values, init={"k": np.asarray([3], np.int64)})


def test_gather_float64():
    x = rand(5, 3, dtype=np.float64)
    idx = np.array([1, 1, 4], dtype=np.int64)
    run_case([N("Gather", ["x", "idx"], ["y"])], "y", [3, 3], {"x": x, "idx": idx}, ["x"],
             lambda x, idx: x[idx], dtype=F64, atol=1e-12)


# ---- recurrent -------------------------------------------------------------------------------


def _onnx_lstm(x, w, r, b, h0, c0):
    """ONNX LSTM (gate order i, o, f, c) in torch, one direction."""
    hs, h, c = [], h0[0], c0[0]
    wb, rb = b[0].chunk(2)
    for t in range(x.shape[0]):
        g = x[t] @ w[0].T + h @ r[0].T + wb + rb
        i, o, f, cc = g.chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(cc)
        h = torch.sigmoid(o) * torch.tanh(c)
        hs.append(h)
    return torch.stack(hs)[:, None], h[None], c[None]


def _onnx_gru(x, w, r, b, h0, lbr):
    hs, h = [], h0[0]
    wb, rb = b[0].chunk(2)
    wz, wr, wh = w[0].chunk(3)
    rz, rr, rh = r[0].chunk(3)
    bz, br, bh = wb.chunk(3)
    cz, cr, ch = rb.chunk(3)
    for t in range(x.shape[0]):
        z = torch.sigmoid(x[t] @ wz.T + h @ rz.T + bz + cz)
        rr_ = torch.sigmoid(x[t] @ wr.T + h @ rr.T + br + cr)
        if lbr:
            hh = torch.tanh(x[t] @ wh.T + bh + rr_ * (h @ rh.T + ch))
        else:
            hh = torch.tanh(x[t] @ wh.T + (rr_ * h) @ rh.T + ch + bh)
        h = (1 - z) * hh + z * h
        hs.append(h)
    return torch.stack(hs)[:, None], h[None]


@pytest.mark.parametrize("use", ["all", "final_h", "final_c"])
def test_lstm(use):
    S, Bt, In, H = 4, 3, 5, 6
    feeds = {"x": rand(S, Bt, In), "w": rand(1, 4 * H, In, scale=0.4),
             "r": rand(1, 4 * H, H, scale=0.4), "b": rand(1, 8 * H, scale=0.3),
             "h0": rand(1, Bt, H), "c0": rand(1, Bt, H)}
    out = {"all": ("y", [S, 1, Bt, H], 0), "final_h": ("yh", [1, Bt, H], 1),
           "final_c": ("yc", [1, Bt, H], 2)}[use]
    nodes = [N("LSTM", ["x", "w", "r", "b", "", "h0", "c0"], ["y", "yh", "yc"], hidden_size=H)]
    run_case(nodes, out[0], out[1], feeds, list(feeds),
             lambda **kw: _onnx_lstm(**kw)[out[2]], atol=2e-5)


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru(lbr):
    S, Bt, In, H = 4, 3, 5, 6
    feeds = {"x": rand(S, Bt, In), "w": rand(1, 3 * H, In, scale=0.4),
             "r": rand(1, 3 * H, H, scale=0.4), "b": rand(1, 6 * H, scale=0.3),
             "h0": rand(1, Bt, H)}
    nodes = [N("GRU", ["x", "w", "r", "b", "", "h0"], ["y"], hidden_size=H,
               linear_before_reset=lbr)]
    run_case(nodes, "y", [S, 1, Bt, H], feeds, list(feeds),
             lambda **kw: _onnx_gru(**kw, lbr=lbr)[0], atol=2e-5)


@pytest.mark.parametrize("subset", [["x"], ["w"], ["b"]])
def test_partial_gradients_of_multi_output_grad_ops(subset):
    """Only some inputs trainable: the optional outputs of ConvGrad are left out, the
    required ones of LayerNormalizationGrad / BatchNormalizationGrad are named but unused."""
    x, w, b = rand(2, 3, 5, 5), rand(4, 3, 3, 3), rand(4)
    run_case([N("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], "y", [2, 4, 5, 5],
             {"x": x, "w": w, "b": b}, subset,
             lambda x, w, b: F.conv2d(x, w, b, padding=1), atol=3e-5)
    s = {"x": "x", "w": "s", "b": "b"}[subset[0]]
    run_case([N("LayerNormalization", ["x", "s", "b"], ["y"])], "y", [4, 6],
             {"x": rand(4, 6), "s": rand(6), "b": rand(6)}, [s],
             lambda x, s, b: F.layer_norm(x, (6,), s, b), atol=2e-5)
    run_case([N("BatchNormalization", ["x", "s", "b", "rm", "rv"], ["y", "m", "v"],
                training_mode=1)], "y", [6, 4], {"x": rand(6, 4), "s": rand(4), "b": rand(4)},
             [s], lambda x, s, b: F.batch_norm(x, None, None, s, b, training=True),
             init={"rm": np.zeros(4, np.float32), "rv": np.ones(4, np.float32)}, atol=2e-5)


def test_pool_input_with_two_gradient_contributions_ort():
    x = rand(1, 2, 4, 4)
    run_case([N("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
              N("Tanh", ["x"], ["t"]), N("ReduceMean", ["t"], ["m"], axes=[2, 3]),
              N("Add", ["p", "m"], ["y"])], "y", [1, 2, 2, 2], {"x": x}, ["x"],
             lambda x: F.max_pool2d(x, 2) + torch.tanh(x).mean((2, 3), keepdim=True),
             ours=False)


def test_pool_input_with_two_gradient_contributions_ours():
    """The pool's contribution is 'x_grad_1' (summed into x_grad): its shape comes from the
    graph's value_info, not from a '<v>_grad' name."""
    x = rand(1, 2, 4, 4)
    run_case([N("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
              N("Tanh", ["x"], ["t"]), N("ReduceMean", ["t"], ["m"], axes=[2, 3]),
              N("Add", ["p", "m"], ["y"])], "y", [1, 2, 2, 2], {"x": x}, ["x"],
             lambda x: F.max_pool2d(x, 2) + torch.tanh(x).mean((2, 3), keepdim=True))


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool_ceil_mode_and_same_padding(op):
    """ceil_mode windows overhanging the input, and auto_pad SAME_UPPER turned into
    explicit pads for the gradient op (ORT's ignore auto_pad)."""
    x = rand(1, 2, 8, 8)
    fn = F.max_pool2d if op == "MaxPool" else F.avg_pool2d
    extra = {} if op == "MaxPool" else {"count_include_pad": False}
    run_case([N(op, ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)], "y",
             [1, 2, 4, 4], {"x": x}, ["x"],
             lambda x: fn(x, 3, 2, ceil_mode=True, **extra))
    x = rand(1, 2, 7, 7)
    run_case([N(op, ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER")],
             "y", [1, 2, 4, 4], {"x": x}, ["x"],
             lambda x: fn(F.pad(x, (0, 1, 0, 1), value=-1e30 if op == "MaxPool" else 0.0), 2)
             if op == "MaxPool" else _avg_same_upper(x))


def _avg_same_upper(x):
    """2x2/2 average with one padded row and column at the end, not counted."""
    ones = torch.ones_like(x)
    s = F.avg_pool2d(F.pad(x, (0, 1, 0, 1)), 2, divisor_override=1)
    c = F.avg_pool2d(F.pad(ones, (0, 1, 0, 1)), 2, divisor_override=1)
    return s / c
