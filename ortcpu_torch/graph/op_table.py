"""The executor's op table: (domain, op type, opset range) -> binding factory.

A *binding factory* is called once per node when a plan is built, with a ``NodeContext``
(attributes already parsed, the opset in force, constant inputs, which outputs are used),
and returns the callable the executor runs: positional inputs (``None`` for an absent
optional input) -> one tensor for a one-output node, else a tuple with one entry per node
output. Everything that can be decided from attributes is decided in the factory, never
per run.

``kind`` says where the node runs: ``"kernel"`` (a registry kernel, or the native core it
calls) or ``"torch"`` (the torch-op long tail, ``ops_torch.py``); ``report()`` counts both.
``pure=False`` marks nodes that must never be constant-folded (in-place updates, random
draws).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import onnx

from .loading import tensor_from_proto

ONNX_DOMAIN = ""
MS_DOMAIN = "com.microsoft"
_DOMAIN_ALIASES = {"ai.onnx": ONNX_DOMAIN, "ai.onnx.ml": "ai.onnx.ml"}


def canonical_domain(domain: str) -> str:
    return _DOMAIN_ALIASES.get(domain, domain)


class UnsupportedOpError(NotImplementedError):
    """A node whose (domain, op type, opset) the executor has no binding for; raised when
    the session (plan) is created, naming the node."""


@dataclass
class NodeContext:
    """What a binding factory sees of one node (built once per plan)."""

    node: onnx.NodeProto
    attrs: dict
    opset: int
    constants: list  # per input: the constant torch value if known at plan time, else None
    outputs_used: list  # per output: True if anything reads it (or it is a graph output)
    input_shapes: list = field(default_factory=list)  # per input: tuple of ints/None, or None
    output_shapes: list = field(default_factory=list)  # per output, as input_shapes
    input_dtypes: list = field(default_factory=list)  # per input: torch dtype, or None
    value_shapes: dict = field(default_factory=dict)  # every statically known value shape
    # values a factory asks to receive after the node's own inputs (read by the planner)
    extra_inputs: list = field(default_factory=list)
    graph_values: frozenset = frozenset()  # every value name produced or fed in the graph

    def dtype(self, i: int = 0):
        """The statically known torch dtype of input ``i`` (None if unknown)."""
        return self.input_dtypes[i] if i < len(self.input_dtypes) else None

    @property
    def name(self) -> str:
        return self.node.name or f"<{self.node.op_type} node>"

    def attr(self, key: str, default=None):
        return self.attrs.get(key, default)

    def const(self, i: int):
        """The constant value of input ``i`` (a torch tensor) or None if dynamic/absent."""
        return self.constants[i] if i < len(self.constants) else None

    def n_inputs(self) -> int:
        return len(self.node.input)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.input) and self.node.input[i] != ""

    def error(self, msg: str, cls=ValueError):
        return cls(f"{self.node.op_type} node {self.name!r}: {msg}")


@dataclass
class Entry:
    domain: str
    op_type: str
    since: int
    until: int  # inclusive
    factory: Callable[[NodeContext], Callable]
    kind: str
    pure: bool


_TABLE: dict[tuple[str, str], list[Entry]] = {}


def op(op_type: str, *, domain: str = ONNX_DOMAIN, since: int = 1, until: int = 10**6,
       kind: str = "torch", pure: bool = True):
    """Decorator registering a binding factory for ``op_type`` over opsets [since, until]."""

    def deco(factory):
        entries = _TABLE.setdefault((domain, op_type), [])
        for e in entries:
            if not (until < e.since or since > e.until):
                raise RuntimeError(f"overlapping bindings for {domain or 'ai.onnx'}::{op_type}")
        entries.append(Entry(domain, op_type, since, until, factory, kind, pure))
        return factory

    return deco


def lookup(domain: str, op_type: str, opset: int) -> Entry | None:
    for e in _TABLE.get((canonical_domain(domain), op_type), ()):
        if e.since <= opset <= e.until:
            return e
    return None


def supported() -> list[tuple[str, str, int, int, str]]:
    """(domain, op type, first opset, last opset, kind) of every binding."""
    return sorted((e.domain, e.op_type, e.since, e.until, e.kind)
                  for es in _TABLE.values() for e in es)


def parse_attrs(node: onnx.NodeProto) -> dict:
    """Node attributes as Python values (tensors as torch tensors, graphs as GraphProto)."""
    out = {}
    for a in node.attribute:
        t = a.type
        A = onnx.AttributeProto
        if t == A.FLOAT:
            out[a.name] = a.f
        elif t == A.INT:
            out[a.name] = a.i
        elif t == A.STRING:
            out[a.name] = a.s.decode("utf-8", "replace")
        elif t == A.TENSOR:
            out[a.name] = tensor_from_proto(a.t)
        elif t == A.GRAPH:
            out[a.name] = a.g
        elif t == A.FLOATS:
            out[a.name] = list(a.floats)
        elif t == A.INTS:
            out[a.name] = list(a.ints)
        elif t == A.STRINGS:
            out[a.name] = [s.decode("utf-8", "replace") for s in a.strings]
        else:
            out[a.name] = onnx.helper.get_attribute_value(a)
    return out
