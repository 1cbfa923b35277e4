"""Conv / pooling / MatMul / Gemm (issue 5) against ONNX Runtime 1.19.2.

ConvGrad (explicit pads: ORT ignores auto_pad, spec §6.1), MaxPoolGrad and AveragePoolGrad
(2-D, output shapes declared in the model, which ORT needs, spec §6.2/6.3) and the forward
ops Conv, MaxPool (with Indices), AveragePool, GlobalAveragePool, GlobalMaxPool, MatMul,
Gemm, all float32. AveragePoolGrad 3-D with overlapping windows is *not* compared (ORT is
wrong there; tests/test_conv_pool.py checks it against torch).

Tolerances: float32 GEMM sums of up to ~300 products in a different order (MLAS vs
OpenBLAS): rtol 1e-4 / atol 1e-4 (measured worst ~4e-6 absolute on O(10) values).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from .ort_harness import check_op  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-4)

CONV = [
    # (N, C, M, group, spatial, kernel, strides, pads, dilations)
    (2, 4, 6, 1, (9, 11), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    (3, 4, 6, 2, (9, 7), (3, 2), (2, 1), (1, 0, 2, 1), (1, 2)),
    (1, 6, 6, 6, (8, 8), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    (2, 3, 4, 1, (17,), (4,), (3,), (2, 1), (2,)),
    (1, 2, 4, 2, (5, 6, 7), (3, 2, 3), (1, 2, 1), (1, 0, 1, 1, 1, 0), (1, 1, 2)),
    # through the Winograd paths (auto choice): F(2x2,3x3), asymmetric pads; F(4x4,3x3)
    (2, 8, 16, 1, (9, 10), (3, 3), (1, 1), (0, 1, 2, 1), (1, 1)),
    (1, 8, 8, 1, (28, 28), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
]


def _conv_out(sp, k, s, p, d):
    r = len(sp)
    return tuple((sp[i] + p[i] + p[r + i] - (d[i] * (k[i] - 1) + 1)) // s[i] + 1
                 for i in range(r))


@pytest.mark.parametrize("case", CONV)
def test_conv_and_convgrad(case):
    n, c, m, g, sp, k, s, p, d = case
    rng = np.random.default_rng(len(sp) * 100 + n)
    x = rng.standard_normal((n, c, *sp)).astype(np.float32)
    w = rng.standard_normal((m, c // g, *k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    attrs = dict(kernel_shape=list(k), strides=list(s), pads=list(p), dilations=list(d),
                 group=g)
    check_op("Conv", [x, w, b], attrs, **TOL)
    out = _conv_out(sp, k, s, p, d)
    dy = rng.standard_normal((n, m, *out)).astype(np.float32)
    check_op("ConvGrad", [dy, x, w], attrs, needs=(True, True, True), **TOL)
    check_op("ConvGrad", [dy, x, w], attrs, needs=(False, True, True), **TOL)


POOL = [
    # (spatial, kernel, strides, pads)
    ((8, 8), (2, 2), (2, 2), (0, 0, 0, 0)),
    ((9, 11), (3, 3), (2, 2), (1, 1, 1, 1)),
    ((10, 9), (3, 2), (1, 2), (1, 0, 1, 0)),
    ((7, 12), (2, 3), (1, 1), (0, 1, 1, 1)),
]


@pytest.mark.parametrize("case", POOL)
def test_maxpool_and_grad(case):
    sp, k, s, p = case
    rng = np.random.default_rng(sum(sp))
    x = rng.standard_normal((2, 3, *sp)).astype(np.float32)
    attrs = dict(kernel_shape=list(k), strides=list(s), pads=list(p))
    res = check_op("MaxPool", [x], attrs, needs=(True, True), output_dtypes=[np.float32,
                                                                             np.int64])
    y, idx = res.ort
    dy = rng.standard_normal(y.shape).astype(np.float32)
    check_op("MaxPoolGrad", [dy, idx], {}, output_dtypes=[np.float32],
             output_shapes=[list(x.shape)], ours_kwargs={"output_shape": list(x.shape)}, **TOL)


@pytest.mark.parametrize("cip", [0, 1])
@pytest.mark.parametrize("case", POOL)
def test_averagepool_and_grad(case, cip):
    sp, k, s, p = case
    rng = np.random.default_rng(sum(sp) + cip)
    x = rng.standard_normal((2, 3, *sp)).astype(np.float32)
    attrs = dict(kernel_shape=list(k), strides=list(s), pads=list(p), count_include_pad=cip)
    res = check_op("AveragePool", [x], attrs, **TOL)
    dy = rng.standard_normal(res.ort[0].shape).astype(np.float32)
    check_op("AveragePoolGrad", [dy], attrs, output_dtypes=[np.float32],
             output_shapes=[list(x.shape)], ours_kwargs={"output_shape": list(x.shape)}, **TOL)


@pytest.mark.parametrize("ceil", [0, 1])
def test_pool_ceil_mode(ceil):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 2, 9, 10)).astype(np.float32)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=ceil)
    check_op("MaxPool", [x], attrs, needs=(True, True), output_dtypes=[np.float32, np.int64],
             **TOL)
    check_op("AveragePool", [x], dict(attrs, count_include_pad=1), **TOL)


def test_global_pools():
    x = np.random.default_rng(3).standard_normal((2, 3, 5, 7)).astype(np.float32)
    check_op("GlobalAveragePool", [x], {}, **TOL)
    check_op("GlobalMaxPool", [x], {}, **TOL)


@pytest.mark.parametrize("sa,sb", [((5, 7), (7, 3)), ((2, 1, 5, 7), (3, 7, 4)),
                                   ((7,), (7, 4)), ((3, 5, 7), (7,))])
def test_matmul(sa, sb):
    rng = np.random.default_rng(len(sa) + len(sb))
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    check_op("MatMul", [a, b], {}, **TOL)


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 1), (0, 1)])
def test_gemm(ta, tb):
    rng = np.random.default_rng(ta * 2 + tb)
    a = rng.standard_normal((20, 30) if ta else (30, 20)).astype(np.float32)
    b = rng.standard_normal((40, 20) if tb else (20, 40)).astype(np.float32)
    c = rng.standard_normal((40,)).astype(np.float32)
    check_op("Gemm", [a, b, c], dict(alpha=0.5, beta=2.0, transA=ta, transB=tb), **TOL)
