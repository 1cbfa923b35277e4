"""Small ONNX graph helpers shared by ``training.api`` and ``training.artifacts``."""

from __future__ import annotations

import copy

import onnx
from onnx import helper


def attribute(node: onnx.NodeProto, name: str, default):
    """The value of ``node``'s attribute ``name``, or ``default``."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def value_info(model: onnx.ModelProto, name: str) -> onnx.ValueInfoProto | None:
    """A copy of the type/shape record of value ``name`` (from the graph, else from ONNX
    shape inference), or None when neither knows it."""
    g = model.graph
    for v in (*g.output, *g.value_info, *g.input):
        if v.name == name and v.type.HasField("tensor_type"):
            return copy.deepcopy(v)
    inferred = onnx.shape_inference.infer_shapes(model)
    for v in (*inferred.graph.value_info, *inferred.graph.output):
        if v.name == name:
            return copy.deepcopy(v)
    return None


def without_unused_batchnorm_outputs(model: onnx.ModelProto, *,
                                     in_place: bool = False) -> onnx.ModelProto:
    """``model`` (a copy unless ``in_place``) where inference-mode BatchNormalization nodes
    keep only their first output when the others (running statistics, which torch exports
    in training mode) are unused. ORT refuses such nodes ("This number of op outputs should
    be 1 when Training_mode = False"); the values were never meaningful in inference mode."""
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    fix = [i for i, n in enumerate(model.graph.node) if n.op_type == "BatchNormalization"
           and len(n.output) > 1 and not attribute(n, "training_mode", 0)
           and not any(o and o in used for o in n.output[1:])]
    if fix and not in_place:
        model = copy.deepcopy(model)
    for i in fix:
        del model.graph.node[i].output[1:]
    return model
