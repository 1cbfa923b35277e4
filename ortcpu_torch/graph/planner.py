"""The planner: one input signature -> a ``Plan`` (a straight-line program of bound calls).

Built once per signature: nodes bound to their op-table entries with attributes parsed,
constants and constant subgraphs folded (including ``Shape``/``Size`` of statically known
shapes), fusions applied, each intermediate freed after its last use. The program is
emitted as one Python function (one line per node, ``del`` after last uses) so a run is
only the calls themselves; a failure is mapped back to its node through the line number.
"""

from __future__ import annotations

import dataclasses
import itertools
import linecache
import time
from dataclasses import dataclass, field

import onnx
import torch

from . import op_table
from .dtypes import ONNX_TO_TORCH
from .op_table import NodeContext, UnsupportedOpError, parse_attrs


class GraphRunError(RuntimeError):
    """A node failed during a run; names the node and chains the kernel's error."""

    def __init__(self, msg: str, node: onnx.NodeProto | None = None):
        super().__init__(msg)
        self.node = node


@dataclass
class BoundNode:
    node: onnx.NodeProto
    kind: str  # "kernel" / "torch"
    fn: object


@dataclass
class Plan:
    """A bound program for one input signature. ``run(*feeds)`` takes the graph inputs in
    order (torch tensors, or lists for sequence inputs) and returns the outputs in order."""

    input_names: list[str]
    output_names: list[str]
    bound: list[BoundNode]
    folded: list[onnx.NodeProto]
    fusions: list[str]
    source: str
    _fn: object = None
    _line_node: dict = field(default_factory=dict)
    _filename: str = ""
    _globals: dict = field(default_factory=dict)

    def run(self, *feeds):
        try:
            return self._fn(*feeds)
        except Exception as e:  # map the failing line back to its node
            node = self._failing_node(e)
            if node is None:
                raise
            name = node.name or "<unnamed>"
            dom = node.domain or "ai.onnx"
            raise GraphRunError(f"{node.op_type} node {name!r} ({dom}) failed: "
                                f"{type(e).__name__}: {e}", node) from e

    def _failing_node(self, e: BaseException):
        tb = e.__traceback__
        node = None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == self._filename:
                node = self._line_node.get(tb.tb_lineno)
            tb = tb.tb_next
        return node

    def profile(self, *feeds, clock=time.perf_counter) -> tuple[tuple, list]:
        """Run once with every bound call timed (a separate copy of the program, so the
        plain ``run`` stays untimed): (outputs, [(node, seconds)] in program order).
        ``clock``: e.g. ``time.thread_time`` for CPU time on a loaded machine."""
        spent = [0.0] * len(self.bound)

        def timed(k, fn):
            def call(*args):
                t0 = clock()
                try:
                    return fn(*args)
                finally:
                    spent[k] += clock() - t0
            return call

        glb = dict(self._globals)
        for k, b in enumerate(self.bound):
            glb[f"f{k}"] = timed(k, b.fn)
        exec(compile(self.source, self._filename, "exec"), glb)  # noqa: S102
        outs = glb["run"](*feeds)
        return outs, [(b.node, t) for b, t in zip(self.bound, spent, strict=True)]

    def counts(self) -> dict[str, dict[str, int]]:
        """op type -> {"kernel": n, "torch": n} over the bound (not folded) nodes; a node
        whose binding decides its side at run time (``fn.side()``: a measured choice that
        may be torch's op) counts where it ran."""
        out: dict[str, dict[str, int]] = {}
        for b in self.bound:
            key = b.node.op_type if b.node.domain in ("", "ai.onnx") else \
                f"{b.node.domain}.{b.node.op_type}"
            c = out.setdefault(key, {"kernel": 0, "torch": 0})
            side = getattr(b.fn, "side", None)
            c[side() if side is not None else b.kind] += 1
        return out


_plan_ids = itertools.count()


def node_entry(node: onnx.NodeProto, opsets: dict[str, int]):
    """The op-table entry for ``node``, or UnsupportedOpError naming it."""
    domain = op_table.canonical_domain(node.domain)
    opset = opsets.get(domain)
    if opset is None:
        raise UnsupportedOpError(
            f"node {node.name!r} ({node.op_type}) uses domain {domain or 'ai.onnx'!r}, which "
            f"the model does not import")
    e = op_table.lookup(domain, node.op_type, opset)
    if e is None:
        raise UnsupportedOpError(
            f"unsupported op: {node.op_type} (domain {domain or 'ai.onnx'!r}, opset {opset}) "
            f"at node {node.name!r}; the executor has no binding for it")
    return e


def check_supported(graph: onnx.GraphProto, opsets: dict[str, int]) -> None:
    for node in graph.node:
        node_entry(node, opsets)


def _is_const_node(node) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx")


