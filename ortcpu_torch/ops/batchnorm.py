"""Autograd function for batch normalization (ORT BatchNormInternal /
BatchNormalizationGrad), with ``torch.nn.functional.batch_norm``'s signature."""

from __future__ import annotations

import torch

from ..kernels import batchnorm as K
from ..kernels._checks import bool_arg, float_attr
from .activations import once_differentiable


class _BatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, training: bool,
                momentum: float, eps: float, unbiased: bool):
        op = "batch_norm"
        x = K.float_input(op, "input", x)
        n, c, s = K.ncs(op, x, "input")
        rm = K.channel_vec(op, "running_mean", running_mean, x, c, "input", cast=True)
        rv = K.channel_vec(op, "running_var", running_var, x, c, "input", cast=True)
        scale = K.channel_vec(op, "weight", weight, x, c, "input")
        shift = K.channel_vec(op, "bias", bias, x, c, "input")
        if training:
            if n * s <= 1:
                raise ValueError(f"{op}: expected more than 1 value per channel when "
                                 f"training, got input size {list(x.shape)}")
            y, mean, var, inv = K.bn_train_core(op, x, scale, shift, eps)
            if unbiased and running_var is not None:
                m = n * s
                var.mul_(m / (m - 1))  # var is this call's own buffer, used only here
            _update_running((running_mean, running_var), (mean, var), momentum)
        else:
            if rm is None or rv is None:
                raise ValueError(f"{op}: running_mean and running_var are required when "
                                 f"training is False")
            mean = rm
            y, inv = K.bn_eval_core(op, x, scale, shift, rm, rv, eps)
        ctx.save_for_backward(x, scale, mean, inv)
        ctx.training, ctx.has_bias = training, bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, scale, mean, inv = ctx.saved_tensors
        need_w = scale is not None and ctx.needs_input_grad[1]
        need_b = ctx.has_bias and ctx.needs_input_grad[2]
        dx, dw, db = K.bn_backward_core("batch_norm", dy.contiguous(), x, scale, mean, inv,
                                        ctx.training, need_w, need_b)
        return dx, dw, db, None, None, None, None, None, None


def _update_running(running, batch, momentum: float) -> None:
    """``running = (1 - momentum)·running + momentum·batch`` in place, for each running
    statistic that is not None (forward of an autograd.Function: grad mode is off). Two
    plain in-place ops per statistic: torch's ``_foreach_`` pair measured slower on [C]."""
    for r, b in zip(running, batch, strict=True):
        if r is not None:
            r.mul_(1.0 - momentum).add_(b if b.dtype is r.dtype else b.to(r.dtype),
                                        alpha=momentum)


def batch_norm(input: torch.Tensor, running_mean: torch.Tensor | None,
               running_var: torch.Tensor | None, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5, *,
               unbiased_running_var: bool = True) -> torch.Tensor:
    """Like ``torch.nn.functional.batch_norm``: in training, batch statistics are used and
    the running ones updated in place, ``running = (1 - momentum)·running +
    momentum·batch`` with the unbiased batch variance (torch). ORT's convention
    (BatchNormInternal): ``momentum = 1 - ort_momentum`` and
    ``unbiased_running_var=False``. Backward: ORT BatchNormalizationGrad."""
    op = "batch_norm"
    eps = float_attr(op, "eps", eps)
    if not eps >= 0:
        raise ValueError(f"{op}: eps must be >= 0, got {eps}")
    return _BatchNorm.apply(input, weight, bias, running_mean, running_var,
                            bool_arg(op, "training", training),
                            float_attr(op, "momentum", momentum), eps,
                            bool_arg(op, "unbiased_running_var", unbiased_running_var))
