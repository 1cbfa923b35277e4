"""Run one registry op in ONNX Runtime and in ortcpu_torch, and compare.

Every kernel family's conformance tests use this module. A case is one ONNX node:

    from tests.conformance.ort_harness import check_op
    check_op("GeluGrad", [dy, x])                              # com.microsoft, 1 output
    check_op("Softmax", [x], {"axis": 1})                      # default domain (ONNX)
    check_op("FastGelu", [x, None])                            # omitted optional input
    check_op("SGDOptimizerV2", [lr, [w1, w2], [g1, g2], None], num_outputs=2)  # sequences
    check_op("MaxPoolGrad", [dy, idx], {...}, ours_kwargs={"output_shape": x.shape})

Model: opset imports ``''``:17 and ``com.microsoft``:1, ``ir_version`` 8, graph inputs typed
and shaped from the values given, graph outputs untyped unless ``output_dtypes`` /
``output_shapes`` are passed (ORT infers them; declare them where it needs them). Session:
``CPUExecutionProvider``, graph optimisations disabled, one intra-op thread; sessions are
cached by model bytes.

Inputs (in the ORT schema's order):
- a numpy array, torch tensor or Python scalar: one tensor input (0-d for scalars; numpy
  object arrays of ``str`` are string tensors);
- ``None``: an omitted optional input (the node gets ``""``; ours gets ``None``);
- a list/tuple of arrays: one ONNX *sequence* input (ours gets a Python list of tensors),
  per the registry convention for ``seq(tensor)`` inputs. Variadic inputs are simply
  several positional entries.

Attributes: ONNX attribute names and values; they are passed to ours as keywords (a name
that is a Python keyword gets a trailing underscore, ``lambda`` -> ``lambda_``). Float
attributes are rounded to float32 first, for both sides: that is what an ONNX node holds.
``ours_kwargs`` adds keywords that ORT reads from the graph instead (``output_shape=``,
``num_outputs=``). ``needs=`` selects optional outputs on both sides.

Comparison: each output's shape and dtype must match; floating outputs within
``rtol``/``atol`` (NaN equals NaN), other dtypes exactly. Inputs that either side writes in
place can be compared too (``compare_inputs``).
"""

from __future__ import annotations

import functools
import keyword
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

OPSET = 17
MS_OPSET = 1
IR_VERSION = 8
MS_DOMAIN = "com.microsoft"

#: ops ONNX Runtime's training build registers in the *default* domain although the ONNX
#: standard does not define them (spec §1, "ONNX 9" rows); every other op that the ONNX
#: standard does not define at opset 17 is taken to be com.microsoft.
ORT_DEFAULT_DOMAIN_OPS = frozenset({
    "AveragePoolGrad", "MaxPoolGrad", "SparseSoftmaxCrossEntropy",
    "SparseSoftmaxCrossEntropyGrad",
})


def op_domain(op_type: str) -> str:
    """``''`` for ops of the ONNX standard at opset 17 (and ORT's default-domain training
    ops), else ``'com.microsoft'``. ONNX's ``Gelu`` (opset 20) is *not* at opset 17, so
    ``Gelu`` is com.microsoft here, as in ORT training graphs."""
    import onnx

    if op_type in ORT_DEFAULT_DOMAIN_OPS:
        return ""
    try:
        onnx.defs.get_schema(op_type, OPSET, "")
        return ""
    except onnx.defs.SchemaError:
        return MS_DOMAIN


def _to_numpy(v) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        return v.detach().cpu().numpy().copy()
    if isinstance(v, np.ndarray):
        return v.copy()
    return np.asarray(v)


def _to_torch(a: np.ndarray):
    if a.dtype == object:
        return a.copy()  # string tensors stay numpy object arrays (registry convention)
    return torch.from_numpy(np.array(a, copy=True))


def _tensor_type(a: np.ndarray) -> int:
    from onnx import TensorProto, helper

    if a.dtype == object or a.dtype.kind in "US":
        return TensorProto.STRING
    return helper.np_dtype_to_tensor_dtype(a.dtype)


def _as_onnx_attr(v):
    """ONNX float attributes are float32: round Python floats (and lists of them) so that
    ours is called with exactly the value ORT sees."""
    if isinstance(v, float):
        return float(np.float32(v))
    if isinstance(v, (list, tuple)) and v and all(isinstance(t, float) for t in v):
        return [float(np.float32(t)) for t in v]
    return v


@dataclass
class Case:
    """One node: what it was built from, and the model."""

    op_type: str
    domain: str
    inputs: list  # numpy arrays, lists of arrays (sequences) or None
    attrs: dict
    num_outputs: int
    needs: tuple[bool, ...] | None
    model: Any = field(repr=False)

    def describe(self) -> str:
        def shape(v):
            if v is None:
                return "None"
            if isinstance(v, list):
                return "[" + ", ".join(shape(t) for t in v) + "]"
            return f"{v.dtype}{list(v.shape)}"

        ins = ", ".join(shape(v) for v in self.inputs)
        return f"{self.domain or 'ai.onnx'}::{self.op_type}({ins}) attrs={self.attrs}"


