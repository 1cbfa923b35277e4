"""The gradient builder: an ONNX forward graph -> an ONNX training graph (forward +
backward) with ONNX Runtime's gradient ops and naming.

``build_gradient_graph(model, requires_grad, loss_name)`` keeps the forward graph
(completing nodes where the backward needs more of them: LayerNormalization's Mean and
InvStdDev, Dropout's mask, MaxPool's Indices, BatchNormalization -> BatchNormInternal,
LSTM/GRU -> LSTMTraining/GRUTraining), then walks it backwards from the loss, calling one
rule per op (``grad_rules_*.py``), and outputs one ``<input>_grad`` per trainable input,
after the forward outputs. Only gradients on a path from a trainable input to the loss
are computed. The result is valid ONNX (opset 13-21 + com.microsoft 1, IR version <= 10)
that onnxruntime-training 1.19.2 runs as well as our executor.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .. import kernels
from . import (  # noqa: F401  (each module registers its rules)
    grad_rules_activation,
    grad_rules_math,
    grad_rules_nn,
    grad_rules_rnn,
    grad_rules_tensor,
)
from .grad_rules_base import (
    FLOAT_TYPES,
    MS,
    RULES,
    GradContext,
    GradientBuildError,
    ValueTable,
    _domain,
    describe,
)

__all__ = ["build_gradient_graph", "GradientBuildError", "FORWARD_NODES_KEY",
           "gradient_rules", "split_training_graph"]

MIN_OPSET = 13
MAX_IR_VERSION = 10  # onnxruntime 1.19.2 refuses IR version 11 and later
# metadata_props key: how many of the training graph's nodes are the forward part
FORWARD_NODES_KEY = "ortcpu_torch.gradient.forward_nodes"

# ORT forward ops ONNX shape inference does not know -> a standard op (and how many of
# the inputs it takes) whose output 0 has the same type and shape, for inference only
_INFERENCE_STAND_INS = {
    (MS, "Gelu"): ("Identity", 1), (MS, "QuickGelu"): ("Identity", 1),
    (MS, "FastGelu"): ("Add", 2), (MS, "BiasGelu"): ("Add", 2),
    ("", "SimplifiedLayerNormalization"): ("Identity", 1),
}
# ORT's training ops that live in the ONNX domain (ORT registers them there, at opset 9)
_ORT_DEFAULT_DOMAIN_OPS = {"MaxPoolGrad", "AveragePoolGrad"}


def build_gradient_graph(model: onnx.ModelProto | str | os.PathLike | bytes,
                         requires_grad: Sequence[str], loss_name: str | Sequence[str], *,
                         seed_inputs: bool = False,
                         params_as_inputs: bool = False) -> onnx.ModelProto:
    """Build the training graph of ``model``.

    Args:
        model: the forward model (ModelProto, path or serialized bytes); not modified.
        requires_grad: names of the graph inputs or initializers to differentiate; each
            gets a graph output ``<name>_grad`` (in this order, after the forward outputs).
        loss_name: the output to differentiate (a float scalar: its gradient is seeded
            with 1), or several outputs.
        seed_inputs: instead of seeding with ones, make each loss output's gradient a
            graph input ``<output>_grad`` (for callers that backpropagate an upstream
            gradient, like ORTModule).
        params_as_inputs: turn the ``requires_grad`` initializers into graph inputs (as
            ONNX Runtime's training models have them); otherwise they stay initializers.

    Returns:
        A new ModelProto. Its ``metadata_props`` entry ``FORWARD_NODES_KEY`` gives the
        number of leading nodes that form the forward part.

    Raises:
        GradientBuildError: a loss that is not a graph output, a name in
            ``requires_grad`` that is not a float input or initializer, an opset below 13,
            or an op on the gradient path without a rule (naming the op type, the node and
            the input that needed a gradient).
    """
    model = _load(model)
    graph = model.graph
    opset = _default_opset(model)
    if not isinstance(loss_name, (str, Sequence)):
        raise TypeError(f"loss_name: expected an output name or a list of them, got "
                        f"{type(loss_name).__name__}")
    losses = [loss_name] if isinstance(loss_name, str) else list(loss_name)
    params = _check_requires_grad(graph, requires_grad)
    _check_losses(graph, losses)

    values = _value_table(model, params)
    for loss in losses:
        if values.dtype(loss) not in FLOAT_TYPES:
            raise GradientBuildError(
                f"loss_name: output {loss!r} is not a float tensor "
                f"({_type_name(values.dtype(loss))}); only float outputs have a gradient")
    nodes = _topological(graph)
    active = _active_values(nodes, params, losses, values)

    used = _all_names(model)
    for p in params:
        if f"{p}_grad" in used:
            raise GradientBuildError(
                f"requires_grad: the model already has a value named {p + '_grad'!r}, "
                f"the name of the gradient output of {p!r}")
    used.update(f"{p}_grad" for p in params)  # reserved for the outputs
    registry = set(kernels.names())

    def check_emit(domain: str, op_type: str) -> None:
        if (domain == MS or op_type in _ORT_DEFAULT_DOMAIN_OPS) and op_type not in registry:
            raise GradientBuildError(f"internal: gradient op {op_type} has no kernel")

    ctx = GradContext(values, opset, used, check_emit)
    ctx.consumed = {i for n in nodes for i in n.input} | {o.name for o in graph.output}
    grads: dict[str, list[str]] = {}
    seed_value_infos = []
    for loss in losses:
        seed = ctx.fresh(f"{loss}_grad")
        if seed_inputs:
            seed_value_infos.append(helper.make_value_info(seed, values.type_proto(loss)))
        else:
            ctx.begin_named("Loss")
            _emit_ones(ctx, loss, seed)
        ctx.named(seed, loss)
        grads[loss] = [seed]

    for node in reversed(nodes):
        _backward_node(ctx, node, grads, active)

    finals = []
    for p in params:
        contributions = grads.get(p)
        if contributions:
            finals.append(_accumulate(ctx, p, grads))
        else:  # the loss does not depend on p
            ctx.begin_named(f"{p}_NoGrad")
            finals.append(ctx.zeros_like(p))
    grad_names = _name_gradients(ctx, params, finals)

    forward = list(nodes)
    del graph.node[:]
    graph.node.extend(forward + ctx.nodes)
    graph.input.extend(seed_value_infos)
    for p, g in zip(params, grad_names, strict=True):
        graph.output.append(helper.make_value_info(g, values.type_proto(p)))
    known_vi = {vi.name for vi in graph.value_info}
    graph.value_info.extend(vi for n, vi in ctx.value_info.items() if n not in known_vi)
    if params_as_inputs:
        _params_to_inputs(graph, params)
    _finish_model(model, len(forward))
    _check_defined(graph)
    return model


def split_training_graph(training: onnx.ModelProto) -> tuple[list, list, list[str]]:
    """(forward nodes, backward nodes, saved values) of a graph built here: the saved
    values are what the backward part reads from the forward part (graph inputs,
    initializers and forward node outputs, in order of first use), i.e. what a caller
    running the two parts separately (ORTModule) keeps between them."""
    meta = {p.key: p.value for p in training.metadata_props}
    if FORWARD_NODES_KEY not in meta:
        raise ValueError(f"training: no {FORWARD_NODES_KEY!r} metadata; not a graph built by "
                         "build_gradient_graph")
    n = int(meta[FORWARD_NODES_KEY])
    forward, backward = list(training.graph.node[:n]), list(training.graph.node[n:])
    g = training.graph
    from_forward = {i.name for i in g.input} | {t.name for t in g.initializer}
    from_forward |= {o for node in forward for o in node.output if o}
    saved = []
    for node in backward:
        for name in node.input:
            if name in from_forward and name not in saved:
                saved.append(name)
    return forward, backward, saved


def gradient_rules() -> list[tuple[str, str]]:
    """(domain, op type) of every op the builder differentiates ("" = ai.onnx); ops that
    stop gradients (Shape, comparisons, random generators, ...) are included."""
    return sorted(RULES)


# ---- loading and checks ---------------------------------------------------------------


def _load(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        out = onnx.ModelProto()
        out.CopyFrom(model)
        return out
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    if isinstance(model, (str, os.PathLike)):
        try:
            return onnx.load(os.fspath(model))
        except Exception as e:  # OSError, protobuf's DecodeError, onnx's errors
            raise GradientBuildError(f"model: cannot load {os.fspath(model)!r}: {e}") from e
    raise TypeError(f"model: expected an onnx.ModelProto, a path or bytes, got "
                    f"{type(model).__name__}")


def _default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if _domain(imp.domain) == "":
            if imp.version < MIN_OPSET:
                raise GradientBuildError(
                    f"model: default-domain opset {imp.version} is not supported; the "
                    f"gradient builder needs opset {MIN_OPSET} or later (convert the model "
                    "with onnx.version_converter)")
            return imp.version
    raise GradientBuildError("model: it imports no default-domain (ai.onnx) opset")


def _check_requires_grad(graph: onnx.GraphProto, requires_grad) -> list[str]:
    if isinstance(requires_grad, str) or not isinstance(requires_grad, Sequence):
        raise TypeError("requires_grad: expected a list of input or initializer names, got "
                        f"{type(requires_grad).__name__}")
    params = list(requires_grad)
    if not params:
        raise GradientBuildError("requires_grad: empty; name at least one input or "
                                 "initializer to differentiate")
    dup = {p for p in params if params.count(p) > 1}
    if dup:
        raise GradientBuildError(f"requires_grad: names listed twice: {sorted(dup)}")
    types = {i.name: i.type.tensor_type.elem_type for i in graph.input}
    types.update({t.name: t.data_type for t in graph.initializer})
    for p in params:
        if not isinstance(p, str):
            raise TypeError(f"requires_grad: expected names (str), got {p!r}")
        if p not in types:
            raise GradientBuildError(
                f"requires_grad: {p!r} is not a graph input or initializer of the model "
                f"(inputs: {[i.name for i in graph.input]}, "
                f"initializers: {[t.name for t in graph.initializer][:20]})")
        if types[p] not in FLOAT_TYPES:
            raise GradientBuildError(
                f"requires_grad: {p!r} is {_type_name(types[p])}; only float tensors have "
                "a gradient")
    return params


def _check_losses(graph: onnx.GraphProto, losses: list[str]) -> None:
    outs = [o.name for o in graph.output]
    if not losses:
        raise GradientBuildError("loss_name: empty")
    for loss in losses:
        if not isinstance(loss, str):
            raise TypeError(f"loss_name: expected an output name (str), got {loss!r}")
        if loss not in outs:
            raise GradientBuildError(
                f"loss_name: {loss!r} is not an output of the graph (outputs: {outs})")


def _type_name(elem_type: int | None) -> str:
    if not elem_type:
        return "of unknown type"
    return TensorProto.DataType.Name(elem_type).lower()


def _all_names(model: onnx.ModelProto) -> set[str]:
    """Every value name of the model, subgraphs (If/Loop/Scan bodies) included."""
    names: set[str] = set()

    def visit(g: onnx.GraphProto) -> None:
        names.update(i.name for i in g.input)
        names.update(o.name for o in g.output)
        names.update(t.name for t in g.initializer)
        names.update(v.name for v in g.value_info)
        for n in g.node:
            names.update(n.input)
            names.update(n.output)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    visit(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        visit(sub)

    visit(model.graph)
    names.discard("")
    return names


# ---- types and shapes ------------------------------------------------------------------


def _value_table(model: onnx.ModelProto, params: list[str]) -> ValueTable:
    """Types and shapes from ONNX shape inference (run on a copy where the ORT forward
    ops it does not know stand in as standard ops of the same output shape), plus the
    values of graph constants."""
    work = helper.make_model(_light_graph(model.graph), opset_imports=model.opset_import,
                             ir_version=model.ir_version)
    work.functions.extend(model.functions)
    for n in work.graph.node:
        stand_in = _INFERENCE_STAND_INS.get((_domain(n.domain), n.op_type))
        if stand_in is not None:
            op, n_inputs = stand_in
            outputs = list(n.output[:1])
            inputs = list(n.input[:n_inputs]) if len(n.input) >= n_inputs else list(n.input[:1])
            if len(inputs) < n_inputs:
                op = "Identity"
            del n.input[:], n.output[:], n.attribute[:]
            n.input.extend(inputs)
            n.output.extend(outputs)
            n.op_type, n.domain = op, ""
    try:
        inferred = onnx.shape_inference.infer_shapes(work, check_type=False, strict_mode=False,
                                                     data_prop=True)
    except Exception:  # noqa: BLE001  (inference is a help here, not a requirement)
        inferred = work

    values = ValueTable()
    g = inferred.graph
    for vi in [*g.input, *g.value_info, *g.output]:
        values.set_from_type_proto(vi.name, vi.type)
    inputs = {i.name for i in model.graph.input}
    for t in model.graph.initializer:
        values.set(t.name, t.data_type, list(t.dims))
        if t.name not in inputs and t.name not in params:
            values.constants[t.name] = t  # converted when a rule asks for it
    for n in model.graph.node:
        if n.op_type == "Constant" and _domain(n.domain) == "" and n.output:
            arr = _constant_node_value(n)
            if arr is not None:
                values.constants[n.output[0]] = arr
                values.set(n.output[0], helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape)
    return values


_KEEP_INITIALIZER_ELEMS = 4096  # small constants (shapes, axes) help data propagation


def _light_graph(graph: onnx.GraphProto) -> onnx.GraphProto:
    """``graph`` for shape inference: large initializers become typed inputs, so their
    bytes are not copied and serialized."""
    light = onnx.GraphProto(name=graph.name)
    light.node.extend(graph.node)
    light.input.extend(graph.input)
    light.output.extend(graph.output)
    light.value_info.extend(graph.value_info)
    inputs = {i.name for i in graph.input}
    for t in graph.initializer:
        if int(np.prod(t.dims)) <= _KEEP_INITIALIZER_ELEMS:
            light.initializer.append(t)
        elif t.name not in inputs:
            light.input.append(helper.make_tensor_value_info(t.name, t.data_type, t.dims))
    return light


def _constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if a.name == "value":
            return numpy_helper.to_array(v)
        if a.name in ("value_float", "value_int"):
            return np.asarray(v, dtype=np.float32 if a.name == "value_float" else np.int64)
        if a.name in ("value_floats", "value_ints"):
            return np.asarray(v, dtype=np.float32 if a.name == "value_floats" else np.int64)
    return None


# ---- graph walking ------------------------------------------------------------------------


def _topological(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes in a valid order (the graph's own when it is one, as ONNX requires)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    ok = True
    for n in graph.node:
        if any(i not in defined for i in n.input):
            ok = False
            break
        defined.update(n.output)
    if ok:
        return [_copy(n) for n in graph.node]
    # Kahn's algorithm, stable in the original order
    producers = {o: k for k, n in enumerate(graph.node) for o in n.output if o}
    pending = list(range(len(graph.node)))
    done_values = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    order = []
    while pending:
        progress = False
        rest = []
        for k in pending:
            n = graph.node[k]
            if all(i in done_values or i not in producers for i in n.input):
                order.append(_copy(n))
                done_values.update(n.output)
                progress = True
            else:
                rest.append(k)
        if not progress:
            raise GradientBuildError(
                f"model: the graph has a cycle through {describe(graph.node[rest[0]])}")
        pending = rest
    return order


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    out = onnx.NodeProto()
    out.CopyFrom(node)
    return out


def _differentiable_inputs(node: onnx.NodeProto) -> list[int]:
    rule = RULES.get((_domain(node.domain), node.op_type))
    if rule is None or rule.inputs is None:
        return list(range(len(node.input)))
    return [i for i in rule.inputs if i < len(node.input)]


def _active_values(nodes, params, losses, values: ValueTable) -> set[str]:
    """Values on a path from a trainable input to a loss: the ones whose gradient is
    needed. Non-float values and non-differentiable inputs cut paths."""

    def can_carry(name: str) -> bool:
        return bool(name) and values.dtype(name) in FLOAT_TYPES | {None}

    reach = set(params)
    for n in nodes:
        if any(n.input[i] in reach for i in _differentiable_inputs(n)):
            reach.update(o for o in n.output if can_carry(o))
    need = set(losses)
    for n in reversed(nodes):
        if any(o in need for o in n.output):
            need.update(n.input[i] for i in _differentiable_inputs(n) if n.input[i])
    return reach & need


def _accumulate(ctx: GradContext, name: str, grads: dict[str, list[str]]) -> str:
    """The total gradient of ``name`` (a sum when several consumers contributed)."""
    parts = grads[name]
    if len(parts) > 1:
        total = parts[0]
        for k, part in enumerate(parts[1:]):
            last = k == len(parts) - 2
            total = ctx.op("Add", total, part,
                           hint=f"{name}_grad" if last else f"{name}_grad_partial")
        ctx.named(total, name)
        grads[name] = [total]
    return grads[name][0]


def _backward_node(ctx: GradContext, node: onnx.NodeProto, grads, active: set[str]) -> None:
    outs = list(node.output)
    has = [bool(o) and o in active and o in grads for o in outs]
    if not any(has):
        return
    rule = RULES.get((_domain(node.domain), node.op_type))
    diff = set(_differentiable_inputs(node))
    needs = [bool(inp) and inp in active and i in diff for i, inp in enumerate(node.input)]
    if not any(needs):
        return
    if rule is None:
        wanted = [node.input[i] for i, w in enumerate(needs) if w]
        raise GradientBuildError(
            f"no gradient rule for op {node.op_type}"
            f"{' (domain ' + node.domain + ')' if _domain(node.domain) else ''}: "
            f"{describe(node)} needs the gradient of its input(s) {wanted}")
    ctx.begin(node)
    dys = []
    for k, o in enumerate(outs):
        if not has[k]:
            dys.append(None)
            continue
        if rule.outputs is not None and k not in rule.outputs:
            raise GradientBuildError(
                f"{describe(node)}: a gradient reaches its output {k} ({o!r}), which has no "
                f"gradient rule (only output(s) {list(rule.outputs)} are differentiable)")
        ctx.begin(node)
        dys.append(_accumulate(ctx, o, grads))
    ctx.begin(node)
    result = list(rule.fn(ctx, node, dys, needs))
    for i, want in enumerate(needs):
        if not want:
            continue
        g = result[i] if i < len(result) else None
        if g is None:
            raise GradientBuildError(
                f"internal: the rule of {describe(node)} gave no gradient for input {i}")
        grads.setdefault(node.input[i], []).append(g)


def _emit_ones(ctx: GradContext, like: str, out: str) -> None:
    dt = ctx.float_dtype(like)
    static = ctx.values.static_shape(like)
    one = np.ones(static if static is not None else [1], dtype=helper.tensor_dtype_to_np_dtype(dt))
    if static is not None:
        ctx.emit("Constant", [], [out], value=numpy_helper.from_array(one, out))
    else:
        ctx.emit("ConstantOfShape", [ctx.shape_of(like)], [out],
                 value=numpy_helper.from_array(one, "one"))


def _name_gradients(ctx: GradContext, params, finals) -> list[str]:
    """Give each final gradient its output name ``<param>_grad``: rename the value where
    it is a backward value of its own, else add an Identity."""
    produced = {o for n in ctx.nodes for o in n.output if n.op_type != "Constant"}
    renames: dict[str, str] = {}
    for p, v in zip(params, finals, strict=True):
        want = f"{p}_grad"
        if finals.count(v) > 1 or v not in produced:
            ctx.begin_named(want)
            ctx.emit("Identity", [v], [want])
        else:
            renames[v] = want
            if v in ctx.value_info:
                vi = ctx.value_info.pop(v)
                vi.name = want
                ctx.value_info[want] = vi
    if renames:
        for n in ctx.nodes:
            for k, name in enumerate(n.input):
                if name in renames:
                    n.input[k] = renames[name]
            for k, name in enumerate(n.output):
                if name in renames:
                    n.output[k] = renames[name]
    return [f"{p}_grad" for p in params]


def _params_to_inputs(graph: onnx.GraphProto, params: list[str]) -> None:
    inputs = {i.name for i in graph.input}
    keep = []
    for t in graph.initializer:
        if t.name in params and t.name not in inputs:
            graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, t.dims))
        elif t.name not in params:
            keep.append(t)
        # an initializer that is also an input stays an input only
    del graph.initializer[:]
    graph.initializer.extend(keep)


def _finish_model(model: onnx.ModelProto, n_forward: int) -> None:
    if not any(_domain(i.domain) == MS for i in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
    for prop in list(model.metadata_props):
        if prop.key == FORWARD_NODES_KEY:
            model.metadata_props.remove(prop)
    entry = model.metadata_props.add()
    entry.key, entry.value = FORWARD_NODES_KEY, str(n_forward)


def _check_defined(graph: onnx.GraphProto) -> None:
    """Every node input is defined before use (catches a rule's mistake early)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    for n in graph.node:
        for i in n.input:
            if i not in defined:
                raise GradientBuildError(f"internal: {describe(n)} reads {i!r} before it is "
                                         "defined")
        defined.update(n.output)
    for o in graph.output:
        if o.name not in defined:
            raise GradientBuildError(f"internal: graph output {o.name!r} is never computed")
