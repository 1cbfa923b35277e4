"""``conv1d/2d/3d`` with ``torch.nn.functional``'s signatures (``padding='same'|'valid'``
included); forward is the ``Conv`` kernel, backward ``ConvGrad`` (only the gradients
autograd asks for are computed)."""

from __future__ import annotations

import torch

from ..kernels import conv as K
from .activations import once_differentiable


def _tuple(name: str, v, n: int, minimum: int) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        v = (v,) * n
    try:
        vals = [int(t) if not isinstance(t, bool) and float(t) == int(t) else None for t in v]
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an int or a tuple of {n} ints, got {v!r}") from None
    if len(vals) == 1 and n > 1:
        vals = vals * n
    if len(vals) != n or any(t is None for t in vals):
        raise ValueError(f"{name} must be an int or a tuple of {n} ints, got {v!r}")
    if any(t < minimum for t in vals):
        raise ValueError(f"{name} must be >= {minimum}, got {v!r}")
    return vals


class _Conv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, attrs: dict, op: str):
        y, ctx.geom = K.conv_forward_geom(op, x, w, b, **attrs)
        ctx.save_for_backward(x, w)
        ctx.op, ctx.has_bias = op, b is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        need = (ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                ctx.has_bias and ctx.needs_input_grad[2])
        dx, dw, db = K.conv_backward(ctx.op, dy.contiguous(), x, w, need, geom=ctx.geom)
        return dx, dw, db, None, None


def _conv(op: str, r: int, input, weight, bias, stride, padding, dilation, groups):
    for name, t in (("input", input), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
    unbatched = input.dim() == r + 1
    if unbatched:
        input = input.unsqueeze(0)
    if input.dim() != r + 2:
        raise ValueError(f"{op}: input must be {r + 1}-D (unbatched) or {r + 2}-D (batched), "
                         f"got shape {tuple(input.shape)}")
    if weight.dim() != r + 2:
        raise ValueError(f"{op}: weight must be {r + 2}-D, got shape {tuple(weight.shape)}")
    s = _tuple(f"{op}: stride", stride, r, 1)
    d = _tuple(f"{op}: dilation", dilation, r, 1)
    k = list(weight.shape[2:])
    if isinstance(padding, str):
        if padding == "valid":
            pads = [0] * (2 * r)
        elif padding == "same":
            if any(v != 1 for v in s):
                raise ValueError(f"{op}: padding='same' is not supported for strided "
                                 f"convolutions (stride={tuple(s)})")
            total = [d[i] * (k[i] - 1) for i in range(r)]
            pads = [t // 2 for t in total] + [t - t // 2 for t in total]
        else:
            raise ValueError(f"{op}: padding must be 'same', 'valid', an int or a tuple of "
                             f"ints, got {padding!r}")
    else:
        p = _tuple(f"{op}: padding", padding, r, 0)
        pads = p + p
    attrs = {"strides": s, "dilations": d, "pads": pads, "group": groups}
    y = _Conv.apply(input, weight, bias, attrs, op)
    return y.squeeze(0) if unbatched else y


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """Like ``torch.nn.functional.conv1d``."""
    return _conv("conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """Like ``torch.nn.functional.conv2d``."""
    return _conv("conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """Like ``torch.nn.functional.conv3d``."""
    return _conv("conv3d", 3, input, weight, bias, stride, padding, dilation, groups)
