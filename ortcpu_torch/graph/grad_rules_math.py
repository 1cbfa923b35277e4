"""Gradient rules of elementwise math: broadcasting binary ops (reduced back to each
input's shape), unary functions, Where/Clip/Cast/Identity, and the ops that stop gradients
(standard ONNX ops only: ORT has no dedicated gradient op for them)."""

from __future__ import annotations

import math

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
