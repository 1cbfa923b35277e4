"""Tensor-manipulation kernels (spec §9, §10.1): Gather / GatherElements / GatherND and
their gradients, Slice and SliceGrad, Split / SplitTraining, Concat / ConcatTraining,
ReduceSumTraining, BroadcastGradientArgs.

Indices are checked before anything is allocated: an index outside ``[-dim, dim-1]``
raises ``ValueError`` naming the argument, the index value and its position (negative
indices wrap). The native gather/scatter kernels check again before writing.

Gather / GatherND / GatherElements and their gradients run on float32/float64 data
(forward gathers also on any other 4- or 8-byte dtype, moved bit for bit); Slice, Split
and Concat copy any dtype. ReduceSumTraining sums float32/float64 natively (float32
accumulated in double); int32/int64 data is summed with torch.
"""

from __future__ import annotations

import math

import torch

from .._native import empty, ffi, lib, native_fn
from ._checks import (
    FLOATS,
    check_status,
    cpu_tensor,
    float_input,
    fmt_shape,
    get_num_threads,
    int_attr,
    normalize_axis,
    same_dtype,
)
from ._registry import register

INTS = (torch.int32, torch.int64)


# ---- helpers ----------------------------------------------------------------------


def _tensor(op: str, name: str, t) -> torch.Tensor:
    t = cpu_tensor(op, name, t)
    return t if t.is_contiguous() else t.contiguous()


def _index_input(op: str, name: str, t, dtypes=INTS) -> torch.Tensor:
    """An int32/int64 tensor as contiguous int64."""
    t = _tensor(op, name, t)
    if t.dtype not in dtypes:
        allowed = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{op}: {name} must be {allowed}, got {str(t.dtype).replace('torch.', '')}")
    return t.to(torch.int64).contiguous()


def _int_list(op: str, name: str, v, rank1: bool = True) -> list[int]:
    """A 1-D int tensor or a sequence of ints as a Python list."""
    if isinstance(v, torch.Tensor):
        if v.dtype not in INTS:
            raise TypeError(f"{op}: {name} must be an int32/int64 tensor, got {v.dtype}")
        if rank1 and v.dim() != 1:
            raise ValueError(f"{op}: {name} must be 1-D, got shape {fmt_shape(v)}")
        return [int(x) for x in v.reshape(-1).tolist()]
    if isinstance(v, (list, tuple, torch.Size)):
        out = []
        for x in v:
            if isinstance(x, bool) or not isinstance(x, int):
                raise TypeError(f"{op}: {name} must contain ints, got {type(x).__name__}")
            out.append(int(x))
        return out
    raise TypeError(f"{op}: {name} must be a 1-D int64 tensor or a sequence of ints, "
                    f"got {type(v).__name__}")


def _shape_input(op: str, name: str, v) -> list[int]:
    shape = _int_list(op, name, v)
    if any(s < 0 for s in shape):
        raise ValueError(f"{op}: {name} must hold non-negative sizes, got {shape}")
    return shape


def check_index_range(op: str, name: str, idx: torch.Tensor, dim: int) -> None:
    """ValueError naming the first index outside [-dim, dim-1] and its position."""
    if idx.numel() == 0:
        return
    bad = (idx < -dim) | (idx >= dim)
    if bool(bad.any()):
        flat = int(torch.nonzero(bad.reshape(-1))[0, 0])
        pos = tuple(int(p) for p in torch.unravel_index(torch.tensor(flat), idx.shape)) \
            if idx.dim() else ()
        raise ValueError(
            f"{op}: {name} holds index {int(idx.reshape(-1)[flat])} at position {pos}, "
            f"out of range for a dimension of size {dim} (valid: [{-dim}, {dim - 1}])"
        )


def _ip(t: torch.Tensor):
    return ffi.cast("int64_t *", t.data_ptr())


def _vp(t: torch.Tensor, offset_elems: int = 0):
    return ffi.cast("char *", t.data_ptr() + offset_elems * t.element_size())


_BITS = {4: torch.float32, 8: torch.float64}


