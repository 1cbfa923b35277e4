"""``InferenceSession``: onnxruntime's API over the executor.

numpy in -> numpy out; torch tensors in -> torch tensors out (fed tensors are used without
a copy). ``report()`` tells, per op type, how many nodes run on registry kernels and how
many on the torch-op long tail, what was folded and what was fused.
"""

from __future__ import annotations

import torch

from .dtypes import type_string
from .executor import _TORCH_TO_ML, Executor, FeedError, to_torch
from .planner import GraphRunError

_CPU = "CPUExecutionProvider"


class NodeArg:
    """An input or output of the model: ``name``, ``shape`` (ints; strings for symbolic
    dims; None for unknown), ``type`` (``"tensor(float)"``)."""

    def __init__(self, name: str, shape, type_: str):
        self.name, self.shape, self.type = name, shape, type_

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


def _node_arg(vi) -> NodeArg:
    t = vi.type
    if t.HasField("sequence_type"):
        elem = t.sequence_type.elem_type.tensor_type.elem_type
        return NodeArg(vi.name, None, f"seq({type_string(elem)})")
    tt = t.tensor_type
    shape = None
    if tt.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in tt.shape.dim]
    return NodeArg(vi.name, shape, type_string(tt.elem_type))


class SessionOptions:
    """Accepted for onnxruntime compatibility; ``graph_optimization_level`` 0
    (ORT_DISABLE_ALL) turns fusions off."""

    def __init__(self):
        self.graph_optimization_level = 99
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.log_severity_level = 2
        self._entries: dict[str, str] = {}

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._entries[key] = value


class InferenceSession:
    """Run an ONNX model on ortcpu_torch's kernels.

    ``model``: a path (external data next to it is loaded), ``bytes`` or an
    ``onnx.ModelProto``. ``providers`` may be omitted or name ``CPUExecutionProvider``.
    """

    def __init__(self, model, sess_options=None, providers=None, **unused):
        if providers is not None:
            names = [p[0] if isinstance(p, tuple) else p for p in providers]
            bad = [p for p in names if p != _CPU]
            if bad or not isinstance(providers, (list, tuple)):
                raise ValueError(f"providers: only {_CPU!r} is available, got {providers!r}")
        fuse = True
        if sess_options is not None:
            level = getattr(sess_options, "graph_optimization_level", 99)
            fuse = int(getattr(level, "value", level)) != 0
        self._ex = Executor(model, fuse=fuse)
        g = self._ex.model.graph
        self._inputs = [_node_arg(vi) for vi in g.input if vi.name not in self._ex.defaults]
        self._outputs = [_node_arg(vi) for vi in g.output]
        self._last_plan = None

    # onnxruntime's accessors
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_providers(self) -> list[str]:
        return [_CPU]

    def get_modelmeta(self):
        return self._ex.model.metadata_props

    @property
    def executor(self) -> Executor:
        """The underlying ``graph.Executor`` (plans, initializers)."""
        return self._ex

    def run(self, output_names, input_feed, run_options=None):
        """Outputs ``output_names`` (None: all) as a list. numpy arrays in -> numpy out;
        torch tensors in -> torch tensors out."""
        if not isinstance(input_feed, dict):
            raise FeedError(f"input_feed must be a dict of input name -> array, got "
                            f"{type(input_feed).__name__}")
        as_numpy = not any(isinstance(v, torch.Tensor) or
                           (isinstance(v, list) and v and isinstance(v[0], torch.Tensor))
                           for v in input_feed.values())
        feeds = {k: to_torch(k, v) for k, v in input_feed.items()}
        vals = self._ex.positional(feeds)
        plan = self._ex.plan_for(vals)
        self._last_plan = plan
        outs = plan.run(*vals)
        names = self._ex.output_names
        if output_names is None:
            sel = list(outs)
        else:
            if isinstance(output_names, str):
                raise TypeError("output_names must be a list of names or None")
            idx = {n: i for i, n in enumerate(names)}
            missing = [n for n in output_names if n not in idx]
            if missing:
                raise ValueError(f"unknown output(s) {missing}; the model's outputs are "
                                 f"{names}")
            sel = [outs[idx[n]] for n in output_names]
        if not as_numpy:
            return sel
        # (defaults are constants: only the fed tensors are added to the cached set)
        fed = {_storage(v) for v in feeds.values() if isinstance(v, torch.Tensor)}
        consts = self._ex.constant_storages()
        return [_to_numpy(o, fed, consts) for o in sel]

    def report(self) -> str:
        """Per op type: nodes on registry kernels vs on torch ops (for the most recently
        run plan, or the first plan built); folded nodes; fusions."""
        plan = self._last_plan or next(iter(self._ex._plans.values()), None)
        if plan is None:
            return "no plan built yet (run the session once)"
        lines = [f"{'op type':<34} {'kernel':>7} {'torch':>7}"]
        tk = tt = 0
        for name, c in sorted(plan.counts().items()):
            lines.append(f"{name:<34} {c['kernel']:>7} {c['torch']:>7}")
            tk += c["kernel"]
            tt += c["torch"]
        lines.append(f"{'total':<34} {tk:>7} {tt:>7}")
        lines.append(f"folded at plan time: {len(plan.folded)} node(s)")
        lines.append("fusions: " + ("; ".join(plan.fusions) if plan.fusions else "none"))
        return "\n".join(lines)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _to_numpy(t, fed: set, consts: set):
    """A numpy view of ``t``; a copy when it shares memory with a feed or a constant of the
    model (storages ``fed`` / ``consts``: ORT returns fresh arrays, and the caller may
    write into them)."""
    if isinstance(t, list):
        return [_to_numpy(x, fed, consts) for x in t]
    if not isinstance(t, torch.Tensor):
        return t
    ml = _TORCH_TO_ML.get(t.dtype)
    if ml is not None:
        import ml_dtypes

        bits = {1: torch.uint8, 2: torch.uint16}[t.element_size()]
        return t.detach().contiguous().view(bits).numpy().copy().view(getattr(ml_dtypes, ml))
    a = t.detach().numpy()
    st = _storage(t)
    return a.copy() if st in fed or st in consts else a


__all__ = ["InferenceSession", "NodeArg", "SessionOptions", "GraphRunError", "FeedError"]
