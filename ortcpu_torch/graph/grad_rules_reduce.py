"""Gradient rules of the Reduce* ops (axes as attribute or input, keepdims, noop): the
gradient broadcast back with Expand, times what each reduction's derivative is."""

from __future__ import annotations

import numpy as np

from .grad_rules_base import attr, grad_rule, input_at

_AXES_INPUT_SINCE = {"ReduceSum": 13}  # every other Reduce* takes axes as an input from 18


def _reduce_axes(ctx, node):
    """('all', None) | ('none', None) | ('static', [axes]) | ('tensor', name)."""
    noop = int(attr(node, "noop_with_empty_axes", 0))
    if ctx.opset >= _AXES_INPUT_SINCE.get(node.op_type, 18):
        name = input_at(node, 1)
        if not name:
            return ("none", None) if noop else ("all", None)
        value = ctx.constant_value(name)
        if value is None:
            return ("tensor", name)
        axes = [int(v) for v in value.reshape(-1)]
    else:
        axes = attr(node, "axes")
        axes = None if axes is None else list(axes)
    if not axes:
        return ("none", None) if noop else ("all", None)
    rank = ctx.values.rank(node.input[0])
    if rank is not None:
        axes = sorted(a % rank for a in axes)
    return ("static", axes)


def _keep_dims(ctx, node, value: str, kind, axes) -> str:
    """``value`` (shaped like the reduction's output) with the reduced axes put back as 1s."""
    if int(attr(node, "keepdims", 1)) or kind == "all":
        return value  # kept, or a scalar that broadcasts
    ax = ctx.ints(axes) if kind == "static" else axes
    return ctx.op("Unsqueeze", value, ax)


def _expanded(ctx, node, name: str):
    """(Expanded ``name`` to the input's shape, kind, axes); None for an identity reduction."""
    x = node.input[0]
    kind, axes = _reduce_axes(ctx, node)
    if kind == "none":
        return None, kind, axes
    kept = _keep_dims(ctx, node, name, kind, axes)
    return ctx.op("Expand", kept, ctx.shape_of(x)), kind, axes


@grad_rule("ReduceSum", inputs=(0,))
def _reduce_sum(ctx, node, dy, needs):
    x = node.input[0]
    g, _, _ = _expanded(ctx, node, dy[0])
    return [dy[0] if g is None else ctx.named(g, x)]


@grad_rule("ReduceMean", inputs=(0,))
def _reduce_mean(ctx, node, dy, needs):
    """dY / count, then broadcast back (scaling the small tensor, not the expanded one)."""
    x = node.input[0]
    kind, axes = _reduce_axes(ctx, node)
    if kind == "none":
        return [dy[0]]
    shape = ctx.values.static_shape(x)
    if shape is not None and kind != "tensor":
        count = int(np.prod(shape if kind == "all" else [shape[a] for a in axes]))
        scaled = ctx.mul_scalar(dy[0], 1.0 / max(count, 1), x)
    else:
        ratio = ctx.op("Div", ctx.op("Size", x), ctx.op("Size", node.output[0]))
        scaled = ctx.op("Div", dy[0], ctx.op("Cast", ratio, to=ctx.float_dtype(x)))
    g, _, _ = _expanded(ctx, node, scaled)
    return [ctx.named(g, x)]


@grad_rule("ReduceMax", "ReduceMin", inputs=(0,))
def _reduce_max_min(ctx, node, dy, needs):
    """torch.amax/amin's rule: dY split evenly over the elements equal to the result."""
    x, y = node.input[0], node.output[0]
    g, kind, axes = _expanded(ctx, node, dy[0])
    if g is None:
        return [dy[0]]
    yk = _keep_dims(ctx, node, y, kind, axes)
    hit = ctx.op("Cast", ctx.op("Equal", x, yk), to=ctx.float_dtype(x))
    if kind == "static":
        count = ctx.op("ReduceSum", hit, ctx.ints(axes), keepdims=1)
    elif kind == "tensor":
        count = ctx.op("ReduceSum", hit, axes, keepdims=1)
    else:  # every axis
        count = ctx.op("ReduceSum", hit, keepdims=1)
    return [ctx.named(ctx.op("Mul", g, ctx.op("Div", hit, count)), x)]


@grad_rule("ReduceSumSquare", inputs=(0,))
def _reduce_sum_square(ctx, node, dy, needs):
    x = node.input[0]
    g, _, _ = _expanded(ctx, node, dy[0])
    g = g if g is not None else dy[0]
    return [ctx.named(ctx.op("Mul", g, ctx.mul_scalar(x, 2.0, x)), x)]


@grad_rule("ReduceL2", inputs=(0,))
def _reduce_l2(ctx, node, dy, needs):  # x / ||x|| (0 where the norm is 0, as torch)
    x, y = node.input[0], node.output[0]
    g, kind, axes = _expanded(ctx, node, dy[0])
    if g is None:
        return [dy[0]]
    yk = _keep_dims(ctx, node, y, kind, axes)
    zero = ctx.scalar(0.0, x)
    safe = ctx.op("Where", ctx.op("Equal", yk, zero), ctx.scalar(1.0, x), yk)
    return [ctx.named(ctx.op("Mul", g, ctx.op("Div", x, safe)), x)]


@grad_rule("ReduceLogSumExp", inputs=(0,))
def _reduce_logsumexp(ctx, node, dy, needs):  # softmax of x over the reduced axes
    x, y = node.input[0], node.output[0]
    g, kind, axes = _expanded(ctx, node, dy[0])
    if g is None:
        return [dy[0]]
    yk = _keep_dims(ctx, node, y, kind, axes)
    return [ctx.named(ctx.op("Mul", g, ctx.op("Exp", ctx.op("Sub", x, yk))), x)]


@grad_rule("ReduceProd", inputs=(0,))
def _reduce_prod(ctx, node, dy, needs):
    """dX = dY · (product of the other elements), exact with zeros: the product of the
    non-zero elements, divided by x where the slice has no zero, taken as is at the one
    zero of a slice with exactly one, and 0 otherwise."""
    x = node.input[0]
    g, kind, axes = _expanded(ctx, node, dy[0])
    if g is None:
        return [dy[0]]

    def reduce(op, value):
        if kind == "static":
            return ctx.op(op, value, ctx.ints(axes), keepdims=1)
        if kind == "tensor":
            return ctx.op(op, value, axes, keepdims=1)
        return ctx.op(op, value, keepdims=1)

    zero, one = ctx.scalar(0.0, x), ctx.scalar(1.0, x)
    is_zero = ctx.op("Equal", x, zero)
    nonzero = ctx.op("Where", is_zero, one, x)
    prod_nonzero = reduce("ReduceProd", nonzero)
    zeros = reduce("ReduceSum", ctx.op("Cast", is_zero, to=ctx.float_dtype(x)))
    at_zero = ctx.op("Where", ctx.op("Equal", zeros, one), prod_nonzero, zero)
    elsewhere = ctx.op("Where", ctx.op("Equal", zeros, zero),
                       ctx.op("Div", prod_nonzero, nonzero), zero)
    others = ctx.op("Where", is_zero, at_zero, elsewhere)
    return [ctx.named(ctx.op("Mul", g, others), x)]
