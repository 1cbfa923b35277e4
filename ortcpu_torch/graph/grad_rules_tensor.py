"""Gradient rules of shape and indexing ops: ORT's GatherGrad, GatherElementsGrad,
GatherNDGrad, SliceGrad and SplitTraining (for ConcatTraining); standard ops for views
(Reshape-likes, Transpose), Expand, Concat, Split, Tile and Pad."""

from __future__ import annotations

import numpy as np

from .grad_rules_base import (
    MS,
    GradientBuildError,
    attr,
    describe,
    grad_rule,
    input_at,
)


@grad_rule("Reshape", "Flatten", "Squeeze", "Unsqueeze", inputs=(0,))
def _view(ctx, node, dy, needs):
    """Views move no data: the gradient is dY in X's shape."""
    x = node.input[0]
    return [ctx.named(ctx.op("Reshape", dy[0], ctx.shape_of(x), hint=f"{x}_grad"), x)]


@grad_rule("Transpose")
def _transpose(ctx, node, dy, needs):
    x = node.input[0]
    perm = attr(node, "perm")
    if perm is None:
        rank = ctx.values.rank(x)
        if rank is None:
            raise GradientBuildError(f"{describe(node)}: Transpose without perm needs the "
                                     "rank of its input, which is unknown")
        perm = list(reversed(range(rank)))
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return [ctx.named(ctx.op("Transpose", dy[0], perm=inverse, hint=f"{x}_grad"), x)]


@grad_rule("Expand", inputs=(0,))
def _expand(ctx, node, dy, needs):
    x = node.input[0]
    return [ctx.reduce_to(dy[0], ctx.values.shape(node.output[0]), x)]


def _axis_sizes(ctx, names, axis_attr) -> list[int] | None:
    sizes = []
    for n in names:
        s = ctx.values.shape(n)
        if s is None:
            return None
        d = s[axis_attr % len(s)]
        if not isinstance(d, int):
            return None
        sizes.append(d)
    return sizes


@grad_rule("Concat")
def _concat(ctx, node, dy, needs):
    """Split dY back along the axis: Split with static sizes, or (when the sizes are only
    known at run time) the forward becomes ConcatTraining and the gradient SplitTraining
    on its per_input_length."""
    if len(node.input) == 1:
        return [dy[0]]
    axis = int(attr(node, "axis"))
    sizes = _axis_sizes(ctx, node.input, axis)
    outs = [ctx.fresh(f"{x}_grad") if w else ctx.fresh(f"{x}_grad_unused")
            for x, w in zip(node.input, needs, strict=True)]
    if sizes is not None:
        ctx.emit("Split", [dy[0], ctx.ints(sizes, "split")], outs, axis=axis)
    else:
        node.op_type, node.domain = "ConcatTraining", MS
        lengths = ctx.forward_output(node, 1, f"{node.output[0]}_per_input_length")
        ctx.emit("SplitTraining", [dy[0], lengths], outs, domain=MS, axis=axis)
    return [ctx.named(o, x) if w else None
            for o, x, w in zip(outs, node.input, needs, strict=True)]


@grad_rule("ConcatTraining", domain=MS, outputs=(0,))
def _concat_training(ctx, node, dy, needs):
    axis = int(attr(node, "axis"))
    lengths = ctx.forward_output(node, 1, f"{node.output[0]}_per_input_length")
    outs = [ctx.fresh(f"{x}_grad") for x in node.input]
    ctx.emit("SplitTraining", [dy[0], lengths], outs, domain=MS, axis=axis)
    return [ctx.named(o, x) if w else None
            for o, x, w in zip(outs, node.input, needs, strict=True)]


@grad_rule("Split", inputs=(0,))
def _split(ctx, node, dy, needs):
    """Concat the outputs' gradients (zeros for outputs nothing differentiates)."""
    x = node.input[0]
    axis = int(attr(node, "axis", 0))
    parts = [g if g is not None else ctx.zeros_like(o)
             for g, o in zip(dy, node.output, strict=True)]
    return [ctx.named(ctx.op("Concat", *parts, axis=axis, hint=f"{x}_grad"), x)]


@grad_rule("Slice", inputs=(0,))
def _slice(ctx, node, dy, needs):
    x = node.input[0]
    ins = [dy[0], ctx.shape_of(x)] + list(node.input[1:])
    return [ctx.named(ctx.op("SliceGrad", *ins, domain=MS, hint=f"{x}_grad"), x)]


@grad_rule("Gather", inputs=(0,))
def _gather(ctx, node, dy, needs):
    x, idx = node.input
    dx = ctx.op("GatherGrad", ctx.shape_of(x), idx, dy[0], domain=MS, hint=f"{x}_grad",
                axis=int(attr(node, "axis", 0)))
    return [ctx.named(dx, x)]


@grad_rule("ShrunkenGather", domain=MS, inputs=(0,))
def _shrunken_gather(ctx, node, dy, needs):
    return _gather(ctx, node, dy, needs)


