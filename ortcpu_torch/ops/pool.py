"""Pooling with ``torch.nn.functional``'s signatures: ``max_pool1d/2d/3d`` (MaxPool +
MaxPoolGrad), ``avg_pool1d/2d/3d`` (AveragePool + AveragePoolGrad), and
``adaptive_avg_pool2d`` for output size 1 (GlobalAveragePool)."""

from __future__ import annotations

import torch

from ..kernels import pool as K
from ._layout import channels_last, to_format
from .activations import once_differentiable
from .conv import _tuple


class _MaxPool(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, attrs: dict, want_indices: bool, op: str):
        ctx.fmt = fmt = channels_last(x)
        x = K.float_input(op, "input", x)
        ctx.x_shape, ctx.op, ctx.attrs = tuple(x.shape), op, attrs
        if want_indices or not ctx.needs_input_grad[0]:
            y, idx = K.maxpool_forward(op, x, want_indices, **attrs)
            saved = idx
        else:  # argmax codes where the geometry allows, not returned
            y, saved = K.maxpool_train_forward(op, x, **attrs)
            idx = None
        ctx.save_for_backward(saved)
        if idx is None:
            idx = torch.empty(0, dtype=torch.int64)
        else:
            idx = to_format(idx, fmt)
        ctx.mark_non_differentiable(idx)
        return to_format(y, fmt), idx

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, _didx):
        (saved,) = ctx.saved_tensors
        dx = K.maxpool_train_backward(ctx.op, dy, saved, ctx.x_shape, **ctx.attrs)
        return to_format(dx, ctx.fmt), None, None, None


class _AvgPool(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, attrs: dict, cip: int, divisor: int, op: str):
        y = K.avgpool_forward(op, x, cip, divisor, **attrs)
        ctx.x_shape, ctx.attrs, ctx.cip, ctx.divisor, ctx.op = (
            tuple(x.shape), attrs, cip, divisor, op)
        ctx.fmt = fmt = channels_last(x)
        return to_format(y, fmt)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        a = {k: v for k, v in ctx.attrs.items() if k != "ceil_mode"}
        dx = K.avgpool_backward(ctx.op, dy.contiguous(), ctx.x_shape, ctx.cip, ctx.divisor, **a)
        return to_format(dx, ctx.fmt), None, None, None, None


class _GlobalPool(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, kind: int, op: str):
        y = K.GlobalAveragePool(x) if kind == 0 else K.GlobalMaxPool(x)
        ctx.save_for_backward(x)
        ctx.kind, ctx.op = kind, op
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        # contiguous, as torch's: its adaptive_avg_pool2d to 1x1 is a mean over H, W
        x = x.contiguous()
        return K.global_pool_backward(ctx.op, dy.contiguous(), x, ctx.kind), None, None


def _batched(op: str, r: int, input):
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{op}: input must be a torch.Tensor, got {type(input).__name__}")
    if input.dim() == r + 1:
        return input.unsqueeze(0), True
    if input.dim() != r + 2:
        raise ValueError(f"{op}: input must be {r + 1}-D (unbatched) or {r + 2}-D (batched), "
                         f"got shape {tuple(input.shape)}")
    return input, False


def _pool_attrs(op, r, kernel_size, stride, padding, dilation=1):
    k = _tuple(f"{op}: kernel_size", kernel_size, r, 1)
    s = k if stride is None or (not isinstance(stride, int) and len(stride) == 0) else \
        _tuple(f"{op}: stride", stride, r, 1)
    p = _tuple(f"{op}: padding", padding, r, 0)
    d = _tuple(f"{op}: dilation", dilation, r, 1)
    for i in range(r):
        if p[i] > k[i] // 2:
            raise ValueError(f"{op}: padding should be at most half of the kernel size, got "
                             f"padding={p[i]} for kernel_size={k[i]}")
    return k, s, p, d


