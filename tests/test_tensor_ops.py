"""Tensor-manipulation kernels (spec §9, §10.1) and ``nn.Embedding`` / ``ops.embedding``:
forward ops vs torch indexing, gradients vs torch autograd (they are sums of copies, so
float32 results must be within summation-order error: rtol 1e-6 / atol 1e-6; pure copies
are compared exactly), float64 gradcheck through ``ops.embedding``, odd sizes, negative
indices and steps, non-contiguous inputs, and clear errors for out-of-range indices
(never a write out of bounds; inputs untouched)."""

from __future__ import annotations

import pytest
import torch

from ortcpu_torch import kernels as K
from ortcpu_torch import nn as onn
from ortcpu_torch import ops

from .conftest import assert_close, assert_unchanged, snapshot

SUM32 = {"rtol": 1e-6, "atol": 1e-6}
DT = [torch.float32, torch.float64]


# ---- Gather / GatherGrad --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("n", [1, 7, 33, 70])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_and_grad_vs_torch(dtype, n, axis):
    x = torch.randn(5, n, 3, dtype=dtype)
    dim = x.shape[axis]
    idx = torch.randint(-dim, dim, (4, 2))
    y = K.Gather(x, idx, axis=axis)
    ax = axis % 3
    ref = torch.index_select(x, ax, (idx % dim).reshape(-1)).reshape(
        x.shape[:ax] + idx.shape + x.shape[ax + 1:])
    assert torch.equal(y, ref)
    xl = x.clone().requires_grad_()
    dy = torch.randn_like(ref)
    torch.index_select(xl, ax, (idx % dim).reshape(-1)).reshape(ref.shape).backward(dy)
    got = K.GatherGrad(torch.tensor(x.shape), idx, dy, axis=axis)
    assert_close(got, xl.grad, **SUM32)


def test_gather_non_float_and_scalar_index():
    x = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    assert torch.equal(K.Gather(x, torch.tensor(-1), axis=1), x[:, -1])
    xi = x.to(torch.int32)
    assert torch.equal(K.Gather(xi, torch.tensor([2, 0], dtype=torch.int32)), xi[[2, 0]])


def test_gather_out_of_range_is_a_clear_error():
    x = torch.randn(4, 3)
    idx = torch.tensor([[0, 1], [4, 2]])
    with pytest.raises(ValueError, match=r"index 4 at position \(1, 0\).*size 4"):
        K.Gather(x, idx)
    dy = torch.randn(2, 2, 3)
    before = snapshot(dy, idx)
    with pytest.raises(ValueError, match="index 4"):
        K.GatherGrad(torch.tensor([4, 3]), idx, dy)
    with pytest.raises(ValueError, match="index -5"):
        K.GatherGrad(torch.tensor([4, 3]), torch.tensor([[0, -5], [1, 2]]), dy)
    assert_unchanged(before, [dy, idx])
    with pytest.raises(ValueError, match="dY must have shape"):
        K.GatherGrad(torch.tensor([4, 3]), idx, torch.randn(2, 3))


def test_native_scatter_checks_indices_itself():
    """The native kernel re-checks what it indexes with (no out-of-bounds write even if
    the Python check were bypassed)."""
    from ortcpu_torch._native import KernelError, check_status, ffi, lib

    dy = torch.ones(2, 3)
    dx = torch.zeros(4, 3)
    idx = torch.tensor([1, 9])
    st = lib.ortcpu_scatter_add_rows_f32(
        ffi.cast("float *", dy.data_ptr()), ffi.cast("int64_t *", idx.data_ptr()),
        ffi.cast("float *", dx.data_ptr()), 1, 4, 2, 3, 1)
    with pytest.raises(KernelError, match="INDEX_OUT_OF_RANGE.*index 9"):
        check_status(st, "scatter_add_rows")
    assert torch.equal(dx, torch.zeros(4, 3))


