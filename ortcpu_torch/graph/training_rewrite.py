"""The rewrite helper of ``training_fusions``: one pass's view of a training graph (who
produces and reads each value, its static shapes and constants) and the replacements a
pass chooses, applied with the forward-node count in the metadata kept right."""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper

from .gradient import FORWARD_NODES_KEY

DOMAIN = "ortcpu_torch.training"
ONNX_DOMAINS = ("", "ai.onnx")
MS_DOMAINS = ("com.microsoft",)


def node_attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    out = {}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            out[vi.name] = [d.dim_value for d in t.shape.dim]
    return out


def value_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Static shapes of the graph's values: its value_info, completed by ONNX inference
    from the (static) input shapes of the captured signature."""
    from .shapes import infer_value_shapes

    shapes = _static_shapes(model)
    ins = {vi.name: tuple(shapes[vi.name]) for vi in model.graph.input if vi.name in shapes}
    types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
    inferred, _ = infer_value_shapes(model, ins, types)
    for name, dims in (inferred or {}).items():
        if dims is not None and all(isinstance(d, int) for d in dims):
            shapes.setdefault(name, list(dims))
    return shapes


def is_onnx(node, op_type: str) -> bool:
    """``node`` is the ONNX-domain op ``op_type``."""
    return node.op_type == op_type and node.domain in ONNX_DOMAINS


class Rewrite:
    """One pass over a training graph: who produces and reads each value, and the
    replacements chosen so far (node -> the nodes that take its place, [] to drop it)."""

    def __init__(self, model: onnx.ModelProto, shapes: dict[str, list[int]]):
        self.model = model
        self.nodes = list(model.graph.node)  # one wrapper object per node: id() is stable
        self.shapes = shapes
        self.outputs = {o.name for o in model.graph.output}
        self.readers: dict[str, list] = {}
        self.producer: dict[str, onnx.NodeProto] = {}
        for n in self.nodes:
            for i in n.input:
                self.readers.setdefault(i, []).append(n)
            for o in n.output:
                self.producer[o] = n
        self.initializers = {t.name: t for t in model.graph.initializer}
        self.opset = next((o.version for o in model.opset_import if o.domain in ONNX_DOMAINS), 0)
        self.replace: dict[int, list] = {}
        self.done: list[str] = []

    def scalar(self, name: str) -> float | None:
        """The value of a one-element constant (initializer or Constant node), else None."""
        t = self.initializers.get(name)
        p = self.producer.get(name)
        if t is None and p is not None and is_onnx(p, "Constant") and \
                p.attribute and p.attribute[0].name == "value":
            t = p.attribute[0].t
        if t is None or t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
            return None
        v = numpy_helper.to_array(t)
        return float(v.reshape(-1)[0]) if v.size == 1 else None

    def taken(self, *nodes) -> bool:
        return any(id(n) in self.replace for n in nodes)

    def only_reader(self, value: str, node) -> bool:
        """``node`` is the one consumer of ``value`` and ``value`` is no graph output."""
        r = self.readers.get(value, [])
        return len(r) == 1 and r[0] is node and value not in self.outputs

    def result(self) -> onnx.ModelProto:
        if not self.replace:
            return self.model
        meta = {p.key: p.value for p in self.model.metadata_props}
        n_fwd = int(meta.get(FORWARD_NODES_KEY, len(self.nodes)))
        new_nodes, new_fwd = [], 0
        for k, n in enumerate(self.nodes):
            part = self.replace.get(id(n), [n])
            new_nodes.extend(part)
            new_fwd += len(part) if k < n_fwd else 0
        out = onnx.ModelProto()
        out.CopyFrom(self.model)
        del out.graph.node[:]
        out.graph.node.extend(new_nodes)
        if FORWARD_NODES_KEY in meta:
            for p in out.metadata_props:
                if p.key == FORWARD_NODES_KEY:
                    p.value = str(new_fwd)
        if any(n.domain == DOMAIN for n in new_nodes) and \
                not any(o.domain == DOMAIN for o in out.opset_import):
            out.opset_import.append(helper.make_opsetid(DOMAIN, 1))
        return out


def const_ints(g: Rewrite, name: str) -> list[int] | None:
    """The values of an integer constant (initializer or Constant node), else None."""
    t = g.initializers.get(name)
    p = g.producer.get(name)
    if t is None and p is not None and is_onnx(p, "Constant") and p.attribute and \
            p.attribute[0].name == "value":
        t = p.attribute[0].t
    return None if t is None else [int(v) for v in numpy_helper.to_array(t).reshape(-1)]
