"""Gradient rules of elementwise math, matrix products and reductions (standard ONNX
ops only: ORT has no dedicated gradient op for them)."""

from __future__ import annotations

import math

import numpy as np

from .grad_rules_base import (
    GradContext,
    GradientBuildError,
    attr,
    describe,
    grad_rule,
    input_at,
    no_gradient,
)

# ---- broadcasting binary ops --------------------------------------------------------------


def _out_shape(ctx: GradContext, node):
    return ctx.values.shape(node.output[0])


@grad_rule("Add", inputs=(0, 1))
def _add(ctx, node, dy, needs):
    shape = _out_shape(ctx, node)
    return [ctx.reduce_to(dy[0], shape, x) if w else None
            for x, w in zip(node.input, needs, strict=True)]


@grad_rule("Sub", inputs=(0, 1))
def _sub(ctx, node, dy, needs):
    shape = _out_shape(ctx, node)
    a, b = node.input
    da = ctx.reduce_to(dy[0], shape, a) if needs[0] else None
    db = None
    if needs[1]:
        db = ctx.named(ctx.op("Neg", ctx.reduce_to(dy[0], shape, b, hint=f"{b}_grad_neg"),
                              hint=f"{b}_grad"), b)
    return [da, db]


@grad_rule("Mul", inputs=(0, 1))
def _mul(ctx, node, dy, needs):
    shape = _out_shape(ctx, node)
    a, b = node.input
    da = ctx.reduce_to(ctx.op("Mul", dy[0], b), shape, a) if needs[0] else None
    db = ctx.reduce_to(ctx.op("Mul", dy[0], a), shape, b) if needs[1] else None
    return [da, db]


@grad_rule("Div", inputs=(0, 1))
def _div(ctx, node, dy, needs):
    shape = _out_shape(ctx, node)
    a, b = node.input
    da = ctx.reduce_to(ctx.op("Div", dy[0], b), shape, a) if needs[0] else None
    db = None
    if needs[1]:  # d(a/b)/db = -(a/b)/b
        t = ctx.op("Neg", ctx.op("Mul", dy[0], ctx.op("Div", node.output[0], b)))
        db = ctx.reduce_to(t, shape, b)
    return [da, db]


@grad_rule("Pow", inputs=(0, 1))
def _pow(ctx, node, dy, needs):
    shape = _out_shape(ctx, node)
    x, e = node.input
    dx = de = None
    if needs[0]:
        ev = ctx.constant_value(e)
        if ev is not None and ev.size == 1:
            p = float(ev.reshape(()))
            if p == 1.0:
                t = dy[0]
            elif p == 2.0:
                t = ctx.op("Mul", dy[0], ctx.mul_scalar(x, 2.0, x))
            else:
                t = ctx.op("Mul", dy[0], ctx.mul_scalar(
                    ctx.op("Pow", x, ctx.scalar(p - 1.0, x)), p, x))
        else:
            ef = _as_dtype_of(ctx, e, x)
            t = ctx.op("Mul", dy[0], ctx.op("Mul", ef, ctx.op(
                "Pow", x, ctx.op("Sub", ef, ctx.scalar(1.0, x)))))
        dx = ctx.reduce_to(t, shape, x)
    if needs[1]:  # d(x^e)/de = x^e · ln x
        t = ctx.op("Mul", dy[0], ctx.op("Mul", node.output[0], ctx.op("Log", x)))
        de = ctx.reduce_to(_as_dtype_of(ctx, t, e), shape, e)
    return [dx, de]


def _as_dtype_of(ctx: GradContext, value: str, like: str) -> str:
    if ctx.values.dtype(value) == ctx.values.dtype(like):
        return value
    return ctx.op("Cast", value, to=ctx.float_dtype(like))