def build_plan(graph: onnx.GraphProto, opsets: dict[str, int], constants: dict,
               fed_names: list[str], shapes: dict[str, tuple], types: dict | None = None, *,
               fuse: bool = True, nodes=None) -> Plan:
    """Bind ``graph`` for one signature. ``constants``: name -> tensor of the initializers
    that cannot be fed (shared, never written by the plan); ``fed_names``: the graph inputs
    in order; ``shapes``: static shapes from ``shapes.infer_value_shapes``."""
    from .fusions import apply_fusions

    consts = dict(constants)
    outputs = [o.name for o in graph.output]
    nodes = list(graph.node) if nodes is None else nodes
    # pass 1: fold constants (so fusions see folded weights); pass 2: fuse and bind
    folded: list = []
    live = _bind_all(nodes, opsets, consts, fed_names, shapes, types, outputs, folded)
    fusions: list[str] = []
    if fuse:
        shapes, types = dict(shapes), dict(types or {})  # the blocked layout adds values
        fused, fusions = apply_fusions([n for n, _, _ in live], consts, graph, opsets,
                                       shapes, types)
        if fusions:
            live = _bind_all(fused, opsets, consts, fed_names, shapes, types, outputs, folded)
    return _emit(live, folded, fusions, consts, fed_names, outputs)


def _bind_all(nodes, opsets, consts, fed_names, shapes, types, outputs, folded):
    """Bind every node; fold those whose inputs are all constants (results go into
    ``consts``, the nodes into ``folded``). Returns [(node, entry, fn)] of the rest."""
    from .fusions import consumer_counts

    consumers = consumer_counts(nodes, outputs)
    graph_values = frozenset([*fed_names, *consts,
                              *(o for n in nodes for o in n.output if o)])
    live_nodes = []
    fresh: set[str] = set()  # values whose storage only their producer's output owns
    out_set = set(outputs)
    for node in nodes:
        entry = node_entry(node, opsets)
        attrs = parse_attrs(node)
        epilogue = attrs.pop("ortcpu_epilogue", None)  # set by fusions.py
        in_consts = [consts.get(i) if i else None for i in node.input]
        in_shapes = [shapes.get(i) if i else None for i in node.input]
        ctx = NodeContext(node, attrs, opsets[op_table.canonical_domain(node.domain)],
                          in_consts, [bool(o) and consumers.get(o, 0) > 0 for o in node.output],
                          in_shapes, [shapes.get(o) if o else None for o in node.output],
                          [_dtype_of(i, consts, types) for i in node.input], shapes,
                          graph_values=graph_values)
        fn = entry.factory(ctx)
        if epilogue:
            fn = _with_epilogue(fn, [e.decode() if isinstance(e, bytes) else e
                                     for e in epilogue])
        if ctx.extra_inputs:  # the binding reads more values than the node lists
            node = _with_inputs(node, ctx.extra_inputs)
            for i in ctx.extra_inputs:
                consumers[i] = consumers.get(i, 0) + 1
        present = [i for i in node.input if i]
        foldable = entry.pure and all(i in consts for i in present)
        meta_args = None
        if entry.pure and not foldable and node.op_type in ("Shape", "Size") and \
                node.domain in ("", "ai.onnx"):
            s = in_shapes[0]
            if s is not None and all(isinstance(d, int) for d in s):
                meta_args = [torch.empty(s, device="meta")]
        if foldable or meta_args is not None:
            args = meta_args or [consts[i] if i else None for i in node.input]
            try:
                res = fn(*args)
            except Exception:
                res = None  # leave it to the run, which reports it against the node
            if res is not None:
                res = (res,) if len(node.output) == 1 else tuple(res)
                for name, v in zip(node.output, res, strict=False):
                    if name:
                        consts[name] = v
                folded.append(node)
                continue
        inplace = _inplace_variant(node, ctx, fresh, consumers, out_set, shapes)
        if inplace is not None:
            fn = inplace
        if (node.op_type in _FRESH_OUTPUT and node.domain in ("", "ai.onnx")) or \
                (node.op_type in _FRESH_OUTPUT_MS and node.domain == "com.microsoft"):
            fresh.update(o for o in node.output if o)
        if ctx.kind is not None and ctx.kind != entry.kind:
            entry = dataclasses.replace(entry, kind=ctx.kind)
        live_nodes.append((node, entry, fn))
    return live_nodes


# ops whose outputs are always newly allocated (never a view of an input)
_FRESH_OUTPUT = {"Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "MatMul", "Gemm",
                 "Conv", "Sum", "Softmax", "LogSoftmax", "Exp", "Erf", "Sqrt", "Pow",
                 "LayerNormalization", "AveragePool", "MaxPool", "GlobalAveragePool",
                 "Concat", "Gelu", "LeakyRelu"}
# com.microsoft kernels whose outputs the registry always allocates (the gradient graph's
# residual Adds read LayerNormalizationGrad's dX)
_FRESH_OUTPUT_MS = {"LayerNormalizationGrad", "GeluGrad", "FastGeluGrad", "BiasGelu"}
_INPLACE = {
    "Add": lambda a, b: a.add_(b), "Sub": lambda a, b: a.sub_(b),
    "Mul": lambda a, b: a.mul_(b), "Div": lambda a, b: a.div_(b),
}
# commutative: the second input may take the result instead
_INPLACE_SECOND = {"Add": lambda a, b: b.add_(a), "Mul": lambda a, b: b.mul_(a)}


