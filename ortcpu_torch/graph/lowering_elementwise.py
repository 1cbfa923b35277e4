"""Elementwise ATen ops: arithmetic, comparisons, activations, where/masked_fill, casts.

Type promotion follows torch's rules (``torch.result_type`` on stand-ins of the inputs);
every input is cast to the computation dtype before the ONNX op, which needs equal types.
"""

from __future__ import annotations

import math

import torch

from .lowering import MS_DOMAIN, Lowering, LoweringError, is_node, lowers

aten = torch.ops.aten


def _stand_in(ctx: Lowering, x):
    if is_node(x):
        m = ctx.meta(x)
        if isinstance(m, torch.Tensor):
            return torch.empty((1,) * min(m.dim(), 1), dtype=m.dtype)
        if isinstance(m, torch.SymInt):
            return 1
        if isinstance(m, torch.SymFloat):
            return 1.0
        if isinstance(m, torch.SymBool):
            return True
    return x


def compute_dtype(ctx: Lowering, *xs) -> torch.dtype:
    """torch's promoted dtype of tensors and scalars ``xs``."""
    stand = [_stand_in(ctx, x) for x in xs]
    if len(stand) == 1:
        s = stand[0]
        return s.dtype if isinstance(s, torch.Tensor) else torch.result_type(torch.tensor(s), s)
    dt = torch.result_type(stand[0], stand[1])
    for s in stand[2:]:
        dt = torch.promote_types(dt, s.dtype if isinstance(s, torch.Tensor) else
                                 torch.result_type(torch.empty((), dtype=dt), s))
    return dt


def promoted(ctx: Lowering, *xs, dtype: torch.dtype | None = None) -> list[str]:
    dt = dtype or compute_dtype(ctx, *xs)
    return [ctx.tensor(x, dt) for x in xs]


def to_out(ctx: Lowering, value: str, src: torch.dtype) -> str:
    return ctx.cast(value, src, ctx.out_dtype())


BOOL_FORMS = {"Mul": "And", "Max": "Or", "Min": "And"}  # ONNX arithmetic has no bool


def binary(onnx_op: str, *, float_math: bool = False):
    """a <op> b with torch promotion; ``float_math``: integer inputs compute in the output
    dtype (true division)."""

    def lower(ctx, node, a):
        x = a.get("self", a.get("input"))
        y = a["other"] if "other" in a else a["exponent"]
        dt = ctx.out_dtype() if float_math else compute_dtype(ctx, x, y)
        op = BOOL_FORMS.get(onnx_op, onnx_op) if dt == torch.bool else onnx_op
        out = ctx.op(op, promoted(ctx, x, y, dtype=dt))
        return to_out(ctx, out, dt)

    return lower


def _pow(ctx, node, a):
    x, e = a["self"], a["exponent"]
    if e == 2:  # x*x: exact, and its gradient needs no Pow
        v = ctx.tensor(x, ctx.out_dtype())
        return ctx.op("Mul", [v, v])
    dt = ctx.out_dtype()
    return ctx.op("Pow", [ctx.tensor(x, dt), ctx.tensor(e, dt)])


lowers(aten.mul.Tensor, aten.mul.Scalar)(binary("Mul"))
lowers(aten.div.Tensor, aten.div.Scalar)(binary("Div", float_math=True))
lowers(aten.maximum.default)(binary("Max"))
lowers(aten.minimum.default)(binary("Min"))
lowers(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar)(_pow)
lowers(aten.fmod.Tensor, aten.fmod.Scalar)(lambda c, n, a: c.op(
    "Mod", promoted(c, a["self"], a["other"]), fmod=1))


@lowers(aten.pow.Scalar)
def _pow_scalar(ctx, node, a):
    dt = ctx.out_dtype()
    return ctx.op("Pow", [ctx.tensor(a["self"], dt), ctx.tensor(a["exponent"], dt)])


def _scaled(ctx, y, alpha, dt):
    yv = ctx.tensor(y, dt)
    if alpha is None or alpha == 1:
        return yv
    return ctx.op("Mul", [yv, ctx.tensor(alpha, dt)])


