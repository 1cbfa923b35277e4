"""Appending nodes to an ONNX graph with fresh names, for the opset it imports."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS_DOMAIN = "com.microsoft"


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    raise ValueError("model: it imports no default-domain (ai.onnx) opset")


def all_names(model: onnx.ModelProto) -> set[str]:
    g = model.graph
    names = {v.name for v in (*g.input, *g.output, *g.value_info)}
    names.update(t.name for t in g.initializer)
    for n in g.node:
        names.update(n.input)
        names.update(n.output)
        names.add(n.name)
    return names


class GraphEditor:
    """Adds nodes and constants to ``model.graph`` under names no other value uses."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.graph = model.graph
        self.opset = default_opset(model)
        self._used = all_names(model)

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self._used:
            name, i = f"{base}_{i}", i + 1
        self._used.add(name)
        return name

    def reserve(self, name: str) -> str:
        """``name`` itself, which must still be free."""
        if name in self._used:
            raise ValueError(f"the model already has a value named {name!r}")
        self._used.add(name)
        return name

    def node(self, op: str, inputs: list[str], n_out: int = 1, *, name: str,
             outputs: list[str] | None = None, domain: str = "", **attrs) -> list[str]:
        outs = outputs if outputs is not None else [self.fresh(f"{name}_out{i}")
                                                    for i in range(n_out)]
        self.graph.node.append(helper.make_node(op, inputs, outs, name=self.fresh(name),
                                                domain=domain, **attrs))
        return outs

    def const(self, value, base: str, dtype=np.float32) -> str:
        name = self.fresh(base)
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def reduce_mean(self, x: str, axes: list[int] | None, keepdims: int, name: str) -> str:
        """ReduceMean over ``axes`` (all when None), as this opset spells it."""
        if axes is None or self.opset < 18:
            kw = {} if axes is None else {"axes": list(axes)}
            return self.node("ReduceMean", [x], name=name, keepdims=keepdims, **kw)[0]
        axes_name = self.const(np.array(axes, np.int64), f"{name}_axes", np.int64)
        return self.node("ReduceMean", [x, axes_name], name=name, keepdims=keepdims)[0]
