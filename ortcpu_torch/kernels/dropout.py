"""Dropout kernels (spec §7): Dropout (ONNX-13 forward with a bool mask) and DropoutGrad.

The mask comes from a counter-based hash of (seed, element index): the same seed gives
the same mask whatever the thread count. Without a ``seed`` attribute the seed is drawn
from torch's RNG (the global one, or ``generator=``), so ``torch.manual_seed`` makes runs
reproducible. Masks do not match ORT's (ORT uses std::minstd_rand0).
"""

from __future__ import annotations

import torch

from .._native import empty, empty_like, ffi, native_fn, ptr
from ._checks import (
    check_status,
    float_input,
    fmt_shape,
    get_num_threads,
    needs_flags,
    same_shape,
    select_outputs,
)
from ._registry import register


def draw_seed(generator: torch.Generator | None = None) -> int:
    """A 64-bit seed from torch's RNG (advances it)."""
    return int(torch.randint(0, 2**62, (), generator=generator, dtype=torch.int64)) * 4 + \
        int(torch.randint(0, 4, (), generator=generator, dtype=torch.int64))


def _u8(t):
    return ffi.NULL if t is None else ffi.cast("uint8_t *", t.data_ptr())


def dropout_forward(op: str, x: torch.Tensor, ratio: float, seed: int, want_mask: bool = True):
    """(y, mask) with mask[i] = u_i >= ratio; y = mask·x/(1-ratio) (0 for ratio 1)."""
    y = empty_like(x)
    mask = empty(x.shape, torch.bool) if want_mask else None
    st = native_fn("dropout_forward", x.dtype)(
        ptr(x), ptr(y), _u8(mask), x.numel(), float(ratio), seed & (2**64 - 1),
        get_num_threads(),
    )
    check_status(st, op)
    return y, mask


def dropout_backward(op: str, dy: torch.Tensor, mask: torch.Tensor | None, scale: float):
    dx = empty_like(dy)
    st = native_fn("dropout_backward", dy.dtype)(
        ptr(dy), _u8(mask), ptr(dx), dy.numel(), float(scale), get_num_threads()
    )
    check_status(st, op)
    return dx


def _ratio(op: str, ratio, default: float = 0.5) -> float:
    if ratio is None:
        return default
    if isinstance(ratio, torch.Tensor):
        if ratio.numel() != 1 or not ratio.dtype.is_floating_point:
            raise TypeError(f"{op}: ratio must be a floating scalar, got {ratio.dtype} "
                            f"{fmt_shape(ratio)}")
        ratio = float(ratio.item())
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
        raise TypeError(f"{op}: ratio must be a float, got {type(ratio).__name__}")
    return float(ratio)


def _flag(op: str, name: str, v) -> bool:
    if v is None:
        return False
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            raise ValueError(f"{op}: {name} must be a scalar, got shape {fmt_shape(v)}")
        v = v.item()
    return bool(v)


@register
def Dropout(data, ratio=None, training_mode=None, *, seed=None, generator=None, needs=None):
    """Dropout (ONNX-13): inputs data, optional ratio (default 0.5), optional training_mode
    (default false). Outputs: output, mask (bool). Inference: identity, mask all true.
    Training: ``mask = u >= ratio``, ``output = mask·data/(1-ratio)``; ``seed`` (attribute)
    fixes the mask, otherwise the seed is drawn from torch's RNG (``generator=``)."""
    op = "Dropout"
    x = float_input(op, "data", data)
    r = _ratio(op, ratio)
    if not 0.0 <= r < 1.0:
        raise ValueError(f"{op}: ratio must be in [0, 1), got {r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"{op}: seed must be an int, got {type(seed).__name__}")
    if not _flag(op, "training_mode", training_mode) or r == 0.0:
        out = (x.clone(), torch.ones(x.shape, dtype=torch.bool))
        return select_outputs(op, out, needs)
    s = seed if seed is not None else draw_seed(generator)
    want_mask = needs_flags(op, needs, 2)[1]
    return select_outputs(op, dropout_forward(op, x, r, s, want_mask), needs)


@register
def DropoutGrad(dy, mask, ratio=None, training_mode=None):
    """com.microsoft DropoutGrad: ``dx = mask ? dy/(1-ratio) : 0``; ratio defaults to 0.5
    and must be in [0, 1); ratio 0 returns dy unmasked; training_mode is ignored (ORT)."""
    op = "DropoutGrad"
    dy = float_input(op, "dy", dy)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"{op}: mask must be a bool tensor, got "
                        f"{getattr(mask, 'dtype', type(mask).__name__)}")
    same_shape(op, "dy", dy, "mask", mask)
    r = _ratio(op, ratio)
    if not 0.0 <= r < 1.0:
        raise ValueError(f"{op}: ratio must be in [0, 1), got {r}")
    _flag(op, "training_mode", training_mode)
    if r == 0.0:
        return dy.clone()
    return dropout_backward(op, dy, mask.contiguous(), 1.0 / (1.0 - r))