@grad_rule("Where", inputs=(1, 2))
def _where(ctx, node, dy, needs):
    shape = _out_shape(ctx, node)
    cond, a, b = node.input
    zero = ctx.scalar(0.0, node.output[0])
    da = ctx.reduce_to(ctx.op("Where", cond, dy[0], zero), shape, a) if needs[1] else None
    db = ctx.reduce_to(ctx.op("Where", cond, zero, dy[0]), shape, b) if needs[2] else None
    return [None, da, db]


@grad_rule("Sum")
def _sum(ctx, node, dy, needs):
    shape = _out_shape(ctx, node)
    return [ctx.reduce_to(dy[0], shape, x) if w else None
            for x, w in zip(node.input, needs, strict=True)]


@grad_rule("Mean")
def _mean(ctx, node, dy, needs):
    shape = _out_shape(ctx, node)
    scaled = ctx.mul_scalar(dy[0], 1.0 / len(node.input), node.output[0])
    return [ctx.reduce_to(scaled, shape, x) if w else None
            for x, w in zip(node.input, needs, strict=True)]


@grad_rule("Max", "Min")
def _max_min(ctx, node, dy, needs):
    """torch's rule: the gradient goes to the winning input, split evenly on ties."""
    if len(node.input) == 1:
        return [dy[0]]
    if len(node.input) != 2:
        raise GradientBuildError(f"{describe(node)}: the {node.op_type} gradient supports one "
                                 f"or two inputs, got {len(node.input)}")
    shape = _out_shape(ctx, node)
    a, b = node.input
    dt = ctx.float_dtype(node.output[0])
    wins = "Greater" if node.op_type == "Max" else "Less"
    res = []
    for k, (x, other) in enumerate(((a, b), (b, a))):
        if not needs[k]:
            res.append(None)
            continue
        share = ctx.op("Add", ctx.op("Cast", ctx.op(wins, x, other), to=dt),
                       ctx.mul_scalar(ctx.op("Cast", ctx.op("Equal", x, other), to=dt), 0.5,
                                      node.output[0]))
        res.append(ctx.reduce_to(ctx.op("Mul", dy[0], share), shape, x))
    return res


# ---- unary ops ------------------------------------------------------------------------------


@grad_rule("CumSum", inputs=(0,))
def _cumsum(ctx, node, dy, needs):
    """The adjoint of a running sum is the running sum the other way."""
    x, axis = node.input
    reverse = int(attr(node, "reverse", 0))
    out = ctx.op("CumSum", dy[0], axis, exclusive=int(attr(node, "exclusive", 0)) or None,
                 reverse=None if reverse else 1, hint=f"{x}_grad")
    return [ctx.named(out, x)]


@grad_rule("Identity")
def _identity(ctx, node, dy, needs):
    return [dy[0]]


@grad_rule("Neg")
def _neg(ctx, node, dy, needs):
    return [ctx.named(ctx.op("Neg", dy[0]), node.input[0])]


@grad_rule("Cast")
def _cast(ctx, node, dy, needs):
    x = node.input[0]
    return [ctx.named(ctx.op("Cast", dy[0], to=ctx.float_dtype(x)), x)]


@grad_rule("Sqrt")
def _sqrt(ctx, node, dy, needs):  # 0.5 / y
    return [ctx.op("Div", ctx.mul_scalar(dy[0], 0.5, node.output[0]), node.output[0])]


@grad_rule("Exp")
def _exp(ctx, node, dy, needs):
    return [ctx.op("Mul", dy[0], node.output[0])]


@grad_rule("Log")
def _log(ctx, node, dy, needs):
    return [ctx.op("Div", dy[0], node.input[0])]


@grad_rule("Reciprocal")
def _reciprocal(ctx, node, dy, needs):  # -y²
    y = node.output[0]
    return [ctx.op("Neg", ctx.op("Mul", dy[0], ctx.op("Mul", y, y)))]


@grad_rule("Abs")
def _abs(ctx, node, dy, needs):
    return [ctx.op("Mul", dy[0], ctx.op("Sign", node.input[0]))]


