"""Capture a torch model as an ONNX graph with explicit training semantics.

``torch.export.export(model, args, kwargs, strict=False)`` → the decompositions of torch's
default table minus :data:`KEEP` (layers ONNX Runtime has fused training kernels for; see
:func:`decompose`) → the ATen → ONNX lowering in ``lowering*.py`` (opset 17 +
com.microsoft 1, ir_version 8).

The graph's inputs are the user inputs (in flattened ``(args, kwargs)`` order), then every
parameter and buffer under its fully qualified name, then one ``dropout_mask_<k>`` per
training-mode dropout. Its outputs are the user outputs (flattened, loss first if the model
returns it first), then ``<buffer>.updated`` for every buffer the forward mutates (BatchNorm
running statistics, ``num_batches_tracked``).

``export(model, args, path)`` writes the eval graph as plain ONNX (parameters as
initializers, no com.microsoft ops) for onnxruntime's InferenceSession.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import time
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx
import torch
from onnx import helper, numpy_helper
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument
from torch.utils import _pytree as pytree

from .lowering import (
    IR_VERSION,
    MS_DOMAIN,
    OPSET,
    TORCH_TO_ONNX,
    Lowering,
    LoweringError,
    lower_call,
)
from .lowering_nn import DropoutMask

aten = torch.ops.aten

#: ATen ops kept whole by the decomposition table (their ONNX forms have fused ORT gradients).
KEEP = (
    aten.linear.default,
    aten.conv1d.default, aten.conv2d.default, aten.conv3d.default,
    aten.conv1d.padding, aten.conv2d.padding, aten.conv3d.padding,
    aten.layer_norm.default,
    aten.max_pool1d.default, aten.max_pool2d.default, aten.max_pool3d.default,
    aten.lstm.input, aten.gru.input,
    aten.cross_entropy_loss.default,
    aten.scaled_dot_product_attention.default,
    aten.embedding.default,
    aten.gelu.default,
)


class CaptureError(RuntimeError):
    """The model cannot be captured; the message says why and where (module path, source)."""


@dataclass
class CapturedGraph:
    """An ONNX graph captured from a torch module, and how to feed it.

    ``model`` is the ONNX ModelProto. ``user_inputs`` / ``user_outputs`` are graph value names
    in flattened pytree order; ``params`` and ``buffers`` are FQNs (also the graph input names,
    or initializer names when captured with ``params_as_initializers=True``);
    ``buffer_updates`` maps a buffer FQN to the output carrying its new value.
    """

    model: onnx.ModelProto
    user_inputs: list[str]
    user_outputs: list[str]
    params: list[str]
    buffers: list[str]
    buffer_updates: dict[str, str]
    dropout_masks: list[DropoutMask]
    detached: dict[str, str]  # gradient-free input "<fqn>.detached" -> the FQN it copies
    train: bool
    in_spec: Any = None
    out_spec: Any = None
    timings: dict[str, float] = field(default_factory=dict)

    def flatten_inputs(self, args: Sequence, kwargs: dict | None = None) -> list[torch.Tensor]:
        """The user inputs in graph order (tensors only)."""
        from torch.export._tree_utils import reorder_kwargs

        kwargs = reorder_kwargs(kwargs or {}, self.in_spec) if self.in_spec else (kwargs or {})
        flat, spec = pytree.tree_flatten((tuple(args), kwargs))
        if self.in_spec is not None and spec != self.in_spec:
            raise ValueError("inputs are not structured as at capture time")
        tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        if len(tensors) != len(self.user_inputs):
            raise ValueError(f"expected {len(self.user_inputs)} tensor inputs, got {len(tensors)}")
        return tensors

    def feeds(self, module: torch.nn.Module, args: Sequence, kwargs: dict | None = None,
              generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """All graph inputs for one run: user inputs, the module's current parameters and
        buffers, and fresh dropout masks drawn from torch's generator (in graph order, as
        eager torch draws them)."""
        feeds = dict(zip(self.user_inputs, self.flatten_inputs(args, kwargs), strict=True))
        names = {n for n in (i.name for i in self.model.graph.input)}
        for fqn in self.params:
            if fqn in names:
                feeds[fqn] = module.get_parameter(fqn).detach()
        for fqn in self.buffers:
            if fqn in names:
                feeds[fqn] = module.get_buffer(fqn).detach()
        for name, fqn in self.detached.items():
            if name in names:
                feeds[name] = feeds[fqn]
        for m in self.dropout_masks:
            feeds[m.name] = m.sample(generator)
        return feeds

    def unflatten_outputs(self, values: Sequence):
        """User outputs (graph order) back into the structure the module returns."""
        return pytree.tree_unflatten(list(values), self.out_spec) if self.out_spec else values


class _Deferred(types.ModuleType):
    """Stands in for a module that torch's export machinery imports but, at import time,
    only names in annotations: networkx (~10 MB of RSS, ~300 modules), imported at the top
    of torch._functorch's activation-checkpointing files, which aot_autograd (under
    torch.export) pulls in; export itself never calls it. While ``_placeholder`` is set every
    attribute is ``typing.Any``; afterwards the first real use imports the module and
    forwards to it, so torch.compile's partitioner still gets real networkx."""

    def __init__(self, name: str, spec):
        super().__init__(name)
        self.__spec__ = spec  # torch._dynamo's trace rules read it (find_spec)
        self._placeholder = True

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if self.__dict__["_placeholder"]:
            from typing import Any

            return Any
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        value = getattr(importlib.import_module(self.__name__), attr)
        setattr(self, attr, value)
        return value


