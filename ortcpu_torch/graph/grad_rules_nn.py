"""Gradient rules of normalizations, convolution, pooling and losses: ORT's
LayerNormalizationGrad, SimplifiedLayerNormalizationGrad, BatchNormalizationGrad (with
the forward as BatchNormInternal), ConvGrad, MaxPoolGrad, AveragePoolGrad,
SoftmaxCrossEntropyLossGrad; standard ops for BatchNormalization in inference mode,
GlobalAveragePool, ConvTranspose and NegativeLogLikelihoodLoss."""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from .grad_rules_base import (
    MS,
    GradientBuildError,
    attr,
    attrs_of,
    describe,
    grad_rule,
    input_at,
)


def _outputs(ctx, node, wanted: list[bool], all_required: bool = False) -> list[str]:
    """Fresh ``<input>_grad`` names for the wanted gradient outputs; the others are ""
    (trailing ones dropped), or, for ops whose schema requires every output, named but
    unused."""
    outs = []
    for i, w in enumerate(wanted):
        base = node.input[i] if i < len(node.input) and node.input[i] else node.output[0]
        if w:
            outs.append(ctx.fresh(f"{base}_grad"))
        else:
            outs.append(ctx.fresh(f"{base}_grad_unused") if all_required else "")
    while outs and not outs[-1]:
        outs.pop()
    return outs


def _result(ctx, node, outs: list[str], wanted: list[bool]) -> list:
    """Per input: its gradient's name where wanted, else None."""
    return [ctx.named(outs[i], node.input[i]) if w and i < len(outs) else None
            for i, w in enumerate(wanted)]


# ---- normalization ---------------------------------------------------------------------------


@grad_rule("LayerNormalization", inputs=(0, 1, 2), outputs=(0,))
def _layer_norm(ctx, node, dy, needs):
    y = node.output[0]
    mean = ctx.forward_output(node, 1, f"{y}_mean")
    inv_std = ctx.forward_output(node, 2, f"{y}_inv_std_dev")
    wanted = [needs[0], needs[1], len(node.input) > 2 and bool(node.input[2]) and needs[2]]
    outs = _outputs(ctx, node, wanted, all_required=True)
    ctx.emit("LayerNormalizationGrad", [dy[0], node.input[0], node.input[1], mean, inv_std],
             outs, domain=MS, axis=int(attr(node, "axis", -1)))
    return _result(ctx, node, outs, wanted)


@grad_rule("SimplifiedLayerNormalization", inputs=(0, 1), outputs=(0,))
def _simplified_layer_norm(ctx, node, dy, needs):
    inv_std = ctx.forward_output(node, 1, f"{node.output[0]}_inv_std_var")
    outs = _outputs(ctx, node, needs[:2], all_required=True)
    ctx.emit("SimplifiedLayerNormalizationGrad", [dy[0], node.input[0], node.input[1], inv_std],
             outs, domain=MS, axis=int(attr(node, "axis", -1)))
    return _result(ctx, node, outs, needs[:2])


def _bn_training(ctx, node) -> bool:
    if ctx.opset >= 14:
        return bool(attr(node, "training_mode", 0))
    return len([o for o in node.output if o]) > 1  # BatchNormalization-9: stats outputs


@grad_rule("BatchNormalization", inputs=(0, 1, 2), outputs=(0,))
def _batch_norm(ctx, node, dy, needs):
    if not _bn_training(ctx, node):
        return _batch_norm_inference(ctx, node, dy, needs)
    # ORT's training form: BatchNormInternal also returns the batch mean and inverse std
    y = node.output[0]
    if ctx.opset < 14 and len(node.output) > 4 and node.output[4]:
        # BatchNormalization-9's 5th output is the saved *variance*; BatchNormInternal's is
        # the inverse std, so it gets a fresh name (nothing may read the old one)
        if node.output[4] in ctx.consumed:
            raise GradientBuildError(f"{describe(node)}: its saved_var output is read by the "
                                     "graph; the training form has no such output")
        node.output[4] = ""
    names = [y] + [ctx.forward_output(node, k, f"{y}_{tag}") for k, tag in
                   ((1, "running_mean"), (2, "running_var"), (3, "saved_mean"),
                    (4, "saved_inv_std"))]
    eps = float(attr(node, "epsilon", 1e-5))
    momentum = float(attr(node, "momentum", 0.9))
    del node.output[:]
    node.output.extend(names)
    node.op_type, node.domain = "BatchNormInternal", MS
    del node.attribute[:]
    node.attribute.extend([helper.make_attribute("epsilon", eps),
                           helper.make_attribute("momentum", momentum),
                           helper.make_attribute("training_mode", 1)])
    outs = _outputs(ctx, node, needs[:3], all_required=True)
    ctx.emit("BatchNormalizationGrad", [dy[0], node.input[0], node.input[1], names[3],
                                        names[4]], outs, domain=MS, epsilon=eps)
    return _result(ctx, node, outs, needs[:3])