def build_case(op_type: str, inputs: Sequence, attrs: Mapping | None = None, *,
               domain: str | None = None, num_outputs: int = 1,
               needs: Sequence[bool] | None = None,
               output_dtypes: Sequence | None = None,
               output_shapes: Sequence | None = None) -> Case:
    """Build the one-node model (see the module docstring)."""
    from onnx import helper

    domain = op_domain(op_type) if domain is None else domain
    attrs = {k: _as_onnx_attr(v) for k, v in (attrs or {}).items()}
    values: list = []
    graph_inputs, node_inputs = [], []
    for i, v in enumerate(inputs):
        name = f"in{i}"
        if v is None:
            values.append(None)
            node_inputs.append("")
            continue
        if isinstance(v, (list, tuple)):
            seq = [_to_numpy(t) for t in v]
            if not seq:
                raise ValueError(f"input {i}: an empty sequence has no element type")
            values.append(seq)
            elem = helper.make_tensor_type_proto(_tensor_type(seq[0]), None)
            graph_inputs.append(helper.make_value_info(name, helper.make_sequence_type_proto(elem)))
        else:
            a = _to_numpy(v)
            values.append(a)
            graph_inputs.append(helper.make_tensor_value_info(name, _tensor_type(a),
                                                              list(a.shape)))
        node_inputs.append(name)
    # ONNX allows dropping trailing omitted inputs; ORT is happy either way
    while node_inputs and node_inputs[-1] == "":
        node_inputs.pop()

    if needs is not None:
        needs = tuple(bool(n) for n in needs)
        num_outputs = len(needs)
    wanted = needs or (True,) * num_outputs
    node_outputs = [f"out{k}" if w else "" for k, w in enumerate(wanted)]
    graph_outputs = []
    for k, w in enumerate(wanted):
        if not w:
            continue
        dt = output_dtypes[k] if output_dtypes is not None else None
        shp = output_shapes[k] if output_shapes is not None else None
        if dt is None:
            graph_outputs.append(helper.make_empty_tensor_value_info(f"out{k}"))
            if shp is not None:
                raise ValueError("an output shape needs an output dtype")
        else:
            elem = _tensor_type(np.empty(0, dtype=np.dtype(dt)))
            graph_outputs.append(helper.make_tensor_value_info(
                f"out{k}", elem, None if shp is None else list(shp)))
    node = helper.make_node(op_type, node_inputs, node_outputs, domain=domain, **attrs)
    graph = helper.make_graph([node], f"{op_type}_conformance", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid(MS_DOMAIN, MS_OPSET)])
    model.ir_version = IR_VERSION
    return Case(op_type, domain, values, attrs, num_outputs, needs, model)


@functools.lru_cache(maxsize=256)
def _session(model_bytes: bytes):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def _copy_inputs(values):
    return [None if v is None else [t.copy() for t in v] if isinstance(v, list) else v.copy()
            for v in values]


def run_ort(case: Case) -> tuple[list, list]:
    """(outputs, inputs after the run) from ONNX Runtime; skipped outputs are None.
    The inputs are fresh copies, so in-place effects are visible but not shared."""
    sess = _session(case.model.SerializeToString())
    feeds_values = _copy_inputs(case.inputs)
    feeds = {f"in{i}": v for i, v in enumerate(feeds_values) if v is not None}
    names = [o.name for o in sess.get_outputs()]
    got = dict(zip(names, sess.run(names, feeds), strict=True))
    wanted = case.needs or (True,) * case.num_outputs
    outs = [got[f"out{k}"] if w else None for k, w in enumerate(wanted)]
    return outs, feeds_values


def _kwarg(name: str) -> str:
    return name + "_" if keyword.iskeyword(name) else name


def run_ours(case: Case, ours: Callable | None = None, ours_kwargs: Mapping | None = None
             ) -> tuple[list, list]:
    """(outputs as numpy, inputs after the call) from the registry op (or ``ours``)."""
    from ortcpu_torch import kernels

    fn = ours if ours is not None else kernels.get(case.op_type)
    args = [None if v is None else [_to_torch(t) for t in v] if isinstance(v, list)
            else _to_torch(v) for v in case.inputs]
    kwargs = {_kwarg(k): v for k, v in case.attrs.items()}
    kwargs.update(ours_kwargs or {})
    if case.needs is not None:
        kwargs["needs"] = case.needs
    result = fn(*args, **kwargs)
    results = list(result) if isinstance(result, tuple) else [result]
    if len(results) != case.num_outputs:
        raise AssertionError(f"{case.describe()}: ours returned {len(results)} outputs, "
                             f"expected {case.num_outputs}")

    def np_(r):
        if r is None:
            return None
        if isinstance(r, (list, tuple)):  # a sequence output
            return [np_(t) for t in r]
        if isinstance(r, torch.Tensor):
            return r.detach().cpu().numpy()
        return np.asarray(r)

    after = [None if a is None else [np_(t) for t in a] if isinstance(a, list) else np_(a)
             for a in args]
    return [np_(r) for r in results], after


