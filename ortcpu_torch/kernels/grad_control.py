"""Gradient-control kernels (spec §10.2, §10.3, §13): ReduceAllL2, Scale,
InplaceClipGradNorm, InPlaceAccumulator, InPlaceAccumulatorV2, ZeroGradient, and -- beyond
ONNX Runtime's CPU build -- IsAllFinite and MixedPrecisionScale.

InplaceClipGradNorm, the accumulators and ZeroGradient write into the tensors passed, as
ORT does. float32 and float64 (ORT 1.19.2: float32 only).

``norm_multi``, ``scale_multi``, ``all_finite_multi`` are the multi-tensor entry points
``ortcpu_torch.optim`` uses.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .._native import empty_like, ffi, native_fn, ptr
from ._checks import (
    FLOATS,
    check_status,
    float_input,
    fmt_shape,
    get_num_threads,
    int_attr,
    select_outputs,
)
from ._multi import bool_flag, ptr_array, size_array, tensor_seq
from ._registry import register

# ---- multi-tensor entry points -----------------------------------------------------------


def norm_multi(tensors, p: float = 2.0, op: str = "norm_multi") -> float:
    """sum |x|^p over every element of every tensor (p = inf: max |x|), in double; no root.
    Tensors must be contiguous and share one float dtype."""
    if not tensors:
        return 0.0
    dt = tensors[0].dtype
    out = ffi.new("double *")
    st = native_fn("norm_multi", dt)(ptr_array(tensors, dt), size_array(tensors),
                                     len(tensors), float(p), out, get_num_threads())
    check_status(st, op)
    return out[0]


def _xy_multi(kernel: str, xs, ys, scalar: float, op: str) -> None:
    """One native call of ``kernel`` (x list, y list, sizes, count, scalar) over a group."""
    if not xs:
        return
    dt = xs[0].dtype
    st = native_fn(kernel, dt)(ptr_array(xs, dt), ptr_array(ys, dt), size_array(xs), len(xs),
                               float(scalar), get_num_threads())
    check_status(st, op)


def scale_multi(xs, ys, factor: float, op: str = "scale_multi") -> None:
    """ys[i] = xs[i] * factor (ys may be xs: in place)."""
    _xy_multi("scale_multi", xs, ys, factor, op)


def axpy_multi(xs, ys, alpha: float = 1.0, op: str = "axpy_multi") -> None:
    """ys[i] += alpha * xs[i]."""
    _xy_multi("axpy_multi", xs, ys, alpha, op)


def all_finite_multi(xs, check_inf: bool = True, check_nan: bool = True,
                     op: str = "all_finite_multi") -> bool:
    if not xs:
        return True
    dt = xs[0].dtype
    out = ffi.new("int *")
    st = native_fn("all_finite_multi", dt)(ptr_array(xs, dt), size_array(xs), len(xs),
                                           int(check_inf), int(check_nan), out,
                                           get_num_threads())
    check_status(st, op)
    return bool(out[0])


def _by_dtype(tensors):
    groups: dict[torch.dtype, list] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return groups


# ---- registry ops ----------------------------------------------------------------------------


@register
def ReduceAllL2(*tensors):
    """Global L2 norm of all inputs: sqrt(Σ_i Σ_j x_ij²), accumulated in double, returned
    as a 0-d tensor of the inputs' dtype (ORT: float32 only)."""
    op = "ReduceAllL2"
    xs = tensor_seq(op, "inputs", list(tensors))
    dt = xs[0].dtype
    for i, x in enumerate(xs):
        if x.dtype != dt:
            raise TypeError(f"{op}: input {i} has dtype {x.dtype}, input 0 has {dt}")
    return torch.tensor(math.sqrt(norm_multi(xs, 2.0, op)), dtype=dt)


