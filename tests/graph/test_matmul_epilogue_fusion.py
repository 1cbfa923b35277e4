"""MatMul epilogues folded into the GEMM (graph/fusions.py + the MatMul binding): a
constant bias or a residual added through C (beta 1), then Relu; a batched MatMul whose
Transpose keeps the last axis writes the transposed layout itself. Fused vs the unfused
executor (``Executor(fuse=False)``) and vs float64 numpy, float32 and float64, odd sizes,
the small-row pre-packed weight path, the fallbacks (broadcast batch, >2 batch levels);
bmm_strided's interleaved output check."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from ortcpu_torch.graph import InferenceSession
from ortcpu_torch.graph.executor import Executor
from ortcpu_torch.kernels.gemm import bmm_strided

_NP = {TP.FLOAT: np.float32, TP.DOUBLE: np.float64}


def _model(nodes, inputs, out, out_shape, inits, elem):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, elem, s)
                                       for n, s in inputs],
                          [helper.make_tensor_value_info(out, elem, out_shape)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _run_both(m, feeds):
    fused = Executor(m)
    unfused = Executor(m, fuse=False)
    tf = {k: torch.from_numpy(v) for k, v in feeds.items()}
    got = fused.run(tf)
    want = unfused.run(tf)
    plan = fused.plan_for(fused.positional(tf))
    return got, want, plan


@pytest.mark.parametrize("elem", [TP.FLOAT, TP.DOUBLE])
@pytest.mark.parametrize("a_shape", [[3, 5, 7], [13, 7], [2, 1, 7], [40, 7]])
@pytest.mark.parametrize("relu", [False, True])
def test_matmul_bias_in_gemm(elem, a_shape, relu):
    t = _NP[elem]
    rng = np.random.default_rng(0)
    w = rng.standard_normal((7, 9)).astype(t)
    bias = rng.standard_normal(9).astype(t)
    nodes = [helper.make_node("MatMul", ["a", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "bias"], ["s" if relu else "y"])]
    if relu:
        nodes.append(helper.make_node("Relu", ["s"], ["y"]))
    m = _model(nodes, [("a", a_shape)], "y", [*a_shape[:-1], 9],
               [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "bias")], elem)
    a = rng.standard_normal(a_shape).astype(t)
    got, want, plan = _run_both(m, {"a": a})
    assert [b.node.op_type for b in plan.bound] == ["MatMul"]
    ref = a.astype(np.float64) @ w.astype(np.float64) + bias
    ref = np.maximum(ref, 0) if relu else ref
    tol = 1e-5 if elem == TP.FLOAT else 1e-12
    np.testing.assert_allclose(got["y"].numpy(), ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(got["y"].numpy(), want["y"].numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("elem", [TP.FLOAT, TP.DOUBLE])
def test_matmul_residual_in_gemm(elem):
    t = _NP[elem]
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["a", "w"], ["mm"]),
             helper.make_node("Add", ["r", "mm"], ["y"])]
    m = _model(nodes, [("a", [2, 5, 6]), ("r", [2, 5, 3])], "y", [2, 5, 3],
               [numpy_helper.from_array(rng.standard_normal((6, 3)).astype(t), "w")], elem)
    feeds = {"a": rng.standard_normal((2, 5, 6)).astype(t),
             "r": rng.standard_normal((2, 5, 3)).astype(t)}
    r_before = feeds["r"].copy()
    got, want, plan = _run_both(m, feeds)
    assert len(plan.bound) == 1
    np.testing.assert_allclose(got["y"].numpy(), want["y"].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(feeds["r"], r_before)  # the feed is not written


def _attention_out(batch, heads, s, d, perm, elem, reshape=True):
    nodes = [helper.make_node("MatMul", ["p", "v"], ["o"]),
             helper.make_node("Transpose", ["o"], ["ot"], perm=perm)]
    shape = [batch, heads, s, d]
    out_shape = [shape[i] for i in perm]
    if reshape:
        nodes.append(helper.make_node("Reshape", ["ot", "shape"], ["y"]))
        out_shape = [batch, s, heads * d]
    inits = [numpy_helper.from_array(np.array([batch, s, heads * d], np.int64), "shape")] \
        if reshape else []
    return _model(nodes, [("p", [batch, heads, s, s]), ("v", [batch, heads, s, d])],
                  "y" if reshape else "ot", out_shape, inits, elem)


@pytest.mark.parametrize("elem", [TP.FLOAT, TP.DOUBLE])
@pytest.mark.parametrize("batch,heads,s,d", [(1, 3, 7, 5), (2, 4, 9, 8), (3, 1, 1, 1)])
def test_matmul_transpose_written_transposed(elem, batch, heads, s, d):
    t = _NP[elem]
    rng = np.random.default_rng(2)
    m = _attention_out(batch, heads, s, d, [0, 2, 1, 3], elem)
    feeds = {"p": rng.random((batch, heads, s, s)).astype(t),
             "v": rng.standard_normal((batch, heads, s, d)).astype(t)}
    got, want, plan = _run_both(m, feeds)
    assert [b.node.op_type for b in plan.bound] == ["MatMul", "Reshape"]
    assert got["y"].is_contiguous()
    ref = (feeds["p"].astype(np.float64) @ feeds["v"]).transpose(0, 2, 1, 3).reshape(
        batch, s, heads * d)
    tol = 1e-5 if elem == TP.FLOAT else 1e-12
    np.testing.assert_allclose(got["y"].numpy(), ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(got["y"].numpy(), want["y"].numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("perm", [[1, 0, 2, 3], [2, 1, 0, 3], [1, 2, 0, 3]])
def test_matmul_transpose_other_perms(perm):
    rng = np.random.default_rng(3)
    m = _attention_out(2, 3, 4, 5, perm, TP.FLOAT, reshape=False)
    feeds = {"p": rng.random((2, 3, 4, 4)).astype(np.float32),
             "v": rng.standard_normal((2, 3, 4, 5)).astype(np.float32)}
    got, want, _ = _run_both(m, feeds)
    ref = (feeds["p"].astype(np.float64) @ feeds["v"]).transpose(perm)
    np.testing.assert_allclose(got["ot"].numpy(), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["ot"].numpy(), want["ot"].numpy(), rtol=1e-5, atol=1e-6)


def test_matmul_transpose_broadcast_batch_falls_back():
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("MatMul", ["p", "v"], ["o"]),
             helper.make_node("Transpose", ["o"], ["y"], perm=[0, 2, 1, 3])]
    m = _model(nodes, [("p", [2, 3, 4, 4]), ("v", [1, 3, 4, 5])], "y", [2, 4, 3, 5], [],
               TP.FLOAT)
    feeds = {"p": rng.random((2, 3, 4, 4)).astype(np.float32),
             "v": rng.standard_normal((1, 3, 4, 5)).astype(np.float32)}
    got, want, _ = _run_both(m, feeds)
    np.testing.assert_allclose(got["y"].numpy(), want["y"].numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bmm_strided_out_interleaved_and_copy_paths(dtype):
    a = torch.randn(2, 3, 6, 4, dtype=dtype)
    b = torch.randn(2, 3, 4, 5, dtype=dtype)
    want = torch.matmul(a.double(), b.double()).to(dtype)
    z = torch.full((2, 6, 3, 5), float("nan"), dtype=dtype)  # heads interleaved per row
    bmm_strided("MatMul", a, b, out=z.permute(0, 2, 1, 3))
    torch.testing.assert_close(z.permute(0, 2, 1, 3), want)
    z = torch.full((3, 5, 2, 6), float("nan"), dtype=dtype)  # columns strided: the copy path
    out = z.permute(2, 0, 3, 1)
    assert bmm_strided("MatMul", a, b, out=out) is out
    torch.testing.assert_close(out, want)


def test_bmm_strided_interleaved_rows_must_not_overlap():
    from ortcpu_torch._native import ffi, native_fn, ptr

    a, b, c = torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.empty(3, 2, 5)
    fn = native_fn("bmm_strided", torch.float32)
    # heads 5 apart inside rows of 10: fine; 4 apart (overlap) or rows of 9: rejected
    for sc1, ldc, ok in ((5, 10, True), (4, 10, False), (5, 9, False)):
        s = ffi.new("int64_t[6]", [0, 12, 0, 20, 0, sc1])
        st = fn(0, 0, 1, 2, 3, 5, 4, 1.0, ptr(a), 4, s, ptr(b), 5, s + 2, ptr(c), ldc, s + 4,
                1)
        assert (st == 0) == ok, (sc1, ldc)


def test_encoder_block_fusions_reported():
    import io
    import warnings

    from tests.conformance.test_graph_conformance import EncoderBlock

    torch.manual_seed(0)
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(EncoderBlock(16, 2, 32).eval(), (torch.randn(2, 5, 16),), f,
                          input_names=["x"], opset_version=17, dynamo=False)
    sess = InferenceSession(f.getvalue())
    x = np.random.default_rng(5).standard_normal((2, 5, 16)).astype(np.float32)
    got = sess.run(None, {"x": x})[0]
    want = Executor(f.getvalue(), fuse=False).run({"x": torch.from_numpy(x)})
    np.testing.assert_allclose(got, next(iter(want.values())).numpy(), rtol=1e-5, atol=1e-5)
    ex = sess.executor
    plan = ex.plan_for(ex.positional({"x": torch.from_numpy(x)}))
    assert any("MatMul+Transpose written transposed" in f for f in plan.fusions)


def _linear_residual_model(elem, a_shape, k, n, identity, weight_t):
    """x + Identity?(a @ W(^T) + bias), bias and x fed (a training graph's Linear and its
    skip connection; torch's exporter writes Dropout(0) as Identity)."""
    nodes = []
    w_name = "w"
    if weight_t:  # a Linear's [n, k] weight read through its Transpose (a view)
        nodes.append(helper.make_node("Transpose", ["wt"], ["w"], perm=[1, 0]))
    nodes += [helper.make_node("MatMul", ["a", w_name], ["mm"]),
              helper.make_node("Add", ["mm", "bias"], ["lin"])]
    if identity:
        nodes.append(helper.make_node("Identity", ["lin"], ["drop"]))
    nodes.append(helper.make_node("Add", ["r", "drop" if identity else "lin"], ["y"]))
    out_shape = [*a_shape[:-1], n]
    ins = [("a", a_shape), ("wt", [n, k]) if weight_t else ("w", [k, n]), ("bias", [n]),
           ("r", out_shape)]
    return _model(nodes, ins, "y", out_shape, [], elem)


@pytest.mark.parametrize("elem", [TP.FLOAT, TP.DOUBLE])
@pytest.mark.parametrize("a_shape,k,n", [([3, 5, 7], 7, 9), ([1, 1, 4], 4, 1), ([33, 17], 17, 3),
                                         ([2, 3, 16], 16, 5)])
@pytest.mark.parametrize("identity", [False, True])
@pytest.mark.parametrize("weight_t", [False, True])
def test_matmul_fed_bias_then_residual_in_gemm(elem, a_shape, k, n, identity, weight_t):
    """A fed [n] bias and then a residual of the output's shape (Identity between them
    dropped): one MatMul node, C = residual + bias, beta 1; the feeds are not written."""
    t = _NP[elem]
    rng = np.random.default_rng(7)
    m = _linear_residual_model(elem, a_shape, k, n, identity, weight_t)
    out_shape = [*a_shape[:-1], n]
    feeds = {"a": rng.standard_normal(a_shape).astype(t),
             "wt" if weight_t else "w": rng.standard_normal((n, k) if weight_t else
                                                             (k, n)).astype(t),
             "bias": rng.standard_normal(n).astype(t),
             "r": rng.standard_normal(out_shape).astype(t)}
    before = {k_: v.copy() for k_, v in feeds.items()}
    got, want, plan = _run_both(m, feeds)
    ops = [b.node.op_type for b in plan.bound]
    assert ops == (["Transpose"] if weight_t else []) + ["MatMul"], ops
    assert any("MatMul+Add(bias)" in f for f in plan.fusions), plan.fusions
    assert any("MatMul+Add(residual)" in f for f in plan.fusions), plan.fusions
    w = feeds["wt"].T if weight_t else feeds["w"]
    ref = feeds["a"].astype(np.float64) @ w.astype(np.float64) + feeds["bias"] + feeds["r"]
    tol = 1e-5 if elem == TP.FLOAT else 1e-12
    np.testing.assert_allclose(got["y"].numpy(), ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(got["y"].numpy(), want["y"].numpy(), rtol=tol, atol=tol)
    for k_, v in feeds.items():
        np.testing.assert_array_equal(v, before[k_])


def test_fed_bias_not_over_the_last_dim_stays_an_add():
    """A fed 1-D addend that is not the output's last dim (it broadcasts into a bigger
    result) is not a bias: the Add stays."""
    rng = np.random.default_rng(8)
    nodes = [helper.make_node("MatMul", ["a", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["y"])]
    m = _model(nodes, [("a", [4, 1]), ("w", [1, 1]), ("b", [3])], "y", [4, 3], [],
               TP.FLOAT)
    feeds = {"a": rng.standard_normal((4, 1)).astype(np.float32),
             "w": rng.standard_normal((1, 1)).astype(np.float32),
             "b": rng.standard_normal(3).astype(np.float32)}
    got, want, plan = _run_both(m, feeds)
    assert [b.node.op_type for b in plan.bound] == ["MatMul", "Add"]
    np.testing.assert_allclose(got["y"].numpy(), want["y"].numpy(), rtol=1e-6)


def test_identity_graph_output_kept_and_readers_rewired():
    """An Identity whose output is a graph output stays; others are dropped and their
    readers read the input (also through a chain of them)."""
    nodes = [helper.make_node("Identity", ["x"], ["i1"]),
             helper.make_node("Identity", ["i1"], ["i2"]),
             helper.make_node("Relu", ["i2"], ["r"]),
             helper.make_node("Identity", ["r"], ["y"])]
    m = _model(nodes, [("x", [2, 3])], "y", [2, 3], [], TP.FLOAT)
    x = np.random.default_rng(9).standard_normal((2, 3)).astype(np.float32)
    got, want, plan = _run_both(m, {"x": x})
    assert [b.node.op_type for b in plan.bound] == ["Relu", "Identity"]
    np.testing.assert_array_equal(got["y"].numpy(), np.maximum(x, 0))