_DEFERRED_IMPORTS = ("networkx",)
_EXPORT_MODULE = "torch.export._trace"


def _import_export_machinery() -> None:
    """Import torch.export's tracing modules once, with :class:`_Deferred` stand-ins for
    :data:`_DEFERRED_IMPORTS` (only for a module installed and not imported yet). If the
    import fails with them, it is retried the ordinary way."""
    if _EXPORT_MODULE in sys.modules:
        return
    stubs = {}
    for name in _DEFERRED_IMPORTS:
        spec = importlib.util.find_spec(name) if name not in sys.modules else None
        if spec is not None:
            stubs[name] = _Deferred(name, spec)
    sys.modules.update(stubs)
    try:
        importlib.import_module(_EXPORT_MODULE)
    except Exception:
        pass  # retried below, with the real modules
    finally:
        for name, stub in stubs.items():
            stub._placeholder = False
            if sys.modules.get(name) is stub:
                del sys.modules[name]
    importlib.import_module(_EXPORT_MODULE)


def decomposition_table() -> dict:
    """torch's default table minus :data:`KEEP`: what :func:`decompose` is equivalent to."""
    table = torch.export.default_decompositions()
    for op in KEEP:
        table.pop(op, None)
    return table


def _split_tables() -> tuple[dict, dict] | None:
    """``run_decompositions(decomposition_table())``'s two tables without enumerating every
    ATen operator: (CompositeImplicitAutograd ops -> their decomposition or torch's
    "preserve" marker, the other ops -> their Python decomposition); None if this torch
    lacks the private names.

    torch builds them by materializing an OpOverload for every overload of every ATen op
    (for the default table, then again for its split) and, for the retrace, registers a
    Python kernel on each of the 513 functional composite ops it finds (torch 2.13). Only
    two kinds of entries change what the retrace records, and they are kept: the 17 ops
    to preserve (KEEP's and torch's ``PRESERVED_ATEN_CIA_OPS``, when functional and
    composite) and the composite ops that have a decomposition of their own in the core
    table (3). The other 493 entries are the op's own composite kernel (C++, or its Python
    CompositeImplicitAutograd kernel), which is what the dispatcher (or
    FunctionalTensorMode's ``decompose``) runs for an unregistered composite op anyway.
    The non-composite table (432 entries) is the default one. Measured on train_step's
    digits CNN: the decomposition step's RSS growth 7.0 -> 1.7 MB, and the captured graphs
    (ONNX and fx code) of tests/graph and of the tiny Hugging Face models are identical."""
    try:
        from torch._decomp import _core_aten_decompositions_post_autograd
        from torch._export.utils import _is_preservable_cia_op, _special_op_to_preserve_cia
        from torch.export.decomp_utils import PRESERVED_ATEN_CIA_OPS
    except ImportError:
        return None
    keep = set(KEEP)
    cia, python = {}, {}
    for op, fn in _core_aten_decompositions_post_autograd().items():
        if op not in keep:
            (cia if _is_preservable_cia_op(op) else python)[op] = fn
    for op in (*KEEP, *PRESERVED_ATEN_CIA_OPS):
        if op not in cia and _is_preservable_cia_op(op):
            cia[op] = _special_op_to_preserve_cia
    return cia, python


