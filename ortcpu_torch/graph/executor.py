"""The executor: a loaded model, its shared initializers and one cached ``Plan`` per input
signature (dtypes and shapes of the feeds).

Internal entry point for every graph front end (InferenceSession, gradient builder,
ORTModule, on-device training)::

    ex = Executor(model_proto)                 # loads, checks, binds-checks every node
    out = ex.run({"x": x, "w": w})             # dict name -> torch tensor, no copies
    out = run_model(model_proto, {"x": x})     # one-shot form of the same

Feeds are used as they are (never copied): in-place nodes (InPlaceAccumulatorV2,
AdamWOptimizer, SGDOptimizerV2, ZeroGradient, ...) write into the tensors the caller fed,
as in onnxruntime. A sequence input (``seq(tensor)``) is fed as a Python list of tensors.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch

from . import ops_blocked, ops_kernels, ops_torch  # noqa: F401  (fill the op table)
from .dtypes import dtype_name, torch_dtype
from .loading import load_model, opset_map, tensor_from_proto
from .planner import Plan, build_plan, check_supported
from .shapes import infer_value_shapes


class FeedError(ValueError):
    """A feed that does not match the model's inputs (name, dtype, rank or a fixed dim)."""


class InputSpec:
    """One graph input: name, ONNX element type, dims (int, str for symbolic, None)."""

    __slots__ = ("name", "elem_type", "dims", "is_sequence", "has_default")

    def __init__(self, vi: onnx.ValueInfoProto, has_default: bool):
        self.name = vi.name
        self.has_default = has_default
        t = vi.type
        self.is_sequence = t.HasField("sequence_type")
        tt = t.sequence_type.elem_type.tensor_type if self.is_sequence else t.tensor_type
        self.elem_type = tt.elem_type
        if tt.HasField("shape"):
            self.dims = [d.dim_value if d.HasField("dim_value") else
                         (d.dim_param or None) for d in tt.shape.dim]
        else:
            self.dims = None

    def check(self, value) -> None:
        """FeedError naming the input and expected vs got."""
        if self.is_sequence:
            if not isinstance(value, (list, tuple)) or not all(
                    isinstance(v, torch.Tensor) for v in value):
                raise FeedError(f"input {self.name!r}: expected a sequence (list) of tensors, "
                                f"got {type(value).__name__}")
            for v in value:
                self._check_dtype(v)
            return
        if not isinstance(value, torch.Tensor):
            raise FeedError(f"input {self.name!r}: expected a torch.Tensor or numpy array, "
                            f"got {type(value).__name__}")
        self._check_dtype(value)
        if self.dims is not None:
            if value.dim() != len(self.dims):
                raise FeedError(f"input {self.name!r}: expected rank {len(self.dims)} "
                                f"(shape {self._dims_str()}), got rank {value.dim()} "
                                f"(shape {tuple(value.shape)})")
            for i, (want, got) in enumerate(zip(self.dims, value.shape, strict=True)):
                if isinstance(want, int) and want > 0 and want != got:
                    raise FeedError(f"input {self.name!r}: dimension {i} must be {want} "
                                    f"(shape {self._dims_str()}), got shape "
                                    f"{tuple(value.shape)}")
        if value.device.type != "cpu":
            raise FeedError(f"input {self.name!r}: expected a CPU tensor, got device "
                            f"{value.device}")

    def _check_dtype(self, v: torch.Tensor) -> None:
        want = torch_dtype(self.elem_type, f"input {self.name!r}")
        if v.dtype != want:
            raise FeedError(f"input {self.name!r}: expected dtype {dtype_name(want)}, got "
                            f"{dtype_name(v.dtype)}")

    def _dims_str(self) -> str:
        return "[" + ", ".join(str(d) for d in self.dims) + "]"


