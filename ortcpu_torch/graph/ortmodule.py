"""``ORTModule``: a torch module whose forward and backward run as ONNX graphs on our kernels.

Per input signature (shapes, dtypes, requires_grad, non-tensor values, train/eval, grad
mode) the wrapped module is captured once (``capture.py``), its training graph is built
(``gradient.build_gradient_graph`` with the outputs' gradients as inputs) and split into a
forward part and a backward part, each bound to an :class:`Executor`. A call then runs the
forward part inside one ``torch.autograd.Function``, keeping the values the backward part
reads; ``backward`` runs the backward part and returns the gradients of the parameters and of
the inputs that require them, which autograd accumulates into the original ``.grad``s.

BatchNorm running statistics and ``num_batches_tracked`` are written back into the wrapped
module's buffers in place after every training forward. Dropout masks are drawn from torch's
generator in the order eager torch draws them, so ``torch.manual_seed`` reproduces a run.
A module that cannot be captured runs eagerly, warned once (``fallback="warn"``) or raising
:class:`ortcpu_torch.FallbackError` (``fallback="error"``).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field

import onnx
import torch
from onnx import helper
from torch.utils import _pytree as pytree

from .capture import CapturedGraph, capture
from .executor import Executor
from .gradient import FORWARD_NODES_KEY, build_gradient_graph
from .lowering import TORCH_TO_ONNX
from .training_fusions import fuse_training_graph
from .training_summary import SUMMARY_OUTPUT, SummaryLog, add_summary_nodes, is_summary_node

_MAX_SIGNATURES = 16
_SHAPE_FROM_FORWARD = {"AveragePoolGrad", "MaxPoolGrad"}


@dataclass
class _Split:
    """A training graph cut into its forward and backward parts."""

    forward: onnx.ModelProto
    backward_nodes: list
    backward_initializers: list
    backward_inputs: list         # ValueInfos of the graph inputs the backward reads
    stash: list[str]             # forward values the backward reads
    grad_outputs: list[str]
    opsets: list
    value_info: list             # the training graph's, for shapes the backward reads
    has_summary: bool = False    # the backward ends in training_summary's nodes


def _split_training_graph(tg: onnx.ModelProto, seeds: list[str],
                          forward_outputs: list[str]) -> _Split:
    n_fwd = int({p.key: p.value for p in tg.metadata_props}[FORWARD_NODES_KEY])
    g = tg.graph
    fwd_nodes, bwd_nodes = list(g.node[:n_fwd]), list(g.node[n_fwd:])
    produced_fwd = {o for n in fwd_nodes for o in n.output if o}
    produced_bwd = {o for n in bwd_nodes for o in n.output if o}
    inputs = [i for i in g.input if i.name not in seeds]
    inits = {t.name: t for t in g.initializer}
    bwd_reads = []
    for n in bwd_nodes:
        for i in n.input:
            if i and i not in produced_bwd and i not in bwd_reads:
                bwd_reads.append(i)
    stash = [v for v in bwd_reads if v in produced_fwd]
    # pool gradients take their output shape from the forward value "<v>" of "<v>_grad"
    # when shape inference cannot see through the backward's com.microsoft ops
    graph_inputs = {i.name for i in g.input}
    shape_refs = set()
    for n in bwd_nodes:
        if n.op_type in _SHAPE_FROM_FORWARD and n.output[0].endswith("_grad"):
            v = n.output[0][: -len("_grad")]
            if v in produced_fwd and v not in stash:
                stash.append(v)
            elif v in graph_inputs:  # the pooled value is a graph input: feed it
                shape_refs.add(v)
    fwd_reads = {i for n in fwd_nodes for i in n.input}
    outputs = [o for o in g.output if o.name in set(forward_outputs)]
    out_names = {o.name for o in outputs}
    outputs += [helper.make_empty_tensor_value_info(s) for s in stash if s not in out_names]
    fwd_graph = helper.make_graph(fwd_nodes, g.name + "_forward", inputs, outputs,
                                  [t for n, t in inits.items() if n in fwd_reads],
                                  value_info=list(g.value_info))
    fwd = helper.make_model(fwd_graph, opset_imports=list(tg.opset_import))
    fwd.ir_version = tg.ir_version
    grads = [o.name for o in g.output if o.name.endswith("_grad") and o.name in produced_bwd]
    return _Split(forward=fwd, backward_nodes=bwd_nodes,
                  backward_initializers=[t for n, t in inits.items() if n in bwd_reads],
                  backward_inputs=[i for i in g.input if i.name in set(bwd_reads) | shape_refs],
                  stash=stash, grad_outputs=grads, opsets=list(tg.opset_import),
                  value_info=list(g.value_info), has_summary=SUMMARY_OUTPUT in produced_bwd)


def _value_info_of(name: str, t: torch.Tensor) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TORCH_TO_ONNX[t.dtype], list(t.shape))


def _state_slot(module: torch.nn.Module, fqn: str) -> tuple[dict, str]:
    """(the owning module's ``_parameters`` or ``_buffers`` dict, key) of a parameter or
    buffer: read per call (``d[key]``), it sees a reassigned tensor, unlike a cached one."""
    prefix, _, name = fqn.rpartition(".")
    owner = module.get_submodule(prefix) if prefix else module
    for d in (owner._parameters, owner._buffers):
        if name in d:
            return d, name
    raise KeyError(f"{fqn!r} is neither a parameter nor a buffer of the module")


@dataclass
class _Entry:
    """Everything bound for one input signature.

    Positions are resolved once (``bind``) so a call only fills lists: ``fwd_*`` are
    positions in the forward executor's inputs, ``bwd_*`` in the backward executor's."""

    graph: CapturedGraph
    forward: Executor
    trainable: list[str] = field(default_factory=list)      # params with gradients
    grad_inputs: list[int] = field(default_factory=list)    # user-input positions with grads
    split: _Split | None = None
    seeds: dict[str, str] = field(default_factory=dict)     # output name -> seed input name
    backward: Executor | None = None
    training_model: onnx.ModelProto | None = None
    # resolved by bind()
    fwd_template: list = field(default_factory=list)   # defaults filled, the rest None
    fwd_user: list = field(default_factory=list)       # (position, user-input index)
    fwd_diff: list = field(default_factory=list)       # (position, differentiable index)
    fwd_state: list = field(default_factory=list)      # (position, (dict, key))
    fwd_masks: list = field(default_factory=list)      # (position, DropoutMask)
    out_user: list = field(default_factory=list)       # forward output index per user output
    out_buffers: list = field(default_factory=list)    # ((dict, key), forward output index)
    out_stash: list = field(default_factory=list)      # forward output index per stash value
    bwd_from_fwd: list = field(default_factory=list)   # (bwd position, fwd position, clone)
    bwd_seeds: list = field(default_factory=list)      # (bwd position, user-output index)
    bwd_stash: list = field(default_factory=list)      # (bwd position, stash index)
    bwd_grads: list = field(default_factory=list)      # bwd output index or None per diff
    bwd_template: list = field(default_factory=list)   # the backward's defaults filled in
    diff_slots: list = field(default_factory=list)     # (dict, key) per trainable parameter
    backward_logged: Executor | None = None            # backward + summary nodes
    training_fusions: list = field(default_factory=list)  # training_fusions.py's rewrites
    log: SummaryLog | None = None

    def diff_names(self) -> list[str]:
        """The differentiable graph inputs: user inputs needing a gradient, then params."""
        return [self.graph.user_inputs[i] for i in self.grad_inputs] + self.trainable

    def bind(self, module: torch.nn.Module) -> None:
        """Resolve the forward executor's inputs and outputs to positions and slots."""
        g, ex = self.graph, self.forward
        diff = {n: j for j, n in enumerate(self.diff_names())}
        user = {n: i for i, n in enumerate(g.user_inputs)}
        masks = {m.name: m for m in g.dropout_masks}
        self.fwd_template = [ex.defaults.get(n) for n in ex.input_names]
        self.fwd_user, self.fwd_diff, self.fwd_state, self.fwd_masks = [], [], [], []
        for pos, name in enumerate(ex.input_names):
            src = g.detached.get(name, name)  # "<fqn>.detached" reads the FQN's value
            if src in diff and src == name:
                self.fwd_diff.append((pos, diff[src]))
            elif src in user:
                self.fwd_user.append((pos, user[src]))
            elif src in masks:
                self.fwd_masks.append((pos, masks[src]))
            elif src in g.params or src in g.buffers:
                self.fwd_state.append((pos, _state_slot(module, src)))
            elif name not in ex.defaults:
                raise RuntimeError(f"ORTModule: no source for graph input {name!r}")
        self.diff_slots = [_state_slot(module, p) for p in self.trainable]
        out_index = {n: k for k, n in enumerate(ex.output_names)}
        self.out_user = [out_index[n] for n in g.user_outputs]
        self.out_buffers = [(_state_slot(module, fqn), out_index[name])
                            for fqn, name in g.buffer_updates.items()]
        self.out_stash = [out_index[n] for n in self.split.stash] if self.split else []

    def build_backward(self, stash_values: list[torch.Tensor]) -> None:
        """The backward model, typed by the stash values of the first forward run, and the
        positions of its inputs and outputs."""
        s = self.split
        inputs = list(s.backward_inputs)
        inputs += [_value_info_of(n, v) for n, v in zip(s.stash, stash_values, strict=True)]
        bwd = self._backward_executor(inputs, [n for n in s.backward_nodes
                                               if not is_summary_node(n)], s.grad_outputs)
        if s.has_summary:  # the logged steps' variant: same inputs, the summary last
            self.backward_logged = self._backward_executor(
                inputs, s.backward_nodes, [*s.grad_outputs, SUMMARY_OUTPUT])
        fwd_pos = {n: k for k, n in enumerate(self.forward.input_names)}
        seed_of = {seed: i for i, out in enumerate(self.graph.user_outputs)
                   if (seed := self.seeds.get(out)) is not None}
        stash_pos = {n: k for k, n in enumerate(s.stash)}
        # a buffer the forward mutates keeps its old value for the backward (the fed
        # tensor shares the buffer's storage, which the buffer write-back overwrites)
        mutated = set(self.graph.buffer_updates)
        self.bwd_from_fwd, self.bwd_seeds, self.bwd_stash = [], [], []
        for pos, name in enumerate(bwd.input_names):
            if name in stash_pos:
                self.bwd_stash.append((pos, stash_pos[name]))
            elif name in seed_of:
                self.bwd_seeds.append((pos, seed_of[name]))
            elif name in fwd_pos:
                src = self.graph.detached.get(name, name)
                self.bwd_from_fwd.append((pos, fwd_pos[name], src in mutated))
            elif name not in bwd.defaults:
                raise RuntimeError(f"ORTModule: no source for backward input {name!r}")
        out_index = {n: k for k, n in enumerate(bwd.output_names)}
        self.bwd_grads = [out_index.get(f"{n}_grad") for n in self.diff_names()]
        self.bwd_template = [bwd.defaults.get(n) for n in bwd.input_names]
        self.backward = bwd

    def _backward_executor(self, inputs, nodes, output_names) -> Executor:
        s = self.split
        stash = set(s.stash)
        outputs = [helper.make_empty_tensor_value_info(n) for n in output_names]
        graph = helper.make_graph(nodes, "backward", inputs, outputs, s.backward_initializers,
                                  value_info=[v for v in s.value_info if v.name not in stash])
        model = helper.make_model(graph, opset_imports=s.opsets)
        model.ir_version = s.forward.ir_version
        return Executor(model, check=False)

    def forward_values(self, module, user: list, masks_generator=None) -> list:
        """The forward executor's inputs except the differentiable ones (left None)."""
        vals = list(self.fwd_template)
        for pos, i in self.fwd_user:
            vals[pos] = user[i]
        for pos, (d, key) in self.fwd_state:
            vals[pos] = d[key].detach()
        for pos, m in self.fwd_masks:
            vals[pos] = m.sample(masks_generator)
        return vals

    def run_forward(self, vals: list) -> tuple:
        """Forward outputs in executor order (buffers not yet written back)."""
        return self.forward.plan_for(vals).run(*vals)

    def write_buffers(self, outs: tuple) -> None:
        """New BatchNorm statistics (and any other mutated buffer) into the module, in
        place."""
        if self.out_buffers:  # one foreach call (dtype-converting, broadcasting like copy_)
            torch._foreach_copy_([d[key] for (d, key), _ in self.out_buffers],
                                 [outs[k] for _, k in self.out_buffers])

    def backward_values(self, vals: list, outs: tuple) -> list:
        """The backward executor's inputs known after the forward (seeds left None); taken
        before ``write_buffers`` so a mutated buffer the backward reads keeps its old
        value (the fed tensor shares the buffer's storage)."""
        saved = list(self.bwd_template)
        for pos, fpos, clone in self.bwd_from_fwd:
            saved[pos] = vals[fpos].clone() if clone else vals[fpos]
        for pos, k in self.bwd_stash:
            saved[pos] = outs[self.out_stash[k]]
        return saved


class _GraphFunction(torch.autograd.Function):
    """Forward part of the graph in ``forward``, backward part in ``backward``.

    ``tensors`` are the differentiable graph inputs (``_Entry.diff_names``); ``vals`` the
    forward executor's other inputs by position (``_Entry.forward_values``).
    """

    @staticmethod
    def forward(ctx, entry: _Entry, vals: list, *tensors):
        for pos, j in entry.fwd_diff:
            vals[pos] = tensors[j].detach()
        outs = entry.run_forward(vals)
        if entry.backward is None:  # typed by this first run's stash
            entry.build_backward([outs[k] for k in entry.out_stash])
        ctx.entry = entry
        ctx.saved = entry.backward_values(vals, outs)
        entry.write_buffers(outs)
        user = [outs[k] for k in entry.out_user]
        nondiff = [u for u in user if not u.dtype.is_floating_point]
        if nondiff:
            ctx.mark_non_differentiable(*nondiff)
        return tuple(user)

    @staticmethod
    def backward(ctx, *grad_outputs):
        entry = ctx.entry
        vals = ctx.saved
        for pos, i in entry.bwd_seeds:
            vals[pos] = grad_outputs[i].contiguous()  # materialized: zeros for unused outputs
        del ctx.saved
        log = entry.log
        if log is not None and entry.backward_logged is not None and log.due():
            grads = entry.backward_logged.plan_for(vals).run(*vals)
            log.write(grads[-1])
        else:
            grads = entry.backward.plan_for(vals).run(*vals)
        return (None, None, *(grads[k] if k is not None else None for k in entry.bwd_grads))


def _scalar_loss(graph: CapturedGraph) -> str | None:
    """The first user output if it is a float scalar (the loss), else None."""
    if not graph.user_outputs:
        return None
    first = graph.user_outputs[0]
    for o in graph.model.graph.output:
        if o.name == first:
            t = o.type.tensor_type
            if t.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE) and \
                    t.HasField("shape") and len(t.shape.dim) == 0:
                return first
    return None


