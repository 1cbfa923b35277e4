"""Gradient rules of activations, softmax and dropout: ORT's com.microsoft gradient ops
(ReluGrad, SigmoidGrad, TanhGrad, GeluGrad, FastGeluGrad, BiasGeluGrad_dX,
BiasFastGeluGrad_dX, QuickGeluGrad, LeakyReluGrad, SoftmaxGrad_13, LogSoftmaxGrad_13,
DropoutGrad), standard ops where ORT has none."""

from __future__ import annotations

from .grad_rules_base import (
    MS,
    GradientBuildError,
    attr,
    describe,
    grad_rule,
    input_at,
)


def _grad_op(ctx, op_type, node, *inputs, **attrs):
    x = node.input[0]
    return ctx.named(ctx.op(op_type, *inputs, domain=MS, hint=f"{x}_grad", **attrs), x)


@grad_rule("Relu")
def _relu(ctx, node, dy, needs):
    return [_grad_op(ctx, "ReluGrad", node, dy[0], node.input[0])]


@grad_rule("Sigmoid")
def _sigmoid(ctx, node, dy, needs):
    return [_grad_op(ctx, "SigmoidGrad", node, dy[0], node.output[0])]


@grad_rule("Tanh")
def _tanh(ctx, node, dy, needs):
    return [_grad_op(ctx, "TanhGrad", node, dy[0], node.output[0])]


@grad_rule("Gelu", domain=MS)
def _gelu_ms(ctx, node, dy, needs):
    return [_grad_op(ctx, "GeluGrad", node, dy[0], node.input[0])]


@grad_rule("Gelu")  # ai.onnx Gelu-20: the gradient follows its ``approximate``
def _gelu_onnx(ctx, node, dy, needs):
    approx = attr(node, "approximate", b"none")
    approx = approx.decode() if isinstance(approx, bytes) else approx
    if approx not in ("none", "tanh"):
        raise GradientBuildError(f"{describe(node)}: approximate={approx!r} is not 'none' "
                                 "or 'tanh'")
    op = "FastGeluGrad" if approx == "tanh" else "GeluGrad"
    return [_grad_op(ctx, op, node, dy[0], node.input[0])]


def _bias_gelu(ctx, node, dy, needs, with_bias_op, plain_op):
    x, b = node.input[0], input_at(node, 1)
    if not b:
        return [_grad_op(ctx, plain_op, node, dy[0], x)]
    dx = ctx.named(ctx.op(with_bias_op, dy[0], x, b, domain=MS, hint=f"{x}_grad"), x)
    db = ctx.reduce_to(dx, ctx.values.shape(x), b) if needs[1] else None
    return [dx if needs[0] else None, db]


@grad_rule("FastGelu", domain=MS, inputs=(0, 1))
def _fast_gelu(ctx, node, dy, needs):
    return _bias_gelu(ctx, node, dy, needs, "BiasFastGeluGrad_dX", "FastGeluGrad")


@grad_rule("BiasGelu", domain=MS, inputs=(0, 1))
def _bias_gelu_rule(ctx, node, dy, needs):
    return _bias_gelu(ctx, node, dy, needs, "BiasGeluGrad_dX", "GeluGrad")


@grad_rule("QuickGelu", domain=MS)
def _quick_gelu(ctx, node, dy, needs):
    return [_grad_op(ctx, "QuickGeluGrad", node, dy[0], node.input[0],
                     alpha=float(attr(node, "alpha", 1.702)))]


@grad_rule("LeakyRelu")
def _leaky_relu(ctx, node, dy, needs):
    alpha = float(attr(node, "alpha", 0.01))
    x = node.input[0]
    if alpha > 0:  # LeakyReluGrad reads Y, whose sign is x's only when alpha > 0
        return [_grad_op(ctx, "LeakyReluGrad", node, dy[0], node.output[0], alpha=alpha)]
    positive = ctx.op("Greater", x, ctx.scalar(0.0, x))
    return [ctx.named(ctx.op("Where", positive, dy[0], ctx.mul_scalar(dy[0], alpha, x)), x)]


@grad_rule("Softplus")
def _softplus(ctx, node, dy, needs):
    return [ctx.named(ctx.op("Mul", dy[0], ctx.op("Sigmoid", node.input[0])), node.input[0])]


@grad_rule("Elu")
def _elu(ctx, node, dy, needs):  # x > 0: 1, else y + alpha
    alpha = float(attr(node, "alpha", 1.0))
    x, y = node.input[0], node.output[0]
    slope = ctx.op("Where", ctx.op("Greater", x, ctx.scalar(0.0, x)), ctx.scalar(1.0, x),
                   ctx.op("Add", y, ctx.scalar(alpha, x)))
    return [ctx.named(ctx.op("Mul", dy[0], slope), x)]


