"""Memory formats through our ops, kept as torch keeps them.

torch's elementwise ops give their output the input's layout, and its convolutions, batch
norm and pools keep a channels_last input channels_last, in the output and in the
gradient they pass back. The next torch op picks its kernel by that layout: in ConvNeXt,
an NCHW output of ours in front of torch's depthwise convolutions made them take mkldnn's
NCHW path, and the wrapped training step slower than plain torch's. Our kernels work on
contiguous buffers, so:

- elementwise ops run on a dense input's memory in its own dim order
  (``storage_order``/``in_order``): permuted, the input is a contiguous view, the kernel
  runs on it without a copy, and ``from_order`` gives the result the input's strides;
- channels-first kernels (convolution, batch norm, pooling) compute in NCHW and hand
  back the output and the input gradient channels_last when torch would
  (``channels_last``/``to_format``): one copy each way, which ``select`` measures.
"""

from __future__ import annotations

import torch

from .._native.arena import restrided

_FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


def storage_order(x: torch.Tensor) -> tuple[int, ...] | None:
    """For a dense, non-overlapping tensor that is not contiguous (channels_last,
    transposed, ...): the dim order, outermost first, in which its memory is contiguous.
    None for a contiguous tensor, and for one with gaps or overlaps (a slice, an expanded
    tensor: those run on a contiguous copy, as before)."""
    if x.is_contiguous():
        return None
    st = x.stride()
    order = tuple(sorted(range(x.dim()), key=lambda d: -st[d]))
    return order if x.permute(order).is_contiguous() else None


def in_order(t: torch.Tensor, order) -> torch.Tensor:
    """``t`` permuted to ``order`` and contiguous: a view when ``t`` is laid out in that
    order (the input itself, or a gradient in the output's layout), else a copy."""
    if order is not None:
        t = t.permute(order)
    return t if t.is_contiguous() else t.contiguous()


def from_order(y: torch.Tensor, order) -> torch.Tensor:
    """The contiguous result ``y`` of a kernel run on ``in_order`` tensors, back in the
    original dim order: a tensor of its own with the input's strides (autograd refuses
    in-place ops on a Function output that is a view)."""
    if order is None:
        return y
    inverse = sorted(range(len(order)), key=order.__getitem__)
    shape, st = y.shape, y.stride()
    return restrided(y, tuple(shape[i] for i in inverse), tuple(st[i] for i in inverse))


def channels_last(*tensors: torch.Tensor | None) -> torch.memory_format | None:
    """``torch.channels_last`` (4-D) or ``channels_last_3d`` (5-D) when one of ``tensors``
    (the input; a convolution's weight too) is laid out so and not contiguous, as torch's
    ``suggest_memory_format`` decides its output's layout; else None."""
    for t in tensors:
        if t is not None:
            fmt = _FORMATS.get(t.dim())
            if fmt is not None and not t.is_contiguous() and t.is_contiguous(memory_format=fmt):
                return fmt
    return None


def to_format(t: torch.Tensor | None, fmt) -> torch.Tensor | None:
    """``t`` (a kernel's fresh contiguous result) in memory format ``fmt`` (None: as is)."""
    if fmt is None or t is None:
        return t
    return t.contiguous(memory_format=fmt)
