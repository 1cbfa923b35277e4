"""Autograd functions for LayerNorm and RMSNorm (ORT LayerNormalization(Grad),
SimplifiedLayerNormalization(Grad)), with torch's functional signatures."""

from __future__ import annotations

import torch

from ..kernels import norm as K
from .activations import once_differentiable


def _shape(op: str, x: torch.Tensor, normalized_shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    shp = tuple(int(s) for s in normalized_shape)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: input must be a torch.Tensor, got {type(x).__name__}")
    if len(shp) == 0 or len(shp) > x.dim() or tuple(x.shape[x.dim() - len(shp):]) != shp:
        raise ValueError(f"{op}: normalized_shape {list(shp)} must be a non-empty suffix of "
                         f"the input shape {list(x.shape)}")
    return shp


def _param(op: str, name: str, t, shp):
    if t is not None and not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t is not None and tuple(t.shape) != shp:
        raise ValueError(f"{op}: {name} must have shape {list(shp)}, got {list(t.shape)}")
    return t


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, ndim: int, eps: float, simplified: bool, op: str):
        x = K.float_input(op, "input", x)
        y, mean, inv = K.layernorm_forward(op, x, weight, bias, eps, -ndim, simplified,
                                           names=("input", "weight", "bias"))
        ctx.save_for_backward(x, weight, mean, inv)
        ctx.ndim, ctx.simplified, ctx.op = ndim, simplified, op
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, mean, inv = ctx.saved_tensors
        need_w = weight is not None and ctx.needs_input_grad[1]
        need_b = ctx.has_bias and ctx.needs_input_grad[2]
        dx, dw, db = K.layernorm_backward(
            ctx.op, dy, x, weight, None, mean, inv, 1 if ctx.simplified else 0, -ctx.ndim,
            need_dscale=need_w, need_dbias=need_b, names=("grad_output", "input"))
        if dw is not None:
            dw = dw.view(weight.shape)
        if db is not None:
            db = db.view(weight.shape if weight is not None else x.shape[x.dim() - ctx.ndim:])
        return dx, dw, db, None, None, None, None


def layer_norm(input: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """Like ``torch.nn.functional.layer_norm``; backward is ORT's LayerNormalizationGrad
    (one fused pass for dX, dweight and dbias)."""
    op = "layer_norm"
    shp = _shape(op, input, normalized_shape)
    _param(op, "weight", weight, shp)
    _param(op, "bias", bias, shp)
    return _LayerNorm.apply(input, weight, bias, len(shp), eps, False, op)


def rms_norm(input: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
             eps: float | None = None) -> torch.Tensor:
    """Like ``torch.nn.functional.rms_norm`` (``eps=None``: ``torch.finfo(input.dtype).eps``);
    ORT SimplifiedLayerNormalization(Grad), float32 and float64."""
    op = "rms_norm"
    shp = _shape(op, input, normalized_shape)
    _param(op, "weight", weight, shp)
    if eps is None:
        eps = torch.finfo(input.dtype).eps if input.dtype.is_floating_point else 0.0
    return _LayerNorm.apply(input, weight, None, len(shp), eps, True, op)
