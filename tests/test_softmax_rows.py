"""Softmax / LogSoftmax forward over contiguous rows (the AVX2 float32 row of
native/src/softmax_avx2.h and the generic row): every length around the 8- and 32-wide
steps and the 1024-element flush, NaN/inf rows, vs float64 torch and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ortcpu_torch import kernels as K

from .conftest import DTYPES, assert_close

LENGTHS = [1, 2, 7, 8, 9, 31, 32, 33, 40, 127, 128, 129, 1023, 1024, 1025, 2047, 3000]


def _ref(x, log):
    r = torch.log_softmax(x.double(), -1) if log else torch.softmax(x.double(), -1)
    return r


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_every_row_length(dtype, log):
    op = K.LogSoftmax if log else K.Softmax
    for n in LENGTHS:
        x = torch.randn(3, n, dtype=dtype) * 4
        tol = dict(rtol=2e-6, atol=2e-6) if dtype == torch.float32 else dict(rtol=1e-12,
                                                                               atol=1e-12)
        assert_close(op(x), _ref(x, log).to(dtype), **tol, msg=f"n={n}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_rows_with_nan_inf(dtype, log):
    op = K.LogSoftmax if log else K.Softmax
    for n in (5, 8, 37, 1030):
        x = torch.randn(5, n, dtype=dtype)
        x[0, n // 2] = float("nan")          # NaN anywhere: the row is NaN
        x[1, n - 1] = float("inf")           # +inf: inf - inf is NaN, the row is NaN
        x[2, 0] = float("-inf")              # one -inf: that entry 0 (log: -inf)
        x[3, :] = float("-inf")              # all -inf: NaN
        x[4, 1 % n] = -200.0                 # far below the max: 0 / denormal, not NaN
        got, want = op(x), _ref(x, log).to(dtype)
        assert_close(got, want, rtol=2e-6, atol=1e-30, msg=f"n={n}")


def test_softmax_attention_shape_vs_ort():
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto as TP
    from onnx import helper

    from ortcpu_torch.graph import InferenceSession

    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "g",
                          [helper.make_tensor_value_info("x", TP.FLOAT, [2, 3, 17, 133])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [2, 3, 17, 133])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    x = np.random.default_rng(0).standard_normal((2, 3, 17, 133)).astype(np.float32) * 5
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = InferenceSession(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("spread", [80.0, 86.9, 87.0, 87.1, 95.0, 110.0])
def test_softmax_rows_spanning_the_underflow_threshold(spread):
    """The AVX2 row takes an exp without underflow handling when the row spans <= 87
    (max - min), the general one otherwise: both sides of that line vs float64, with the
    smallest entries (normal or denormal) right too."""
    for n in (9, 40, 128, 1030):
        g = torch.Generator().manual_seed(n)
        x = torch.rand(4, n, generator=g) * -spread
        x[:, 0] = 0.0
        x[:, 1] = -spread
        for log in (False, True):
            op = K.LogSoftmax if log else K.Softmax
            assert_close(op(x), _ref(x, log).float(), rtol=2e-6, atol=1e-44,
                         msg=f"n={n} log={log}")


@pytest.mark.parametrize("log", [False, True])
def test_softmax_causal_masked_rows(log):
    """Causally masked attention scores (-inf above the diagonal, as masked_fill leaves
    them), and vectors mixing masked lanes with lanes in the denormal band [-104, -87)
    and below -104: masked entries are exactly 0 (log: -inf), the rest vs float64."""
    op = K.LogSoftmax if log else K.Softmax
    for n in (1, 7, 8, 33, 128, 131):
        g = torch.Generator().manual_seed(n)
        x = torch.randn(n, n, generator=g) * 3
        x = x.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        got = op(x)
        # log-softmax entries near 0 are differences of O(1) terms: absolute tolerance
        assert_close(got, _ref(x, log).float(), rtol=2e-6, atol=1e-6 if log else 1e-44,
                     msg=f"n={n}")
        upper = torch.ones(n, n, dtype=torch.bool).triu(1)
        assert bool((got[upper] == (float("-inf") if log else 0.0)).all())
    x = torch.zeros(3, 40)
    x[0, 1::3] = float("-inf")
    x[1, 1::3], x[1, 2::3] = -95.0, float("-inf")         # denormal band + masked
    x[2, 1::4], x[2, 2::4], x[2, 3::4] = -103.9, -104.5, -150.0  # around the -104 edge
    assert_close(op(x), _ref(x, log).float(), rtol=2e-6, atol=1e-6 if log else 1e-44)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_grad_every_row_length(dtype):
    """SoftmaxGrad_13 over contiguous rows (float32: the AVX2 row's sum(dY * Y) in 32 float
    lanes flushed every 1024 elements, then its scalar tail) and the masked, scaled
    attention gradient that shares that sum, both vs float64."""
    from ortcpu_torch.kernels import activations as kact

    tol = dict(rtol=1e-5, atol=1e-7) if dtype == torch.float32 else dict(rtol=1e-12,
                                                                         atol=1e-14)
    for n in LENGTHS:
        g = torch.Generator().manual_seed(n)
        y = torch.softmax(torch.randn(3, n, generator=g, dtype=torch.float64) * 3, -1)
        dy = torch.randn(3, n, generator=g, dtype=torch.float64)
        want = y * (dy - (dy * y).sum(-1, keepdim=True))
        got = K.SoftmaxGrad_13(dy.to(dtype), y.to(dtype))
        assert_close(got, want.to(dtype), **tol, msg=f"n={n}")
        mask = torch.zeros(1, n, dtype=torch.uint8)
        mask[0, ::3] = 1
        got = kact.masked_softmax_grad_core("MaskedScaledSoftmaxGrad", dy.to(dtype),
                                            y.to(dtype), mask, 1, 0.5)
        assert_close(got, (0.5 * want).masked_fill(mask.bool(), 0.0).to(dtype), **tol,
                     msg=f"masked n={n}")
