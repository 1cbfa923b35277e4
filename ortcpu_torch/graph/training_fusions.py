"""Rewrites of a training graph for execution on our kernels (ORTModule applies them to the
graph it runs; the training graph it saves and reports stays standard ONNX + ORT's ops).

- MaxPool 2x2 / stride 2 (unpadded, floor mode) whose Indices feed only MaxPoolGrad ->
  ``MaxPool2x2Train`` (Y and a 1-byte argmax code per window instead of int64 flat
  Indices) + ``MaxPool2x2TrainGrad`` (dY scattered by the code), in the private domain
  ``ortcpu_torch.training``: 8x less stash memory, and the dedicated 2x2 kernel instead of
  the generic windowed one (measured on [64, 32, 28, 28] at 1 thread: 1.8 vs 6.0 ms).
"""

from __future__ import annotations

import onnx
from onnx import helper

DOMAIN = "ortcpu_torch.training"
_ONNX = ("", "ai.onnx")


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    out = {}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            out[vi.name] = [d.dim_value for d in t.shape.dim]
    return out


def _is_2x2(node, shape) -> bool:
    a = _attrs(node)
    auto_pad = a.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    return (shape is not None and len(shape) == 4 and list(a.get("kernel_shape", [])) == [2, 2]
            and list(a.get("strides", [1, 1])) == [2, 2]
            and list(a.get("pads", [0, 0, 0, 0])) == [0, 0, 0, 0]
            and list(a.get("dilations", [1, 1])) == [1, 1] and not a.get("ceil_mode", 0)
            and not a.get("storage_order", 0) and auto_pad in ("NOTSET", "VALID")
            and shape[2] >= 2 and shape[3] >= 2)


def fuse_training_graph(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A rewritten copy of ``model`` (or ``model`` itself when nothing applies) and a
    description of each rewrite."""
    g = model.graph
    nodes = list(g.node)  # one wrapper object per node, so id() is stable below
    shapes = _static_shapes(model)
    outputs = {o.name for o in g.output}
    readers: dict[str, list] = {}
    for n in nodes:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    replace, done = {}, []
    for n in nodes:
        if n.op_type != "MaxPool" or n.domain not in _ONNX or len(n.output) < 2 or \
                not n.output[1] or n.output[1] in outputs:
            continue
        grads = readers.get(n.output[1], [])
        if not grads or any(r.op_type != "MaxPoolGrad" or list(r.input).index(n.output[1]) != 1
                            for r in grads):
            continue
        x_shape = shapes.get(n.input[0])
        if not _is_2x2(n, x_shape):
            continue
        code = n.output[1] + "_code2x2"
        replace[id(n)] = helper.make_node("MaxPool2x2Train", [n.input[0]], [n.output[0], code],
                                          domain=DOMAIN, name=n.name + "_2x2")
        for r in grads:
            replace[id(r)] = helper.make_node("MaxPool2x2TrainGrad", [r.input[0], code],
                                              list(r.output), domain=DOMAIN,
                                              name=r.name + "_2x2", x_shape=x_shape)
        done.append("MaxPool 2x2 + MaxPoolGrad -> MaxPool2x2Train + MaxPool2x2TrainGrad")
    if not replace:
        return model, []
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(replace.get(id(n), n) for n in nodes)
    out.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return out, done
