"""Quantization-aware training kernels (spec §14): FakeQuant and FakeQuantGrad.

float32 and float64 (ORT 1.19.2 has float32 only). Rounding is ORT's: ``x / scale``
rounded half to even, ``zero_point`` added in floating point, then truncated.
"""

from __future__ import annotations

import torch

from .._native import empty, empty_like, ffi, native_fn, ptr
from ._checks import (
    check_status,
    float_input,
    fmt_shape,
    get_num_threads,
    int_attr,
    same_shape,
    select_outputs,
)
from ._registry import register


def _scalar(op: str, name: str, v) -> float:
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            raise ValueError(f"{op}: {name} must have exactly one element, got shape "
                             f"{fmt_shape(v)}")
        if v.dtype.is_complex or v.dtype == torch.bool:
            raise TypeError(f"{op}: {name} must be a real number, got {v.dtype}")
        return float(v.reshape(()).item())
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{op}: {name} must be a number or a 1-element tensor, "
                        f"got {type(v).__name__}")
    return float(v)


@register
def FakeQuant(input, scale, zero_point, quant_min: int = 0, quant_max: int = 255, needs=None):
    """com.microsoft FakeQuant: ``q = trunc(round_half_even(x/scale) + zero_point)``,
    ``output = (clamp(q, quant_min, quant_max) - zero_point)·scale``,
    ``mask = quant_min ≤ q ≤ quant_max``. Inputs: input, scale, zero_point (1 element
    each). Outputs: output, mask (bool)."""
    op = "FakeQuant"
    x = float_input(op, "input", input)
    s = _scalar(op, "scale", scale)
    zp = _scalar(op, "zero_point", zero_point)
    qmin = int_attr(op, "quant_min", quant_min)
    qmax = int_attr(op, "quant_max", quant_max)
    if s == 0.0 or s != s or s in (float("inf"), float("-inf")):
        raise ValueError(f"{op}: scale must be finite and non-zero, got {s}")
    if qmin > qmax:
        raise ValueError(f"{op}: quant_min ({qmin}) must be <= quant_max ({qmax})")
    y = empty_like(x)
    mask = empty(x.shape, torch.bool)
    st = native_fn("fake_quant", x.dtype)(
        ptr(x), ptr(y), ffi.cast("uint8_t *", mask.data_ptr()), x.numel(), s, zp, qmin, qmax,
        get_num_threads())
    check_status(st, op)
    return select_outputs(op, (y, mask), needs)


@register
def FakeQuantGrad(dY, gradient_mask):
    """com.microsoft FakeQuantGrad: straight-through estimator ``dX = mask ? dY : 0``.
    Inputs: dY, gradient_mask (bool, FakeQuant's second output). Output: dX."""
    op = "FakeQuantGrad"
    dY = float_input(op, "dY", dY)
    m = float_input(op, "gradient_mask", gradient_mask, dtypes=(torch.bool,))
    same_shape(op, "dY", dY, "gradient_mask", m)
    dx = empty_like(dY)
    st = native_fn("fake_quant_grad", dY.dtype)(
        ptr(dY), ffi.cast("uint8_t *", m.data_ptr()), ptr(dx), dY.numel(), get_num_threads())
    check_status(st, op)
    return dx