def _per_channel(ctx, value: str, rank: int) -> str:
    """[C] -> [C, 1, ...] so that it broadcasts against [N, C, spatial...]."""
    return ctx.op("Reshape", value, ctx.ints([-1] + [1] * (rank - 2)))


def _batch_norm_inference(ctx, node, dy, needs):
    """Inference-mode BatchNormalization (running stats as constants): standard ops."""
    x, scale, bias, mean, var = node.input[:5]
    rank = ctx.values.rank(x)
    if rank is None or rank < 2:
        raise GradientBuildError(f"{describe(node)}: the rank of X is unknown or < 2")
    eps = float(attr(node, "epsilon", 1e-5))
    inv_std = ctx.op("Reciprocal", ctx.op("Sqrt", ctx.op("Add", var, ctx.scalar(eps, x))))
    axes = ctx.ints([0] + list(range(2, rank)))
    dx = dscale = dbias = None
    if needs[0]:
        k = _per_channel(ctx, ctx.op("Mul", scale, inv_std), rank)
        dx = ctx.named(ctx.op("Mul", dy[0], k, hint=f"{x}_grad"), x)
    if needs[1]:
        xhat = ctx.op("Mul", ctx.op("Sub", x, _per_channel(ctx, mean, rank)),
                      _per_channel(ctx, inv_std, rank))
        dscale = ctx.named(ctx.op("ReduceSum", ctx.op("Mul", dy[0], xhat), axes, keepdims=0,
                                  hint=f"{scale}_grad"), scale)
    if needs[2]:
        dbias = ctx.named(ctx.op("ReduceSum", dy[0], axes, keepdims=0, hint=f"{bias}_grad"),
                          bias)
    return [dx, dscale, dbias]


# ---- convolution --------------------------------------------------------------------------


