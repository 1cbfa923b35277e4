"""ATen → ONNX lowering: the op table and the graph builder every lowering writes through.

One entry per ATen overload, registered with :func:`lowers`. A lowering function gets the
:class:`Lowering` context, the fx node and its arguments normalized against the op's schema
(``a["input"]``, defaults filled in) and returns the ONNX value name of its result (or a tuple
of them, ``None`` for an output nothing may use). Families live in ``lowering_*.py`` beside
this file; all of them fill the one table ``LOWERINGS``.

Values: a tensor is an ONNX value name (``str``); a SymInt is an int64 0-d tensor name; a
Python number stays a number until an op needs it as a tensor (:meth:`Lowering.tensor`).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
MS_DOMAIN = "com.microsoft"
IR_VERSION = 8  # onnxruntime 1.19.2 loads ir_version <= 10; 8 is what its training tools write

TORCH_TO_ONNX = {
    torch.float32: TensorProto.FLOAT,
    torch.float64: TensorProto.DOUBLE,
    torch.float16: TensorProto.FLOAT16,
    torch.bfloat16: TensorProto.BFLOAT16,
    torch.int64: TensorProto.INT64,
    torch.int32: TensorProto.INT32,
    torch.int16: TensorProto.INT16,
    torch.int8: TensorProto.INT8,
    torch.uint8: TensorProto.UINT8,
    torch.bool: TensorProto.BOOL,
}
TORCH_TO_NUMPY = {
    torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
    torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
    torch.uint8: np.uint8, torch.bool: np.bool_,
}

LOWERINGS: dict[Any, Callable] = {}


class LoweringError(RuntimeError):
    """An fx node cannot be lowered; the message names the op, module path and source line."""


def lowers(*targets):
    """Register the decorated function as the lowering of each ATen overload in ``targets``."""

    def deco(fn):
        for t in targets:
            LOWERINGS[t] = fn
        return fn

    return deco


def normalize_args(node) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled in."""
    target = node.target
    schema = getattr(target, "_schema", None)
    if schema is None:
        return {f"arg{i}": a for i, a in enumerate(node.args)} | dict(node.kwargs)
    out: dict[str, Any] = {}
    args = list(node.args)
    for i, arg in enumerate(schema.arguments):
        if i < len(args):
            out[arg.name] = args[i]
        elif arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            out[arg.name] = None
    return out


def node_location(node) -> str:
    """'module path (Type), file:line' of an fx node, from its export metadata."""
    parts = []
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path, cls = list(stack.values())[-1]
        cls_name = cls if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
        parts.append(f"module '{path or '<root>'}' ({cls_name.rsplit('.', 1)[-1]})")
    trace = node.meta.get("stack_trace") or ""
    files = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)', trace)
    if files:
        f, line, src = files[-1]
        parts.append(f"{f}:{line}: {src.strip()}")
    return ", ".join(parts) if parts else "unknown location"


def is_node(x) -> bool:
    return isinstance(x, torch.fx.Node)


