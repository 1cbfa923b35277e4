"""Static shapes of every value for one input signature, from ONNX shape inference.

The inference runs on a light copy of the model: large initializers become typed graph
inputs (their data is not needed to infer shapes, and copying it would cost seconds on
big models); small ones stay, so shape-valued constants still propagate (``data_prop``).
"""

from __future__ import annotations

import onnx
from onnx import helper

from . import training_shapes
from .loading import _checkable

_KEEP_INITIALIZER_ELEMS = 256
_MAX_ROUNDS = 16  # rounds of ONNX inference around training ops it has no schema for


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
    out, types = _infer(m)
    if out is None:  # inference is an optimisation here; the run checks shapes itself
        return dict(input_shapes), dict(input_types)
    # the model's own value_info fills in what onnx cannot infer (ORT's training ops, e.g.
    # the pool gradients, whose output shape the gradient builder records there)
    for vi in g.value_info:
        d = _dims(vi.type)
        if d is not None and vi.name not in out:
            out[vi.name] = d
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types.setdefault(vi.name, vi.type.tensor_type.elem_type)
    # training ops ONNX has no schema for: their output shapes by rule, fed back as
    # value_info so the next round of inference continues past them
    ruled = [n for n in g.node if n.op_type in training_shapes.RULES and
             (n.domain not in ("", "ai.onnx") or not onnx.defs.has(n.op_type))]
    for _ in range(_MAX_ROUNDS if ruled else 0):
        known = {**out, **input_shapes}
        added = []
        for n in ruled:
            shapes = training_shapes.output_shapes(n, known)
            for name, shape in zip(n.output, shapes or (), strict=False):
                if name and shape is not None and name not in out and \
                        all(isinstance(d, int) for d in shape):
                    et = types.get(n.input[0]) if n.input else None
                    if et:
                        added.append(helper.make_tensor_value_info(name, et, list(shape)))
                        out[name] = tuple(shape)
        if not added:
            break
        m.graph.value_info.extend(added)
        more, more_types = _infer(m)
        if more is None:
            break
        out.update({k: v for k, v in more.items() if k not in out})
        types.update({k: v for k, v in more_types.items() if k not in types})
    for t in model.graph.initializer:
        types.setdefault(t.name, t.data_type)
    out.update(input_shapes)
    types.update(input_types)
    return out, types


def _infer(m: onnx.ModelProto):
    """(shapes, element types) of the values ONNX inference finds; (None, None) on error."""
    try:
        inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:
        return None, None
    out, types = {}, {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + \
            list(inferred.graph.input):
        d = _dims(vi.type)
        if d is not None:
            out[vi.name] = d
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return out, types
