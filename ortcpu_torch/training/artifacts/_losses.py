"""The loss sub-graphs ``generate_artifacts`` puts on top of a model's output.

Each loss reads the model output ``x`` and a target graph input (added, named as ONNX
Runtime names it: ``labels`` for cross-entropy, ``target`` otherwise) and produces a float
scalar, the mean over all elements:

    MSELoss            mean((x - t)^2)
    CrossEntropyLoss   SoftmaxCrossEntropyLoss(x, labels), reduction "mean" (classes on axis 1)
    BCEWithLogitsLoss  mean(max(x, 0) - x*t + softplus(-|x|))   (the overflow-free form)
    L1Loss             mean(|x - t|)
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from .._onnx_utils import value_info
from ._graph_edit import GraphEditor

TARGET_NAMES = {"MSELoss": "target", "CrossEntropyLoss": "labels",
                "BCEWithLogitsLoss": "target", "L1Loss": "target"}


def _value_type(model: onnx.ModelProto, name: str) -> onnx.TypeProto:
    vi = value_info(model, name)
    if vi is None:
        raise ValueError(f"loss input {name!r}: its type and shape are unknown")
    return vi.type


def _target_input(ed: GraphEditor, name: str, elem_type: int, dims) -> str:
    if any(i.name == name for i in ed.graph.input):
        return name
    ed.reserve(name)
    ed.graph.input.append(helper.make_tensor_value_info(name, elem_type, dims))
    return name


def _dims(t: onnx.TypeProto):
    if not t.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in t.tensor_type.shape.dim]


def add_loss(model: onnx.ModelProto, loss_name: str, inputs: list[str]) -> str:
    """Append loss ``loss_name`` (a LossType member's name) reading ``inputs[0]`` (and the
    target ``inputs[1]`` if given) to ``model``; returns the loss output's name."""
    ed = GraphEditor(model)
    x = inputs[0]
    xt = _value_type(model, x)
    target_name = inputs[1] if len(inputs) > 1 else TARGET_NAMES[loss_name]
    out = ed.fresh("loss")
    if loss_name == "CrossEntropyLoss":
        dims = _dims(xt)
        label_dims = None if dims is None else dims[:1] + dims[2:]
        t = _target_input(ed, target_name, TensorProto.INT64, label_dims)
        ed.node("SoftmaxCrossEntropyLoss", [x, t], name="CrossEntropyLoss",
                outputs=[out, ed.fresh("log_prob")], reduction="mean")
        return out
    t = _target_input(ed, target_name, xt.tensor_type.elem_type, _dims(xt))
    if loss_name == "MSELoss":
        (d,) = ed.node("Sub", [x, t], name="MSELoss_Sub")
        (per,) = ed.node("Mul", [d, d], name="MSELoss_Square")
    elif loss_name == "L1Loss":
        (d,) = ed.node("Sub", [x, t], name="L1Loss_Sub")
        (per,) = ed.node("Abs", [d], name="L1Loss_Abs")
    elif loss_name == "BCEWithLogitsLoss":
        (pos,) = ed.node("Relu", [x], name="BCE_Relu")
        (xt_,) = ed.node("Mul", [x, t], name="BCE_Mul")
        (a,) = ed.node("Abs", [x], name="BCE_Abs")
        (na,) = ed.node("Neg", [a], name="BCE_Neg")
        (sp,) = ed.node("Softplus", [na], name="BCE_Softplus")
        (d,) = ed.node("Sub", [pos, xt_], name="BCE_Sub")
        (per,) = ed.node("Add", [d, sp], name="BCE_Add")
    else:
        raise ValueError(f"loss: unknown loss {loss_name!r}")
    ed.node("ReduceMean", [per], name=f"{loss_name}_Mean", outputs=[out], keepdims=0)
    return out