_DECOMPOSE_ARGS = ("cia_to_decomp", "python_decomp_table", "joint_loss_index",
                   "decompose_custom_triton_ops")


def _private_decompose():
    """torch's ``_decompose_exported_program`` if it takes the arguments :func:`decompose`
    passes (torch 2.13's), else None (a torch that renamed or changed it)."""
    try:
        from torch.export.exported_program import _decompose_exported_program as fn
    except ImportError:
        return None
    params = inspect.signature(fn).parameters
    return fn if all(a in params for a in _DECOMPOSE_ARGS) else None


def decompose(ep):
    """``ep.run_decompositions(decomposition_table())`` through :func:`_split_tables`."""
    fn = _private_decompose()
    tables = _split_tables() if fn is not None else None
    if tables is None:
        return ep.run_decompositions(decomposition_table())
    return fn(ep, cia_to_decomp=tables[0], python_decomp_table=tables[1],
              joint_loss_index=None, decompose_custom_triton_ops=False)


def _value_info(name: str, val) -> onnx.ValueInfoProto | None:
    if not isinstance(val, torch.Tensor) or val.dtype not in TORCH_TO_ONNX:
        return None
    dims = [int(d) if isinstance(d, int) else str(d) for d in val.shape]
    return helper.make_tensor_value_info(name, TORCH_TO_ONNX[val.dtype], dims)


def _dead_code_elimination(nodes, outputs: set[str]):
    needed = set(outputs)
    kept = []
    for n in reversed(nodes):
        if any(o in needed for o in n.output if o):
            kept.append(n)
            needed.update(i for i in n.input if i)
    return kept[::-1], needed