def _scale_factor(op: str, scale, scale_down) -> float:
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{op}: scale must be a torch.Tensor, got {type(scale).__name__}")
    if scale.dtype not in (torch.float32, torch.float64, torch.int64, torch.int32):
        raise TypeError(f"{op}: scale must be float, double, int64 or int32, got {scale.dtype}")
    if scale.numel() != 1:
        raise ValueError(f"{op}: scale must have exactly one element, got shape "
                         f"{fmt_shape(scale)}")
    s = np.float32(scale.reshape(()).item())
    if s == 0:
        raise ValueError(f"{op}: scale must be non-zero (ORT rejects 0 even when multiplying)")
    return float(np.float32(1.0) / s if scale_down else s)


@register
def Scale(input, scale, *, scale_down: int = 0):
    """output = input · s, or input / s when ``scale_down`` (as ORT: s is rounded to float32
    first, scale_down multiplies by the float32 reciprocal, and s = 0 is an error)."""
    op = "Scale"
    x = float_input(op, "input", input)
    if isinstance(scale_down, bool) or not isinstance(scale_down, int):
        raise TypeError(f"{op}: scale_down must be an int, got {type(scale_down).__name__}")
    f = _scale_factor(op, scale, scale_down)
    y = empty_like(x)
    scale_multi([x], [y], f, op)
    return y


@register
def InplaceClipGradNorm(gradients, *, max_norm: float = 1.0, norm_type: str = "fro"):
    """Clip a sequence of gradients to a global L2 norm, **in place**:
    coef = min(max_norm / (‖g‖ + 1e-6), 1); every gradient ← gradient · coef.
    Returns the same tensors (ORT's clipped_gradients aliases the input)."""
    op = "InplaceClipGradNorm"
    if norm_type != "fro":
        raise ValueError(f"{op}: norm_type must be 'fro' (the only one ORT accepts), "
                         f"got {norm_type!r}")
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)):
        raise TypeError(f"{op}: max_norm must be a float, got {type(max_norm).__name__}")
    gs = tensor_seq(op, "gradients", gradients, writable=True)
    total = np.float32(math.sqrt(norm_multi(gs, 2.0, op)))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        coef = np.float32(max_norm) / (total + np.float32(1e-6))
    coef = min(coef, np.float32(1.0)) if coef == coef else coef
    if coef != 1.0:
        scale_multi(gs, gs, float(coef), op)
    return list(gradients)


def _accumulate_value(op: str, buf: torch.Tensor, value) -> torch.Tensor:
    v = float_input(op, "value", value)
    if v.dtype != buf.dtype:
        raise TypeError(f"{op}: value must have the dtype of the buffer ({buf.dtype}), "
                        f"got {v.dtype}")
    if v.shape != buf.shape:
        try:
            shape = torch.broadcast_shapes(v.shape, buf.shape)
        except RuntimeError:
            shape = None
        if shape != buf.shape:
            raise ValueError(f"{op}: value {fmt_shape(v)} must broadcast to the buffer's "
                             f"shape {fmt_shape(buf)}")
        v = v.expand(buf.shape).contiguous()
    return v


def _buffer(op: str, name: str, t) -> torch.Tensor:
    (b,) = tensor_seq(op, name, [t], writable=True)
    return b


@register
def InPlaceAccumulator(old_sum, value, update_signal=None):
    """new_sum = old_sum + value (value broadcast into old_sum's shape), **in place** into
    old_sum; update_signal false leaves it unchanged. Returns old_sum."""
    op = "InPlaceAccumulator"
    buf = _buffer(op, "old_sum", old_sum)
    v = _accumulate_value(op, buf, value)
    if bool_flag(op, "update_signal", update_signal):
        axpy_multi([v], [buf], 1.0, op)
    return old_sum