# ---- Embedding ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("padding_idx", [None, 2, -1])
def test_embedding_vs_torch(dtype, padding_idx):
    te = torch.nn.Embedding(11, 37, padding_idx=padding_idx).to(dtype)
    oe = onn.Embedding(11, 37, padding_idx=padding_idx).to(dtype)
    oe.load_state_dict(te.state_dict())
    idx = torch.tensor([[1, 2, 2, 10], [2, 0, 1, 2], [9, 9, 9, 2]])   # repeats accumulate
    yt, yo = te(idx), oe(idx)
    assert torch.equal(yo, yt)
    g = torch.randn_like(yt)
    yt.backward(g)
    yo.backward(g)
    assert_close(oe.weight.grad, te.weight.grad, **SUM32)
    if padding_idx is not None:
        assert torch.count_nonzero(oe.weight.grad[padding_idx % 11]) == 0
        assert torch.count_nonzero(oe.weight[padding_idx % 11]) == 0
    assert list(oe.state_dict()) == ["weight"]


def test_embedding_repeats_accumulate_exactly():
    w = torch.zeros(3, 4, requires_grad=True)
    y = ops.embedding(torch.tensor([1, 1, 1, 2, 1]), w)
    y.backward(torch.ones_like(y))
    assert torch.equal(w.grad, torch.tensor([[0.0] * 4, [4.0] * 4, [1.0] * 4]))


def test_embedding_gradcheck():
    w = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([[0, 5, 5], [3, 1, 2]])
    assert torch.autograd.gradcheck(lambda w: ops.embedding(idx, w), [w])
    # (padding_idx is deliberately not a true gradient -- the row is read but gets none --
    # so it is checked against torch above, not by gradcheck)


@pytest.mark.parametrize("bad", [5, -1, -5, -6])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_embedding_index_out_of_range_is_index_error_like_torch(bad, dtype):
    """Negative indices do not wrap in torch's embedding: IndexError, as torch raises;
    the weight is untouched. (The registry's Gather keeps ONNX's wrapping.)"""
    w = torch.randn(5, 3, requires_grad=True)
    idx = torch.tensor([[0, 1], [bad, 2]], dtype=dtype)
    with pytest.raises(IndexError):
        torch.nn.functional.embedding(idx, w)
    before = w.detach().clone()
    with pytest.raises(IndexError, match=rf"index {bad} at position \(1, 0\).*"
                                         r"num_embeddings 5"):
        ops.embedding(idx, w)
    with pytest.raises(IndexError, match=f"index {bad}"):
        onn.Embedding.from_pretrained(w.detach())(idx)
    assert torch.equal(w.detach(), before) and w.grad is None
    if bad < 0 and bad >= -5:  # the ONNX registry op still wraps it
        assert torch.equal(K.Gather(w.detach(), idx), w.detach()[idx % 5])


def test_embedding_errors():
    oe = onn.Embedding(5, 3)
    with pytest.raises(IndexError, match="index 5 at position"):
        oe(torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="max_norm"):
        onn.Embedding(5, 3, max_norm=1.0)
    with pytest.raises(ValueError, match="max_norm"):
        ops.embedding(torch.tensor([0]), oe.weight, max_norm=1.0)
    with pytest.raises(TypeError, match="int32 or int64"):
        oe(torch.tensor([0.0, 1.0]))


# ---- GatherElements / GatherND -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_gather_elements_vs_torch(dtype, axis):
    x = torch.randn(4, 5, 6, dtype=dtype)
    ishape = [3, 4, 5]
    ishape[axis] = 7
    dim = x.shape[axis]
    idx = torch.randint(-dim, dim, ishape)
    y = K.GatherElements(x, idx, axis=axis)
    ref = torch.gather(x, axis, idx % dim)
    assert torch.equal(y, ref)
    xl = x.clone().requires_grad_()
    dy = torch.randn_like(ref)
    torch.gather(xl, axis, idx % dim).backward(dy)
    assert_close(K.GatherElementsGrad(dy, torch.tensor(x.shape), idx, axis=axis), xl.grad,
                 **SUM32)


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd_vs_reference(batch_dims):
    x = torch.randn(3, 4, 5, 2, dtype=torch.float64)
    if batch_dims == 0:
        idx = torch.tensor([[[0, 1], [2, -1]], [[1, 3], [1, 3]]])      # [2,2,2]
        ref = torch.stack([torch.stack([x[tuple(p.tolist())] for p in row]) for row in idx])
    else:
        idx = torch.tensor([[[1]], [[3]], [[-4]]])                     # [3,1,1]
        ref = torch.stack([x[b, int(idx[b, 0, 0])].unsqueeze(0) for b in range(3)])
    y = K.GatherND(x, idx, batch_dims=batch_dims)
    assert torch.equal(y, ref)
    upd = torch.randn_like(y)
    xl = x.clone().requires_grad_()
    if batch_dims == 0:
        r = torch.stack([torch.stack([xl[tuple(p.tolist())] for p in row]) for row in idx])
    else:
        r = torch.stack([xl[b, int(idx[b, 0, 0])].unsqueeze(0) for b in range(3)])
    r.backward(upd)
    got = K.GatherNDGrad(torch.tensor(x.shape), idx, upd, batch_dims=batch_dims)
    assert_close(got, xl.grad, rtol=1e-12, atol=1e-12)


