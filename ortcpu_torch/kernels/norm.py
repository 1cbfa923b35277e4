"""Normalization kernels (spec §4): LayerNormalization, SimplifiedLayerNormalization
(RMSNorm) and their gradients, including InvertibleLayerNormalizationGrad.

float32 and float64 everywhere (ORT 1.19.2 cannot run SimplifiedLayerNormalization(Grad)
in float64). Row statistics are accumulated in double, in two passes.
"""

from __future__ import annotations

import math

import torch

from .._native import empty_like, native_fn, ptr
from ._checks import (
    check_status,
    float_attr,
    float_input,
    fmt_shape,
    get_num_threads,
    normalize_axis,
    same_dtype,
    same_shape,
    select_outputs,
)
from ._registry import register

#: ONNX TensorProto element types accepted for ``stash_type``
_STASH = {1: torch.float32, 11: torch.float64}


def _stash(op: str, stash_type) -> torch.dtype:
    if stash_type not in _STASH:
        raise ValueError(f"{op}: stash_type must be 1 (float) or 11 (double), got {stash_type!r}")
    return _STASH[stash_type]


def rows_cols(op: str, x: torch.Tensor, axis: int) -> tuple[int, int, int]:
    """(axis, rows, cols) of x viewed as [prod(dims[:axis]), prod(dims[axis:])]."""
    axis = normalize_axis(op, axis, x.dim())
    cols = math.prod(x.shape[axis:])
    rows = math.prod(x.shape[:axis])
    return axis, rows, cols


def _param(op: str, name: str, t, x: torch.Tensor, cols: int, x_name: str = "X"):
    if t is None:
        return None
    t = float_input(op, name, t)
    same_dtype(op, x_name, x, name, t)
    if t.numel() != cols:
        raise ValueError(
            f"{op}: {name} must have {cols} elements (the normalized dims of {x_name} "
            f"{fmt_shape(x)}), got shape {fmt_shape(t)}"
        )
    return t


def _stat(op: str, name: str, t, x: torch.Tensor, rows: int):
    """A per-row statistic in x's dtype (ORT stashes float32 even for double data)."""
    t = float_input(op, name, t)
    if t.numel() != rows:
        raise ValueError(f"{op}: {name} must have {rows} elements (one per row), "
                         f"got shape {fmt_shape(t)}")
    return t.to(x.dtype).contiguous()


def layernorm_forward(op: str, x, scale, bias, eps: float, axis: int, simplified: bool,
                      names=("X", "Scale", "B")):
    """(y, mean, inv_std) with mean/inv_std of shape [rows] in x's dtype (mean None for
    RMSNorm)."""
    x = float_input(op, names[0], x)
    if x.dim() == 0:
        raise ValueError(f"{op}: {names[0]} must have rank >= 1, got shape ()")
    eps = float_attr(op, "epsilon", eps)
    if not eps >= 0:
        raise ValueError(f"{op}: epsilon must be >= 0, got {eps}")
    axis, rows, cols = rows_cols(op, x, axis)
    scale = _param(op, names[1], scale, x, cols, names[0])
    bias = None if simplified else _param(op, names[2], bias, x, cols, names[0])
    y = empty_like(x)
    mean = None if simplified else torch.empty(rows, dtype=x.dtype)
    inv = torch.empty(rows, dtype=x.dtype)
    st = native_fn("layernorm_forward", x.dtype)(
        ptr(x), ptr(scale), ptr(bias), ptr(y), ptr(mean), ptr(inv), rows, cols, eps,
        int(simplified), get_num_threads(),
    )
    check_status(st, op)
    return y, mean, inv


def layernorm_backward(op: str, dy, xy, scale, bias, mean, inv, mode: int, axis: int = -1,
                       need_dscale: bool = True, need_dbias: bool = True,
                       names=("Y_grad", "X")):
    """(dx, dscale, dbias) of LayerNorm (mode 0), RMSNorm (1) or invertible LayerNorm
    from Y (2). dscale/dbias are flat [cols]; None where not needed."""
    dy = float_input(op, names[0], dy)
    xy = float_input(op, names[1], xy)
    same_dtype(op, names[1], xy, names[0], dy)
    same_shape(op, names[1], xy, names[0], dy)
    if xy.dim() == 0:
        raise ValueError(f"{op}: {names[1]} must have rank >= 1, got shape ()")
    axis, rows, cols = rows_cols(op, xy, axis)
    scale = _param(op, "scale", scale, xy, cols, names[1])
    bias = _param(op, "bias", bias, xy, cols, names[1])
    if mode == 0:
        mean = _stat(op, "mean", mean, xy, rows)
    inv = _stat(op, "inv_std", inv, xy, rows)
    dx = empty_like(xy)
    dscale = torch.empty(cols, dtype=xy.dtype) if need_dscale else None
    dbias = torch.empty(cols, dtype=xy.dtype) if (need_dbias and mode != 1) else None
    st = native_fn("layernorm_backward", xy.dtype)(
        ptr(dy), ptr(xy), ptr(scale), ptr(bias), ptr(mean if mode == 0 else None), ptr(inv),
        ptr(dx), ptr(dscale), ptr(dbias), rows, cols, mode, get_num_threads(),
    )
    check_status(st, op)
    return dx, dscale, dbias