@grad_rule("HardSigmoid")
def _hard_sigmoid(ctx, node, dy, needs):  # alpha inside the linear piece (torch: open ends)
    x = node.input[0]
    alpha, beta = float(attr(node, "alpha", 0.2)), float(attr(node, "beta", 0.5))
    z = ctx.op("Add", ctx.mul_scalar(x, alpha, x), ctx.scalar(beta, x))
    inside = ctx.op("And", ctx.op("Greater", z, ctx.scalar(0.0, x)),
                    ctx.op("Less", z, ctx.scalar(1.0, x)))
    g = ctx.op("Where", inside, ctx.mul_scalar(dy[0], alpha, x), ctx.scalar(0.0, x))
    return [ctx.named(g, x)]


@grad_rule("HardSwish")
def _hard_swish(ctx, node, dy, needs):  # torch: 0 up to -3, (2x + 3)/6 inside, 1 from 3 on
    x = node.input[0]
    slope = ctx.op("Add", ctx.mul_scalar(x, 1.0 / 3.0, x), ctx.scalar(0.5, x))
    slope = ctx.op("Where", ctx.op("LessOrEqual", x, ctx.scalar(-3.0, x)), ctx.scalar(0.0, x),
                   ctx.op("Where", ctx.op("Less", x, ctx.scalar(3.0, x)), slope,
                          ctx.scalar(1.0, x)))
    return [ctx.named(ctx.op("Mul", dy[0], slope), x)]


@grad_rule("Selu")
def _selu(ctx, node, dy, needs):  # gamma for x > 0, else y + alpha·gamma
    x, y = node.input[0], node.output[0]
    alpha = float(attr(node, "alpha", 1.67326319217681884765625))
    gamma = float(attr(node, "gamma", 1.05070102214813232421875))
    slope = ctx.op("Where", ctx.op("Greater", x, ctx.scalar(0.0, x)), ctx.scalar(gamma, x),
                   ctx.op("Add", y, ctx.scalar(alpha * gamma, x)))
    return [ctx.named(ctx.op("Mul", dy[0], slope), x)]


@grad_rule("Softsign")
def _softsign(ctx, node, dy, needs):  # 1 / (1 + |x|)²
    x = node.input[0]
    d = ctx.op("Add", ctx.op("Abs", x), ctx.scalar(1.0, x))
    return [ctx.named(ctx.op("Div", dy[0], ctx.op("Mul", d, d)), x)]


@grad_rule("PRelu", inputs=(0, 1))
def _prelu(ctx, node, dy, needs):
    x, slope = node.input
    positive = ctx.op("Greater", x, ctx.scalar(0.0, x))
    zero = ctx.scalar(0.0, x)
    dx = ds = None
    if needs[0]:
        dx = ctx.reduce_to(ctx.op("Where", positive, dy[0], ctx.op("Mul", dy[0], slope)),
                           ctx.values.shape(node.output[0]), x)
    if needs[1]:
        ds = ctx.reduce_to(ctx.op("Where", positive, zero, ctx.op("Mul", dy[0], x)),
                           ctx.values.shape(node.output[0]), slope)
    return [dx, ds]


def _softmax_axis(ctx, node) -> int:
    if ctx.opset < 13:  # not reachable: the builder requires opset 13
        raise GradientBuildError(f"{describe(node)}: opset {ctx.opset} softmax")
    return int(attr(node, "axis", -1))


@grad_rule("Softmax")
def _softmax(ctx, node, dy, needs):
    return [_grad_op(ctx, "SoftmaxGrad_13", node, dy[0], node.output[0],
                     axis=_softmax_axis(ctx, node))]


@grad_rule("LogSoftmax")
def _log_softmax(ctx, node, dy, needs):
    return [_grad_op(ctx, "LogSoftmaxGrad_13", node, dy[0], node.output[0],
                     axis=_softmax_axis(ctx, node))]


@grad_rule("Dropout", inputs=(0,), outputs=(0,))
def _dropout(ctx, node, dy, needs):
    """DropoutGrad(dY, mask, ratio, training_mode). Dropout without training_mode (or
    with a constant false one) is the identity; with a run-time training_mode the
    gradient is DropoutGrad in training and dY otherwise (DropoutGrad ignores the flag)."""
    x = node.input[0]
    ratio, mode = input_at(node, 1), input_at(node, 2)
    if not mode:
        return [dy[0]]
    mode_value = ctx.constant_value(mode)
    if mode_value is not None and not bool(mode_value.reshape(-1)[0]):
        return [dy[0]]
    if ratio:
        ratio_value = ctx.constant_value(ratio)
        if ratio_value is not None and float(ratio_value.reshape(-1)[0]) == 0.0:
            return [dy[0]]
    mask = ctx.forward_output(node, 1, f"{node.output[0]}_mask")
    ins = [dy[0], mask] + ([ratio, mode] if ratio else ["", mode])
    dx = ctx.op("DropoutGrad", *ins, domain=MS, hint=f"{x}_grad")
    if mode_value is None:
        dx = ctx.op("Where", mode, dx, dy[0], hint=f"{x}_grad")
    return [ctx.named(dx, x)]

