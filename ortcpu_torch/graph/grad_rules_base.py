"""What every gradient rule builds on: the rule table, value type/shape lookups and
``GradContext``, which emits the backward nodes.

A rule is ``fn(ctx, node, dy, needs) -> list`` registered with :func:`grad_rule`:
``dy[k]`` is the name of the gradient of the node's output ``k`` (``None`` when nothing
downstream needs it), ``needs[i]`` says whether input ``i`` wants a gradient, and the
result holds, per input, the name of its gradient (the input's shape and dtype) or
``None``. Rules emit nodes only through ``ctx`` and may complete the forward node in
place (add an optional output they need, or retype it to ORT's training variant, e.g.
BatchNormalization -> BatchNormInternal) without changing what it computes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"

FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16,
                         TensorProto.BFLOAT16})

Dim = int | str | None  # a static size, a symbolic name, or unknown


class GradientBuildError(ValueError):
    """The gradient graph cannot be built (bad arguments, or an op/attribute without a
    gradient rule); the message names the node, its op type and the input concerned."""


@dataclass(frozen=True)
class GradRule:
    fn: Callable
    inputs: tuple[int, ...] | None  # input indices that can carry a gradient (None: all)
    outputs: tuple[int, ...] | None  # outputs whose gradient the rule consumes (None: all)


RULES: dict[tuple[str, str], GradRule] = {}


def _domain(d: str) -> str:
    return "" if d in ("", "ai.onnx") else d


def grad_rule(*op_types: str, domain: str = "", inputs: Sequence[int] | None = None,
              outputs: Sequence[int] | None = None) -> Callable:
    """Register ``fn`` as the gradient rule of ``op_types`` in ``domain``. ``inputs``: the
    differentiable inputs (others never get a gradient: indices, shapes, labels);
    ``outputs``: outputs whose gradient the rule handles (a gradient reaching another
    output is an error)."""

    def deco(fn: Callable) -> Callable:
        for op in op_types:
            key = (_domain(domain), op)
            if key in RULES:
                raise RuntimeError(f"gradient rule for {key} registered twice")
            RULES[key] = GradRule(fn, None if inputs is None else tuple(inputs),
                                  None if outputs is None else tuple(outputs))
        return fn

    return deco


def no_gradient(*op_types: str, domain: str = "") -> None:
    """Ops whose float outputs carry no gradient to their inputs (random generators,
    rounding, constants): gradients stop there."""
    grad_rule(*op_types, domain=domain, inputs=())(lambda ctx, node, dy, needs: [])


def attr(node: onnx.NodeProto, name: str, default=None):
    """Attribute ``name`` of ``node`` as a Python value, or ``default``."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def attrs_of(node: onnx.NodeProto, names: Iterable[str] | None = None,
             skip: Iterable[str] = ()) -> dict:
    """The node's attributes (all, or those in ``names``) as a keyword dict."""
    want = None if names is None else set(names)
    skipped = set(skip)
    out = {}
    for a in node.attribute:
        if (want is None or a.name in want) and a.name not in skipped:
            v = helper.get_attribute_value(a)
            out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def input_at(node: onnx.NodeProto, i: int) -> str:
    """Input ``i`` of ``node``, or "" when absent (optional inputs)."""
    return node.input[i] if i < len(node.input) else ""


def describe(node: onnx.NodeProto) -> str:
    dom = f"{node.domain}::" if _domain(node.domain) else ""
    return f"{dom}{node.op_type} node {node.name or '<unnamed>'!r}"


class ValueTable:
    """Element types and shapes of the graph's values (from ONNX shape inference, plus
    what the builder records for the values it creates)."""

    def __init__(self) -> None:
        self._type: dict[str, int] = {}
        self._shape: dict[str, list[Dim] | None] = {}
        self.constants: dict[str, np.ndarray | onnx.TensorProto] = {}

    def set(self, name: str, elem_type: int | None, shape: Sequence[Dim] | None) -> None:
        if elem_type:
            self._type[name] = elem_type
        if shape is not None:
            self._shape[name] = list(shape)

    def set_from_type_proto(self, name: str, tp: onnx.TypeProto) -> None:
        if not tp.HasField("tensor_type"):
            return
        tt = tp.tensor_type
        shape = None
        if tt.HasField("shape"):
            shape = []
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    shape.append(d.dim_value)
                elif d.HasField("dim_param"):
                    shape.append(d.dim_param)
                else:
                    shape.append(None)
        self.set(name, tt.elem_type or None, shape)

    def dtype(self, name: str) -> int | None:
        return self._type.get(name)

    def shape(self, name: str) -> list[Dim] | None:
        return self._shape.get(name)

    def static_shape(self, name: str) -> list[int] | None:
        s = self._shape.get(name)
        if s is None or any(not isinstance(d, int) for d in s):
            return None
        return list(s)

    def rank(self, name: str) -> int | None:
        s = self._shape.get(name)
        return None if s is None else len(s)

    def type_proto(self, name: str) -> onnx.TypeProto:
        return helper.make_tensor_type_proto(self._type.get(name, 0), self._shape.get(name))