def test_gather_nd_errors():
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="index 4"):
        K.GatherND(x, torch.tensor([[0, 4]]))
    with pytest.raises(ValueError, match="batch_dims"):
        K.GatherND(x, torch.tensor([[0, 1, 2]]))


# ---- Slice / SliceGrad ---------------------------------------------------------------------------


SLICES = [
    ([1], [5], [0], [1]),
    ([-1], [-100], [1], [-1]),
    ([5, 0], [0, 100], [0, 2], [-2, 3]),
    ([100], [-100], [-1], [-3]),
    ([2], [2], [0], [1]),            # empty
    ([0, 1, 1], [9, 3, 7], [0, 1, 2], [2, 1, 2]),
]


def _torch_slice(x, starts, ends, axes, steps):
    """Reference through Python slices (flip for negative steps)."""
    idx = [slice(None)] * x.dim()
    flips = []
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        d = x.shape[a]
        if st > 0:
            idx[a] = slice(s, e, st)
        else:
            r = list(range(d))[slice(s, e if e >= -d else None, st)] if e >= -d else \
                list(range(d))[slice(s, None, st)]
            idx[a] = torch.tensor(r, dtype=torch.long)
            flips.append(a)
    out = x
    for a in range(x.dim()):
        sl = idx[a]
        if isinstance(sl, torch.Tensor):
            out = out.index_select(a, sl)
        else:
            out = out[(slice(None),) * a + (sl,)]
    return out


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("case", SLICES)
def test_slice_and_grad(dtype, case):
    x = torch.randn(7, 5, 9, dtype=dtype)
    starts, ends, axes, steps = case
    y = K.Slice(x, torch.tensor(starts), torch.tensor(ends), torch.tensor(axes),
                torch.tensor(steps))
    ref = _torch_slice(x, starts, ends, axes, steps)
    assert torch.equal(y, ref)
    xl = x.clone().requires_grad_()
    dy = torch.randn_like(ref)
    _torch_slice(xl, starts, ends, axes, steps).backward(dy)
    got = K.SliceGrad(dy, torch.tensor(x.shape), torch.tensor(starts), torch.tensor(ends),
                      torch.tensor(axes), torch.tensor(steps))
    assert torch.equal(got, xl.grad)


def test_slice_noncontiguous_and_defaults():
    x = torch.randn(6, 8).t()
    assert torch.equal(K.Slice(x, [1, 2], [7, 5]), x[1:7, 2:5])
    with pytest.raises(ValueError, match="steps must be non-zero"):
        K.Slice(x, [0], [1], [0], [0])
    with pytest.raises(ValueError, match="dY must have"):
        K.SliceGrad(torch.randn(3), [6], [0], [2])


# ---- Split / Concat ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_split_concat_roundtrip(dtype, axis):
    x = (torch.randn(6, 9, 4) * 10).to(dtype)
    parts = [1, 0, 2, 3] if x.shape[axis] == 6 else ([4, 5] if x.shape[axis] == 9 else [1, 3])
    outs = K.SplitTraining(x, torch.tensor(parts), axis=axis)
    refs = torch.split(x, parts, dim=axis)
    assert len(outs) == len(refs) and all(torch.equal(a, b) for a, b in zip(outs, refs,
                                                                          strict=True))
    y, lens = K.ConcatTraining(*outs, axis=axis)
    assert torch.equal(y, x) and lens.tolist() == parts
    assert torch.equal(K.Concat(*outs, axis=axis), x)
    eq = K.Split(x, None, axis=axis, num_outputs=x.shape[axis] if x.shape[axis] < 5 else 3)
    assert torch.equal(torch.cat(eq, axis), x)