class ORTModule(torch.nn.Module):
    """Run ``module``'s forward and backward as captured ONNX graphs on ortcpu_torch kernels.

    ``ORTModule(model)`` is a drop-in for ``model`` in a training loop: same parameters (the
    module's own ``nn.Parameter`` objects, so any optimizer works), same ``state_dict`` keys,
    ``train()``/``eval()``, ``torch.save``/``copy.deepcopy``. Args:

    - ``fallback``: ``"warn"`` (default) runs a module that cannot be captured eagerly in
      torch, warning once with the reason; ``"error"`` raises ``ortcpu_torch.FallbackError``.
    - ``save_onnx``: a directory; each captured forward graph and training graph is written
      there (``<signature>_forward.onnx``, ``<signature>_training.onnx``).
    - ``log_dir``: a directory for TensorBoard event files. The training graph then ends in
      SummaryScalar / SummaryHistogram nodes (``training_summary.py``) that every
      ``log_every`` backward passes (the first, then every ``log_every``-th) write the loss
      (the module's first output, if it is a float scalar), the global gradient norm
      (``grad_norm``) and a histogram per parameter gradient (``gradients/<name>``).
    """

    def __init__(self, module: torch.nn.Module, *, fallback: str = "warn",
                 save_onnx: str | os.PathLike | None = None,
                 log_dir: str | os.PathLike | None = None, log_every: int = 10):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"ORTModule: module must be a torch.nn.Module, got "
                            f"{type(module).__name__}")
        if fallback not in ("warn", "error"):
            raise ValueError(f"ORTModule: fallback must be 'warn' or 'error', got {fallback!r}")
        self.module = module
        self.fallback = fallback
        self.save_onnx = os.fspath(save_onnx) if save_onnx is not None else None
        if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1:
            raise ValueError(f"ORTModule: log_every must be a positive int, got {log_every!r}")
        self.log_dir = os.fspath(log_dir) if log_dir is not None else None
        self.log_every = log_every
        self._log: SummaryLog | None = None
        self._cache: dict = {}
        self._fallback_reason: str | None = None
        self.train(module.training)

    # ---- state: identical to the wrapped module ------------------------------------
    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        if assign:
            self._cache.clear()  # parameters are new objects
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_cache"] = {}  # executors are rebuilt on the next call
        state["_log"] = None  # a copy opens its own event file
        return state

    # ---- running ---------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self._fallback_reason is not None:
            return self.module(*args, **kwargs)
        key = self._signature(args, kwargs)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._build(args, kwargs)
            if entry is None:
                return self.module(*args, **kwargs)
            if len(self._cache) >= _MAX_SIGNATURES:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = entry
        return self._run(entry, args, kwargs)

    def _signature(self, args, kwargs) -> tuple:
        if not kwargs and all(type(a) is torch.Tensor for a in args):  # the common call
            return (tuple((a.shape, a.dtype, a.requires_grad) for a in args),
                    self.module.training, torch.is_grad_enabled())
        flat, spec = pytree.tree_flatten((args, kwargs))
        sig = tuple((tuple(x.shape), x.dtype, x.requires_grad) if isinstance(x, torch.Tensor)
                    else (type(x), x if isinstance(x, (int, float, bool, str, type(None)))
                          else id(x)) for x in flat)
        return (sig, str(spec), self.module.training, torch.is_grad_enabled())

    def _build(self, args, kwargs) -> _Entry | None:
        from ..wrap.policy import FallbackError, FallbackWarning

        try:
            return self._capture(args, kwargs)
        except Exception as e:  # any capture/build failure means: run eagerly
            reason = f"{type(e).__name__}: {e}"
            if self.fallback == "error":
                raise FallbackError(f"ORTModule could not capture "
                                    f"{type(self.module).__name__}: {reason}") from e
            self._fallback_reason = reason
            warnings.warn(f"ORTModule: {type(self.module).__name__} runs eagerly in torch: "
                          f"{reason}", FallbackWarning, stacklevel=3)
            return None

    def _capture(self, args, kwargs) -> _Entry:
        module = self.module
        graph = capture(module, args, kwargs, train=module.training)
        tensors = graph.flatten_inputs(args, kwargs)
        entry = _Entry(graph=graph, forward=None)
        if torch.is_grad_enabled():
            entry.trainable = [p for p in graph.params if module.get_parameter(p).requires_grad]
            entry.grad_inputs = [i for i, t in enumerate(tensors)
                                 if t.requires_grad and t.dtype.is_floating_point]
        wrt = [graph.user_inputs[i] for i in entry.grad_inputs] + entry.trainable
        tag = f"{'train' if graph.train else 'eval'}_{len(self._cache)}"
        if wrt:
            outs = graph.model.graph.output
            float_outs = [o.name for o in outs if o.name in graph.user_outputs and
                          o.type.tensor_type.elem_type in (onnx.TensorProto.FLOAT,
                                                           onnx.TensorProto.DOUBLE)]
            tg = build_gradient_graph(graph.model, wrt, float_outs, seed_inputs=True)
            before = {i.name for i in graph.model.graph.input}
            seed_names = [i.name for i in tg.graph.input if i.name not in before]
            entry.seeds = dict(zip(float_outs, seed_names, strict=True))
            if self.log_dir is not None:
                entry.log = self._summary_log()
                add_summary_nodes(tg, _scalar_loss(graph), {
                    p: f"{p}_grad" for p in entry.trainable
                    if f"{p}_grad" in {o.name for o in tg.graph.output}})
            forward_outputs = graph.user_outputs + list(graph.buffer_updates.values())
            run_tg, entry.training_fusions = fuse_training_graph(tg)
            entry.split = _split_training_graph(run_tg, seed_names, forward_outputs)
            entry.forward = Executor(entry.split.forward, check=False)
            entry.training_model = tg
        else:
            entry.forward = Executor(graph.model, check=False)
        if self.save_onnx is not None:
            os.makedirs(self.save_onnx, exist_ok=True)
            onnx.save_model(graph.model, os.path.join(self.save_onnx, f"{tag}_forward.onnx"))
            if entry.training_model is not None:
                onnx.save_model(entry.training_model,
                                os.path.join(self.save_onnx, f"{tag}_training.onnx"))
        entry.bind(module)
        return entry

    def _summary_log(self) -> SummaryLog:
        if self._log is None:
            self._log = SummaryLog(self.log_dir, self.log_every)
        return self._log

    def _run(self, entry: _Entry, args, kwargs):
        module, g = self.module, entry.graph
        user = list(args) if not kwargs and all(type(a) is torch.Tensor for a in args) \
            else g.flatten_inputs(args, kwargs)
        vals = entry.forward_values(module, user)  # draws the dropout masks (torch's generator)
        if entry.split is None:
            with torch.no_grad():
                outs = entry.run_forward(vals)
                entry.write_buffers(outs)
            outs = [outs[k] for k in entry.out_user]
        else:
            tensors = [user[i] for i in entry.grad_inputs]
            tensors += [d[key] for d, key in entry.diff_slots]
            outs = list(_GraphFunction.apply(entry, vals, *tensors))
        return g.unflatten_outputs(outs)

    def report_data(self) -> dict:
        """What ran where, structured (``ortcpu_torch.report(model)`` prints it): the module
        class, the fallback reason (None: graph-wide), and per captured signature its mode,
        node counts, per op type the nodes on our kernels / on torch ops in the forward and
        backward plans, the plan-time fusions, and whether summaries are logged."""
        sigs = []
        for entry in self._cache.values():
            g = entry.graph
            parts = {}
            for part, ex in (("forward", entry.forward), ("backward", entry.backward)):
                plans = list(ex._plans.values()) if ex is not None else []
                ops: dict[str, dict[str, int]] = {}
                fusions: list[str] = []
                for plan in plans[-1:]:  # the most recent plan of this signature
                    ops = plan.counts()
                    fusions = list(plan.fusions)
                    parts[part] = {"nodes": len(plan.bound), "folded": len(plan.folded),
                                   "ops": ops, "fusions": fusions}
            sigs.append({
                "mode": "train" if g.train else "eval",
                "captured_nodes": len(g.model.graph.node),
                "backward_nodes": len(entry.split.backward_nodes) if entry.split else 0,
                "parameters_with_grad": len(entry.trainable),
                "plans": parts,
                "training_fusions": list(entry.training_fusions),
                "summaries": entry.log is not None and entry.backward_logged is not None,
                "capture_s": dict(g.timings),
            })
        return {"module": f"{type(self.module).__module__}.{type(self.module).__qualname__}",
                "fallback": self._fallback_reason, "fallback_policy": self.fallback,
                "signatures": sigs}

    def report(self) -> str:
        """``ortcpu_torch.report(self, file=None).text``: what ran graph-wide (per captured
        signature), what was fused and what fell back to torch."""
        from ..wrap.report import report

        return report(self, file=None).text