class Lowering:
    """Builds one ONNX graph: nodes, constants (as initializers), value info.

    ``standard_only=True`` asks lowerings for plain ONNX (no com.microsoft ops): the eval
    deployment path.
    """

    def __init__(self, *, standard_only: bool = False, train: bool = True):
        self.standard_only = standard_only
        self.train = train
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.extra_inputs: list[onnx.ValueInfoProto] = []
        self.dropout_masks: list[Any] = []  # filled by the dropout lowerings (capture.DropoutMask)
        self.values: dict[str, Any] = {}  # fx node name -> lowered value
        self._names: set[str] = set()
        self._consts: dict[tuple, str] = {}
        self._sym_values: dict[str, str] = {}  # str(sympy expr) -> value name
        self.current = None  # the fx node being lowered (for names and errors)
        self.bn_count = 0  # training batch norms lowered so far
        self.detached_inputs: dict[str, str] = {}  # "<value>.detached" input -> the value it copies
        self.state_names: set[str] = set()  # graph inputs that are parameters or buffers

    # ---- names, nodes, constants ------------------------------------------------
    def fresh(self, hint: str) -> str:
        hint = re.sub(r"[^A-Za-z0-9_.]", "_", hint) or "v"
        name, i = hint, 1
        while name in self._names:
            name = f"{hint}_{i}"
            i += 1
        self._names.add(name)
        return name

    def reserve(self, name: str) -> None:
        self._names.add(name)

    def op(self, op_type: str, inputs: Sequence[str | None], n_out: int = 1, *,
           domain: str = "", outputs: Sequence[str] | None = None, **attrs):
        """Append one ONNX node; returns its output name (or a tuple when ``n_out > 1``)."""
        base = self.current.name if self.current is not None else op_type.lower()
        outs = list(outputs) if outputs is not None else [
            self.fresh(f"{base}_{op_type}" if n_out == 1 else f"{base}_{op_type}_{i}")
            for i in range(n_out)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(
            op_type, ["" if i is None else i for i in inputs], outs,
            name=self.fresh(f"n_{base}_{op_type}"), domain=domain or None, **attrs))
        return outs[0] if n_out == 1 else tuple(outs)

    def const(self, value, dtype: torch.dtype | None = None, *, shared: bool = True) -> str:
        """An initializer holding ``value`` (array-like), deduplicated by content unless
        ``shared=False`` (for inputs a kernel may overwrite in place)."""
        if isinstance(value, torch.Tensor):
            arr = value.detach().cpu()
            if arr.dtype == torch.bfloat16:
                raise LoweringError("bfloat16 constants are not supported")
            arr = arr.numpy()
        else:
            arr = np.asarray(value, dtype=TORCH_TO_NUMPY[dtype] if dtype is not None else None)
        if dtype is not None:
            arr = arr.astype(TORCH_TO_NUMPY[dtype])
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if shared and key in self._consts:
            return self._consts[key]
        name = self.fresh("const")
        self.initializers.append(numpy_helper.from_array(arr.copy(order="C"), name))
        if shared:
            self._consts[key] = name
        return name

    def detached(self, arg) -> str:
        """A gradient-free copy of a parameter or buffer: an extra graph input
        ``<name>.detached`` that is fed the same tensor (no gradient flows through it)."""
        value = self.v(arg)
        if value not in self.state_names:
            raise LoweringError(f"'{value}' is not a parameter or buffer of the module")
        name = f"{value}.detached"
        if name not in self.detached_inputs:
            self.reserve(name)
            m = self.meta(arg)
            self.extra_inputs.append(helper.make_tensor_value_info(
                name, TORCH_TO_ONNX[m.dtype], [int(d) for d in m.shape]))
            self.detached_inputs[name] = value
        return name

    def ints(self, values) -> str:
        return self.const(np.asarray(values, dtype=np.int64))

    # ---- reading fx arguments ----------------------------------------------------
    def v(self, arg) -> str:
        """ONNX value of a tensor-valued fx argument."""
        if is_node(arg):
            val = self.values.get(arg.name)
            if val is None:
                raise LoweringError(f"value of '{arg.name}' is not available ({arg.target})")
            if isinstance(val, (int, float, bool)):  # a constant-folded SymInt
                return self.const(val, torch.int64 if isinstance(val, int) else torch.float32)
            return val
        raise LoweringError(f"expected a tensor argument, got {type(arg).__name__}")

    @staticmethod
    def meta(arg):
        return arg.meta.get("val") if is_node(arg) else None

    def dtype(self, arg) -> torch.dtype:
        m = self.meta(arg)
        if isinstance(m, torch.Tensor):
            return m.dtype
        if isinstance(m, torch.SymInt) or isinstance(arg, int):
            return torch.int64
        if isinstance(m, torch.SymFloat) or isinstance(arg, float):
            return torch.float32
        if isinstance(m, torch.SymBool) or isinstance(arg, bool):
            return torch.bool
        raise LoweringError(f"no dtype for {arg!r}")

    def shape(self, arg) -> tuple:
        m = self.meta(arg)
        return tuple(m.shape)

    def rank(self, arg) -> int:
        return len(self.shape(arg))

    def out_meta(self):
        return self.current.meta.get("val")

    def out_dtype(self) -> torch.dtype:
        m = self.out_meta()
        return (m[0] if isinstance(m, (tuple, list)) else m).dtype

    def static_shape(self, arg) -> list[int] | None:
        shape = self.shape(arg)
        return [int(s) for s in shape] if all(isinstance(s, int) for s in shape) else None

    # ---- tensors from Python scalars, casts, SymInts -----------------------------
    def tensor(self, x, dtype: torch.dtype) -> str:
        """``x`` (fx node, SymInt node or Python number) as an ONNX value of ``dtype``."""
        if is_node(x):
            return self.cast(self.v(x), self.dtype(x), dtype)
        if isinstance(x, (bool, int, float)):
            return self.const(x, dtype)
        raise LoweringError(f"expected a tensor or a number, got {type(x).__name__}")

    def cast(self, value: str, src: torch.dtype, dst: torch.dtype) -> str:
        if src == dst:
            return value
        return self.op("Cast", [value], to=TORCH_TO_ONNX[dst])

    def int_list(self, items) -> str:
        """A 1-D int64 value from a list of ints and SymInt nodes (Concat when symbolic)."""
        if all(isinstance(i, int) for i in items):
            return self.ints(list(items))
        parts = []
        for i in items:
            if isinstance(i, int):
                parts.append(self.ints([i]))
            else:
                parts.append(self.op("Reshape", [self.tensor(i, torch.int64), self.ints([1])]))
        return self.op("Concat", parts, axis=0)

    def shape_of_output(self, fallback_items=None) -> str:
        """The current node's output shape as a 1-D int64 value (constant when static)."""
        m = self.out_meta()
        dims = list(m.shape)
        if all(isinstance(d, int) for d in dims):
            return self.ints(dims)
        if fallback_items is None:
            raise LoweringError("symbolic output shape without a size list")
        return self.int_list(fallback_items)

    def sym_value(self, expr) -> str | None:
        return self._sym_values.get(str(expr))