def _as_float_bits(op: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """Float tensors as they are; other 4/8-byte dtypes viewed bit for bit (data movement
    only: the native gather is a memcpy)."""
    if t.dtype in FLOATS:
        return t
    if t.dtype.is_complex or t.element_size() not in _BITS:
        raise TypeError(f"{op}: {name} dtype {t.dtype} is not supported "
                        "(float32/float64 or another 4- or 8-byte type)")
    return t.view(_BITS[t.element_size()])


def strided_copy(src: torch.Tensor, src_offset: int, dst: torch.Tensor, dst_offset: int,
                 shape, src_strides, dst_strides) -> None:
    """dst[dst_offset + i·dst_strides] = src[src_offset + i·src_strides] over ``shape``."""
    nd = len(shape)
    c_shape = ffi.new("int64_t[]", list(shape) or [1])
    c_ss = ffi.new("int64_t[]", list(src_strides) or [1])
    c_ds = ffi.new("int64_t[]", list(dst_strides) or [1])
    st = lib.ortcpu_strided_copy(
        _vp(src, src_offset), _vp(dst, dst_offset), nd, c_shape, c_ss, c_ds,
        src.element_size(), get_num_threads())
    check_status(st, "strided_copy")


def _prod(xs) -> int:
    return math.prod(int(x) for x in xs)


def _gather_rows(op, x, idx, outer, dim, n, inner, out_shape):
    y = empty(out_shape, x.dtype)
    xb = _as_float_bits(op, "data", x)
    yb = y.view(xb.dtype) if y.dtype != xb.dtype else y
    st = native_fn("gather_rows", xb.dtype)(
        ffi.cast("float *" if xb.dtype == torch.float32 else "double *", xb.data_ptr()),
        _ip(idx), ffi.cast("float *" if xb.dtype == torch.float32 else "double *",
                           yb.data_ptr()),
        outer, dim, n, inner, get_num_threads())
    check_status(st, op)
    return y


def _scatter_add_rows(op, dy, idx, outer, dim, n, inner, out_shape):
    dx = empty(out_shape, dy.dtype)
    cast = "float *" if dy.dtype == torch.float32 else "double *"
    st = native_fn("scatter_add_rows", dy.dtype)(
        ffi.cast(cast, dy.data_ptr()), _ip(idx), ffi.cast(cast, dx.data_ptr()),
        outer, dim, n, inner, get_num_threads())
    check_status(st, op)
    return dx


# ---- Gather / GatherGrad -------------------------------------------------------------


@register
def Gather(data, indices, axis: int = 0):
    """ONNX Gather: ``data`` indexed along ``axis`` by ``indices`` (negative wraps).
    Output shape ``data.shape[:axis] + indices.shape + data.shape[axis+1:]``."""
    op = "Gather"
    data = _tensor(op, "data", data)
    idx = _index_input(op, "indices", indices)
    if data.dim() == 0:
        raise ValueError(f"{op}: data must have rank >= 1, got shape ()")
    ax = normalize_axis(op, axis, data.dim())
    dim = data.shape[ax]
    check_index_range(op, "indices", idx, dim)
    _as_float_bits(op, "data", data)
    out_shape = tuple(data.shape[:ax]) + tuple(idx.shape) + tuple(data.shape[ax + 1:])
    return _gather_rows(op, data, idx.reshape(-1), _prod(data.shape[:ax]), dim, idx.numel(),
                        _prod(data.shape[ax + 1:]), out_shape)


@register
def GatherGrad(shape, indices, dY, axis: int = 0):
    """com.microsoft GatherGrad: zeros of ``shape`` with ``dY`` scatter-added at the
    gathered positions along ``axis`` (duplicates accumulate, negative indices wrap,
    out-of-range indices raise). Inputs: shape (int64), indices, dY. Output: dX."""
    op = "GatherGrad"
    shp = _shape_input(op, "shape", shape)
    idx = _index_input(op, "indices", indices)
    dY = float_input(op, "dY", dY)
    if len(shp) == 0:
        raise ValueError(f"{op}: shape must have rank >= 1, got []")
    ax = normalize_axis(op, axis, len(shp))
    want = tuple(shp[:ax]) + tuple(idx.shape) + tuple(shp[ax + 1:])
    if tuple(dY.shape) != want:
        raise ValueError(f"{op}: dY must have shape {want} (shape[:axis] + indices.shape + "
                         f"shape[axis+1:]), got {fmt_shape(dY)}")
    check_index_range(op, "indices", idx, shp[ax])
    return _scatter_add_rows(op, dY, idx.reshape(-1), _prod(shp[:ax]), shp[ax], idx.numel(),
                             _prod(shp[ax + 1:]), tuple(shp))


# ---- GatherElements ----------------------------------------------------------------


def _elements_linear(op, shp, idx, ax):
    """Linear offsets into a contiguous tensor of ``shp`` for GatherElements' indices."""
    rank = len(shp)
    if idx.dim() != rank:
        raise ValueError(f"{op}: indices must have the rank of the data ({rank}), "
                         f"got shape {fmt_shape(idx)}")
    for k in range(rank):
        if k != ax and idx.shape[k] > shp[k]:
            raise ValueError(f"{op}: indices.shape[{k}]={idx.shape[k]} exceeds the data's "
                             f"size {shp[k]} on that axis")
    check_index_range(op, "indices", idx, shp[ax])
    strides = [_prod(shp[k + 1:]) for k in range(rank)]
    lin = torch.where(idx < 0, idx + shp[ax], idx) * strides[ax]
    for k in range(rank):
        if k == ax:
            continue
        view = [1] * rank
        view[k] = idx.shape[k]
        lin = lin + torch.arange(idx.shape[k], dtype=torch.int64).view(view) * strides[k]
    return lin.reshape(-1).contiguous()


@register
def GatherElements(data, indices, axis: int = 0):
    """ONNX GatherElements: ``out[i] = data[i with i[axis] replaced by indices[i]]``."""
    op = "GatherElements"
    data = _tensor(op, "data", data)
    idx = _index_input(op, "indices", indices)
    if data.dim() == 0:
        raise ValueError(f"{op}: data must have rank >= 1, got shape ()")
    ax = normalize_axis(op, axis, data.dim())
    _as_float_bits(op, "data", data)
    lin = _elements_linear(op, list(data.shape), idx, ax)
    return _gather_rows(op, data, lin, 1, data.numel(), lin.numel(), 1, tuple(idx.shape))


@register
def GatherElementsGrad(dY, shape, indices, axis: int = 0):
    """com.microsoft GatherElementsGrad: zeros of ``shape``, then
    ``dX[i with i[axis] = indices[i]] += dY[i]`` (duplicates accumulate)."""
    op = "GatherElementsGrad"
    dY = float_input(op, "dY", dY)
    shp = _shape_input(op, "shape", shape)
    idx = _index_input(op, "indices", indices)
    if len(shp) == 0:
        raise ValueError(f"{op}: shape must have rank >= 1, got []")
    ax = normalize_axis(op, axis, len(shp))
    if dY.shape != idx.shape:
        raise ValueError(f"{op}: dY must have the shape of indices {fmt_shape(idx)}, "
                         f"got {fmt_shape(dY)}")
    lin = _elements_linear(op, shp, idx, ax)
    return _scatter_add_rows(op, dY, lin, 1, _prod(shp), lin.numel(), 1, tuple(shp))


# ---- GatherND ----------------------------------------------------------------------------


def _nd_rows(op, shp, idx, batch_dims):
    """(row ids, rows per batch * batches, inner, output shape) for GatherND."""
    if isinstance(batch_dims, bool) or not isinstance(batch_dims, int) or batch_dims < 0:
        raise ValueError(f"{op}: batch_dims must be a non-negative int, got {batch_dims!r}")
    rank, q = len(shp), idx.dim()
    if q < 1:
        raise ValueError(f"{op}: indices must have rank >= 1, got shape ()")
    k = idx.shape[-1]
    b = batch_dims
    if b >= q or b + k > rank:
        raise ValueError(f"{op}: need batch_dims < rank(indices) and batch_dims + "
                         f"indices.shape[-1] <= rank(data); got batch_dims={b}, indices "
                         f"{fmt_shape(idx)}, data rank {rank}")
    if tuple(idx.shape[:b]) != tuple(shp[:b]):
        raise ValueError(f"{op}: the first batch_dims={b} dims of indices {fmt_shape(idx)} "
                         f"must equal the data's {tuple(shp[:b])}")
    nb = _prod(shp[:b])
    idx2 = idx.reshape(nb, _prod(idx.shape[b:-1]), k)  # no -1: k or a dim may be 0
    row = torch.zeros(idx2.shape[:2], dtype=torch.int64)
    m = 1
    for j in range(k - 1, -1, -1):
        d = shp[b + j]
        comp = idx2[..., j]
        check_index_range(op, f"indices[..., {j}]", comp, d)
        row = row + torch.where(comp < 0, comp + d, comp) * m
        m *= d
    row = row + torch.arange(nb, dtype=torch.int64).view(nb, 1) * m
    inner = _prod(shp[b + k:])
    out_shape = tuple(idx.shape[:-1]) + tuple(shp[b + k:])
    return row.reshape(-1).contiguous(), nb * m, inner, out_shape


@register
def GatherND(data, indices, batch_dims: int = 0):
    """ONNX GatherND: slices of ``data`` addressed by the last axis of ``indices``."""
    op = "GatherND"
    data = _tensor(op, "data", data)
    idx = _index_input(op, "indices", indices)
    _as_float_bits(op, "data", data)
    rows, dim, inner, out_shape = _nd_rows(op, list(data.shape), idx, batch_dims)
    return _gather_rows(op, data, rows, 1, dim, rows.numel(), inner, out_shape)


@register
def GatherNDGrad(shape, indices, update, batch_dims: int = 0):
    """com.microsoft GatherNDGrad: zeros of ``shape`` with ``update`` added into the slices
    GatherND read (duplicates accumulate). Inputs: shape, indices (int64), update."""
    op = "GatherNDGrad"
    shp = _shape_input(op, "shape", shape)
    idx = _index_input(op, "indices", indices, dtypes=(torch.int64,))
    update = float_input(op, "update", update)
    rows, dim, inner, out_shape = _nd_rows(op, shp, idx, batch_dims)
    if tuple(update.shape) != out_shape:
        raise ValueError(f"{op}: update must have shape {out_shape}, got {fmt_shape(update)}")
    return _scatter_add_rows(op, update, rows, 1, dim, rows.numel(), inner, tuple(shp))


# ---- Slice / SliceGrad -------------------------------------------------------------------


def slice_plan(op: str, shp, starts, ends, axes=None, steps=None):
    """ONNX Slice semantics: per-axis (start, step, count) after clamping."""
    rank = len(shp)
    starts = _int_list(op, "starts", starts)
    ends = _int_list(op, "ends", ends)
    if len(starts) != len(ends):
        raise ValueError(f"{op}: starts and ends must have the same length, got "
                         f"{len(starts)} and {len(ends)}")
    axes = list(range(len(starts))) if axes is None else _int_list(op, "axes", axes)
    steps = [1] * len(starts) if steps is None else _int_list(op, "steps", steps)
    if len(axes) != len(starts) or len(steps) != len(starts):
        raise ValueError(f"{op}: axes and steps must have the length of starts ({len(starts)})")
    plan = [(0, 1, d) for d in shp]
    seen = set()
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        a = normalize_axis(op, a, rank, "axes")
        if a in seen:
            raise ValueError(f"{op}: axes must not repeat, got axis {a} twice")
        seen.add(a)
        if st == 0:
            raise ValueError(f"{op}: steps must be non-zero")
        d = shp[a]
        s = s + d if s < 0 else s
        e = e + d if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
            n = max(0, (e - s + st - 1) // st)
        else:
            s, e = min(max(s, 0), d - 1), min(max(e, -1), d - 1)
            n = max(0, (s - e + (-st) - 1) // (-st))
        plan[a] = (s, st, n)
    return plan


def _slice_view(shp, plan):
    cstr = [_prod(shp[k + 1:]) for k in range(len(shp))]
    offset = sum(s * c for (s, _, n), c in zip(plan, cstr, strict=True) if n > 0)
    strides = [st * c for (_, st, _), c in zip(plan, cstr, strict=True)]
    counts = [n for (_, _, n) in plan]
    return offset, strides, counts


@register
def Slice(data, starts, ends, axes=None, steps=None):
    """ONNX Slice (opset 13 semantics: clamping, negative starts/ends/steps)."""
    op = "Slice"
    data = _tensor(op, "data", data)
    plan = slice_plan(op, list(data.shape), starts, ends, axes, steps)
    offset, strides, counts = _slice_view(list(data.shape), plan)
    y = empty(counts, data.dtype)
    cstr = [_prod(counts[k + 1:]) for k in range(len(counts))]
    strided_copy(data, offset, y, 0, counts, strides, cstr)
    return y


@register
def SliceGrad(dY, shape, starts, ends, axes=None, steps=None):
    """com.microsoft SliceGrad: zeros of ``shape`` with ``dY`` copied into the sliced
    region (negative steps supported, unlike ORT 1.19.2)."""
    op = "SliceGrad"
    dY = float_input(op, "dY", dY)
    shp = _shape_input(op, "shape", shape)
    plan = slice_plan(op, shp, starts, ends, axes, steps)
    offset, strides, counts = _slice_view(shp, plan)
    if list(dY.shape) != counts:
        raise ValueError(f"{op}: dY must have the slice's shape {tuple(counts)}, "
                         f"got {fmt_shape(dY)}")
    dx = empty(shp, dY.dtype)
    dx.zero_()
    cstr = [_prod(counts[k + 1:]) for k in range(len(counts))]
    strided_copy(dY, 0, dx, offset, counts, cstr, strides)
    return dx


# ---- Split / Concat ---------------------------------------------------------------------


def _split_sizes(op, dim, split, num_outputs):
    sizes = [] if split is None else _int_list(op, "split", split)
    if sizes:
        if any(s < 0 for s in sizes):
            raise ValueError(f"{op}: split sizes must be >= 0, got {sizes}")
        if sum(sizes) != dim:
            raise ValueError(f"{op}: split sizes {sizes} must sum to the axis size {dim}")
        if num_outputs is not None and num_outputs != len(sizes):
            raise ValueError(f"{op}: num_outputs={num_outputs} but split has {len(sizes)} "
                             "entries")
        return sizes
    if isinstance(num_outputs, bool) or not isinstance(num_outputs, int) or num_outputs < 1:
        raise ValueError(f"{op}: with an empty split, num_outputs= (a positive int) is "
                         f"required, got {num_outputs!r}")
    if dim % num_outputs:
        raise ValueError(f"{op}: axis size {dim} is not divisible into {num_outputs} equal "
                         "parts")
    return [dim // num_outputs] * num_outputs


def _split(op, x, split, axis, num_outputs):
    x = _tensor(op, "input", x)
    if x.dim() == 0:
        raise ValueError(f"{op}: input must have rank >= 1, got shape ()")
    ax = normalize_axis(op, axis, x.dim())
    dim = x.shape[ax]
    sizes = _split_sizes(op, dim, split, num_outputs)
    outer, inner = _prod(x.shape[:ax]), _prod(x.shape[ax + 1:])
    outs, off = [], 0
    for s in sizes:
        y = empty(tuple(x.shape[:ax]) + (s,) + tuple(x.shape[ax + 1:]), x.dtype)
        strided_copy(x, off * inner, y, 0, (outer, s * inner), (dim * inner, 1),
                     (s * inner, 1))
        outs.append(y)
        off += s
    return tuple(outs)


@register
def Split(input, split=None, axis: int = 0, num_outputs=None):
    """ONNX Split (opset 13+): parts along ``axis`` of sizes ``split`` (an input), or
    ``num_outputs=`` equal parts when ``split`` is absent/empty. Returns a tuple."""
    return _split("Split", input, split, axis, num_outputs)


@register
def SplitTraining(input, split, axis: int = 0, num_outputs=None):
    """com.microsoft SplitTraining: Split with ``split`` as a required (possibly empty)
    int64 input; ``num_outputs=`` gives the count for an empty split. Any dtype (ORT 1.19.2
    fails on double)."""
    return _split("SplitTraining", input, split, axis, num_outputs)


def _concat(op, inputs, axis):
    if len(inputs) == 0:
        raise ValueError(f"{op}: needs at least one input")
    ts = [_tensor(op, f"inputs[{i}]", t) for i, t in enumerate(inputs)]
    ref = ts[0]
    if ref.dim() == 0:
        raise ValueError(f"{op}: inputs must have rank >= 1, got shape ()")
    ax = normalize_axis(op, axis, ref.dim())
    for i, t in enumerate(ts[1:], 1):
        same_dtype(op, "inputs[0]", ref, f"inputs[{i}]", t)
        if t.dim() != ref.dim() or any(
            t.shape[k] != ref.shape[k] for k in range(ref.dim()) if k != ax
        ):
            raise ValueError(f"{op}: inputs[{i}] shape {fmt_shape(t)} does not match "
                             f"inputs[0] {fmt_shape(ref)} outside axis {ax}")
    lens = [t.shape[ax] for t in ts]
    total = sum(lens)
    outer, inner = _prod(ref.shape[:ax]), _prod(ref.shape[ax + 1:])
    y = empty(tuple(ref.shape[:ax]) + (total,) + tuple(ref.shape[ax + 1:]), ref.dtype)
    off = 0
    for t, n in zip(ts, lens, strict=True):
        strided_copy(t, 0, y, off * inner, (outer, n * inner), (n * inner, 1),
                     (total * inner, 1))
        off += n
    return y, lens


@register
def Concat(*inputs, axis: int):
    """ONNX Concat of the (variadic) inputs along ``axis``."""
    return _concat("Concat", inputs, axis)[0]


@register
def ConcatTraining(*inputs, axis: int, needs=None):
    """com.microsoft ConcatTraining: Concat plus ``per_input_length`` (int64, each input's
    extent along ``axis``). Outputs: concat_result, per_input_length."""
    from ._checks import select_outputs

    y, lens = _concat("ConcatTraining", inputs, axis)
    return select_outputs("ConcatTraining", (y, torch.tensor(lens, dtype=torch.int64)), needs)


# ---- ReduceSumTraining ---------------------------------------------------------------------


def sum_axis(t: torch.Tensor, axis: int, op: str = "ReduceSumTraining",
             keepdim: bool = True) -> torch.Tensor:
    """Sum of a contiguous float tensor over one (non-negative) axis, kept as size 1
    unless ``keepdim`` is False; float32 accumulates in double. Not a registry op: also the
    bias gradient of Linear."""
    shp = list(t.shape)
    y = empty(shp[:axis] + [1] * keepdim + shp[axis + 1:], t.dtype)
    ctype = "float *" if t.dtype == torch.float32 else "double *"
    st = native_fn("sum_axis", t.dtype)(
        ffi.cast(ctype, t.data_ptr()), ffi.cast(ctype, y.data_ptr()), _prod(shp[:axis]),
        shp[axis], _prod(shp[axis + 1:]), get_num_threads())
    check_status(st, op)
    return y



@register
def ReduceSumTraining(data, axes, keepdims: int = 1, noop_with_empty_axes: int = 0):
    """com.microsoft ReduceSumTraining: ONNX ReduceSum-13 with ``axes`` as an int64 input
    (empty: all axes, or identity when ``noop_with_empty_axes``). float32 sums accumulate
    in double."""
    op = "ReduceSumTraining"
    data = _tensor(op, "data", data)
    if data.dtype not in FLOATS + INTS:
        raise TypeError(f"{op}: data must be float32, float64, int32 or int64, got {data.dtype}")
    ax = _int_list(op, "axes", axes)
    keepdims = int_attr(op, "keepdims", keepdims, (0, 1))
    noop_with_empty_axes = int_attr(op, "noop_with_empty_axes", noop_with_empty_axes, (0, 1))
    rank = data.dim()
    if not ax:
        if noop_with_empty_axes:
            return data.clone()
        ax = list(range(rank))
    norm = [normalize_axis(op, a, rank, "axes") for a in ax]
    if len(set(norm)) != len(norm):
        raise ValueError(f"{op}: axes must not repeat, got {ax}")
    if data.dtype in INTS:
        out = data.sum(dim=norm, keepdim=True, dtype=data.dtype) if norm else data.clone()
    else:
        out = data
        for a in sorted(norm, reverse=True):
            out = sum_axis(out, a, op)
    if not keepdims:
        out = out.reshape([s for k, s in enumerate(out.shape) if k not in set(norm)])
    return out


# ---- BroadcastGradientArgs -------------------------------------------------------------------


@register
def BroadcastGradientArgs(a_shape, b_shape, needs=None):
    """com.microsoft BroadcastGradientArgs: the output axes along which A's and B's
    gradients must be summed (descending, int64). Outputs: a_axes, b_axes."""
    from ._checks import select_outputs

    op = "BroadcastGradientArgs"
    a = _int_list(op, "a_shape", a_shape)
    b = _int_list(op, "b_shape", b_shape)
    ndim = max(len(a), len(b))
    a_axes, b_axes = [], []
    for k in range(ndim - 1, -1, -1):
        ia, ib = k - (ndim - len(a)), k - (ndim - len(b))
        if ia < 0 or ib < 0:
            (a_axes if ia < 0 else b_axes).append(k)
            continue
        da, db = a[ia], b[ib]
        if da == db:
            continue
        if da == 1:
            a_axes.append(k)
        elif db == 1:
            b_axes.append(k)
        else:
            raise ValueError(f"{op}: broadcast is not possible between {a} and {b} "
                             f"(dims {da} and {db} at output axis {k})")
    outs = (torch.tensor(a_axes, dtype=torch.int64), torch.tensor(b_axes, dtype=torch.int64))
    return select_outputs(op, outs, needs)