def _np_dtype(elem_type: int) -> np.dtype:
    return helper.tensor_dtype_to_np_dtype(elem_type)


class GradContext:
    """Emits the backward nodes of one gradient graph and answers type/shape questions.

    Node names follow ORT's gradient builder ("<forward node>_Grad/<op>_<k>"); value
    names are made unique against every name in the model."""

    def __init__(self, values: ValueTable, opset: int, used_names: set[str],
                 emitted_check: Callable[[str, str], None] | None = None) -> None:
        self.values = values
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.value_info: dict[str, onnx.ValueInfoProto] = {}
        self._used = used_names
        self._suffix: dict[str, int] = {}  # next suffix to try per hint (keeps fresh O(1))
        self._const_cache: dict[tuple, str] = {}
        self._shape_cache: dict[str, str] = {}
        self._scope = "Grad"
        self._scope_count = 0
        self._scope_counts: dict[str, int] = {}
        self._check_emit = emitted_check
        self.consumed: set[str] = set()  # values forward nodes read, and graph outputs

    # ---- naming ---------------------------------------------------------------------

    def fresh(self, hint: str) -> str:
        """A value name based on ``hint`` that no other value uses."""
        name, k = hint, self._suffix.get(hint, 1)
        while name in self._used:
            name = f"{hint}_{k}"
            k += 1
        self._suffix[hint] = k
        self._used.add(name)
        return name

    def begin(self, node: onnx.NodeProto) -> None:
        """Start the nodes of ``node``'s gradient (names them ``<node>_Grad/...``)."""
        self.begin_named(f"{node.name or node.op_type}_Grad")

    def begin_named(self, scope: str) -> None:
        """Name the next nodes ``<scope>/<op>_<k>``."""
        self._scope_counts[self._scope] = self._scope_count
        self._scope = scope
        self._scope_count = self._scope_counts.get(scope, 0)

    # ---- emitting -------------------------------------------------------------------

    def emit(self, op_type: str, inputs: Sequence[str], outputs: int | Sequence[str] = 1,
             domain: str = "", hint: str | None = None, **attributes) -> list[str]:
        """Append one node; ``outputs`` is a count (fresh names from ``hint``) or names
        ("" for an optional output left out). Returns the output names."""
        if self._check_emit is not None:
            self._check_emit(domain, op_type)
        if isinstance(outputs, int):
            base = hint or f"{self._scope}/{op_type}_out"
            outputs = [self.fresh(base if outputs == 1 else f"{base}{k}") for k in range(outputs)]
        name = f"{self._scope}/{op_type}_{self._scope_count}"
        self._scope_count += 1
        attrs = {k: v for k, v in attributes.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), name=name,
                                           domain=domain, **attrs))
        return list(outputs)

    def op(self, op_type: str, *inputs: str, domain: str = "", hint: str | None = None,
           **attributes) -> str:
        """Append a one-output node and return its output name."""
        return self.emit(op_type, inputs, 1, domain=domain, hint=hint, **attributes)[0]

    def forward_output(self, node: onnx.NodeProto, index: int, hint: str) -> str:
        """Output ``index`` of the forward ``node``, added under a fresh name when the
        model left it out: the backward reads it (a mask, Mean/InvStdDev, Indices)."""
        while len(node.output) <= index:
            node.output.append("")
        if not node.output[index]:
            node.output[index] = self.fresh(hint)
        return node.output[index]

    def named(self, grad: str, like: str) -> str:
        """Record that ``grad`` has the type and shape of forward value ``like``."""
        self.values.set(grad, self.values.dtype(like), self.values.shape(like))
        return grad

    def annotate(self, name: str, like: str) -> None:
        """Put ``name``'s type and shape (those of ``like``) into the graph's value_info:
        ORT's pool gradients read their output shape from there."""
        self.value_info[name] = helper.make_value_info(name, self.values.type_proto(like))

    # ---- constants and shapes --------------------------------------------------------

    def const(self, array: np.ndarray, hint: str = "const") -> str:
        """A Constant node holding ``array`` (one per distinct value)."""
        array = np.asarray(array)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._const_cache:
            out = self.fresh(f"{self._scope}/{hint}")
            saved = self._scope
            self.begin_named("Grad_Constants")
            self.emit("Constant", [], [out], value=numpy_helper.from_array(array, out))
            self.begin_named(saved)
            self.values.set(out, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
            self.values.constants[out] = array
            self._const_cache[key] = out
        return self._const_cache[key]

    def ints(self, values: Sequence[int], hint: str = "ints") -> str:
        """A 1-D int64 Constant."""
        return self.const(np.asarray(list(values), dtype=np.int64), hint)

    def scalar(self, value: float, like: str, hint: str = "scalar") -> str:
        """A rank-0 Constant of ``like``'s float dtype."""
        return self.const(np.asarray(value, dtype=_np_dtype(self.float_dtype(like))), hint)

    def float_dtype(self, name: str) -> int:
        dt = self.values.dtype(name)
        if dt is None:
            raise GradientBuildError(
                f"the element type of {name!r} is unknown (shape inference could not type "
                "it); give the model value_info for it")
        return dt

    def shape_of(self, name: str) -> str:
        """The shape of ``name`` as an int64 tensor: a Constant when it is static, else one
        Shape node per value."""
        static = self.values.static_shape(name)
        if static is not None:
            return self.ints(static, "shape")
        if name not in self._shape_cache:
            out = self.op("Shape", name, hint=f"{self._scope}/shape_of_{name}")
            self.values.set(out, TensorProto.INT64, [self.values.rank(name)]
                            if self.values.rank(name) is not None else None)
            self._shape_cache[name] = out
        return self._shape_cache[name]

    def zeros_like(self, name: str) -> str:
        """Zeros with ``name``'s shape and float dtype."""
        dt = self.float_dtype(name)
        zero = numpy_helper.from_array(np.zeros(1, dtype=_np_dtype(dt)), "zero")
        out = self.op("ConstantOfShape", self.shape_of(name), value=zero,
                      hint=f"{self._scope}/zeros_{name}")
        return self.named(out, name)

    def constant_value(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when it is a graph constant (Constant node or an
        initializer that is neither a graph input nor trainable), else None."""
        value = self.values.constants.get(name)
        if isinstance(value, onnx.TensorProto):
            value = self.values.constants[name] = numpy_helper.to_array(value)
        return value

    # ---- gradient helpers -------------------------------------------------------------

    def reduce_to(self, grad: str, out_shape: Sequence[Dim] | None, target: str,
                  hint: str | None = None) -> str:
        """Sum ``grad`` (shaped ``out_shape``, the broadcast shape) down to the shape of
        ``target`` (ONNX multidirectional broadcasting). Static shapes give a ReduceSum
        over known axes; otherwise BroadcastGradientArgs finds the axes at run time."""
        hint = hint or f"{target}_grad"
        ts = self.values.shape(target)
        axes = _broadcast_axes(ts, out_shape)
        if axes is None:
            return self._reduce_dynamic(grad, target, hint)
        if not axes:  # same shape
            return grad
        leading = len(out_shape) - len(ts)
        inner = [a for a in axes if a >= leading]
        if not inner:
            out = self.op("ReduceSum", grad, self.ints(axes, "axes"), keepdims=0, hint=hint)
        elif leading == 0:
            out = self.op("ReduceSum", grad, self.ints(axes, "axes"), keepdims=1, hint=hint)
        else:
            summed = self.op("ReduceSum", grad, self.ints(axes, "axes"), keepdims=1)
            out = self.op("Reshape", summed, self.shape_of(target), hint=hint)
        return self.named(out, target)

    def _reduce_dynamic(self, grad: str, target: str, hint: str) -> str:
        axes = self.emit("BroadcastGradientArgs", [self.shape_of(target), self.shape_of(grad)],
                         [self.fresh(f"{self._scope}/axes_for_{target}")], domain=MS)[0]
        summed = self.op("ReduceSum", grad, axes, keepdims=1, noop_with_empty_axes=1)
        out = self.op("Reshape", summed, self.shape_of(target), hint=hint)
        return self.named(out, target)

    def mul_scalar(self, x: str, value: float, like: str) -> str:
        """``x · value`` (no node when value is 1)."""
        if value == 1.0:
            return x
        return self.op("Mul", x, self.scalar(value, like))


def _broadcast_axes(target: Sequence[Dim] | None, out: Sequence[Dim] | None) -> list[int] | None:
    """Axes of ``out`` along which a value shaped ``target`` was broadcast, or None when
    the shapes do not decide it statically."""
    if target is None or out is None or len(target) > len(out):
        return None
    leading = len(out) - len(target)
    axes = list(range(leading))
    for j, t in enumerate(target):
        o = out[j + leading]
        if t is not None and t == o:
            continue
        if t == 1:  # broadcast (summing a size-1 axis of out is harmless, so o may be symbolic)
            axes.append(j + leading)
            continue
        return None
    return axes