@register
def InPlaceAccumulatorV2(accumulation_buffer, value, overwrite_flag=None, *, needs=None):
    """Accumulate into (or, with overwrite_flag true, overwrite) the buffer **in place**:
    buffer ← buffer + value, or buffer ← value (value broadcast into the buffer's shape).
    Returns (updated_flag (bool [1], always true), the buffer). (ORT 1.19.2 mishandles a
    broadcasting value: its output takes value's shape.)"""
    op = "InPlaceAccumulatorV2"
    buf = _buffer(op, "accumulation_buffer", accumulation_buffer)
    v = _accumulate_value(op, buf, value)
    overwrite = overwrite_flag is not None and bool_flag(op, "overwrite_flag", overwrite_flag)
    if overwrite:
        dt = buf.dtype
        st = native_fn("copy_multi", dt)(ptr_array([v], dt), ptr_array([buf], dt),
                                         size_array([buf]), 1, get_num_threads())
        check_status(st, op)
    else:
        axpy_multi([v], [buf], 1.0, op)
    return select_outputs(op, (torch.ones(1, dtype=torch.bool), accumulation_buffer), needs)


@register
def ZeroGradient(old_gradient, reset_signal):
    """Zero ``old_gradient`` **in place** and return it; ``reset_signal`` (any tensor) is
    only a control dependency."""
    op = "ZeroGradient"
    buf = _buffer(op, "old_gradient", old_gradient)
    if not isinstance(reset_signal, torch.Tensor):
        raise TypeError(f"{op}: reset_signal must be a torch.Tensor, got "
                        f"{type(reset_signal).__name__}")
    dt = buf.dtype
    st = native_fn("zero_multi", dt)(ptr_array([buf], dt), size_array([buf]), 1,
                                     get_num_threads())
    check_status(st, op)
    return old_gradient


@register
def IsAllFinite(*input, isinf_only: int = 0, isnan_only: int = 0):
    """True (a bool scalar) when no input holds an inf or NaN (only inf with
    ``isinf_only``, only NaN with ``isnan_only``). Not in ORT's CPU build; here on CPU."""
    op = "IsAllFinite"
    xs = tensor_seq(op, "input", list(input), FLOATS)
    isinf_only = int_attr(op, "isinf_only", isinf_only, (0, 1))
    isnan_only = int_attr(op, "isnan_only", isnan_only, (0, 1))
    if isinf_only and isnan_only:
        raise ValueError(f"{op}: isinf_only and isnan_only cannot both be set")
    ok = True
    for group in _by_dtype(xs).values():
        ok = ok and all_finite_multi(group, not isnan_only, not isinf_only, op)
    return torch.tensor(ok, dtype=torch.bool)


_TO = {1: torch.float32, 10: torch.float16, 16: torch.bfloat16, 11: torch.float64}


@register
def MixedPrecisionScale(S, *X, to: int, fuse_outputs: int = 0):
    """Y_i = X_i · S cast to ``to`` (ONNX TensorProto dtype: 1 float, 10 float16,
    16 bfloat16, 11 double); with ``fuse_outputs`` the results are concatenated into one
    flat tensor. Not in ORT's CPU build; here on CPU (the product in the inputs' dtype,
    natively, then a cast)."""
    op = "MixedPrecisionScale"
    if to not in _TO:
        raise ValueError(f"{op}: to must be one of {sorted(_TO)} (ONNX dtypes), got {to!r}")
    s_t = float_input(op, "S", S, (torch.float32,))
    if s_t.numel() != 1:
        raise ValueError(f"{op}: S must have exactly one element, got shape {fmt_shape(s_t)}")
    s = s_t.reshape(()).item()
    xs = tensor_seq(op, "X", list(X), FLOATS + (torch.float16, torch.bfloat16))
    out_dt = _TO[to]
    ys = []
    for x in xs:
        if x.dtype in FLOATS:
            y = empty_like(x)
            scale_multi([x], [y], s, op)
            ys.append(y if out_dt == x.dtype else y.to(out_dt))
        else:  # half inputs: compute in float32
            y = x.float()
            scale_multi([y], [y], s, op)
            ys.append(y.to(out_dt))
    if fuse_outputs:
        return torch.cat([y.reshape(-1) for y in ys]) if ys else torch.empty(0, dtype=out_dt)
    return ys[0] if len(ys) == 1 else tuple(ys)


__all__ = ["norm_multi", "scale_multi", "axpy_multi", "all_finite_multi", "ptr"]
