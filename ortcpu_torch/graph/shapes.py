"""Static shapes of every value for one input signature, from ONNX shape inference.

The inference runs on a light copy of the model: large initializers become typed graph
inputs (their data is not needed to infer shapes, and copying it would cost seconds on
big models); small ones stay, so shape-valued constants still propagate (``data_prop``).
"""

from __future__ import annotations

import onnx
from onnx import helper

from .loading import _checkable

_KEEP_INITIALIZER_ELEMS = 256


def _dims(type_proto) -> tuple | None:
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    out = []
    for d in type_proto.tensor_type.shape.dim:
        out.append(d.dim_value if d.HasField("dim_value") else None)
    return tuple(out)


def infer_value_shapes(model: onnx.ModelProto, input_shapes: dict[str, tuple],
                       input_types: dict[str, int], constant_inputs=frozenset()
                       ) -> tuple[dict[str, tuple], dict[str, int]]:
    """(name -> shape tuple (ints, None for an unknown dim), name -> ONNX element type) of
    every value onnx can infer. ``constant_inputs``: graph inputs left to their
    initializer in this signature (their small values propagate, e.g. the shape feeding a
    ConstantOfShape weight in onnx's light models)."""
    g = model.graph
    light = onnx.GraphProto(name=g.name)
    light.node.extend(g.node)
    light.output.extend(g.output)
    fed = set()
    for vi in g.input:
        if vi.name in input_shapes:
            light.input.append(helper.make_tensor_value_info(
                vi.name, input_types[vi.name], list(input_shapes[vi.name])))
        else:
            light.input.append(vi)
        fed.add(vi.name)
    for t in g.initializer:
        n = 1
        for d in t.dims:
            n *= d
        if t.name in fed:
            if t.name in constant_inputs and n <= _KEEP_INITIALIZER_ELEMS:
                light.initializer.append(t)
            continue
        if n <= _KEEP_INITIALIZER_ELEMS:
            light.initializer.append(t)
        else:
            light.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    m = helper.make_model(light, opset_imports=list(model.opset_import),
                          ir_version=model.ir_version)
    m.functions.extend(model.functions)
    m = _checkable(m)  # ORT's default-domain training ops: skipped, not fatal
    try:
        inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # inference is an optimisation here; the run checks shapes itself
        return dict(input_shapes), dict(input_types)
    out, types = {}, {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + \
            list(inferred.graph.input):
        d = _dims(vi.type)
        if d is not None:
            out[vi.name] = d
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    # the model's own value_info fills in what onnx cannot infer (ORT's training ops, e.g.
    # the pool gradients, whose output shape the gradient builder records there)
    for vi in g.value_info:
        d = _dims(vi.type)
        if d is not None and vi.name not in out:
            out[vi.name] = d
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types.setdefault(vi.name, vi.type.tensor_type.elem_type)
    for t in model.graph.initializer:
        types.setdefault(t.name, t.data_type)
    out.update(input_shapes)
    types.update(input_types)
    return out, types