def test_split_concat_errors():
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match="sum to the axis size"):
        K.SplitTraining(x, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="num_outputs"):
        K.SplitTraining(x, torch.tensor([], dtype=torch.int64))
    with pytest.raises(ValueError, match="divisible"):
        K.SplitTraining(x, torch.tensor([], dtype=torch.int64), axis=1, num_outputs=2)
    with pytest.raises(ValueError, match="does not match"):
        K.Concat(x, torch.randn(4, 2), axis=0)
    with pytest.raises(TypeError, match="dtype"):
        K.Concat(x, x.double(), axis=0)


# ---- ReduceSumTraining / BroadcastGradientArgs ----------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
@pytest.mark.parametrize("axes", [[], [0], [-1], [0, 2], [2, 1, 0]])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_sum_training(dtype, axes, keepdims):
    x = (torch.randn(3, 70, 5) * 10).to(dtype)
    got = K.ReduceSumTraining(x, torch.tensor(axes, dtype=torch.int64), keepdims=keepdims)
    dims = axes or [0, 1, 2]
    ref = x.double().sum(dim=dims, keepdim=bool(keepdims)).to(dtype)
    if dtype == torch.float32:
        assert_close(got, ref, rtol=1e-6, atol=1e-5)
    else:
        assert_close(got, ref, rtol=1e-12, atol=1e-9)
    assert torch.equal(K.ReduceSumTraining(x, torch.tensor([], dtype=torch.int64),
                                           noop_with_empty_axes=1), x)


def test_reduce_sum_nan_inf():
    x = torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]])
    got = K.ReduceSumTraining(x, torch.tensor([0]), keepdims=0)
    assert got[0] == float("inf") and torch.isnan(got[1])


@pytest.mark.parametrize("a,b,ra,rb", [([2, 3, 4], [4], [], [1, 0]),
                                       ([2, 1, 4], [1, 3, 1], [1], [2, 0]),
                                       ([3], [1, 3], [0], []), ([1], [5, 1], [0], [])])
def test_broadcast_gradient_args(a, b, ra, rb):
    ga, gb = K.BroadcastGradientArgs(torch.tensor(a), torch.tensor(b))
    assert ga.tolist() == ra and gb.tolist() == rb and ga.dtype == torch.int64


def test_broadcast_gradient_args_error():
    with pytest.raises(ValueError, match="broadcast is not possible"):
        K.BroadcastGradientArgs(torch.tensor([2, 3]), torch.tensor([4, 3]))


def test_empty_tensors():
    x = torch.randn(0, 4)
    assert K.Gather(x, torch.tensor([], dtype=torch.int64), axis=0).shape == (0, 4)
    assert K.GatherGrad(torch.tensor([3, 0]), torch.tensor([0, 1]),
                        torch.randn(2, 0)).shape == (3, 0)
    assert K.Slice(x, [0], [5]).shape == (0, 4)
    assert K.Concat(x, torch.randn(2, 4), axis=0).shape == (2, 4)


def test_embedding_direct_kernel_path_edge_cases():
    """int32 indices, a non-contiguous weight, empty and 0-d indices, a float index
    tensor rejected by name; gradients vs torch."""
    w = torch.randn(12, 6, dtype=torch.float64)[::2]  # non-contiguous rows
    assert not w.is_contiguous()
    for idx in (torch.tensor([[0, 5], [5, 2]], dtype=torch.int32), torch.tensor(3),
                torch.zeros(0, 3, dtype=torch.int64)):
        a, b = w.clone().requires_grad_(True), w.clone().requires_grad_(True)
        y, y_r = ops.embedding(idx, a), torch.nn.functional.embedding(idx, b)
        torch.testing.assert_close(y, y_r, rtol=0, atol=0)
        dy = torch.randn(y.shape, dtype=torch.float64)
        y.backward(dy)
        y_r.backward(dy)
        torch.testing.assert_close(a.grad, b.grad)
    with pytest.raises(TypeError, match="int32 or int64"):
        ops.embedding(torch.tensor([0.0]), w)
