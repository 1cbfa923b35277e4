"""Autograd function for batch normalization (ORT BatchNormInternal /
BatchNormalizationGrad), with ``torch.nn.functional.batch_norm``'s signature.

The argument checks run once per signature (``kernels._checks.SignatureCache``); in
training the kernel also updates running statistics of the input's dtype in place, so a
call is one native forward (and one native backward) with no other torch op."""

from __future__ import annotations

import math

import torch

from ..kernels import batchnorm as K
from ..kernels._checks import SignatureCache, bool_arg, checked_signature, float_attr
from ._layout import channels_last, to_format
from .activations import once_differentiable


def _vec(t, x: torch.Tensor):
    """A checked per-channel tensor (``K.channel_vec``'s checks passed) as a contiguous 1-D
    tensor of x's dtype: ``t`` itself in the common case."""
    if t is None or (t.dtype is x.dtype and t.dim() == 1 and t.is_contiguous()):
        return t
    return t.to(x.dtype).contiguous().view(-1)


class _BatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, training: bool,
                momentum: float, eps: float, unbiased: bool):
        # arguments checked by batch_norm (_check_batch_norm) for this signature
        op = "batch_norm"
        ctx.fmt = fmt = channels_last(x)
        if not x.is_contiguous():
            x = x.contiguous()
        scale, shift = _vec(weight, x), _vec(bias, x)
        ctx.training, ctx.has_bias = training, bias is not None
        if training:
            n, s = x.shape[0], math.prod(x.shape[2:])
            factor = n * s / (n * s - 1) if unbiased else 1.0
            rm, rv = _vec(running_mean, x), _vec(running_var, x)
            if rm is running_mean and rv is running_var:
                # running buffers of x's dtype, contiguous [C] (or None): the kernel
                # updates them in place
                y, stats = K.bn_train_running(op, x, scale, shift, eps, running_mean,
                                              running_var, momentum, factor)
                ctx.save_for_backward(x, scale, stats)
                return to_format(y, fmt)
            y, mean, var, inv = K.bn_train_core(op, x, scale, shift, eps)
            if running_var is not None:
                var.mul_(factor)  # var is this call's own buffer, used only here
            update_running((running_mean, running_var), (mean, var), momentum)
        else:
            rm, rv = _vec(running_mean, x), _vec(running_var, x)
            mean = rm
            y, inv = K.bn_eval_core(op, x, scale, shift, rm, rv, eps)
        ctx.save_for_backward(x, scale, mean, inv)
        return to_format(y, fmt)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        saved = ctx.saved_tensors
        x, scale = saved[0], saved[1]
        need_w = scale is not None and ctx.needs_input_grad[1]
        need_b = ctx.has_bias and ctx.needs_input_grad[2]
        if len(saved) == 3:  # bn_train_running's [2, C] statistics
            dx, dw, db = K.bn_backward_stats("batch_norm", dy.contiguous(), x, scale,
                                             saved[2], need_w, need_b)
        else:
            dx, dw, db = K.bn_backward_core("batch_norm", dy.contiguous(), x, scale,
                                            saved[2], saved[3], ctx.training, need_w, need_b)
        return to_format(dx, ctx.fmt), dw, db, None, None, None, None, None, None


def update_running(running, batch, momentum: float, scales=None) -> None:
    """``running = (1 - momentum)·running + momentum·scale·batch`` in place, for each
    running statistic that is not None (``scales``: one factor per statistic, default 1;
    grad mode off). Two plain in-place ops per statistic: torch's ``_foreach_`` pair
    measured slower on [C]."""
    for i, (r, b) in enumerate(zip(running, batch, strict=True)):
        if r is not None:
            alpha = momentum if scales is None else momentum * scales[i]
            r.mul_(1.0 - momentum).add_(b if b.dtype is r.dtype else b.to(r.dtype),
                                        alpha=alpha)


_BN_CHECKED = SignatureCache()


def _check_batch_norm(op, input, running_mean, running_var, weight, bias, training, eps):
    x = K.float_input(op, "input", input)
    n, c, s = K.ncs(op, x, "input")
    for name, t, cast in (("running_mean", running_mean, True),
                          ("running_var", running_var, True), ("weight", weight, False),
                          ("bias", bias, False)):
        K.channel_vec(op, name, t, x, c, "input", cast=cast)
    if training and n * s <= 1:
        raise ValueError(f"{op}: expected more than 1 value per channel when training, got "
                         f"input size {list(x.shape)}")
    if not training and (running_mean is None or running_var is None):
        raise ValueError(f"{op}: running_mean and running_var are required when training "
                         f"is False")
    if not eps >= 0:
        raise ValueError(f"{op}: eps must be >= 0, got {eps}")


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
    key = checked_signature(input, running_mean, running_var, weight, bias, training,
                            momentum, eps, unbiased_running_var)
    if key is None or key not in _BN_CHECKED:
        eps = float_attr(op, "eps", eps)
        momentum = float_attr(op, "momentum", momentum)
        training = bool_arg(op, "training", training)
        unbiased_running_var = bool_arg(op, "unbiased_running_var", unbiased_running_var)
        _check_batch_norm(op, input, running_mean, running_var, weight, bias, training, eps)
        _BN_CHECKED.add(key)
    return _BatchNorm.apply(input, weight, bias, running_mean, running_var, bool(training),
                            float(momentum), float(eps), bool(unbiased_running_var))