class Executor:
    """A model bound for execution: ``run(feeds) -> {name: tensor}``, one plan per input
    signature, initializers held once as torch tensors and shared by every plan."""

    def __init__(self, model, *, check: bool = True, fuse: bool = True):
        self.model = load_model(model, check=check)
        g = self.model.graph
        self.opsets = opset_map(self.model)
        self.opsets.setdefault("", 1)
        check_supported(g, self.opsets)
        init = {t.name: tensor_from_proto(t) for t in g.initializer}
        for sp in g.sparse_initializer:
            dense = onnx.numpy_helper.to_array(sp)
            init[sp.values.name] = torch.from_numpy(dense.copy())
        input_names = [i.name for i in g.input]
        self.inputs = [InputSpec(vi, vi.name in init) for vi in g.input]
        self._spec = {s.name: s for s in self.inputs}
        # initializers listed as inputs are defaults a feed may override (not constants)
        self.defaults = {n: init[n] for n in input_names if n in init}
        # (position, initializer) of each default: a plan key records which were left to
        # their initializer (constants of that plan) rather than fed
        self._default_pos = [(k, self.defaults[n]) for k, n in enumerate(input_names)
                             if n in self.defaults]
        self.constants = {n: t for n, t in init.items() if n not in self.defaults}
        self.input_names = input_names
        self.output_names = [o.name for o in g.output]
        self.fuse = fuse
        self._plans: dict[tuple, Plan] = {}
        self._const_storages = None

    def constant_storages(self) -> set:
        """Storage addresses of the initializers (outputs aliasing them get copied before
        they are handed to numpy users)."""
        if self._const_storages is None:
            self._const_storages = {t.untyped_storage().data_ptr()
                                    for t in (*self.constants.values(), *self.defaults.values())
                                    if isinstance(t, torch.Tensor)}
        return self._const_storages

    # -- planning -----------------------------------------------------------------------

    def plan_for(self, values: list) -> Plan:
        """The plan for these positional graph-input values (built and cached on first use)."""
        # computed on every run of ORTModule's forward and backward: kept to one pass of
        # C-level map over the values plus the default positions only
        key = tuple(map(_sig, values))
        if self._default_pos:  # which defaults were left to their initializer
            key += (tuple(values[k] is d for k, d in self._default_pos),)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._build(values, key)
        return plan

    def _build(self, values: list, key: tuple) -> Plan:
        for spec, v in zip(self.inputs, values, strict=True):
            spec.check(v)
        shapes_in = {s.name: tuple(v.shape) for s, v in zip(self.inputs, values, strict=True)
                     if isinstance(v, torch.Tensor)}
        types_in = {s.name: s.elem_type for s in self.inputs}
        consts = dict(self.constants)
        for n, v in zip(self.input_names, values, strict=True):
            if n in self.defaults and v is self.defaults[n]:
                consts[n] = v  # not fed: a constant of this plan (folded like the others)
        shapes, types = infer_value_shapes(self.model, shapes_in, types_in,
                                           frozenset(n for n in self.defaults if n in consts))
        plan = build_plan(self.model.graph, self.opsets, consts, self.input_names,
                          shapes, types, fuse=self.fuse)
        if len(self._plans) >= 64:  # bound the cache under ever-changing shapes
            self._plans.pop(next(iter(self._plans)))
        self._plans[key] = plan
        return plan

    # -- running ------------------------------------------------------------------------

    def positional(self, feeds: dict) -> list:
        """Feeds (name -> value) as graph-input order, defaults filled in; FeedError for an
        unknown or missing name."""
        if not isinstance(feeds, dict):
            raise FeedError(f"input_feed must be a dict of input name -> value, got "
                            f"{type(feeds).__name__}")
        for name in feeds:
            if name not in self._spec:
                raise FeedError(f"unknown input {name!r}; the model's inputs are "
                                f"{self.input_names}")
        vals = []
        for name in self.input_names:
            if name in feeds:
                v = feeds[name]
                vals.append(v if isinstance(v, torch.Tensor) else to_torch(name, v))
            elif name in self.defaults:
                vals.append(self.defaults[name])
            else:
                missing = [n for n in self.input_names
                           if n not in feeds and n not in self.defaults]
                raise FeedError(f"missing input(s) {missing}; the model needs "
                                f"{[n for n in self.input_names if n not in self.defaults]}")
        return vals

    def run(self, feeds: dict, output_names=None) -> dict:
        """Run with ``feeds`` (name -> torch tensor / list of tensors); returns name ->
        output for ``output_names`` (all outputs when None)."""
        vals = self.positional(feeds)
        outs = self.plan_for(vals).run(*vals)
        if output_names is None:
            return dict(zip(self.output_names, outs, strict=True))
        res = dict(zip(self.output_names, outs, strict=True))
        missing = [n for n in output_names if n not in res]
        if missing:
            raise ValueError(f"unknown output(s) {missing}; the model's outputs are "
                             f"{self.output_names}")
        return {n: res[n] for n in output_names}


# numpy dtypes of the ml_dtypes package (what onnx uses) -> torch dtypes, same bits
_ML_DTYPES = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn,
              "float8_e4m3fnuz": torch.float8_e4m3fnuz, "float8_e5m2": torch.float8_e5m2,
              "float8_e5m2fnuz": torch.float8_e5m2fnuz}
_TORCH_TO_ML = {v: k for k, v in _ML_DTYPES.items()}


def to_torch(name, v):
    """A feed as a torch tensor (numpy arrays wrapped without a copy; ml_dtypes' bfloat16 /
    float8 arrays reinterpreted bit for bit), lists element-wise."""
    if isinstance(v, torch.Tensor):
        return v
    if isinstance(v, (list, tuple)):
        return [to_torch(name, x) for x in v]
    if isinstance(v, np.generic):
        v = np.asarray(v)
    if isinstance(v, np.ndarray):
        if v.dtype == object or v.dtype.kind in "US":
            raise FeedError(f"input {name!r}: string tensors are not supported")
        if not v.flags.writeable:
            v = v.copy()
        # (dtype.name costs ~5 us a feed: only user-defined dtypes, ml_dtypes', need it)
        ml = _ML_DTYPES.get(v.dtype.name) if v.dtype.isbuiltin != 1 else None
        if ml is not None:
            return torch.from_numpy(v.view(f"uint{8 * v.itemsize}")).view(ml)
        return torch.from_numpy(v)
    raise FeedError(f"input {name!r}: expected a numpy array or torch tensor, got "
                    f"{type(v).__name__}")


def _sig(v):
    if type(v) is torch.Tensor or isinstance(v, torch.Tensor):  # (the common case first)
        return (v.dtype, v.shape)
    if isinstance(v, (list, tuple)):
        return ("seq", tuple(_sig(x) for x in v))
    return (type(v),)


def run_model(model, feeds: dict, output_names=None) -> dict:
    """One-shot ``Executor(model).run(feeds)``. Build an ``Executor`` yourself to reuse its
    plan cache across calls."""
    return Executor(model).run(feeds, output_names)
