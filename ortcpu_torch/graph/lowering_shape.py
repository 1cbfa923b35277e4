"""Shape, view and indexing ATen ops; tensor factories; SymInt sizes.

Views become Reshape/Transpose/Slice/Gather (ONNX has no aliasing; torch.export's
functionalization already removed the mutations through views). A size that is static in the
node's metadata is written as a constant; a symbolic one is built from Shape/Gather/Concat.
"""

from __future__ import annotations

import torch

from .lowering import (
    Lowering,
    LoweringError,
    is_node,
    lowers,
)

aten = torch.ops.aten
INT64_MAX = 2**63 - 1


def norm_dim(d: int, rank: int) -> int:
    if not -max(rank, 1) <= d < max(rank, 1):
        raise LoweringError(f"dim {d} out of range for rank {rank}")
    return d % max(rank, 1)


@lowers(aten.sym_size.int)
def _sym_size(ctx: Lowering, node, a):
    shape = ctx.op("Shape", [ctx.v(a["self"])])
    return ctx.op("Gather", [shape, ctx.const(a["dim"], torch.int64)], axis=0)


@lowers(aten.sym_numel.default)
def _sym_numel(ctx, node, a):
    return ctx.op("Size", [ctx.v(a["self"])])


@lowers(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(ctx, node, a):
    return ctx.op("Reshape", [ctx.v(a["self"]), ctx.shape_of_output(a["size"])])


@lowers(aten.expand.default)
def _expand(ctx, node, a):
    x = a["self"]
    if ctx.static_shape(node) is not None:
        target = ctx.shape_of_output()
    else:  # -1 keeps the input's size: take it from Shape(x)
        sizes = list(a["size"])
        lead = len(sizes) - ctx.rank(x)
        items = []
        for i, s in enumerate(sizes):
            if isinstance(s, int) and s == -1:
                items.append(_dim_value(ctx, x, i - lead))
            else:
                items.append(s)
        target = ctx.int_list(items)
    return ctx.op("Expand", [ctx.v(x), target])


def _dim_value(ctx, x, d):
    s = ctx.shape(x)[d]
    if isinstance(s, int):
        return s
    return ctx.op("Gather", [ctx.op("Shape", [ctx.v(x)]), ctx.const(d, torch.int64)], axis=0)


@lowers(aten.permute.default)
def _permute(ctx, node, a):
    r = ctx.rank(a["self"])
    return ctx.op("Transpose", [ctx.v(a["self"])], perm=[norm_dim(d, r) for d in a["dims"]])


@lowers(aten.t.default, aten.numpy_T.default)
def _t(ctx, node, a):
    r = ctx.rank(a["self"])
    if r < 2:
        return ctx.op("Identity", [ctx.v(a["self"])])
    return ctx.op("Transpose", [ctx.v(a["self"])], perm=list(range(r))[::-1])


@lowers(aten.transpose.int)
def _transpose(ctx, node, a):
    r = ctx.rank(a["self"])
    perm = list(range(r))
    d0, d1 = norm_dim(a["dim0"], r), norm_dim(a["dim1"], r)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return ctx.op("Transpose", [ctx.v(a["self"])], perm=perm)


@lowers(aten.unsqueeze.default)
def _unsqueeze(ctx, node, a):
    d = norm_dim(a["dim"], ctx.rank(a["self"]) + 1)
    return ctx.op("Unsqueeze", [ctx.v(a["self"]), ctx.ints([d])])


@lowers(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(ctx, node, a):
    x = a["self"]
    shape, r = ctx.shape(x), ctx.rank(x)
    if node.target is aten.squeeze.default:
        dims = [i for i, s in enumerate(shape) if isinstance(s, int) and s == 1]
    else:
        raw = a["dim"]
        dims = [raw] if isinstance(raw, int) else list(raw)
        dims = [norm_dim(d, r) for d in dims] if r else []
        dims = [d for d in dims if isinstance(shape[d], int) and shape[d] == 1]
    if not dims:
        return ctx.op("Identity", [ctx.v(x)])
    return ctx.op("Squeeze", [ctx.v(x), ctx.ints(dims)])


@lowers(aten.slice.Tensor)
def _slice(ctx, node, a):
    x = a["self"]
    d = norm_dim(a["dim"], ctx.rank(x))
    start = 0 if a["start"] is None else a["start"]
    end = INT64_MAX if a["end"] is None else a["end"]
    if isinstance(end, int):
        end = min(end, INT64_MAX)
    step = a["step"]
    return ctx.op("Slice", [ctx.v(x), ctx.int_list([start]), ctx.int_list([end]),
                            ctx.ints([d]), ctx.int_list([step])])


@lowers(aten.select.int, aten.index_select.default)
def _select(ctx, node, a):
    # a scalar index (select) drops the dim, a 1-D one (index_select) keeps it: both Gather
    x = a["self"]
    d = norm_dim(a["dim"], ctx.rank(x))
    return ctx.op("Gather", [ctx.v(x), ctx.tensor(a["index"], torch.int64)], axis=d)


@lowers(aten.narrow.default)
def _narrow(ctx, node, a):
    x = a["self"]
    d = norm_dim(a["dim"], ctx.rank(x))
    start = ctx.tensor(a["start"], torch.int64)
    end = ctx.op("Add", [start, ctx.tensor(a["length"], torch.int64)])
    one = ctx.ints([1])
    return ctx.op("Slice", [ctx.v(x), ctx.op("Reshape", [start, one]),
                            ctx.op("Reshape", [end, one]), ctx.ints([d])])


@lowers(aten.cat.default, aten.concat.default)
def _cat(ctx, node, a):
    tensors = [t for t in a["tensors"] if not (ctx.shape(t) == (0,) and ctx.rank(node) > 1)]
    dt = ctx.out_dtype()
    if not tensors:
        return ctx.const(torch.zeros(ctx.static_shape(node), dtype=dt))
    d = norm_dim(a["dim"], ctx.rank(tensors[0]))
    return ctx.op("Concat", [ctx.tensor(t, dt) for t in tensors], axis=d)


@lowers(aten.stack.default)
def _stack(ctx, node, a):
    tensors = a["tensors"]
    d = norm_dim(a["dim"], ctx.rank(tensors[0]) + 1)
    dt = ctx.out_dtype()
    parts = [ctx.op("Unsqueeze", [ctx.tensor(t, dt), ctx.ints([d])]) for t in tensors]
    return ctx.op("Concat", parts, axis=d)


def _split_sizes(ctx, x, d, sizes):
    outs = ctx.op("Split", [ctx.v(x), ctx.ints(sizes)], n_out=len(sizes), axis=d)
    return (outs,) if len(sizes) == 1 else outs


@lowers(aten.split_with_sizes.default, aten.split.Tensor, aten.split.sizes)
def _split(ctx, node, a):
    x = a["self"]
    d = norm_dim(a["dim"], ctx.rank(x))
    outs = ctx.out_meta()
    sizes = [o.shape[d] for o in outs]
    if not all(isinstance(s, int) for s in sizes):
        raise LoweringError("split into symbolic sizes is not supported")
    return _split_sizes(ctx, x, d, sizes)


@lowers(aten.unbind.int)
def _unbind(ctx, node, a):
    x = a["self"]
    d = norm_dim(a["dim"], ctx.rank(x))
    n = ctx.shape(x)[d]
    if not isinstance(n, int):
        raise LoweringError("unbind along a symbolic dimension")
    parts = _split_sizes(ctx, x, d, [1] * n)
    return tuple(ctx.op("Squeeze", [p, ctx.ints([d])]) for p in parts)


@lowers(aten.gather.default)
def _gather(ctx, node, a):
    x = a["self"]
    d = norm_dim(a["dim"], ctx.rank(x))
    return ctx.op("GatherElements", [ctx.v(x), ctx.tensor(a["index"], torch.int64)], axis=d)


def _index_parts(ctx, x, indices):
    """(first indexed dim, [int64 index values]) for adjacent tensor indices."""
    dims = [i for i, t in enumerate(indices) if t is not None]
    if not dims:
        raise LoweringError("index with no index tensors")
    if dims != list(range(dims[0], dims[-1] + 1)):
        raise LoweringError("index with non-adjacent index tensors is not supported")
    for i in dims:
        if ctx.dtype(indices[i]) == torch.bool:
            raise LoweringError("boolean-mask indexing (data-dependent shape) is not supported")
    return dims[0], [ctx.tensor(indices[i], torch.int64) for i in dims]


def _to_front(ctx, x, d, rank):
    if d == 0:
        return ctx.v(x), None
    perm = [d] + [i for i in range(rank) if i != d]
    return ctx.op("Transpose", [ctx.v(x)], perm=perm), perm


def _nonneg(ctx, idx, size):
    """Negative indices wrapped (GatherND/ScatterND need them in range)."""
    size_v = ctx.tensor(size, torch.int64)
    neg = ctx.op("Less", [idx, ctx.const(0, torch.int64)])
    return ctx.op("Where", [neg, ctx.op("Add", [idx, size_v]), idx])


def _bool_mask(ctx, x, indices):
    """The mask of ``x[mask]`` (one boolean index over x's leading dims), else None."""
    present = [t for t in indices if t is not None]
    if len(present) != 1 or ctx.dtype(present[0]) != torch.bool:
        return None
    if indices[0] is None:
        raise LoweringError("boolean-mask indexing after a full slice (x[:, mask]) is not "
                            "supported")
    mask = indices[0]
    if list(ctx.shape(mask)) != list(ctx.shape(x))[:ctx.rank(mask)]:
        raise LoweringError("boolean mask whose shape is not x's leading dims")
    return mask


def _mask_positions(ctx, mask):
    """[nnz, mask rank] int64 positions of the True entries (row-major, as torch)."""
    return ctx.op("Transpose", [ctx.op("NonZero", [ctx.v(mask)])], perm=[1, 0])


@lowers(aten.index.Tensor)
def _index(ctx, node, a):
    x = a["self"]
    indices = list(a["indices"])
    mask = _bool_mask(ctx, x, indices)
    if mask is not None:  # data-dependent length: NonZero + GatherND
        return ctx.op("GatherND", [ctx.v(x), _mask_positions(ctx, mask)])
    first, idx = _index_parts(ctx, x, indices)
    if len(idx) == 1:
        return ctx.op("Gather", [ctx.v(x), idx[0]], axis=first)
    if first != 0:
        raise LoweringError("multi-tensor indexing must start at dim 0")
    shape = ctx.shape(x)
    parts = [ctx.op("Unsqueeze", [_nonneg(ctx, i, shape[k]), ctx.ints([-1])])
             for k, i in enumerate(idx)]
    try:
        bshape = torch.broadcast_shapes(*(ctx.shape(indices[k]) for k in range(len(idx))))
        bshape = [int(s) for s in bshape] + [1]
    except (TypeError, RuntimeError):
        raise LoweringError("multi-tensor indexing with symbolic index shapes") from None
    parts = [ctx.op("Expand", [p, ctx.ints(bshape)]) for p in parts]
    return ctx.op("GatherND", [ctx.v(x), ctx.op("Concat", parts, axis=-1)])


def _masked_put(ctx, x, mask, values, accumulate):
    """``x[mask] = values`` (``+=`` with accumulate): a Where for a single value, else the
    True positions' rows scattered (ScatterND)."""
    dt = ctx.dtype(x)
    vals = ctx.tensor(values, dt)
    if not is_node(values) or ctx.rank(values) == 0:
        extra = ctx.rank(x) - ctx.rank(mask)
        m = ctx.v(mask)
        if extra:
            m = ctx.op("Reshape", [m, ctx.ints(list(ctx.shape(mask)) + [1] * extra)])
        new = ctx.op("Add", [ctx.v(x), vals]) if accumulate else vals
        return ctx.op("Where", [m, new, ctx.v(x)])
    return ctx.op("ScatterND", [ctx.v(x), _mask_positions(ctx, mask), vals],
                  reduction="add" if accumulate else None)


@lowers(aten.index_put.default)
def _index_put(ctx, node, a):
    x = a["self"]
    mask = _bool_mask(ctx, x, list(a["indices"]))
    if mask is not None:
        return _masked_put(ctx, x, mask, a["values"], bool(a["accumulate"]))
    first, idx = _index_parts(ctx, x, list(a["indices"]))
    if len(idx) != 1:
        raise LoweringError("index_put with more than one index tensor is not supported")
    rank = ctx.rank(x)
    data, perm = _to_front(ctx, x, first, rank)
    shape = ctx.shape(x)
    ind = ctx.op("Unsqueeze", [_nonneg(ctx, idx[0], shape[first]), ctx.ints([-1])])
    # values broadcast to index.shape + data.shape[1:] (in the moved-to-front layout)
    vals = ctx.tensor(a["values"], ctx.dtype(x))
    vrank = ctx.rank(a["values"]) if is_node(a["values"]) else 0
    if perm is not None and vrank == rank:
        vals = ctx.op("Transpose", [vals], perm=perm)
    data_shape = ctx.op("Shape", [data])
    upd_shape = ctx.op("Concat", [ctx.op("Shape", [idx[0]]),
                                  ctx.op("Slice", [data_shape, ctx.ints([1]),
                                                   ctx.ints([INT64_MAX])])], axis=0)
    vals = ctx.op("Expand", [vals, upd_shape])
    out = ctx.op("ScatterND", [data, ind, vals],
                 reduction="add" if a["accumulate"] else None)
    if perm is not None:
        inv = [perm.index(i) for i in range(rank)]
        out = ctx.op("Transpose", [out], perm=inv)
    return out


@lowers(aten.scatter.src, aten.scatter.value, aten.scatter_add.default, aten.scatter.reduce,
        aten.scatter.value_reduce)
def _scatter(ctx, node, a):
    x = a["self"]
    d = norm_dim(a["dim"], ctx.rank(x))
    dt = ctx.dtype(x)
    idx = ctx.tensor(a["index"], torch.int64)
    src = a.get("src", a.get("value"))
    if not is_node(src):
        src = ctx.op("Expand", [ctx.const(src, dt), ctx.op("Shape", [idx])])
    else:
        src = ctx.tensor(src, dt)
    reduction = a.get("reduce")
    if node.target is aten.scatter_add.default:
        reduction = "add"
    reduction = {"multiply": "mul"}.get(reduction, reduction)
    return ctx.op("ScatterElements", [ctx.v(x), idx, src], axis=d, reduction=reduction)


# ---- factories -----------------------------------------------------------------------
def _filled(ctx, node, sizes, value, dt):
    static = ctx.static_shape(node)
    if static is not None:
        scalar = ctx.const(value, dt)
        if not static:
            return scalar
        return ctx.op("Expand", [scalar, ctx.ints(static)])
    return ctx.op("Expand", [ctx.tensor(value, dt), ctx.int_list(list(sizes))])


@lowers(aten.full.default)
def _full(ctx, node, a):
    return _filled(ctx, node, a["size"], a["fill_value"], ctx.out_dtype())


@lowers(aten.zeros.default, aten.ones.default, aten.empty.memory_format)
def _zeros_ones(ctx, node, a):
    value = 1 if node.target is aten.ones.default else 0
    return _filled(ctx, node, a["size"], value, ctx.out_dtype())


@lowers(aten.full_like.default, aten.zeros_like.default, aten.ones_like.default,
        aten.empty_like.default)
def _like(ctx, node, a):
    value = {aten.zeros_like.default: 0, aten.ones_like.default: 1,
             aten.empty_like.default: 0}.get(node.target, a.get("fill_value"))
    dt = ctx.out_dtype()
    static = ctx.static_shape(node)
    if static is not None:
        return _filled(ctx, node, static, value, dt)
    return ctx.op("Expand", [ctx.tensor(value, dt), ctx.op("Shape", [ctx.v(a["self"])])])


@lowers(aten.new_full.default, aten.new_zeros.default, aten.new_ones.default,
        aten.new_empty.default)
def _new_filled(ctx, node, a):
    value = {aten.new_zeros.default: 0, aten.new_ones.default: 1,
             aten.new_empty.default: 0}.get(node.target, a.get("fill_value"))
    return _filled(ctx, node, a["size"], value, ctx.out_dtype())


@lowers(aten.scalar_tensor.default)
def _scalar_tensor(ctx, node, a):
    return ctx.const(a["s"], ctx.out_dtype())


@lowers(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(ctx, node, a):
    dt = ctx.out_dtype()
    start = a.get("start", 0)
    end = a["end"]
    step = a.get("step", 1)
    if all(isinstance(v, (int, float)) for v in (start, end, step)):
        return ctx.const(torch.arange(start, end, step, dtype=dt))
    return ctx.op("Range", [ctx.tensor(start, dt), ctx.tensor(end, dt), ctx.tensor(step, dt)])


@lowers(aten.tril.default, aten.triu.default)
def _tril(ctx, node, a):
    upper = 1 if node.target is aten.triu.default else 0
    return ctx.op("Trilu", [ctx.v(a["self"]), ctx.tensor(a["diagonal"], torch.int64)],
                  upper=upper)


@lowers(aten.constant_pad_nd.default)
def _pad(ctx, node, a):
    x = a["self"]
    r = ctx.rank(x)
    pad = list(a["pad"])
    begins, ends = [0] * r, [0] * r
    for i in range(len(pad) // 2):
        begins[r - 1 - i], ends[r - 1 - i] = pad[2 * i], pad[2 * i + 1]
    if any(p < 0 for p in begins + ends):
        raise LoweringError("negative padding is not supported")
    dt = ctx.dtype(x)
    return ctx.op("Pad", [ctx.v(x), ctx.ints(begins + ends), ctx.const(a["value"], dt)])


@lowers(aten.cumsum.default)
def _cumsum(ctx, node, a):
    x = a["self"]
    d = norm_dim(a["dim"], ctx.rank(x))
    dt = ctx.out_dtype()
    return ctx.op("CumSum", [ctx.tensor(x, dt), ctx.const(d, torch.int64)])


@lowers(aten.cumprod.default)
def _cumprod(ctx, node, a):
    """ONNX has no CumProd: a log-depth scan (Hillis-Steele), y ·= y shifted by 1, 2, 4, ...
    along ``dim`` with ones shifted in (Slice + Pad + Mul), exact with zeros and negative
    values, and differentiable through the Mul / Slice / Pad gradients."""
    x = a["self"]
    r = ctx.rank(x)
    d = norm_dim(a["dim"], r) if r else 0
    dt = ctx.out_dtype()
    y = ctx.tensor(x, dt)
    n = ctx.shape(x)[d] if r else 1
    if not isinstance(n, int):
        raise LoweringError("cumprod along a dimension of symbolic size is not supported")
    one = ctx.const(1, dt)
    s = 1
    while s < n:
        head = ctx.op("Slice", [y, ctx.ints([0]), ctx.ints([n - s]), ctx.ints([d])])
        pads = [0] * (2 * r)
        pads[d] = s
        y = ctx.op("Mul", [y, ctx.op("Pad", [head, ctx.ints(pads), one])])
        s *= 2
    return y


@lowers(aten.repeat.default)
def _repeat(ctx, node, a):
    x = a["self"]
    reps = list(a["repeats"])
    v = ctx.v(x)
    extra = len(reps) - ctx.rank(x)
    if extra > 0:
        v = ctx.op("Reshape", [v, ctx.ints([1] * extra + list(ctx.static_shape(x)))])
    return ctx.op("Tile", [v, ctx.int_list(reps)])


@lowers(aten.flip.default)
def _flip(ctx, node, a):
    x = a["self"]
    r = ctx.rank(x)
    v = ctx.v(x)
    for d in a["dims"]:
        d = norm_dim(d, r)
        v = ctx.op("Slice", [v, ctx.ints([-1]), ctx.ints([-INT64_MAX]), ctx.ints([d]),
                             ctx.ints([-1])])
    return v


@lowers(aten.topk.default)
def _topk(ctx, node, a):
    x = a["self"]
    d = norm_dim(a["dim"], ctx.rank(x))
    vals, idx = ctx.op("TopK", [ctx.v(x), ctx.int_list([a["k"]])], n_out=2, axis=d,
                       largest=int(a["largest"]), sorted=int(a["sorted"]))
    return vals, idx
