"""Loading the artifact models and sorting their inputs and outputs by ORT's conventions.

ONNX Runtime's on-device training names things by suffix (``training_api/utils.cc``): an
input or output named ``<param>_grad.accumulation.buffer``, ``<param>_grad`` or
``<param>_grad.accumulation.out`` belongs to a gradient; the input ``lazy_reset_grad`` is the
accumulate/overwrite switch; an input whose name is a checkpoint parameter is that
parameter; every other input is a user input, every other output a user output.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnx

LAZY_RESET_GRAD = "lazy_reset_grad"
GRAD_SUFFIXES = ("_grad.accumulation.buffer", "_grad", "_grad.accumulation.out")

# onnx TensorProto element type -> numpy dtype, for the types parameters may have
_NP_OF_ELEM = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64,
               9: np.bool_, 10: np.float16, 11: np.float64}


def load_onnx(uri, argument: str) -> onnx.ModelProto:
    """``uri`` (path or ModelProto) as a ModelProto; a clear error naming ``argument``."""
    if isinstance(uri, onnx.ModelProto):
        return uri
    if not isinstance(uri, (str, bytes, os.PathLike)):
        raise TypeError(f"{argument}: expected a path to an ONNX model, got {type(uri).__name__}")
    path = os.fsdecode(uri)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{argument}: no ONNX model at {path!r}")
    try:
        return onnx.load(path)
    except Exception as e:  # protobuf's DecodeError and friends
        raise ValueError(f"{argument}: {path!r} is not a readable ONNX model ({e})") from e


def param_of_gradient(name: str) -> str | None:
    """The parameter a gradient-named value belongs to, or None."""
    for suffix in GRAD_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return None


@dataclass
class InputSpec:
    name: str
    dtype: np.dtype | None
    dims: list | None  # int for a fixed dim, None/str for a free one


def input_specs(model: onnx.ModelProto) -> dict[str, InputSpec]:
    out = {}
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        dt = _NP_OF_ELEM.get(tt.elem_type)
        dims = None
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        out[vi.name] = InputSpec(vi.name, None if dt is None else np.dtype(dt), dims)
    return out


@dataclass
class Layout:
    """How a training or eval model's inputs and outputs are fed and returned."""

    user_inputs: list[str]
    param_inputs: list[str]
    grad_inputs: list[tuple[str, str]]  # (input name, parameter name)
    reset_input: str | None
    user_outputs: list[str]


def layout_of(model: onnx.ModelProto, param_names, training: bool) -> Layout:
    """Sort ``model``'s inputs/outputs into user, parameter and gradient ones (ORT's rules;
    the eval model has no gradient inputs and all its outputs are user outputs)."""
    user, params, grads, reset = [], [], [], None
    for vi in model.graph.input:
        n = vi.name
        if n in param_names:
            params.append(n)
        elif training and n == LAZY_RESET_GRAD:
            reset = n
        elif training and param_of_gradient(n) is not None:
            grads.append((n, param_of_gradient(n)))
        else:
            user.append(n)
    outputs = [o.name for o in model.graph.output
               if not training or param_of_gradient(o.name) is None]
    return Layout(user, params, grads, reset, outputs)
