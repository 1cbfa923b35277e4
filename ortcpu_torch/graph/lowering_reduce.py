"""Reductions, softmax and matrix products.

Opset 17: ReduceSum takes its axes as an input, the other Reduce* ops as an attribute.
"""

from __future__ import annotations

import torch

from .lowering import Lowering, LoweringError, lowers
from .lowering_shape import norm_dim

aten = torch.ops.aten


def _axes(ctx: Lowering, x, dim) -> list[int] | None:
    """Normalized reduction axes; None means all."""
    r = ctx.rank(x)
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted({norm_dim(d, r) for d in dims}) if r else None


def reduce(ctx: Lowering, kind: str, x: str, axes, keepdim: bool) -> str:
    if kind == "ReduceSum":
        inputs = [x] if axes is None else [x, ctx.ints(axes)]
        return ctx.op("ReduceSum", inputs, keepdims=int(keepdim))
    return ctx.op(kind, [x], keepdims=int(keepdim), axes=axes)


def _reduction(kind: str, *, float_out: bool = False):
    def lower(ctx, node, a):
        x = a["self"]
        dt = ctx.out_dtype()
        src = ctx.dtype(x)
        work = dt if (float_out or a.get("dtype") is not None or src == torch.bool) else src
        if kind in ("ReduceMax", "ReduceMin") and src == torch.bool:
            work = torch.int32
        v = ctx.tensor(x, work)
        out = reduce(ctx, kind, v, _axes(ctx, x, a.get("dim")), bool(a.get("keepdim", False)))
        return ctx.cast(out, work, dt)

    return lower


lowers(aten.sum.dim_IntList, aten.sum.default)(_reduction("ReduceSum"))
lowers(aten.mean.dim, aten.mean.default)(_reduction("ReduceMean", float_out=True))
lowers(aten.amax.default)(_reduction("ReduceMax"))
lowers(aten.amin.default)(_reduction("ReduceMin"))
lowers(aten.prod.dim_int, aten.prod.default)(_reduction("ReduceProd"))


@lowers(aten.any.dim, aten.any.dims, aten.any.default, aten.all.dim, aten.all.dims,
        aten.all.default)
def _any_all(ctx, node, a):
    x = a["self"]
    kind = "ReduceMax" if "any" in str(node.target) else "ReduceMin"
    v = ctx.op("Cast", [ctx.tensor(x, torch.bool)], to=6)  # INT32
    out = reduce(ctx, kind, v, _axes(ctx, x, a.get("dim")), bool(a.get("keepdim", False)))
    return ctx.op("Cast", [out], to=9)  # BOOL


@lowers(aten.max.dim, aten.min.dim)
def _max_dim(ctx, node, a):
    """TopK(k=1): values and indices in one node, with a gradient in ORT (TopKGrad)."""
    x = a["self"]
    d = norm_dim(a["dim"], ctx.rank(x))
    vals, idx = ctx.op("TopK", [ctx.v(x), ctx.ints([1])], n_out=2, axis=d,
                       largest=int(node.target is aten.max.dim), sorted=1)
    if not a["keepdim"]:
        vals = ctx.op("Squeeze", [vals, ctx.ints([d])])
        idx = ctx.op("Squeeze", [idx, ctx.ints([d])])
    return vals, idx


@lowers(aten.max.default, aten.min.default)
def _max_all(ctx, node, a):
    kind = "ReduceMax" if node.target is aten.max.default else "ReduceMin"
    return ctx.op(kind, [ctx.v(a["self"])], keepdims=0)


@lowers(aten.argmax.default, aten.argmin.default)
def _argmax(ctx, node, a):
    x = a["self"]
    op = "ArgMax" if node.target is aten.argmax.default else "ArgMin"
    v = ctx.v(x)
    if a["dim"] is None:
        v = ctx.op("Reshape", [v, ctx.ints([-1])])
        out = ctx.op(op, [v], axis=0, keepdims=0)
        if a["keepdim"]:
            out = ctx.op("Reshape", [out, ctx.ints([1] * ctx.rank(x))])
        return out
    return ctx.op(op, [v], axis=norm_dim(a["dim"], ctx.rank(x)), keepdims=int(a["keepdim"]))


@lowers(aten.var.correction, aten.var_mean.correction)
def _var(ctx, node, a):
    x = a["self"]
    dt = ctx.dtype(x)
    axes = _axes(ctx, x, a["dim"])
    keep = bool(a["keepdim"])
    v = ctx.v(x)
    mean = reduce(ctx, "ReduceMean", v, axes, True)
    diff = ctx.op("Sub", [v, mean])
    sq = reduce(ctx, "ReduceSum", ctx.op("Mul", [diff, diff]), axes, keep)
    shape = ctx.shape(x)
    n = 1
    for i in (range(len(shape)) if axes is None else axes):
        if not isinstance(shape[i], int):
            raise LoweringError("var over a symbolic dimension is not supported")
        n *= shape[i]
    corr = 1 if a["correction"] is None else a["correction"]
    var = ctx.op("Div", [sq, ctx.const(max(n - corr, 0), dt)])
    if node.target is aten.var_mean.correction:
        return var, (mean if keep else reduce(ctx, "ReduceMean", v, axes, False))
    return var


@lowers(aten._softmax.default, aten.softmax.int)
def _softmax(ctx, node, a):
    x = a["self"]
    return ctx.op("Softmax", [ctx.tensor(x, ctx.out_dtype())], axis=norm_dim(a["dim"], ctx.rank(x)))


@lowers(aten._log_softmax.default, aten.log_softmax.int)
def _log_softmax(ctx, node, a):
    x = a["self"]
    return ctx.op("LogSoftmax", [ctx.tensor(x, ctx.out_dtype())],
                  axis=norm_dim(a["dim"], ctx.rank(x)))


@lowers(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _mm(ctx, node, a):
    return ctx.op("MatMul", [ctx.v(a["self"]), ctx.v(a["other"] if "other" in a else a["mat2"])])


@lowers(aten.addmm.default)
def _addmm(ctx, node, a):
    return ctx.op("Gemm", [ctx.v(a["mat1"]), ctx.v(a["mat2"]), ctx.v(a["self"])],
                  alpha=float(a["alpha"]), beta=float(a["beta"]))


@lowers(aten.baddbmm.default)
def _baddbmm(ctx, node, a):
    dt = ctx.out_dtype()
    prod = ctx.op("MatMul", [ctx.v(a["batch1"]), ctx.v(a["batch2"])])
    if a["alpha"] != 1:
        prod = ctx.op("Mul", [prod, ctx.const(a["alpha"], dt)])
    if a["beta"] == 0:
        return prod
    bias = ctx.v(a["self"])
    if a["beta"] != 1:
        bias = ctx.op("Mul", [bias, ctx.const(a["beta"], dt)])
    return ctx.op("Add", [bias, prod])