def scalar_of(x):
    """A Python number from an int/float/bool argument (SymInts and tensors: None)."""
    return x if isinstance(x, (bool, int, float)) else None


def finite(x: float) -> bool:
    return not (math.isinf(x) or math.isnan(x))


# ---- the driver: ExportedProgram graph → ONNX nodes -----------------------------------
SKIPPED_TARGETS = {
    torch.ops.aten._assert_tensor_metadata.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range.default,
}

SYM_OPS = {
    operator.add: "Add", operator.sub: "Sub", operator.mul: "Mul",
    operator.floordiv: "Div", operator.truediv: "Div",
}
# SymInt comparisons (they feed the runtime asserts export adds for data-dependent sizes,
# which are skipped, so they are usually dead code)
SYM_COMPARE = {
    operator.ge: "GreaterOrEqual", operator.le: "LessOrEqual", operator.gt: "Greater",
    operator.lt: "Less", operator.eq: "Equal",
}


def lower_call(ctx: Lowering, node) -> Any:
    """Lower one call_function node; raises LoweringError naming the op and source."""
    target = node.target
    ctx.current = node
    if target is operator.getitem:
        seq, idx = node.args
        val = ctx.values[seq.name]
        if not isinstance(val, (tuple, list)):
            raise LoweringError(f"getitem on a non-tuple value '{seq.name}'")
        item = val[idx]
        if item is None:
            raise LoweringError(
                f"output {idx} of {seq.target} is used, which the lowering does not produce "
                f"(at {node_location(seq)})")
        return item
    if target in SYM_OPS:
        a, b = node.args
        return ctx.op(SYM_OPS[target], [ctx.tensor(a, torch.int64), ctx.tensor(b, torch.int64)])
    if target in SYM_COMPARE:
        a, b = node.args
        return ctx.op(SYM_COMPARE[target], [ctx.tensor(a, torch.int64),
                                            ctx.tensor(b, torch.int64)])
    if target in SKIPPED_TARGETS:
        return None
    fn = LOWERINGS.get(target)
    if fn is None:
        raise LoweringError(
            f"unsupported op {target} at {node_location(node)}: the ONNX lowering has no entry "
            f"for it (ortcpu_torch/graph/lowering*.py)")
    try:
        return fn(ctx, node, normalize_args(node))
    except LoweringError as e:
        if " at " in str(e) and "module '" in str(e):
            raise
        raise LoweringError(f"{target} at {node_location(node)}: {e}") from None


# family modules fill LOWERINGS when imported
from . import (  # noqa: E402,F401
    lowering_elementwise,
    lowering_nn,
    lowering_reduce,
    lowering_rnn,
    lowering_shape,
)