@grad_rule("GatherElements", inputs=(0,))
def _gather_elements(ctx, node, dy, needs):
    x, idx = node.input
    dx = ctx.op("GatherElementsGrad", dy[0], ctx.shape_of(x), idx, domain=MS,
                hint=f"{x}_grad", axis=int(attr(node, "axis", 0)))
    return [ctx.named(dx, x)]


@grad_rule("TopK", inputs=(0,), outputs=(0,))
def _top_k(ctx, node, dy, needs):
    """The values went where the Indices output says: GatherElementsGrad scatters back."""
    x = node.input[0]
    indices = ctx.forward_output(node, 1, f"{node.output[0]}_indices")
    dx = ctx.op("GatherElementsGrad", dy[0], ctx.shape_of(x), indices, domain=MS,
                hint=f"{x}_grad", axis=int(attr(node, "axis", -1)))
    return [ctx.named(dx, x)]


@grad_rule("GatherND", inputs=(0,))
def _gather_nd(ctx, node, dy, needs):
    x, idx = node.input
    dx = ctx.op("GatherNDGrad", ctx.shape_of(x), idx, dy[0], domain=MS, hint=f"{x}_grad",
                batch_dims=int(attr(node, "batch_dims", 0)))
    return [ctx.named(dx, x)]


def _scatter(ctx, node, dy, needs, gather_op: str, **gather_attrs):
    """ScatterElements / ScatterND: the scattered positions of data were overwritten (their
    gradient is 0, or dY for reduction="add"); updates get dY gathered back."""
    data, indices, updates = node.input
    reduction = attr(node, "reduction", b"none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction not in ("none", "add"):
        raise GradientBuildError(f"{describe(node)}: {node.op_type} with reduction="
                                 f"{reduction!r} has no gradient rule")
    dd = du = None
    if needs[0]:
        if reduction == "add":
            dd = dy[0]
        else:
            dd = ctx.op(node.op_type, dy[0], indices, ctx.zeros_like(updates),
                        hint=f"{data}_grad", **gather_attrs)
        dd = ctx.named(dd, data)
    if needs[2]:
        du = ctx.named(ctx.op(gather_op, dy[0], indices, hint=f"{updates}_grad",
                              **gather_attrs), updates)
    return [dd, None, du]


@grad_rule("ScatterElements", inputs=(0, 2))
def _scatter_elements(ctx, node, dy, needs):
    return _scatter(ctx, node, dy, needs, "GatherElements", axis=int(attr(node, "axis", 0)))


@grad_rule("ScatterND", inputs=(0, 2))
def _scatter_nd(ctx, node, dy, needs):
    return _scatter(ctx, node, dy, needs, "GatherND")


@grad_rule("Trilu", inputs=(0,))
def _trilu(ctx, node, dy, needs):  # a mask: the same triangle of dY
    x = node.input[0]
    k = input_at(node, 1)
    out = ctx.op("Trilu", dy[0], *([k] if k else []), upper=int(attr(node, "upper", 1)),
                 hint=f"{x}_grad")
    return [ctx.named(out, x)]


@grad_rule("Tile", inputs=(0,))
def _tile(ctx, node, dy, needs):
    """Reshape dY [r0·d0, r1·d1, ...] to [r0, d0, r1, d1, ...] and sum the r axes
    (static shapes only)."""
    x, repeats = node.input
    shape = ctx.values.static_shape(x)
    reps = ctx.constant_value(repeats)
    if shape is None or reps is None:
        raise GradientBuildError(f"{describe(node)}: the Tile gradient needs a static input "
                                 "shape and constant repeats")
    split = []
    for r, d in zip(reps.reshape(-1).tolist(), shape, strict=True):
        split += [int(r), d]
    summed = ctx.op("ReduceSum", ctx.op("Reshape", dy[0], ctx.ints(split)),
                    ctx.ints(list(range(0, 2 * len(shape), 2))), keepdims=0, hint=f"{x}_grad")
    return [ctx.named(summed, x)]


@grad_rule("Pad", inputs=(0,))
def _pad(ctx, node, dy, needs):
    """Constant-mode Pad with constant, non-negative pads: slice the padding off dY."""
    x = node.input[0]
    mode = attr(node, "mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    pads = ctx.constant_value(input_at(node, 1))
    if mode != "constant" or pads is None or (pads < 0).any():
        raise GradientBuildError(f"{describe(node)}: the Pad gradient supports constant "
                                 "mode with constant non-negative pads only")
    pads = pads.reshape(-1).astype(np.int64)
    axes_in = input_at(node, 3)
    rank = ctx.values.rank(x)
    if axes_in:
        axes = ctx.constant_value(axes_in)
        if axes is None or rank is None:
            raise GradientBuildError(f"{describe(node)}: Pad with run-time axes")
        axes = [int(a) % rank for a in axes.reshape(-1)]
    else:
        axes = list(range(len(pads) // 2))
    n = len(axes)
    starts = pads[:n].tolist()
    ends = [-int(e) if e else np.iinfo(np.int64).max for e in pads[n:]]
    out = ctx.op("Slice", dy[0], ctx.ints(starts), ctx.ints(ends), ctx.ints(axes),
                 hint=f"{x}_grad")
    return [ctx.named(out, x)]