def assert_arrays_close(ours: np.ndarray, ref: np.ndarray, *, rtol: float, atol: float,
                        what: str) -> None:
    """Shape, dtype and values (floats within tolerance, NaN == NaN; others exactly)."""
    assert ours is not None, f"{what}: ours returned None"
    ours, ref = np.asarray(ours), np.asarray(ref)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != ORT {ref.shape}"
    assert ours.dtype == ref.dtype, f"{what}: dtype {ours.dtype} != ORT {ref.dtype}"
    if ref.dtype.kind != "f":
        assert np.array_equal(ours, ref), f"{what}: values differ from ORT"
        return
    same_nan = np.isnan(ours) == np.isnan(ref)
    o, r = ours.astype(np.float64), ref.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        close = (o == r) | (np.abs(o - r) <= atol + rtol * np.abs(r)) | (np.isnan(o) & np.isnan(r))
    bad = ~(close & same_nan)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.where(bad, np.abs(o - r), 0)
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{bad.size} elements differ from ORT "
            f"(rtol={rtol}, atol={atol}); first at {idx}: ours {o[idx]!r}, ORT {r[idx]!r}; "
            f"max abs diff {np.nanmax(err):.3e}")


@dataclass
class Result:
    case: Case
    ort: list
    ours: list
    ort_inputs: list
    ours_inputs: list


def check_op(op_type: str, inputs: Sequence, attrs: Mapping | None = None, *,
             rtol: float = 1e-5, atol: float = 1e-6, domain: str | None = None,
             num_outputs: int | None = None, needs: Sequence[bool] | None = None,
             output_dtypes: Sequence | None = None, output_shapes: Sequence | None = None,
             ours: Callable | None = None, ours_kwargs: Mapping | None = None,
             compare_inputs: Sequence[int] = (), tolerances: Mapping | None = None
             ) -> Result:
    """Run ``op_type`` in ORT and in ortcpu_torch on the same inputs and compare every
    output (and the inputs listed in ``compare_inputs``, for ops that write in place).
    ``tolerances`` maps an output index to its own ``(rtol, atol)``. ``num_outputs``
    defaults to ``len(needs)`` or 1. Returns both sides' results for further checks."""
    if num_outputs is None:
        num_outputs = len(needs) if needs is not None else 1
    case = build_case(op_type, inputs, attrs, domain=domain, num_outputs=num_outputs,
                      needs=needs, output_dtypes=output_dtypes, output_shapes=output_shapes)
    ort_out, ort_in = run_ort(case)
    our_out, our_in = run_ours(case, ours, ours_kwargs)
    tolerances = dict(tolerances or {})
    for k, (a, b) in enumerate(zip(our_out, ort_out, strict=True)):
        if b is None:
            assert a is None, f"{case.describe()}: output {k} was not requested"
            continue
        rt, at = tolerances.get(k, (rtol, atol))
        if isinstance(b, list):  # a sequence output: element by element
            assert isinstance(a, list) and len(a) == len(b), \
                f"{case.describe()} output {k}: a sequence of {len(b)} tensors expected"
            for j, (x, y) in enumerate(zip(a, b, strict=True)):
                assert_arrays_close(x, y, rtol=rt, atol=at,
                                    what=f"{case.describe()} output {k}[{j}]")
            continue
        assert_arrays_close(a, b, rtol=rt, atol=at, what=f"{case.describe()} output {k}")
    for i in compare_inputs:
        a, b = our_in[i], ort_in[i]
        pairs = zip(a, b, strict=True) if isinstance(b, list) else [(a, b)]
        for j, (x, y) in enumerate(pairs):
            assert_arrays_close(x, y, rtol=rtol, atol=atol,
                                what=f"{case.describe()} input {i}[{j}] after the call")
    return Result(case, ort_out, our_out, ort_in, our_in)


def ort_runs(op_type: str, inputs: Sequence, attrs: Mapping | None = None, **kw) -> bool:
    """Whether ORT can build and run this node at all (e.g. for a dtype without a
    kernel); other exceptions propagate."""
    from onnxruntime.capi.onnxruntime_pybind11_state import (
        Fail,
        InvalidArgument,
        InvalidGraph,
        NotImplemented,
    )

    try:
        run_ort(build_case(op_type, inputs, attrs, **kw))
        return True
    except (NotImplemented, InvalidGraph, InvalidArgument, Fail):
        return False