@grad_rule("Erf")
def _erf(ctx, node, dy, needs):  # 2/sqrt(pi) · exp(-x²)
    x = node.input[0]
    e = ctx.op("Exp", ctx.op("Neg", ctx.op("Mul", x, x)))
    return [ctx.op("Mul", dy[0], ctx.mul_scalar(e, 2.0 / math.sqrt(math.pi), x))]


@grad_rule("Sin")
def _sin(ctx, node, dy, needs):
    return [ctx.op("Mul", dy[0], ctx.op("Cos", node.input[0]))]


@grad_rule("Cos")
def _cos(ctx, node, dy, needs):
    return [ctx.op("Neg", ctx.op("Mul", dy[0], ctx.op("Sin", node.input[0])))]


@grad_rule("Tan")
def _tan(ctx, node, dy, needs):  # 1 + y²
    y = node.output[0]
    return [ctx.op("Mul", dy[0], ctx.op("Add", ctx.op("Mul", y, y), ctx.scalar(1.0, y)))]


def _inverse_sqrt_rule(sign: float, offset: float, square_sign: float):
    """d/dx of asin/acos/asinh/acosh: sign / sqrt(offset + square_sign·x²)."""

    def rule(ctx, node, dy, needs):
        x = node.input[0]
        sq = ctx.mul_scalar(ctx.op("Mul", x, x), square_sign, x)
        root = ctx.op("Sqrt", ctx.op("Add", sq, ctx.scalar(offset, x)))
        g = ctx.op("Div", dy[0], root)
        return [ctx.op("Neg", g) if sign < 0 else g]

    return rule


grad_rule("Asin")(_inverse_sqrt_rule(1.0, 1.0, -1.0))
grad_rule("Acos")(_inverse_sqrt_rule(-1.0, 1.0, -1.0))
grad_rule("Asinh")(_inverse_sqrt_rule(1.0, 1.0, 1.0))
grad_rule("Acosh")(_inverse_sqrt_rule(1.0, -1.0, 1.0))


@grad_rule("Atan", "Atanh")
def _atan(ctx, node, dy, needs):  # 1 / (1 ± x²)
    x = node.input[0]
    sq = ctx.op("Mul", x, x)
    if node.op_type == "Atanh":
        sq = ctx.op("Neg", sq)
    return [ctx.op("Div", dy[0], ctx.op("Add", sq, ctx.scalar(1.0, x)))]


@grad_rule("Sinh")
def _sinh(ctx, node, dy, needs):
    return [ctx.op("Mul", dy[0], ctx.op("Cosh", node.input[0]))]


@grad_rule("Cosh")
def _cosh(ctx, node, dy, needs):
    return [ctx.op("Mul", dy[0], ctx.op("Sinh", node.input[0]))]


@grad_rule("Mod", inputs=(0, 1))
def _mod(ctx, node, dy, needs):
    """fmod (float Mod): y = a - trunc(a/b)·b, so dA = dY and dB = -dY·trunc(a/b)."""
    if not int(attr(node, "fmod", 0)):
        raise GradientBuildError(f"{describe(node)}: Mod with fmod=0 on floats is not valid "
                                 "ONNX")
    shape = _out_shape(ctx, node)
    a, b = node.input
    da = ctx.reduce_to(dy[0], shape, a) if needs[0] else None
    db = None
    if needs[1]:
        q = ctx.op("Div", a, b)
        trunc = ctx.op("Mul", ctx.op("Sign", q), ctx.op("Floor", ctx.op("Abs", q)))
        db = ctx.reduce_to(ctx.op("Neg", ctx.op("Mul", dy[0], trunc)), shape, b)
    return [da, db]


@grad_rule("Clip", inputs=(0,))
def _clip(ctx, node, dy, needs):
    """dY where min <= x <= max (torch.clamp's rule: the bounds themselves pass)."""
    x = node.input[0]
    mask = None
    for k, cmp in ((1, "GreaterOrEqual"), (2, "LessOrEqual")):
        bound = input_at(node, k)
        if bound:
            m = ctx.op(cmp, x, bound)
            mask = m if mask is None else ctx.op("And", mask, m)
    if mask is None:
        return [dy[0]]
    return [ctx.named(ctx.op("Where", mask, dy[0], ctx.scalar(0.0, x)), x)]


