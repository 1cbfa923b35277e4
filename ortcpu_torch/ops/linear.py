"""``linear`` with ``torch.nn.functional.linear``'s signature on the ``Gemm`` kernel
(OpenBLAS): forward ``Y = X·Wᵀ + b``; backward ``dX = dY·W``, ``dW = dYᵀ·X`` and
``db`` = the column sums of dY (``ReduceSumTraining``, accumulated in double). Only the
gradients autograd asks for are computed."""

from __future__ import annotations

import torch

from ..kernels import gemm as KG
from ..kernels import tensor as KT
from .activations import once_differentiable


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        x2 = x.reshape(x.shape[:-1].numel(), x.shape[-1])
        y = KG.Gemm(x2, weight, bias, transB=1)
        ctx.save_for_backward(x2, weight)
        ctx.x_shape, ctx.has_bias = x.shape, bias is not None
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x2, weight = ctx.saved_tensors
        dy2 = dy.reshape(x2.shape[0], weight.shape[0])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = KG.Gemm(dy2, weight).view(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            dw = KG.Gemm(dy2, x2, transA=1)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = KT.ReduceSumTraining(dy2, [0], keepdims=0)
        return dx, dw, db


def linear(input: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """Like ``torch.nn.functional.linear``: ``input`` [..., in_features], ``weight``
    [out_features, in_features], ``bias`` [out_features] or None; float32 or float64."""
    op = "linear"
    for name, t in (("input", input), ("weight", weight), ("bias", bias)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if weight.dim() != 2:
        raise ValueError(f"{op}: weight must be 2-D [out_features, in_features], got shape "
                         f"{list(weight.shape)}")
    if input.dim() < 1 or input.shape[-1] != weight.shape[1]:
        raise ValueError(f"{op}: input's last dim must be in_features={weight.shape[1]}, got "
                         f"shape {list(input.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"{op}: bias must have shape [{weight.shape[0]}], got "
                         f"{list(bias.shape)}")
    return _Linear.apply(input, weight, bias)