def _stat_shape(x: torch.Tensor, axis: int) -> tuple[int, ...]:
    return tuple(x.shape[:axis]) + (1,) * (x.dim() - axis)


@register
def LayerNormalization(X, Scale, B=None, *, axis: int = -1, epsilon: float = 1e-5,
                       stash_type: int = 1, needs=None):
    """LayerNormalization (ONNX-17): ``Y = (X - mean)·InvStdDev·Scale + B`` over dims
    ``[axis:]``. Inputs: X, Scale, optional B. Outputs: Y, Mean, InvStdDev (stats shaped
    ``X.shape[:axis] + (1,)*…``, dtype from ``stash_type``: float32 by default, as ORT)."""
    op = "LayerNormalization"
    stash = _stash(op, stash_type)
    y, mean, inv = layernorm_forward(op, X, Scale, B, epsilon, axis, False)
    ax = normalize_axis(op, axis, y.dim())
    shp = _stat_shape(y, ax)
    return select_outputs(op, (y, mean.to(stash).view(shp), inv.to(stash).view(shp)), needs)


@register
def SimplifiedLayerNormalization(X, scale, *, axis: int = -1, epsilon: float = 1e-5,
                                 stash_type: int = 1, needs=None):
    """SimplifiedLayerNormalization (RMSNorm): ``Y = X·inv_std_var·scale``,
    ``inv_std_var = 1/sqrt(mean(X²) + ε)`` over dims ``[axis:]``. Inputs: X, scale.
    Outputs: Y, inv_std_var (dtype from ``stash_type``). float64 too (ORT 1.19.2: no)."""
    op = "SimplifiedLayerNormalization"
    stash = _stash(op, stash_type)
    y, _, inv = layernorm_forward(op, X, scale, None, epsilon, axis, True,
                                  names=("X", "scale", "B"))
    ax = normalize_axis(op, axis, y.dim())
    return select_outputs(op, (y, inv.to(stash).view(_stat_shape(y, ax))), needs)


@register
def LayerNormalizationGrad(Y_grad, X, scale, mean, inv_std_dev, *, axis: int = -1,
                           needs=None):
    """com.microsoft LayerNormalizationGrad. Inputs: Y_grad, X, scale, mean, inv_std_dev
    (forward stats, any float dtype). Outputs: X_grad, scale_grad, bias_grad. Unlike ORT,
    a normalized size of 1 is accepted (X_grad is then 0)."""
    op = "LayerNormalizationGrad"
    if scale is None:
        raise TypeError(f"{op}: scale is required")
    dx, ds, db = layernorm_backward(op, Y_grad, X, scale, None, mean, inv_std_dev, 0, axis)
    return select_outputs(op, (dx, ds.view(scale.shape), db.view(scale.shape)), needs)


@register
def InvertibleLayerNormalizationGrad(Y_grad, Y, scale, bias, inv_std_var, *, axis: int = -1,
                                     needs=None):
    """com.microsoft InvertibleLayerNormalizationGrad: LayerNorm backward from the forward
    *output* Y (``x̂ = (Y - bias)/scale``; scale must be non-zero). Inputs: Y_grad, Y, scale,
    bias, inv_std_var. Outputs: X_grad, scale_grad, bias_grad."""
    op = "InvertibleLayerNormalizationGrad"
    if scale is None or bias is None:
        raise TypeError(f"{op}: scale and bias are required")
    dx, ds, db = layernorm_backward(op, Y_grad, Y, scale, bias, None, inv_std_var, 2, axis,
                                    names=("Y_grad", "Y"))
    return select_outputs(op, (dx, ds.view(scale.shape), db.view(scale.shape)), needs)


@register
def SimplifiedLayerNormalizationGrad(Y_grad, X, scale, inv_std_var, *, axis: int = -1,
                                     needs=None):
    """com.microsoft SimplifiedLayerNormalizationGrad (RMSNorm backward). Inputs: Y_grad, X,
    scale, inv_std_var. Outputs: X_grad, scale_grad. float64 too (ORT 1.19.2: no)."""
    op = "SimplifiedLayerNormalizationGrad"
    if scale is None:
        raise TypeError(f"{op}: scale is required")
    dx, ds, _ = layernorm_backward(op, Y_grad, X, scale, None, None, inv_std_var, 1, axis)
    return select_outputs(op, (dx, ds.view(scale.shape)), needs)


