"""ops.linear / nn.Linear (Gemm kernel) and ops.matmul (batched GEMM) against torch:
float32 forward and gradients (tolerance: sums of up to 70 products of O(1) values,
OpenBLAS vs MKL summation order; measured worst 1.9e-6, checked at 2e-5), float64
gradcheck, transposed and non-contiguous operands, edge shapes, bad input, routing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ortcpu_torch
from ortcpu_torch import nn, ops

TOL32 = dict(rtol=2e-5, atol=2e-5)

# (input shape, out_features)
SHAPES = [((5, 7), 4), ((2, 3, 7), 5), ((7,), 3), ((0, 7), 4), ((1, 1), 1), ((3, 70), 33),
          ((2, 1, 17), 1), ((4, 0), 3)]


def _make(shape, out, dtype, bias):
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    w = torch.randn(out, shape[-1], dtype=dtype, requires_grad=True)
    b = torch.randn(out, dtype=dtype, requires_grad=True) if bias else None
    return x, w, b


@pytest.mark.parametrize("shape,out", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_forward_and_grads_match_torch_float32(shape, out, bias):
    x, w, b = _make(shape, out, torch.float32, bias)
    ins = [t for t in (x, w, b) if t is not None]
    y = ops.linear(x, w, b)
    yt = F.linear(x, w, b)
    torch.testing.assert_close(y, yt, **TOL32)
    dy = torch.randn_like(yt)
    for g, gt in zip(torch.autograd.grad(y, ins, dy), torch.autograd.grad(yt, ins, dy),
                     strict=True):
        torch.testing.assert_close(g, gt, **TOL32)


@pytest.mark.parametrize("shape,out", [((3, 5), 4), ((2, 3, 6), 2), ((5,), 3), ((0, 4), 2)])
@pytest.mark.parametrize("bias", [True, False])
def test_gradcheck_float64(shape, out, bias):
    x, w, b = _make(shape, out, torch.float64, bias)
    assert torch.autograd.gradcheck(lambda x, w, b: ops.linear(x, w, b), (x, w, b))


def test_only_requested_gradients_and_noncontiguous_input():
    x = torch.randn(6, 5).t()  # [5, 6], non-contiguous
    w = torch.randn(3, 6, requires_grad=True)
    b = torch.randn(3)
    y = ops.linear(x, w, b)
    torch.testing.assert_close(y, F.linear(x, w, b), **TOL32)
    (gw,) = torch.autograd.grad(y.sum(), (w,))
    torch.testing.assert_close(gw, x.sum(0).expand(3, 6), **TOL32)


def test_nan_stays_in_its_row():
    x = torch.randn(4, 9)
    x[1, 3] = float("nan")
    y = ops.linear(x, torch.randn(5, 9), torch.randn(5))
    assert torch.isnan(y[1]).all() and not torch.isnan(y[[0, 2, 3]]).any()


@pytest.mark.parametrize("args,exc,match", [
    ((torch.randn(3, 4), torch.randn(4)), ValueError, "weight must be 2-D"),
    ((torch.randn(3, 4), torch.randn(2, 5)), ValueError, "in_features=5"),
    ((torch.randn(3, 4), torch.randn(2, 4), torch.randn(3)), ValueError, "bias must have shape"),
    (([1.0, 2.0], torch.randn(2, 2)), TypeError, "input must be a torch.Tensor"),
    # dtype errors name linear's arguments, not the Gemm kernel's A / B / C
    ((torch.ones(3, 4, dtype=torch.int64), torch.ones(2, 4, dtype=torch.int64)), TypeError,
     "linear: input must be float32 or float64"),
    ((torch.randn(3, 4), torch.randn(2, 4, dtype=torch.float64)), TypeError,
     "linear: weight must have the dtype of input"),
    ((torch.randn(3, 4), torch.randn(2, 4), torch.randn(2, dtype=torch.float64)), TypeError,
     "linear: bias must have the dtype of input"),
])
def test_bad_input_raises_and_leaves_inputs_alone(args, exc, match):
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(exc, match=match):
        ops.linear(*args)
    for a, b in zip(args, before, strict=True):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)


def test_module_matches_torch_linear():
    torch.manual_seed(3)
    ref = torch.nn.Linear(11, 6)
    torch.manual_seed(3)
    ours = nn.Linear(11, 6)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    for k, v in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v)  # same initialisation
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, 11)
    torch.testing.assert_close(ours(x), ref(x), **TOL32)
    nb = nn.Linear(3, 2, bias=False)
    assert nb.bias is None and list(nb.state_dict()) == ["weight"]


# ---- matmul ----------------------------------------------------------------------------

T = torch.Tensor.transpose
MATMUL_CASES = [  # (a, b) builders: plain, [..., m, k] @ [k, n], transposed / permuted views
    lambda r: (r(3, 4), r(4, 5)),
    lambda r: (r(2, 3, 4), r(4, 5)),
    lambda r: (r(2, 3, 17), r(2, 17, 1)),
    lambda r: (r(2, 2, 3, 4), r(2, 2, 4, 5)),
    lambda r: (r(2, 4, 5, 3), T(r(2, 4, 5, 3), -2, -1)),  # q @ k^T, read in place
    lambda r: (T(r(2, 6, 3), -2, -1), r(2, 6, 5)),  # transposed left operand
    lambda r: (r(4, 3, 2, 5).permute(1, 2, 0, 3), r(3, 2, 5, 2)),  # neither layout: copied
    lambda r: (r(5, 7), T(r(6, 7), 0, 1)),  # x @ w^T
    lambda r: (r(0, 3, 4), r(0, 4, 2)),
    lambda r: (r(2, 3, 0), r(2, 0, 4)),
    lambda r: (r(2, 0, 4), r(4, 3)),
]


def _leaves(pair):
    return tuple(t.detach().clone().requires_grad_() for t in pair)


@pytest.mark.parametrize("case", range(len(MATMUL_CASES)))
def test_matmul_matches_torch_float32(case):
    a, b = _leaves(MATMUL_CASES[case](torch.randn))  # clone keeps the (transposed) strides
    assert a.stride() == MATMUL_CASES[case](torch.randn)[0].stride()
    y, yt = ops.matmul(a, b), torch.matmul(a, b)
    torch.testing.assert_close(y, yt, **TOL32)
    dy = torch.randn_like(yt)
    for g, gt in zip(torch.autograd.grad(y, (a, b), dy), torch.autograd.grad(yt, (a, b), dy),
                     strict=True):
        torch.testing.assert_close(g, gt, **TOL32)


@pytest.mark.parametrize("case", [0, 1, 3, 4, 5, 6, 8])
def test_matmul_gradcheck_float64(case):
    a, b = _leaves(MATMUL_CASES[case](lambda *s: torch.randn(*s, dtype=torch.float64)))
    assert torch.autograd.gradcheck(ops.matmul, (a, b))


@pytest.mark.parametrize("a,b,exc,match", [
    (torch.randn(4), torch.randn(4, 3), ValueError, "not implemented"),
    (torch.randn(2, 3, 4), torch.randn(1, 4, 5), ValueError, "not implemented"),
    (torch.randn(3, 4), torch.randn(2, 4, 5), ValueError, "not implemented"),
    (torch.randn(3, 4), torch.randn(5, 3), ValueError, "inner dims differ"),
    (torch.randn(3, 4), [[1.0]], TypeError, "other must be a torch.Tensor"),
    (torch.ones(3, 4, dtype=torch.int32), torch.ones(4, 2, dtype=torch.int32), TypeError,
     "float32 or float64"),
])
def test_matmul_bad_input(a, b, exc, match):
    with pytest.raises(exc, match=match):
        ops.matmul(a, b)


def test_matmul_routed_and_unsupported_shapes_fall_back():
    a, b, v = torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.randn(4)
    with ortcpu_torch.kernels_enabled(fallback="silent") as mode:
        y = a @ b
        y2 = torch.matmul(a, v)  # 1-D operand: torch's matmul runs
        y3 = torch.bmm(a, b)
    torch.testing.assert_close(y, torch.matmul(a, b), **TOL32)
    torch.testing.assert_close(y2, torch.matmul(a, v), rtol=0, atol=0)
    torch.testing.assert_close(y3, torch.bmm(a, b), **TOL32)
    funcs = {f["name"]: f for f in ortcpu_torch.report(mode, file=None).functionals}
    assert funcs["Tensor.matmul"]["calls_ours"] == 1
    assert funcs["torch.matmul"]["calls_torch"] == 1
    assert funcs["torch.bmm"]["calls_ours"] == 1


def test_bias_grad_column_sums_edges():
    """Linear's bias gradient, the axis sum (native tensor.inc): column sums vs float64 at
    block edges (64 columns, 32-row groups), empty and size-1 shapes, both dtypes, and
    with an outer dimension."""
    from ortcpu_torch.kernels import tensor as KT

    for dtype in (torch.float32, torch.float64):
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        for rows, cols in ((0, 5), (1, 1), (3, 0), (31, 63), (33, 64), (65, 65), (2048, 130)):
            dy = torch.randn(rows, cols, dtype=dtype)
            want = dy.double().sum(0).to(dtype)
            torch.testing.assert_close(KT.sum_axis(dy, 0, keepdim=False), want, rtol=tol,
                                       atol=tol * 10)
        x = torch.randn(3, 70, 130, dtype=dtype)
        torch.testing.assert_close(KT.sum_axis(x, 1), x.double().sum(1, keepdim=True).to(dtype),
                                   rtol=tol, atol=tol * 10)