no_gradient("Floor", "Ceil", "Round", "Sign", "RandomNormalLike", "RandomUniformLike",
            "RandomNormal", "RandomUniform", "EyeLike", "ConstantOfShape", "Constant",
            "Shape", "Size", "Range", "OneHot", "NonZero", "ArgMax", "ArgMin", "IsNaN",
            "IsInf", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not",
            "And", "Or", "Xor", "Bernoulli", "Multinomial")


# ---- matrix products -----------------------------------------------------------------------


def _swap_last2(ctx, name: str, rank: int) -> str:
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return ctx.op("Transpose", name, perm=perm)


@grad_rule("MatMul", inputs=(0, 1))
def _matmul(ctx, node, dy, needs):
    a, b = node.input
    ra, rb = ctx.values.rank(a), ctx.values.rank(b)
    if ra is None or rb is None:
        raise GradientBuildError(f"{describe(node)}: the ranks of its inputs are unknown "
                                 "(shape inference could not tell); the MatMul gradient "
                                 "needs them")
    g = dy[0]
    if ra == 1 or rb == 1:
        return _matmul_vector(ctx, node, g, needs, ra, rb)
    da = db = None
    if ra == 2 and rb == 2:
        if needs[0]:
            da = ctx.named(ctx.op("Gemm", g, b, transB=1, hint=f"{a}_grad"), a)
        if needs[1]:
            db = ctx.named(ctx.op("Gemm", a, g, transA=1, hint=f"{b}_grad"), b)
        return [da, db]
    out_shape = ctx.values.shape(node.output[0])
    if needs[0]:
        if rb == 2:  # [..., N] x Bᵀ as one GEMM over the flattened rows: no copy of B
            rows = ctx.op("Gemm", ctx.op("Flatten", g, axis=ra - 1), b, transB=1)
            da = ctx.named(ctx.op("Reshape", rows, ctx.shape_of(a), hint=f"{a}_grad"), a)
        else:
            prod = ctx.op("MatMul", g, _swap_last2(ctx, b, rb))
            da = ctx.reduce_to(prod, _with_last2(out_shape, a, ctx), a)
    if needs[1]:
        if rb == 2:  # a weight shared over the batch dims: one GEMM over the flattened rows
            rows_a = ctx.op("Flatten", a, axis=ra - 1)
            rows_g = ctx.op("Flatten", g, axis=ra - 1)
            db = ctx.named(ctx.op("Gemm", rows_a, rows_g, transA=1, hint=f"{b}_grad"), b)
        else:
            prod = ctx.op("MatMul", _swap_last2(ctx, a, ra), g)
            db = ctx.reduce_to(prod, _with_last2(out_shape, b, ctx), b)
    return [da, db]


def _with_last2(out_shape, like, ctx):
    """The broadcast batch dims of the product followed by ``like``'s matrix dims."""
    ls = ctx.values.shape(like)
    if out_shape is None or ls is None:
        return None
    return list(out_shape[:-2]) + list(ls[-2:])


def _matmul_vector(ctx, node, g, needs, ra, rb):
    """MatMul with a 1-D operand: treat it as a matrix with a unit dim, as ONNX does."""
    a, b = node.input
    ax = ctx.op("Unsqueeze", a, ctx.ints([0])) if ra == 1 else a
    bx = ctx.op("Unsqueeze", b, ctx.ints([1])) if rb == 1 else b
    gx = g
    if ra == 1:
        gx = ctx.op("Unsqueeze", gx, ctx.ints([-1 if rb == 1 else -2]))
    if rb == 1:
        gx = ctx.op("Unsqueeze", gx, ctx.ints([-1]))
    da = db = None
    if needs[0]:
        prod = ctx.op("MatMul", gx, _swap_last2(ctx, bx, max(rb, 2)))
        da = _sum_to_vector(ctx, prod, a) if ra == 1 else ctx.named(prod, a)
    if needs[1]:
        prod = ctx.op("MatMul", _swap_last2(ctx, ax, max(ra, 2)), gx)
        db = _sum_to_vector(ctx, prod, b) if rb == 1 else ctx.named(prod, b)
    return [da, db]


