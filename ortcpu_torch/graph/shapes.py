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
    # ops ONNX has no schema for (ORT's training ops, training_fusions.py's private ops):
    # their outputs' shapes by rule (training_shapes.py) or from the model's value_info,
    # typed like the rule's type input, fed back as value_info so the next round of
    # inference continues past them (else everything downstream stays untyped, and the
    # bindings there take their dtype-generic paths)
    opaque = [n for n in g.node if n.domain not in ("", "ai.onnx") or
              not onnx.defs.has(n.op_type)]
    init_dims = {t.name: tuple(t.dims) for t in g.initializer}
    init_values = {t.name: tuple(int(v) for v in onnx.numpy_helper.to_array(t))
                   for t in g.initializer if t.data_type == onnx.TensorProto.INT64 and
                   len(t.dims) == 1 and t.dims[0] <= _KEEP_INITIALIZER_ELEMS}
    fed_back: set[str] = set()
    for _ in range(_MAX_ROUNDS if opaque else 0):
        known = {**init_dims, **out, **input_shapes}
        values = {**init_values, **_shape_values(g.node, known)}
        added = []
        for n in opaque:
            ruled = training_shapes.output_shapes(n, known, values) or ()
            et = types.get(training_shapes.type_input(n))
            for k, name in enumerate(n.output):
                if not name or name in fed_back:
                    continue
                shape = out.get(name)
                if shape is None or not _static(shape):
                    shape = ruled[k] if k < len(ruled) else None
                t = types.get(name) or et
                if shape is None or not _static(shape) or not t:
                    continue
                added.append(helper.make_tensor_value_info(name, t, list(shape)))
                out[name], types[name] = tuple(shape), t
                fed_back.add(name)
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


def _shape_values(nodes, known: dict) -> dict:
    """Output -> value of the 1-D int64 Constants and of the Shapes of static shapes."""
    out = {}
    for n in nodes:
        if n.domain not in ("", "ai.onnx"):
            continue
        if n.op_type == "Constant":
            t = next((a.t for a in n.attribute if a.name == "value"), None)
            if t is not None and t.data_type == onnx.TensorProto.INT64 and len(t.dims) == 1:
                out[n.output[0]] = tuple(int(v) for v in onnx.numpy_helper.to_array(t))
            continue
        if n.op_type != "Shape":
            continue
        s = known.get(n.input[0])
        if s is None or not _static(s):
            continue
        a = {at.name: at.i for at in n.attribute}
        out[n.output[0]] = tuple(s)[slice(a.get("start"), a.get("end"))]
    return out


def _static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


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
