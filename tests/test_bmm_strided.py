"""The graph executor's batched MatMul reads strided operands in place
(kernels.gemm.strided_layout / bmm_strided): transposed, sliced, head-split and expanded
views vs torch.matmul in float64, and attention-shaped graphs vs onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ortcpu_torch.kernels.gemm import batch_strides, bmm_strided, strided_layout

from .conftest import DTYPES, assert_close


def _views(dtype):
    g = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=dtype)
    qkv = r(2, 9, 3 * 4 * 5)  # [batch, seq, 3·heads·dhead], attention's fused projection
    q = qkv[..., :20].reshape(2, 9, 4, 5).transpose(1, 2)          # [2,4,9,5] row stride 60
    k_t = qkv[..., 20:40].reshape(2, 9, 4, 5).permute(0, 2, 3, 1)  # [2,4,5,9] transposed
    v = qkv[..., 40:].reshape(2, 9, 4, 5).transpose(1, 2)
    yield "q.kT", q, k_t
    yield "p.v", r(2, 4, 9, 9), v
    yield "contiguous", r(3, 6, 7), r(3, 7, 2)
    yield "a transposed", r(3, 7, 6).transpose(1, 2), r(3, 7, 2)
    yield "both transposed", r(3, 7, 6).transpose(1, 2), r(3, 2, 7).transpose(1, 2)
    yield "expanded a (batch stride 0)", r(1, 6, 7).expand(4, 6, 7), r(4, 7, 3)
    yield "size-1 rows/cols", r(3, 1, 7), r(3, 7, 1)
    yield "size-1 batch dims", r(1, 3, 1, 4, 5), r(1, 3, 1, 5, 2)
    yield "column slice", r(2, 5, 10)[..., 3:8], r(2, 5, 4)
    yield "k = 0", r(2, 3, 0), r(2, 0, 4)
    yield "not collapsible batch", r(4, 3, 6, 5).transpose(0, 1), r(3, 4, 5, 2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bmm_strided_matches_torch(dtype):
    for what, a, b in _views(dtype):
        before = (a.clone(), b.clone())
        y = bmm_strided("MatMul", a, b, alpha=0.5)
        want = 0.5 * torch.matmul(a.double(), b.double())
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12,
                                                                               atol=1e-12)
        assert y.is_contiguous()
        assert_close(y, want.to(dtype), **tol, msg=what)
        assert torch.equal(a, before[0]) and torch.equal(b, before[1]), what


def test_layouts_read_attention_views_in_place():
    x = torch.randn(2, 9, 60)
    q = x[..., :20].reshape(2, 9, 4, 5).transpose(1, 2)       # [2, 4, 9, 5]
    kt = x[..., 20:40].reshape(2, 9, 4, 5).permute(0, 2, 3, 1)  # [2, 4, 5, 9]
    assert strided_layout(q) == (False, 60)
    assert strided_layout(kt) == (True, 60)
    y = torch.empty(2, 4, 9, 9)
    assert batch_strides(q.shape[:-2], q, kt, y) == [(2, [540, 540, 324]), (4, [5, 5, 81])]
    assert strided_layout(torch.randn(3, 4, 5)[:, ::2, ::2]) is None
    z = torch.randn(2, 3, 4, 5, 6).permute(1, 0, 2, 3, 4)
    assert batch_strides(z.shape[:-2], z) is None                # three levels


def test_bmm_strided_rejects_overlapping_output():
    from ortcpu_torch._native import ffi, native_fn, ptr

    a, b, c = torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.empty(2, 3, 5)
    s = ffi.new("int64_t[6]", [0, 12, 0, 20, 0, 5])  # output entries 5 apart: overlap
    st = native_fn("bmm_strided", torch.float32)(0, 0, 1, 2, 3, 5, 4, 1.0, ptr(a), 4, s,
                                                 ptr(b), 5, s + 2, ptr(c), 5, s + 4, 1)
    assert st != 0


def test_attention_graph_vs_ort():
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    from ortcpu_torch.graph import InferenceSession

    s, h, d = 11, 3, 6
    nodes = [
        helper.make_node("Split", ["x", "sp"], ["q0", "k0", "v0"], axis=2),
        helper.make_node("Reshape", ["q0", "hs"], ["q1"]),
        helper.make_node("Reshape", ["k0", "hs"], ["k1"]),
        helper.make_node("Reshape", ["v0", "hs"], ["v1"]),
        helper.make_node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["q", "kt"], ["sc"]),
        helper.make_node("Div", ["sc", "scale"], ["sc2"]),
        helper.make_node("Softmax", ["sc2"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"]),
    ]
    inits = [numpy_helper.from_array(np.array([h * d] * 3, np.int64), "sp"),
             numpy_helper.from_array(np.array([2, s, h, d], np.int64), "hs"),
             numpy_helper.from_array(np.array(np.sqrt(d), np.float32), "scale")]
    g = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("x", TP.FLOAT,
                                                                        [2, s, 3 * h * d])],
                          [helper.make_tensor_value_info("o", TP.FLOAT, [2, h, s, d])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    x = np.random.default_rng(1).standard_normal((2, s, 3 * h * d)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = InferenceSession(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