def _explicit_pads(ctx, node, x: str, kernel: list[int] | None) -> dict:
    """The node's geometry attributes with auto_pad turned into explicit pads (ORT's
    ConvGrad and pool gradients ignore auto_pad). Left as auto_pad when X's spatial
    shape is not static (our kernels honour auto_pad; ORT's do not)."""
    a = attrs_of(node, ("kernel_shape", "strides", "pads", "dilations", "group",
                        "auto_pad", "count_include_pad"))
    mode = a.get("auto_pad", "NOTSET")
    if mode == "NOTSET":
        a.pop("auto_pad", None)
        return a
    shape = ctx.values.static_shape(x)
    if shape is None or kernel is None:
        return a
    spatial = shape[2:]
    strides = a.get("strides", [1] * len(spatial))
    dil = a.get("dilations", [1] * len(spatial))
    begin, end = [], []
    for n, k, s, d in zip(spatial, kernel, strides, dil, strict=True):
        if mode == "VALID":
            total = 0
        else:
            out = -(-n // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - n)
        lo = total // 2 if mode != "SAME_LOWER" else total - total // 2
        begin.append(lo)
        end.append(total - lo)
    a.pop("auto_pad")
    a["pads"] = begin + end
    return a


def _kernel_shape(ctx, node, w: str | None) -> list[int] | None:
    ks = attr(node, "kernel_shape")
    if ks is not None:
        return list(ks)
    if w:
        ws = ctx.values.static_shape(w)
        if ws is not None:
            return ws[2:]
    return None


@grad_rule("Conv", inputs=(0, 1, 2))
def _conv(ctx, node, dy, needs):
    x, w = node.input[0], node.input[1]
    has_b = len(node.input) > 2 and bool(node.input[2])
    attrs = _explicit_pads(ctx, node, x, _kernel_shape(ctx, node, w))
    attrs.pop("count_include_pad", None)
    wanted = [needs[0], needs[1], has_b and needs[2]]
    outs = _outputs(ctx, node, wanted)
    ctx.emit("ConvGrad", [dy[0], x, w], outs, domain=MS, **attrs)
    return _result(ctx, node, outs, wanted)


@grad_rule("ConvTranspose", inputs=(0, 1, 2))
def _conv_transpose(ctx, node, dy, needs):
    """ConvTranspose is Conv's input gradient, so its gradients are a Conv (dX) and
    ConvGrad with the roles of X and dY exchanged (dW); dB sums dY over all but dim 1."""
    x, w = node.input[0], node.input[1]
    b = input_at(node, 2)
    for unsupported in ("output_shape", "auto_pad"):
        if attr(node, unsupported) not in (None, b"NOTSET", "NOTSET"):
            raise GradientBuildError(f"{describe(node)}: ConvTranspose with {unsupported} "
                                     "has no gradient rule; give explicit pads")
    geometry = attrs_of(node, ("kernel_shape", "strides", "pads", "dilations", "group"))
    dx = dw = db = None
    if needs[0]:
        dx = ctx.named(ctx.op("Conv", dy[0], w, hint=f"{x}_grad", **geometry), x)
    if needs[1]:
        out = ctx.fresh(f"{w}_grad")
        ctx.emit("ConvGrad", [x, dy[0], w], ["", out], domain=MS, **geometry)
        dw = ctx.named(out, w)
    if b and needs[2]:
        rank = ctx.values.rank(x)
        if rank is None:
            raise GradientBuildError(f"{describe(node)}: the rank of X is unknown")
        db = ctx.named(ctx.op("ReduceSum", dy[0], ctx.ints([0] + list(range(2, rank))),
                              keepdims=0, hint=f"{b}_grad"), b)
    return [dx, dw, db]


# ---- pooling ----------------------------------------------------------------------------------


@grad_rule("MaxPool", inputs=(0,), outputs=(0,))
def _max_pool(ctx, node, dy, needs):
    if int(attr(node, "storage_order", 0)) != 0:
        raise GradientBuildError(f"{describe(node)}: MaxPool with storage_order=1 has no "
                                 "gradient rule (MaxPoolGrad reads row-major Indices)")
    x = node.input[0]
    indices = ctx.forward_output(node, 1, f"{node.output[0]}_indices")
    dx = ctx.op("MaxPoolGrad", dy[0], indices, hint=f"{x}_grad")
    ctx.annotate(dx, x)  # ORT takes MaxPoolGrad's output shape from the graph
    return [ctx.named(dx, x)]


@grad_rule("AveragePool", inputs=(0,))
def _average_pool(ctx, node, dy, needs):
    x = node.input[0]
    attrs = _explicit_pads(ctx, node, x, _kernel_shape(ctx, node, None))
    attrs.pop("group", None)
    attrs.pop("dilations", None)
    dx = ctx.op("AveragePoolGrad", dy[0], hint=f"{x}_grad", **attrs)
    ctx.annotate(dx, x)
    return [ctx.named(dx, x)]


@grad_rule("GlobalAveragePool")
def _global_average_pool(ctx, node, dy, needs):
    x = node.input[0]
    shape = ctx.values.static_shape(x)
    if shape is not None:
        scaled = ctx.mul_scalar(dy[0], 1.0 / max(1, math.prod(shape[2:])), x)
    else:
        count = ctx.op("Cast", ctx.op("Div", ctx.op("Size", x),
                                      ctx.op("Size", node.output[0])), to=ctx.float_dtype(x))
        scaled = ctx.op("Div", dy[0], count)
    return [ctx.named(ctx.op("Expand", scaled, ctx.shape_of(x), hint=f"{x}_grad"), x)]


# ---- losses -------------------------------------------------------------------------------------


@grad_rule("SoftmaxCrossEntropyLoss", inputs=(0,), outputs=(0,))
def _softmax_cross_entropy_loss(ctx, node, dy, needs):
    scores = node.input[0]
    log_prob = ctx.forward_output(node, 1, f"{node.output[0]}_log_prob")
    ins = [dy[0], log_prob, node.input[1]]
    if input_at(node, 2):
        ins.append(node.input[2])
    attrs = attrs_of(node, ("reduction", "ignore_index"))
    dx = ctx.op("SoftmaxCrossEntropyLossGrad", *ins, domain=MS, hint=f"{scores}_grad",
                **attrs)
    return [ctx.named(dx, scores)]


@grad_rule("SoftmaxCrossEntropyLossInternal", domain=MS, inputs=(0,), outputs=(0,))
def _softmax_cross_entropy_loss_internal(ctx, node, dy, needs):
    """ORT's form with ignore_index as an input (as ORT-written training models have)."""
    scores = node.input[0]
    log_prob = ctx.forward_output(node, 1, f"{node.output[0]}_log_prob")
    ins = [dy[0], log_prob, node.input[1], input_at(node, 2), input_at(node, 3)]
    while ins and not ins[-1]:
        ins.pop()
    attrs = attrs_of(node, ("reduction", "output_type"))
    dx = ctx.op("SoftmaxCrossEntropyLossInternalGrad", *ins, domain=MS,
                hint=f"{scores}_grad", **attrs)
    return [ctx.named(dx, scores)]


@grad_rule("NegativeLogLikelihoodLoss", inputs=(0,))
def _nll_loss(ctx, node, dy, needs):
    """dX[n, c, ...] = -[c == t] · w[t] · g with g = dY (none/sum) or dY / Σw (mean);
    ignored targets get 0. Standard ops (ORT has no gradient op for it)."""
    x, target = node.input[0], node.input[1]
    weight = input_at(node, 2)
    reduction = attr(node, "reduction", b"mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    ignore = attr(node, "ignore_index")
    dtype = ctx.float_dtype(x)
    safe_target = target
    keep = None
    if ignore is not None:
        ig = ctx.const(np.asarray(ignore, dtype=_np_int(ctx, target)), "ignore_index")
        ignored = ctx.op("Equal", target, ig)
        keep = ctx.op("Cast", ctx.op("Not", ignored), to=dtype)
        safe_target = ctx.op("Where", ignored, ctx.const(
            np.asarray(0, dtype=_np_int(ctx, target)), "zero_index"), target)
    if weight:
        w = ctx.op("Gather", weight, safe_target, axis=0)
        if keep is not None:
            w = ctx.op("Mul", w, keep)
    else:
        w = keep if keep is not None else ctx.op(
            "ConstantOfShape", ctx.op("Shape", target),
            value=numpy_helper.from_array(np.ones(1, dtype=_np_float(dtype)), "one"))
    if reduction == "mean":
        coeff = ctx.op("Div", ctx.op("Mul", w, dy[0]), ctx.op("ReduceSum", w, keepdims=0))
    elif reduction in ("sum", "none"):
        coeff = ctx.op("Mul", w, dy[0])
    else:
        raise GradientBuildError(f"{describe(node)}: reduction={reduction!r}")
    depth = ctx.op("Gather", ctx.shape_of(x), ctx.ints([1]), axis=0)
    values = ctx.const(np.asarray([0, -1], dtype=_np_float(dtype)), "onehot_values")
    onehot = ctx.op("OneHot", safe_target, depth, values, axis=1)
    dx = ctx.op("Mul", onehot, ctx.op("Unsqueeze", coeff, ctx.ints([1])), hint=f"{x}_grad")
    return [ctx.named(dx, x)]


def _np_int(ctx, name):
    return helper.tensor_dtype_to_np_dtype(ctx.values.dtype(name) or TensorProto.INT64)


def _np_float(dtype):
    return helper.tensor_dtype_to_np_dtype(dtype)