def capture(module: torch.nn.Module, args: Sequence = (), kwargs: dict | None = None, *,
            train: bool | None = None, standard_only: bool = False,
            params_as_initializers: bool = False, dynamic_shapes=None,
            check: bool = True) -> CapturedGraph:
    """Capture ``module(*args, **kwargs)`` as an ONNX graph.

    ``train``: capture in training (True) or eval (False) mode; default: the module's current
    mode (it is restored afterwards). ``standard_only``: no com.microsoft ops.
    ``params_as_initializers``: parameters and buffers as initializers holding their current
    values instead of graph inputs. Raises :class:`CaptureError` naming the reason.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"capture: module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(args, (tuple, list)):
        args = (args,)
    was_training = module.training
    train = was_training if train is None else bool(train)
    _import_export_machinery()
    lower = dict(train=train, standard_only=standard_only,
                 params_as_initializers=params_as_initializers, check=check)
    try:
        module.train(train)
        try:
            graph = _capture_once(module, args, kwargs, dynamic_shapes, lower,
                                  stack_traces=False)
        except _LoweringFailed:
            # again with fx's per-node stack traces: the message names the source line
            graph = _capture_once(module, args, kwargs, dynamic_shapes, lower,
                                  stack_traces=True)
    finally:
        module.train(was_training)
    return graph


class _LoweringFailed(CaptureError):
    """A node could not be lowered (captured without stack traces: no source line yet)."""


def _capture_once(module, args, kwargs, dynamic_shapes, lower: dict, *,
                  stack_traces: bool) -> CapturedGraph:
    """export + decompose + lower. Without ``stack_traces`` fx records no per-node Python
    stack: it formats the whole stack of every traced op, reading each source file on it
    (torch's own included) into ``linecache``, ~3 MB of RSS for a small CNN that the
    process keeps; only an error message needs it (``lowering.node_location``)."""
    fx_config = torch.fx.config
    quiet = not stack_traces and hasattr(fx_config, "do_not_emit_stack_traces")
    saved = getattr(fx_config, "do_not_emit_stack_traces", None)
    t0 = time.perf_counter()
    try:
        if quiet:
            fx_config.do_not_emit_stack_traces = True
        try:
            ep = torch.export.export(module, tuple(args), kwargs, strict=False,
                                     dynamic_shapes=dynamic_shapes)
            t1 = time.perf_counter()
            ep = decompose(ep)
        finally:
            if quiet:
                fx_config.do_not_emit_stack_traces = saved
    except Exception as e:  # torch raises many types; all mean "cannot capture"
        msg = str(e).strip()
        raise CaptureError(f"torch.export could not capture {type(module).__name__}: "
                           f"{type(e).__name__}: {msg[:2000]}") from e
    t2 = time.perf_counter()
    try:
        graph = _lower_program(ep, module, **lower)
    except CaptureError as e:
        if quiet:
            raise _LoweringFailed(str(e)) from None
        raise
    graph.timings = {"export": t1 - t0, "decompose": t2 - t1,
                     "lower": time.perf_counter() - t2}
    return graph


def _lower_program(ep, module, *, train, standard_only, params_as_initializers, check):
    sig = ep.graph_signature
    ctx = Lowering(standard_only=standard_only, train=train)
    specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
    user_inputs, params, buffers = [], [], []
    user_infos, graph_inputs, initializers = [], [], []
    state = dict(module.state_dict(keep_vars=True))
    state.update(dict(module.named_buffers(remove_duplicate=False)))

    def add_state(fqn, node):
        tensor = ep.state_dict.get(fqn, state.get(fqn))
        if tensor is None:
            tensor = ep.constants.get(fqn)
        if params_as_initializers:
            initializers.append(numpy_helper.from_array(tensor.detach().cpu().numpy(), fqn))
        else:
            graph_inputs.append(_value_info(fqn, node.meta["val"]))

    out_node = None
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            spec = specs[node.name]
            if spec.kind == InputKind.USER_INPUT:
                if not isinstance(spec.arg, TensorArgument):
                    ctx.values[node.name] = node.meta.get("val")
                    continue
                name = node.name
                user_inputs.append(name)
                user_infos.append(_value_info(name, node.meta["val"]))
            elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
                name = spec.target
                (params if spec.kind == InputKind.PARAMETER else buffers).append(name)
                add_state(name, node)
                ctx.state_names.add(name)
            elif spec.kind == InputKind.CONSTANT_TENSOR:
                name = ctx.const(ep.constants[spec.target])
            else:
                raise CaptureError(f"unsupported graph input kind {spec.kind} ({node.name})")
            ctx.reserve(name)
            ctx.values[node.name] = name
        elif node.op == "call_function":
            try:
                ctx.values[node.name] = lower_call(ctx, node)
            except LoweringError as e:
                raise CaptureError(str(e)) from None
        elif node.op == "output":
            out_node = node
        else:
            raise CaptureError(f"unsupported fx node kind '{node.op}' ({node.name})")

    outputs, user_outputs, buffer_updates = [], [], {}
    graph_inputs = user_infos + graph_inputs
    used_names = set(n for n in (v.name for v in graph_inputs if v is not None))
    used_names.update(i.name for i in ctx.initializers)
    ctx.current = None
    for spec, arg in zip(sig.output_specs, out_node.args[0], strict=True):
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            raise CaptureError(f"the model mutates its input '{spec.target}' in place")
        value = ctx.values.get(arg.name) if isinstance(arg, torch.fx.Node) else None
        if not isinstance(value, str):
            raise CaptureError(f"output {arg} is not a tensor")
        meta = arg.meta.get("val")
        if spec.kind == OutputKind.BUFFER_MUTATION:
            name = f"{spec.target}.updated"
            ctx.op("Identity", [value], outputs=[name])
            buffer_updates[spec.target] = name
        elif spec.kind == OutputKind.USER_OUTPUT:
            name = value
            if name in used_names:  # an input or an already-used output: give it its own name
                fresh = ctx.fresh(f"output_{len(user_outputs)}")
                name = ctx.op("Identity", [value], outputs=[fresh])
            user_outputs.append(name)
        else:
            raise CaptureError(f"unsupported graph output kind {spec.kind}")
        used_names.add(name)
        outputs.append(_value_info(name, meta) or helper.make_empty_tensor_value_info(name))
    # user outputs first, then buffer updates
    outputs.sort(key=lambda v: v.name in buffer_updates.values())

    nodes, needed = _dead_code_elimination(ctx.nodes, {o.name for o in outputs})
    value_infos = _node_value_infos(ep, ctx, nodes, {o.name for o in outputs})
    inputs = [v for v in graph_inputs if v is not None] + ctx.extra_inputs
    inits = initializers + [t for t in ctx.initializers if t.name in needed]
    if params_as_initializers:  # the gradient-free copies hold the same values
        by_name = {t.name: t for t in initializers}
        for name, fqn in ctx.detached_inputs.items():
            copy = onnx.TensorProto()
            copy.CopyFrom(by_name[fqn])
            copy.name = name
            inits.append(copy)
        inputs = [v for v in inputs if v.name not in ctx.detached_inputs]
    graph = helper.make_graph(nodes, type(module).__name__, inputs, outputs, inits,
                              value_info=value_infos)
    opsets = [helper.make_opsetid("", OPSET)]
    if any(n.domain == MS_DOMAIN for n in nodes):
        opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="ortcpu_torch.capture")
    model.ir_version = IR_VERSION
    if check:
        onnx.checker.check_model(model)
    out_user = [o.name for o in outputs if o.name not in buffer_updates.values()]
    return CapturedGraph(model=model, user_inputs=user_inputs, user_outputs=out_user,
                         params=params, buffers=buffers, buffer_updates=buffer_updates,
                         dropout_masks=list(ctx.dropout_masks), detached=dict(ctx.detached_inputs),
                         train=train,
                         in_spec=ep.call_spec.in_spec, out_spec=ep.call_spec.out_spec)


def _node_value_infos(ep, ctx, nodes, outputs):
    """Types and shapes of values that are the result of one fx node (from export's meta)."""
    produced = {o for n in nodes for o in n.output}
    infos = []
    for node in ep.graph.nodes:
        val = ctx.values.get(node.name)
        if isinstance(val, str) and val in produced and val not in outputs:
            vi = _value_info(val, node.meta.get("val"))
            if vi is not None:
                infos.append(vi)
    return infos


def export(model: torch.nn.Module, args: Sequence, path: str | os.PathLike, *,
           train: bool = False, kwargs: dict | None = None,
           dynamic_shapes=None) -> CapturedGraph:
    """Write ``model(*args)`` as an ONNX file with its parameters as initializers.

    ``train=False`` (default): the eval-mode graph in standard ONNX (opset 17, no
    com.microsoft ops), which onnxruntime's InferenceSession runs. ``train=True``: the
    training-mode graph (com.microsoft Gelu/FastGelu, training BatchNormalization with
    ``<buffer>.updated`` outputs, dropout masks as inputs). ``dynamic_shapes`` as in
    ``torch.export.export`` (e.g. ``({0: torch.export.Dim("batch")},)`` for a variable
    batch size of the first input). Returns the CapturedGraph.
    """
    graph = capture(model, args, kwargs, train=train, standard_only=not train,
                    params_as_initializers=True, dynamic_shapes=dynamic_shapes)
    onnx.save_model(graph.model, os.fspath(path))
    return graph
