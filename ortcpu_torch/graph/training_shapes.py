"""Output shapes of onnxruntime's training and com.microsoft ops, which ONNX shape
inference has no schema for (``shapes.infer_value_shapes`` fills them in between rounds of
ONNX inference, so the shapes downstream of a GeluGrad or BatchNormInternal are known when
a plan is built and static-shape bindings apply).

A rule maps the node's input shapes (``None`` where unknown) and the shapes known so far
to one shape (or ``None``) per output; ``SHAPE_INPUT`` ops take their output shape from an
input's value. Outputs take the element type of the node's first input (``type_input``:
another one where the op says so).
"""

from __future__ import annotations

from collections.abc import Callable

Shape = tuple


def _like(*which: int) -> Callable:
    """Output k has the shape of input ``which[k]``."""
    def rule(node, ins, known):
        return [ins[i] if i < len(ins) else None for i in which]
    return rule


def _conv_grad(node, ins, known):
    w = ins[2] if len(ins) > 2 else None
    return [ins[1] if len(ins) > 1 else None, w, (w[0],) if w else None]


def _pool_grad(node, ins, known):
    # ORT's gradient builder names the gradient of value v "v_grad"; dX has v's shape
    out = node.output[0]
    return [known.get(out[: -len("_grad")]) if out.endswith("_grad") else None]


def _maxpool_2x2(node, ins, known):
    x = ins[0] if ins else None
    return [(x[0], x[1], x[2] // 2, x[3] // 2) if x and len(x) == 4 else None, None]


def _x_shape_attr(node, ins, known):
    for a in node.attribute:
        if a.name == "x_shape":
            return [tuple(a.ints)]
    return [None]


def _lstm_torch_gates(node, ins, known):
    x, w = (ins + [None, None])[:2]
    if x is None or w is None or len(x) != 3 or len(w) != 2:
        return [None] * 5
    s, b, h = x[0], x[1], w[0] // 4
    return [(s, 1, b, h), (1, b, h), (1, b, h), (s, 1, b, h), (s, 1, b, 4 * h)]


def _lstm_torch_gates_grad(node, ins, known):
    ins = ins + [None] * 5
    w = ins[1]
    bias = (w[0],) if w is not None and len(w) == 2 else None
    return [ins[0], ins[1], ins[2], bias, bias, ins[3], ins[4]]


def _split_view(node, ins, known):
    x = ins[0] if ins else None
    a = {at.name: at for at in node.attribute}
    if x is None or "axis" not in a or "sizes" not in a:
        return [None] * len(node.output)
    axis = a["axis"].i
    return [tuple(s if k != axis else n for k, s in enumerate(x)) for n in a["sizes"].ints]


def _merge_heads(node, ins, known):
    a, b = (ins + [None, None])[:2]
    t = next((at.ints for at in node.attribute if at.name == "transposed"), [])
    if a is None or b is None or len(a) != 4 or len(b) != 4 or not t:
        return [None]
    rows, cols = (b[3], a[2]) if t[0] else (a[2], b[3])
    return [(a[0], rows, len(t) * a[1] * cols)]


def _rnn_grad(gates):
    """LSTMGrad / GRUGrad: dX, dW, dR like X, W, R; dB [1, 2·gates·H], dH0 (dC0) [1, B, H],
    LSTM's dP [1, 3H]."""
    def rule(node, ins, known):
        x, w, r = (ins + [None] * 3)[:3]
        h = r[2] if r is not None and len(r) == 3 else None
        b = x[1] if x is not None and len(x) == 3 else None
        state = (1, b, h) if h is not None and b is not None else None
        out = [x, w, r, (1, 2 * gates * h) if h is not None else None, state]
        if gates == 4:
            out += [state, (1, 3 * h) if h is not None else None]
        return out
    return rule


_UNARY_GRADS = ("GeluGrad", "FastGeluGrad", "QuickGeluGrad", "BiasGeluGrad_dX", "ReluGrad",
                "SigmoidGrad", "TanhGrad", "SoftmaxGrad", "SoftmaxGrad_13", "LogSoftmaxGrad",
                "LogSoftmaxGrad_13", "DropoutGrad", "BiasFastGeluGrad_dX", "LeakyReluGrad")

RULES: dict[str, Callable] = {
    **{name: _like(0) for name in ("Gelu", "FastGelu", "QuickGelu", "BiasGelu")},
    **{name: _like(0) for name in _UNARY_GRADS},
    "BatchNormInternal": _like(0, 3, 4, 3, 4),
    "BatchNormalizationGrad": _like(1, 2, 2),
    "LayerNormalizationGrad": _like(1, 2, 2),
    "InvertibleLayerNormalizationGrad": _like(1, 2, 2),
    "SimplifiedLayerNormalizationGrad": _like(1, 2),
    "SoftmaxCrossEntropyLossGrad": _like(1),
    "SoftmaxCrossEntropyLossInternalGrad": _like(1),
    "ConvGrad": _conv_grad,
    "LSTMGrad": _rnn_grad(4),
    "GRUGrad": _rnn_grad(3),
    "MaxPoolGrad": _pool_grad,
    "AveragePoolGrad": _pool_grad,
    # training_fusions.py's private ops
    "MaxPool2x2Train": _maxpool_2x2,
    "MaxPool2x2TrainGrad": _x_shape_attr,
    "GeluMaxPool2x2Train": _maxpool_2x2,
    "GeluMaxPool2x2TrainGrad": _like(1),
    "MaskedScaledSoftmax": _like(0),
    "MaskedScaledSoftmaxGrad": _like(1),
    "LSTMTorchGatesTraining": _lstm_torch_gates,
    "LSTMTorchGatesGrad": _lstm_torch_gates_grad,
    "BiasGeluGradWithBiasGrad": _like(1, 2),
    "SplitView": _split_view,
    "MatMulMergeHeads": _merge_heads,
}

#: ops whose output shape is the value of one of their inputs (a Shape of the forward value)
SHAPE_INPUT = {"GatherGrad": 0, "SliceGrad": 1, "GatherElementsGrad": 1}

#: ops whose outputs take their element type from an input other than the first
_TYPE_INPUT = {"GatherGrad": 2}  # (shape, indices, dY); GatherElementsGrad: (dY, shape, ...)


def type_input(node) -> str | None:
    """The input whose element type the node's (float) outputs have."""
    k = _TYPE_INPUT.get(node.op_type, 0)
    return node.input[k] if k < len(node.input) else None


def output_shapes(node, known: dict[str, Shape], values: dict | None = None) -> list | None:
    """Shapes of ``node``'s outputs by its rule (None: no rule for this op). ``values``:
    the statically known values of 1-D int64 tensors (shapes), for ``SHAPE_INPUT`` ops."""
    k = SHAPE_INPUT.get(node.op_type)
    if k is not None:
        v = (values or {}).get(node.input[k]) if k < len(node.input) else None
        return [tuple(v) if v is not None else None]
    rule = RULES.get(node.op_type)
    if rule is None:
        return None
    ins = [known.get(i) if i else None for i in node.input]
    return rule(node, ins, known)