def _max_pool(op, r, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    x, unbatched = _batched(op, r, input)
    k, s, p, d = _pool_attrs(op, r, kernel_size, stride, padding, dilation)
    attrs = {"kernel_shape": k, "strides": s, "pads": p + p, "dilations": d,
             "ceil_mode": int(bool(ceil_mode))}
    y, idx = _MaxPool.apply(x, attrs, bool(return_indices), op)
    if return_indices:
        isz = 1
        for v in x.shape[2:]:
            isz *= v
        planes = torch.arange(x.shape[0] * x.shape[1], dtype=torch.int64).view(
            x.shape[0], x.shape[1], *([1] * r)) * isz
        idx = idx - planes
        if unbatched:
            return y.squeeze(0), idx.squeeze(0)
        return y, idx
    return y.squeeze(0) if unbatched else y


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """Like ``torch.nn.functional.max_pool1d``."""
    return _max_pool("max_pool1d", 1, input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """Like ``torch.nn.functional.max_pool2d``."""
    return _max_pool("max_pool2d", 2, input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """Like ``torch.nn.functional.max_pool3d``."""
    return _max_pool("max_pool3d", 3, input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


def _avg_pool(op, r, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
              divisor_override):
    x, unbatched = _batched(op, r, input)
    k, s, p, _ = _pool_attrs(op, r, kernel_size, stride, padding)
    div = 0
    if divisor_override is not None:
        if isinstance(divisor_override, bool) or not isinstance(divisor_override, int) or \
                divisor_override == 0:
            raise ValueError(f"{op}: divisor_override must be a non-zero int, got "
                             f"{divisor_override!r}")
        if divisor_override < 0:
            raise ValueError(f"{op}: divisor_override must be positive, got {divisor_override}")
        div = divisor_override
    attrs = {"kernel_shape": k, "strides": s, "pads": p + p, "ceil_mode": int(bool(ceil_mode))}
    y = _AvgPool.apply(x, attrs, int(bool(count_include_pad)), div, op)
    return y.squeeze(0) if unbatched else y


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True):
    """Like ``torch.nn.functional.avg_pool1d``."""
    return _avg_pool("avg_pool1d", 1, input, kernel_size, stride, padding, ceil_mode,
                     count_include_pad, None)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """Like ``torch.nn.functional.avg_pool2d``."""
    return _avg_pool("avg_pool2d", 2, input, kernel_size, stride, padding, ceil_mode,
                     count_include_pad, divisor_override)


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """Like ``torch.nn.functional.avg_pool3d``."""
    return _avg_pool("avg_pool3d", 3, input, kernel_size, stride, padding, ceil_mode,
                     count_include_pad, divisor_override)


def adaptive_avg_pool2d(input, output_size):
    """Like ``torch.nn.functional.adaptive_avg_pool2d`` for output size 1 or (1, 1)
    (GlobalAveragePool); other sizes raise ValueError."""
    sizes = (output_size,) * 2 if isinstance(output_size, int) else output_size
    if not (isinstance(sizes, (tuple, list)) and len(sizes) == 2
            and all(v is None or (isinstance(v, int) and v == 1) for v in sizes)):
        raise ValueError(f"adaptive_avg_pool2d: only output_size 1 or (1, 1) is supported, "
                         f"got {output_size!r}")
    x, unbatched = _batched("adaptive_avg_pool2d", 2, input)
    if isinstance(output_size, (tuple, list)) and None in output_size:
        if any(v is None and x.shape[2 + i] != 1 for i, v in enumerate(output_size)):
            raise ValueError("adaptive_avg_pool2d: output_size None keeps the input size; "
                             "only sizes that end up 1 are supported")
    y = _GlobalPool.apply(x, 0, "adaptive_avg_pool2d")
    return y.squeeze(0) if unbatched else y


def global_max_pool(input):
    """Max over all spatial dims, keeping them as size 1 (GlobalMaxPool, with gradient)."""
    if not isinstance(input, torch.Tensor) or input.dim() < 3:
        raise ValueError("global_max_pool: input must be a tensor [N, C, spatial...]")
    return _GlobalPool.apply(input, 1, "global_max_pool")


def global_avg_pool(input):
    """Mean over all spatial dims, keeping them as size 1 (GlobalAveragePool, with gradient)."""
    if not isinstance(input, torch.Tensor) or input.dim() < 3:
        raise ValueError("global_avg_pool: input must be a tensor [N, C, spatial...]")
    return _GlobalPool.apply(input, 0, "global_avg_pool")
