"""Batch normalization kernels (spec §5): BatchNormInternal (training forward with saved
statistics and ORT's running-stat update), BatchNormalization (ONNX-15) and
BatchNormalizationGrad. X is [N, C, spatial...] with any number of spatial dims (or [N, C]).
"""

from __future__ import annotations

import math

import torch

from .._native import empty_like, ffi, native_fn, ptr
from ._checks import (
    check_status,
    float_attr,
    float_input,
    fmt_shape,
    get_num_threads,
    same_dtype,
    same_shape,
    select_outputs,
)
from ._registry import register


def ncs(op: str, x: torch.Tensor, name: str = "X") -> tuple[int, int, int]:
    if x.dim() < 2:
        raise ValueError(f"{op}: {name} must have rank >= 2 ([N, C, ...]), got shape "
                         f"{fmt_shape(x)}")
    return x.shape[0], x.shape[1], math.prod(x.shape[2:])


def channel_vec(op: str, name: str, t, x: torch.Tensor, c: int, x_name: str = "X",
                cast: bool = False):
    """A per-channel [C] tensor in x's dtype (None passes through)."""
    if t is None:
        return None
    t = float_input(op, name, t)
    if not cast:
        same_dtype(op, x_name, x, name, t)
    if t.numel() != c or t.dim() > 1:
        raise ValueError(f"{op}: {name} must have shape ({c},) (C of {x_name} "
                         f"{fmt_shape(x)}), got {fmt_shape(t)}")
    if t.dtype is x.dtype and t.dim() == 1:
        return t  # already [C], contiguous, of x's dtype (the common case: no new views)
    return t.to(x.dtype).contiguous().view(c)


def bn_train_forward(op: str, x, scale, bias, eps: float, names=("X", "scale", "B")):
    """(y, batch_mean, batch_var (biased), inv_std) for training-mode BatchNorm."""
    x = float_input(op, names[0], x)
    n, c, s = ncs(op, x, names[0])
    scale = channel_vec(op, names[1], scale, x, c, names[0])
    bias = channel_vec(op, names[2], bias, x, c, names[0])
    eps = float_attr(op, "epsilon", eps)
    if not eps >= 0:
        raise ValueError(f"{op}: epsilon must be >= 0, got {eps}")
    return bn_train_core(op, x, scale, bias, eps)


def bn_train_core(op: str, x: torch.Tensor, scale, bias, eps: float):
    """bn_train_forward on checked arguments: ``x`` contiguous [N, C, ...], ``scale`` /
    ``bias`` contiguous [C] of x's dtype or None (``channel_vec``), ``eps`` >= 0."""
    n, c, s = ncs(op, x)
    y = empty_like(x)
    mean = torch.empty(c, dtype=x.dtype)
    var = torch.empty(c, dtype=x.dtype)
    inv = torch.empty(c, dtype=x.dtype)
    st = native_fn("batchnorm_forward_train", x.dtype)(
        ptr(x), ptr(scale), ptr(bias), ptr(y), ptr(mean), ptr(var), ptr(inv), ffi.NULL,
        ffi.NULL, n, c, s, eps, 0.0, 1.0, get_num_threads(),
    )
    check_status(st, op)
    return y, mean, var, inv


def bn_train_running(op: str, x: torch.Tensor, scale, bias, eps: float, running_mean,
                     running_var, momentum: float, var_factor: float):
    """(y, stats): bn_train_core for torch's ``F.batch_norm`` in training, with the running
    statistics updated in place by the kernel, ``running = (1 - momentum)·running +
    momentum·batch`` (the batch variance times ``var_factor``). ``running_mean`` /
    ``running_var``: None or contiguous [C] of x's dtype. ``stats`` [2, C] holds the
    batch mean and inverse std (``bn_backward_stats`` takes it)."""
    n, c, s = ncs(op, x)
    y = empty_like(x)
    stats = torch.empty(2, c, dtype=x.dtype)
    p = ptr(stats)
    st = native_fn("batchnorm_forward_train", x.dtype)(
        ptr(x), ptr(scale), ptr(bias), ptr(y), p, ffi.NULL, p + c, ptr(running_mean),
        ptr(running_var), n, c, s, eps, momentum, var_factor, get_num_threads(),
    )
    check_status(st, op)
    return y, stats