def _sum_to_vector(ctx, grad, target):
    """Sum a batched [..., K] or [..., K, 1] product down to the 1-D ``target`` [K]."""
    length = ctx.values.static_shape(target)
    shape = ctx.ints([-1, length[0]]) if length is not None else ctx.op(
        "Concat", ctx.ints([-1]), ctx.op("Shape", target), axis=0)
    rows = ctx.op("Reshape", grad, shape)
    return ctx.named(ctx.op("ReduceSum", rows, ctx.ints([0]), keepdims=0,
                            hint=f"{target}_grad"), target)


@grad_rule("Gemm", inputs=(0, 1, 2))
def _gemm(ctx, node, dy, needs):
    """Y = alpha·A'·B' + beta·C with A' = A or Aᵀ (transA), B' likewise."""
    a, b = node.input[0], node.input[1]
    c = input_at(node, 2)
    alpha = float(attr(node, "alpha", 1.0))
    beta = float(attr(node, "beta", 1.0))
    ta, tb = int(attr(node, "transA", 0)), int(attr(node, "transB", 0))
    g = dy[0]
    da = db = dc = None

    def gemm(x, y, tx, ty, target):
        out = ctx.op("Gemm", x, y, transA=tx or None, transB=ty or None,
                     alpha=alpha if alpha != 1.0 else None, hint=f"{target}_grad")
        return ctx.named(out, target)

    if needs[0]:  # dA' = g·B'ᵀ
        da = gemm(g, b, 0, 1 - tb, a) if not ta else gemm(b, g, tb, 1, a)
    if needs[1]:  # dB' = A'ᵀ·g
        db = gemm(a, g, 1 - ta, 0, b) if not tb else gemm(g, a, 1, ta, b)
    if c and needs[2]:
        dc = ctx.reduce_to(ctx.mul_scalar(g, beta, c), ctx.values.shape(node.output[0]), c)
    return [da, db, dc]


@grad_rule("Einsum")
def _einsum(ctx, node, dy, needs):
    """Each operand's gradient is an einsum of dY with the other operands, read back
    into the operand's subscripts. Explicit output subscripts, no ellipsis, no repeated
    subscript within one operand; an operand's subscripts must appear in the output or in
    another operand (what is summed out of one operand alone needs an Expand: not done)."""
    eq = attr(node, "equation")
    eq = (eq.decode() if isinstance(eq, bytes) else eq).replace(" ", "")
    if "->" not in eq or "." in eq:
        raise GradientBuildError(f"{describe(node)}: the Einsum gradient needs explicit "
                                 f"output subscripts and no ellipsis, got {eq!r}")
    lhs, out = eq.split("->")
    subs = lhs.split(",")
    res = []
    for i, (x, want) in enumerate(zip(node.input, needs, strict=True)):
        if not want:
            res.append(None)
            continue
        others = [s for k, s in enumerate(subs) if k != i]
        if len(set(subs[i])) != len(subs[i]) or not set(subs[i]) <= set(out).union(*others):
            raise GradientBuildError(f"{describe(node)}: no Einsum gradient rule for operand "
                                     f"{i} of {eq!r} (repeated or summed-alone subscripts)")
        inputs = [dy[0]] + [n for k, n in enumerate(node.input) if k != i]
        grad_eq = ",".join([out] + others) + "->" + subs[i]
        res.append(ctx.named(ctx.op("Einsum", *inputs, equation=grad_eq, hint=f"{x}_grad"), x))
    return res


# ---- reductions ------------------------------------------------------------------------------


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