def _inplace_variant(node, ctx, fresh, consumers, out_set, shapes):
    """The in-place form of an elementwise node whose first input (for Add and Mul: or
    second) is a fresh intermediate used only here, with the output's (static) shape and
    dtype; else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in _INPLACE:
        return None
    dts = ctx.input_dtypes
    if len(node.input) != 2 or dts[0] is None or any(d != dts[0] for d in dts):
        return None
    if node.op_type == "Div" and not dts[0].is_floating_point:
        return None  # integer Div truncates (ONNX), div_ would not
    so = shapes.get(node.output[0])
    for k, table in ((0, _INPLACE), (1, _INPLACE_SECOND)):
        x = node.input[k]
        if node.op_type not in table or x not in fresh or consumers.get(x) != 1 or \
                x in out_set or (k == 1 and x == node.input[0]):
            continue
        sx = shapes.get(x)
        if sx is None or so is None or sx != so or any(not isinstance(d, int) for d in sx):
            continue
        return table[node.op_type]
    return None



def _with_epilogue(fn, steps):
    """``fn`` followed by in-place steps on its (fresh) output: "add" (the last argument is
    the bias) and/or "relu". A binding that can fold the steps into its own kernel offers
    ``fn.with_epilogue(steps)``, returning the fused callable (or None to decline)."""
    fused = getattr(fn, "with_epilogue", None)
    fused = fused(steps) if fused is not None else None
    if fused is not None:
        return fused
    n_add, relu = steps.count("add"), "relu" in steps
    if n_add == 1 and relu:
        def run(*args):
            return fn(*args[:-1]).add_(args[-1]).relu_()
    elif n_add == 1:
        def run(*args):
            return fn(*args[:-1]).add_(args[-1])
    elif n_add == 0:
        def run(*args):
            return fn(*args).relu_()
    else:  # several addends, in the order of the steps (the last arguments)
        def run(*args):
            y = fn(*args[:-n_add])
            for addend in args[-n_add:]:
                y = y.add_(addend)
            return y.relu_() if relu else y
    return run


def _with_inputs(node, extra):
    n = onnx.NodeProto()
    n.CopyFrom(node)
    n.input.extend(extra)
    return n


def _dtype_of(name, consts, types):
    if not name:
        return None
    c = consts.get(name)
    if isinstance(c, torch.Tensor):
        return c.dtype
    e = (types or {}).get(name)
    return ONNX_TO_TORCH.get(e) if e else None


def _emit(live_nodes, folded, fusions, consts, fed_names, outputs) -> Plan:
    """Generate the straight-line run function."""
    var: dict[str, str] = {}
    glb: dict[str, object] = {}
    for i, name in enumerate(fed_names):
        if name not in consts:  # an unfed default initializer is a constant instead
            var[name] = f"a{i}"
    last_use: dict[str, int] = {}
    for k, (node, _, _) in enumerate(live_nodes):
        for i in node.input:
            if i:
                last_use[i] = k
    out_set = set(outputs)
    const_names: dict[str, str] = {}

    def ref(name: str) -> str:
        if not name:
            return "None"
        if name in var:
            return var[name]
        if name in consts:
            if name not in const_names:
                const_names[name] = f"k{len(const_names)}"
                glb[const_names[name]] = consts[name]
            return const_names[name]
        raise UnsupportedOpError(f"value {name!r} is used but never produced (not an input, "
                                 "initializer or node output)")

    lines = [f"def run({', '.join(f'a{i}' for i in range(len(fed_names)))}):"]
    line_node = {}
    bound = []
    counter = itertools.count()
    for k, (node, entry, fn) in enumerate(live_nodes):
        fname = f"f{k}"
        glb[fname] = fn
        args = ", ".join(ref(i) for i in node.input)
        outs = []
        for o in node.output:
            if o:
                v = f"v{next(counter)}"
                var[o] = v
                outs.append(v)
            else:
                outs.append("_")
        if len(outs) == 1:
            lhs = outs[0]
        else:
            lhs = ", ".join(outs) + ","
        lines.append(f"    {lhs} = {fname}({args})")
        line_node[len(lines)] = node
        dead = [var[i] for i in dict.fromkeys(node.input)
                if i and last_use.get(i) == k and i not in out_set and i in var
                and not var[i].startswith("k")]
        dead += [var[o] for o in node.output if o and o not in last_use and o not in out_set]
        if dead:
            lines.append(f"    del {', '.join(dead)}")
        bound.append(BoundNode(node, entry.kind, fn))
    rets = [ref(o) for o in outputs]
    lines.append(f"    return ({', '.join(rets)}{',' if len(rets) == 1 else ''})")
    source = "\n".join(lines) + "\n"
    filename = f"<ortcpu_torch graph plan {next(_plan_ids)}>"
    code = compile(source, filename, "exec")
    exec(code, glb)  # noqa: S102  (our own generated straight-line program)
    plan = Plan(list(fed_names), list(outputs), bound, folded, fusions, source,
                glb["run"], line_node, filename, {k: v for k, v in glb.items()
                                                  if k != "__builtins__"})
    # keep the generated source reachable for tracebacks and debugging
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return plan