def bn_apply(op: str, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """y = x·a[c] + b[c] (x validated by the caller)."""
    n, c, s = ncs(op, x)
    y = empty_like(x)
    st = native_fn("batchnorm_apply", x.dtype)(
        ptr(x), ptr(a.contiguous()), ptr(b.contiguous()), ptr(y), n, c, s, get_num_threads()
    )
    check_status(st, op)
    return y


def bn_eval_forward(op: str, x, scale, bias, mean, var, eps: float,
                    names=("X", "scale", "B", "input_mean", "input_var")):
    """Inference BatchNorm: ``(x - mean)/sqrt(var + eps)·scale + bias``."""
    x = float_input(op, names[0], x)
    n, c, s = ncs(op, x, names[0])
    scale = channel_vec(op, names[1], scale, x, c, names[0])
    bias = channel_vec(op, names[2], bias, x, c, names[0])
    mean = channel_vec(op, names[3], mean, x, c, names[0], cast=True)
    var = channel_vec(op, names[4], var, x, c, names[0], cast=True)
    eps = float_attr(op, "epsilon", eps)
    return bn_eval_core(op, x, scale, bias, mean, var, eps)[0]


def bn_eval_core(op: str, x: torch.Tensor, scale, bias, mean: torch.Tensor,
                 var: torch.Tensor, eps: float):
    """(y, inv_std in x's dtype): bn_eval_forward on checked arguments (``channel_vec``
    [C] vectors); the statistics are combined in double."""
    inv = torch.rsqrt(var.double() + eps)
    a = inv * (scale.double() if scale is not None else 1.0)
    b = (bias.double() if bias is not None else 0.0) - mean.double() * a
    return bn_apply(op, x, a.to(x.dtype), b.to(x.dtype)), inv.to(x.dtype)


def bn_backward(op: str, dy, x, scale, mean, inv_std, training: bool = True,
                need_dscale: bool = True, need_dbias: bool = True,
                names=("dY", "X", "scale", "mean", "variance")):
    dy = float_input(op, names[0], dy)
    x = float_input(op, names[1], x)
    same_dtype(op, names[1], x, names[0], dy)
    same_shape(op, names[1], x, names[0], dy)
    n, c, s = ncs(op, x, names[1])
    scale = channel_vec(op, names[2], scale, x, c, names[1])
    mean = channel_vec(op, names[3], mean, x, c, names[1], cast=True)
    inv_std = channel_vec(op, names[4], inv_std, x, c, names[1], cast=True)
    return bn_backward_core(op, dy, x, scale, mean, inv_std, training, need_dscale,
                            need_dbias)


def bn_backward_core(op: str, dy: torch.Tensor, x: torch.Tensor, scale, mean: torch.Tensor,
                     inv_std: torch.Tensor, training: bool, need_dscale: bool,
                     need_dbias: bool):
    """bn_backward on checked arguments: ``dy`` and ``x`` contiguous, same shape and
    dtype; ``scale`` (or None), ``mean``, ``inv_std`` contiguous [C] of x's dtype."""
    n, c, s = ncs(op, x)
    dx = empty_like(x)
    dscale = torch.empty(c, dtype=x.dtype) if need_dscale else None
    dbias = torch.empty(c, dtype=x.dtype) if need_dbias else None
    st = native_fn("batchnorm_backward", x.dtype)(
        ptr(dy), ptr(x), ptr(scale), ptr(mean), ptr(inv_std), ptr(dx), ptr(dscale),
        ptr(dbias), n, c, s, int(bool(training)), get_num_threads(),
    )
    check_status(st, op)
    return dx, dscale, dbias


def bn_backward_stats(op: str, dy: torch.Tensor, x: torch.Tensor, scale, stats: torch.Tensor,
                      need_dscale: bool, need_dbias: bool):
    """bn_backward_core (training) with the [2, C] statistics of ``bn_train_running``."""
    n, c, s = ncs(op, x)
    dx = empty_like(x)
    dscale = torch.empty(c, dtype=x.dtype) if need_dscale else None
    dbias = torch.empty(c, dtype=x.dtype) if need_dbias else None
    p = ptr(stats)
    st = native_fn("batchnorm_backward", x.dtype)(
        ptr(dy), ptr(x), ptr(scale), p, p + c, ptr(dx), ptr(dscale), ptr(dbias), n, c, s, 1,
        get_num_threads(),
    )
    check_status(st, op)
    return dx, dscale, dbias


def _training_mode(op: str, v) -> bool:
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            raise TypeError(f"{op}: training_mode must be 0 or 1 (a scalar), got a tensor of "
                            f"shape {fmt_shape(v)}")
        v = v.item()
    if isinstance(v, bool) or v in (0, 1):
        return bool(v)
    raise ValueError(f"{op}: training_mode must be 0 or 1, got {v!r}")


def _running(x, mean, var, bmean, bvar, momentum: float):
    """ORT's rule: running = momentum·input + (1 - momentum)·batch (biased variance)."""
    rm = mean.to(x.dtype) * momentum + bmean * (1.0 - momentum)
    rv = var.to(x.dtype) * momentum + bvar * (1.0 - momentum)
    return rm.to(mean.dtype), rv.to(var.dtype)


def _check_stats(op, X, input_mean, input_var):
    x = float_input(op, "X", X)
    _, c, _ = ncs(op, x)
    for name, t in (("input_mean", input_mean), ("input_var", input_var)):
        if t is None:
            raise TypeError(f"{op}: {name} is required")
        channel_vec(op, name, t, x, c, "X", cast=True)


def _running_checked(op, y, input_mean, input_var, bm, bv, momentum):
    c = bm.numel()
    return _running(y, input_mean.reshape(c), input_var.reshape(c), bm, bv, momentum)


@register
def BatchNormInternal(X, scale, B, input_mean, input_var, *, epsilon: float = 1e-5,
                      momentum: float = 0.9, training_mode: int = 1, needs=None):
    """com.microsoft BatchNormInternal: training BatchNorm. Inputs: X [N, C, ...], scale,
    B, input_mean, input_var ([C]). Outputs (training): Y, running_mean, running_var,
    saved_mean, saved_inv_std with ``running = momentum·input + (1-momentum)·batch``
    (biased batch variance, ORT's rule); inference (training_mode=0): Y only.
    Unlike ORT, input_mean / input_var are not updated in place: the new running
    statistics are returned."""
    op = "BatchNormInternal"
    momentum = float_attr(op, "momentum", momentum)
    if not _training_mode(op, training_mode):
        return bn_eval_forward(op, X, scale, B, input_mean, input_var, epsilon)
    _check_stats(op, X, input_mean, input_var)
    y, bm, bv, inv = bn_train_forward(op, X, scale, B, epsilon)
    rm, rv = _running_checked(op, y, input_mean, input_var, bm, bv, momentum)
    return select_outputs(op, (y, rm, rv, bm, inv), needs)


@register
def BatchNormalization(X, scale, B, input_mean, input_var, *, epsilon: float = 1e-5,
                       momentum: float = 0.9, training_mode: int = 0, needs=None):
    """BatchNormalization (ONNX-15). Inputs: X [N, C, ...], scale, B, input_mean, input_var.
    Inference (default): Y from the given statistics. training_mode=1: Y from batch
    statistics plus running_mean, running_var (``momentum·input + (1-momentum)·batch``)."""
    op = "BatchNormalization"
    momentum = float_attr(op, "momentum", momentum)
    if not _training_mode(op, training_mode):
        return bn_eval_forward(op, X, scale, B, input_mean, input_var, epsilon)
    _check_stats(op, X, input_mean, input_var)
    y, bm, bv, _ = bn_train_forward(op, X, scale, B, epsilon)
    rm, rv = _running_checked(op, y, input_mean, input_var, bm, bv, momentum)
    return select_outputs(op, (y, rm, rv), needs)


@register
def BatchNormalizationGrad(dY, X, scale, mean, variance, *, epsilon: float = 1e-5,
                           needs=None):
    """com.microsoft BatchNormalizationGrad. Inputs: dY, X [N, C, ...], scale, mean (saved
    batch mean), variance (**the saved inverse std**, as ORT's builder passes it).
    Outputs: X_grad, scale_grad, bias_grad. ``epsilon`` is ignored (as in ORT)."""
    op = "BatchNormalizationGrad"
    float_attr(op, "epsilon", epsilon)
    if scale is None:
        raise TypeError(f"{op}: scale is required")
    return select_outputs(op, bn_backward(op, dY, X, scale, mean, variance, True), needs)