@lowers(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def _add_sub(ctx, node, a):
    dt = compute_dtype(ctx, a["self"], a["other"])
    op = "Add" if node.target in (aten.add.Tensor, aten.add.Scalar) else "Sub"
    if dt == torch.bool:  # bool add is logical or
        return ctx.op("Or", [ctx.v(a["self"]), ctx.v(a["other"])])
    out = ctx.op(op, [ctx.tensor(a["self"], dt), _scaled(ctx, a["other"], a.get("alpha"), dt)])
    return to_out(ctx, out, dt)


@lowers(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(ctx, node, a):
    dt = compute_dtype(ctx, a["self"], a["other"])
    out = ctx.op("Sub", [ctx.tensor(a["other"], dt), _scaled(ctx, a["self"], a.get("alpha"), dt)])
    return to_out(ctx, out, dt)


@lowers(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(ctx, node, a):
    mode = a["rounding_mode"]
    dt = compute_dtype(ctx, a["self"], a["other"])
    x, y = promoted(ctx, a["self"], a["other"], dtype=dt)
    if mode is None:
        return binary("Div", float_math=True)(ctx, node, a)
    if dt.is_floating_point:
        q = ctx.op("Div", [x, y])
        if mode == "floor":
            return ctx.op("Floor", [q])
        return _trunc_float(ctx, q, dt)
    if mode == "trunc":
        return ctx.op("Div", [x, y])  # ONNX integer Div truncates toward zero
    # floor division of integers: (x - mod(x, y)) / y, with Python-sign mod
    r = ctx.op("Mod", [x, y], fmod=0)
    return ctx.op("Div", [ctx.op("Sub", [x, r]), y])


def _trunc_float(ctx, q, dt):
    neg = ctx.op("Less", [q, ctx.const(0, dt)])
    return ctx.op("Where", [neg, ctx.op("Ceil", [q]), ctx.op("Floor", [q])])


@lowers(aten.trunc.default)
def _trunc(ctx, node, a):
    return _trunc_float(ctx, ctx.v(a["self"]), ctx.dtype(a["self"]))


@lowers(aten.remainder.Tensor, aten.remainder.Scalar)
def _remainder(ctx, node, a):
    dt = compute_dtype(ctx, a["self"], a["other"])
    x, y = promoted(ctx, a["self"], a["other"], dtype=dt)
    if not dt.is_floating_point:
        return ctx.op("Mod", [x, y], fmod=0)
    q = ctx.op("Floor", [ctx.op("Div", [x, y])])
    return ctx.op("Sub", [x, ctx.op("Mul", [q, y])])


def compare(onnx_op: str, negate: bool = False):
    def lower(ctx, node, a):
        x, y = promoted(ctx, a["self"], a["other"])
        out = ctx.op(onnx_op, [x, y])
        return ctx.op("Not", [out]) if negate else out

    return lower


for _ops, _onnx, _neg in [
    ((aten.eq.Tensor, aten.eq.Scalar), "Equal", False),
    ((aten.ne.Tensor, aten.ne.Scalar), "Equal", True),
    ((aten.lt.Tensor, aten.lt.Scalar), "Less", False),
    ((aten.le.Tensor, aten.le.Scalar), "LessOrEqual", False),
    ((aten.gt.Tensor, aten.gt.Scalar), "Greater", False),
    ((aten.ge.Tensor, aten.ge.Scalar), "GreaterOrEqual", False),
]:
    lowers(*_ops)(compare(_onnx, _neg))


def logical(onnx_op: str):
    def lower(ctx, node, a):
        x = ctx.tensor(a["self"], torch.bool)
        y = ctx.tensor(a["other"], torch.bool)
        return to_out(ctx, ctx.op(onnx_op, [x, y]), torch.bool)

    return lower


lowers(aten.logical_and.default)(logical("And"))
lowers(aten.logical_or.default)(logical("Or"))
lowers(aten.logical_xor.default)(logical("Xor"))


@lowers(aten.logical_not.default)
def _logical_not(ctx, node, a):
    return to_out(ctx, ctx.op("Not", [ctx.tensor(a["self"], torch.bool)]), torch.bool)


@lowers(aten.bitwise_not.default)
def _bitwise_not(ctx, node, a):
    if ctx.dtype(a["self"]) != torch.bool:
        raise LoweringError("bitwise_not is lowered for bool tensors only")
    return ctx.op("Not", [ctx.v(a["self"])])


def _bitwise_bool(onnx_op):
    def lower(ctx, node, a):
        if ctx.out_dtype() != torch.bool:
            raise LoweringError(f"{node.target} is lowered for bool tensors only")
        return ctx.op(onnx_op, promoted(ctx, a["self"], a["other"], dtype=torch.bool))

    return lower


lowers(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar)(_bitwise_bool("And"))
lowers(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar)(_bitwise_bool("Or"))
lowers(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)(_bitwise_bool("Xor"))


def unary(onnx_op: str, *, float_out: bool = False):
    """One ONNX op on one input; ``float_out``: integer input is cast to the output dtype."""

    def lower(ctx, node, a):
        x = a["self"]
        dt = ctx.out_dtype() if float_out else ctx.dtype(x)
        return ctx.op(onnx_op, [ctx.tensor(x, dt)])

    return lower


for _ops, _onnx, _fl in [
    ((aten.neg.default,), "Neg", False),
    ((aten.abs.default,), "Abs", False),
    ((aten.exp.default,), "Exp", True),
    ((aten.log.default,), "Log", True),
    ((aten.sqrt.default,), "Sqrt", True),
    ((aten.sin.default,), "Sin", True),
    ((aten.cos.default,), "Cos", True),
    ((aten.tan.default,), "Tan", True),
    ((aten.tanh.default,), "Tanh", True),
    ((aten.sigmoid.default,), "Sigmoid", True),
    ((aten.relu.default,), "Relu", False),
    ((aten.erf.default,), "Erf", True),
    ((aten.reciprocal.default,), "Reciprocal", True),
    ((aten.floor.default,), "Floor", False),
    ((aten.ceil.default,), "Ceil", False),
    ((aten.round.default,), "Round", False),
    ((aten.sign.default,), "Sign", False),
    ((aten.asin.default,), "Asin", True),
    ((aten.acos.default,), "Acos", True),
    ((aten.atan.default,), "Atan", True),
    ((aten.sinh.default,), "Sinh", True),
    ((aten.cosh.default,), "Cosh", True),
    ((aten.isnan.default,), "IsNaN", False),
]:
    lowers(*_ops)(unary(_onnx, float_out=_fl))


@lowers(aten.isinf.default)
def _isinf(ctx, node, a):
    x = ctx.v(a["self"])
    if not ctx.dtype(a["self"]).is_floating_point:  # integers are never infinite
        return ctx.op("Not", [ctx.op("Equal", [x, x])])
    return ctx.op("IsInf", [x])


@lowers(aten.rsqrt.default)
def _rsqrt(ctx, node, a):
    return ctx.op("Reciprocal", [ctx.op("Sqrt", [ctx.tensor(a["self"], ctx.out_dtype())])])


@lowers(aten.log1p.default)
def _log1p(ctx, node, a):
    dt = ctx.out_dtype()
    return ctx.op("Log", [ctx.op("Add", [ctx.tensor(a["self"], dt), ctx.const(1, dt)])])


@lowers(aten.expm1.default)
def _expm1(ctx, node, a):
    dt = ctx.out_dtype()
    return ctx.op("Sub", [ctx.op("Exp", [ctx.tensor(a["self"], dt)]), ctx.const(1, dt)])


@lowers(aten.log2.default, aten.log10.default)
def _log_base(ctx, node, a):
    dt = ctx.out_dtype()
    base = 2.0 if node.target is aten.log2.default else 10.0
    return ctx.op("Div", [ctx.op("Log", [ctx.tensor(a["self"], dt)]),
                          ctx.const(math.log(base), dt)])


@lowers(aten.exp2.default)
def _exp2(ctx, node, a):
    dt = ctx.out_dtype()
    return ctx.op("Pow", [ctx.const(2.0, dt), ctx.tensor(a["self"], dt)])


@lowers(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_max.default,
        aten.clamp_min.Tensor, aten.clamp_max.Tensor)
def _clamp(ctx, node, a):
    dt = ctx.out_dtype()
    lo = a.get("min")
    hi = a.get("max")
    x = ctx.tensor(a["self"], dt)
    if lo is not None:
        x = ctx.op("Max", [x, ctx.tensor(lo, dt)])
    if hi is not None:
        x = ctx.op("Min", [x, ctx.tensor(hi, dt)])
    return x


@lowers(aten.hardtanh.default)
def _hardtanh(ctx, node, a):
    dt = ctx.out_dtype()
    return ctx.op("Min", [ctx.op("Max", [ctx.v(a["self"]), ctx.const(a["min_val"], dt)]),
                          ctx.const(a["max_val"], dt)])


@lowers(aten.leaky_relu.default)
def _leaky_relu(ctx, node, a):
    return ctx.op("LeakyRelu", [ctx.v(a["self"])], alpha=float(a["negative_slope"]))


@lowers(aten.elu.default)
def _elu(ctx, node, a):
    if a["scale"] != 1 or a["input_scale"] != 1:
        dt = ctx.out_dtype()
        x = ctx.op("Mul", [ctx.v(a["self"]), ctx.const(a["input_scale"], dt)])
        y = ctx.op("Elu", [x], alpha=float(a["alpha"]))
        return ctx.op("Mul", [y, ctx.const(a["scale"], dt)])
    return ctx.op("Elu", [ctx.v(a["self"])], alpha=float(a["alpha"]))


@lowers(aten.silu.default)
def _silu(ctx, node, a):
    x = ctx.v(a["self"])
    return ctx.op("Mul", [x, ctx.op("Sigmoid", [x])])


@lowers(aten.hardsigmoid.default)
def _hardsigmoid(ctx, node, a):
    return ctx.op("HardSigmoid", [ctx.v(a["self"])], alpha=1.0 / 6.0, beta=0.5)


@lowers(aten.hardswish.default)
def _hardswish(ctx, node, a):
    x = ctx.v(a["self"])
    return ctx.op("Mul", [x, ctx.op("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5)])


@lowers(aten.softplus.default)
def _softplus(ctx, node, a):
    dt = ctx.out_dtype()
    x = ctx.v(a["self"])
    beta, threshold = float(a["beta"]), float(a["threshold"])
    bx = x if beta == 1 else ctx.op("Mul", [x, ctx.const(beta, dt)])
    sp = ctx.op("Softplus", [bx])
    if beta != 1:
        sp = ctx.op("Div", [sp, ctx.const(beta, dt)])
    return ctx.op("Where", [ctx.op("Greater", [bx, ctx.const(threshold, dt)]), x, sp])


@lowers(aten.gelu.default)
def _gelu(ctx, node, a):
    """com.microsoft Gelu (erf) / FastGelu (tanh) in training graphs, so the gradient builder
    emits GeluGrad / FastGeluGrad; opset-17 arithmetic in standard-only graphs."""
    x = ctx.v(a["self"])
    tanh = a["approximate"] == "tanh"
    if not ctx.standard_only:
        return ctx.op("FastGelu" if tanh else "Gelu", [x], domain=MS_DOMAIN)
    dt = ctx.dtype(a["self"])
    half = ctx.op("Mul", [x, ctx.const(0.5, dt)])
    if tanh:
        cube = ctx.op("Mul", [ctx.op("Mul", [x, x]), x])
        inner = ctx.op("Add", [x, ctx.op("Mul", [cube, ctx.const(0.044715, dt)])])
        t = ctx.op("Tanh", [ctx.op("Mul", [inner, ctx.const(math.sqrt(2 / math.pi), dt)])])
    else:
        t = ctx.op("Erf", [ctx.op("Mul", [x, ctx.const(1 / math.sqrt(2), dt)])])
    return ctx.op("Mul", [half, ctx.op("Add", [t, ctx.const(1.0, dt)])])


@lowers(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(ctx, node, a):
    dt = ctx.out_dtype()
    cond = ctx.tensor(a["condition"], torch.bool)
    return ctx.op("Where", [cond, ctx.tensor(a["self"], dt), ctx.tensor(a["other"], dt)])


@lowers(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx, node, a):
    dt = ctx.out_dtype()
    return ctx.op("Where", [ctx.tensor(a["mask"], torch.bool), ctx.tensor(a["value"], dt),
                            ctx.v(a["self"])])


@lowers(aten._to_copy.default, aten.to.dtype, aten.type_as.default)
def _to_copy(ctx, node, a):
    x = a["self"]
    return ctx.cast(ctx.v(x), ctx.dtype(x), ctx.out_dtype())


@lowers(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default,
        aten.detach.default, aten.contiguous.default, aten.dropout.default)
def _identity(ctx, node, a):
    if node.target is aten.dropout.default and a["train"] and a["p"] > 0:
        raise LoweringError("training-mode aten.dropout reached the lowering undecomposed")
    return ctx.op("Identity", [ctx.v(a.get("self", a.get("input")))])


@lowers(aten.copy.default)
def _copy(ctx, node, a):
    """copy(dst, src): src cast to dst's dtype and broadcast to its shape (functionalized
    slice assignment)."""
    dst, src = a["self"], a["src"]
    static = ctx.static_shape(dst)
    target = ctx.ints(static) if static is not None else ctx.op("Shape", [ctx.v(dst)])
    return ctx.op("Expand", [ctx.tensor(src, ctx.dtype(dst)), target])


@lowers(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(ctx, node, a):
    dt = ctx.out_dtype()
    x, end = ctx.tensor(a["self"], dt), ctx.tensor(a["end"], dt)
    w = ctx.tensor(a["weight"], dt)
    return ctx.op("Add", [x, ctx.op("Mul", [w, ctx.op("Sub", [end, x])])])


@lowers(aten.addcmul.default, aten.addcdiv.default)
def _addc(ctx, node, a):
    dt = ctx.out_dtype()
    op = "Mul" if node.target is aten.addcmul.default else "Div"
    t = ctx.op(op, [ctx.tensor(a["tensor1"], dt), ctx.tensor(a["tensor2"], dt)])
    t = ctx.op("Mul", [t, ctx.tensor(a["value"], dt)])
    return ctx.op("Add", [ctx.tensor(a["self"], dt), t])
