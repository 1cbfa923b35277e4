"""Autograd functions for LayerNorm and RMSNorm (ORT LayerNormalization(Grad),
SimplifiedLayerNormalization(Grad)), with torch's functional signatures."""

from __future__ import annotations

import torch

from .._native import empty_like, ffi, native_fn
from ..kernels._checks import (
    SignatureCache,
    check_status,
    checked_signature,
    float_attr,
    float_check,
    get_num_threads,
    same_dtype,
)
from .activations import once_differentiable

_cast, _NULL = ffi.cast, ffi.NULL


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


#: per dtype: the C pointer type and the two kernels (looked up once, not per call)
_KERNELS = {dt: (ffi.typeof("float *" if dt == torch.float32 else "double *"),
                 native_fn("layernorm_forward", dt), native_fn("layernorm_backward", dt))
            for dt in (torch.float32, torch.float64)}


def ln_forward(x, weight, bias, ndim: int, eps: float, simplified: bool, op: str):
    """``(y, x, weight, stats)`` of LayerNorm (RMSNorm when ``simplified``) over the last
    ``ndim`` dims, arguments checked by the caller: the kernel called directly, on
    contiguous data (``x``/``weight`` as used), ``stats`` [2 * rows] = mean (unused by
    RMSNorm), inv_std. Shared by ``_LayerNorm`` and ``ortcpu::layer_norm``."""
    if not x.is_contiguous():
        x = x.contiguous()
    if weight is not None and not weight.is_contiguous():
        weight = weight.contiguous()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    cols = x.shape[-1] if ndim == 1 else x.shape[x.dim() - ndim:].numel()
    rows = x.numel() // cols if cols else x.shape[:x.dim() - ndim].numel()
    y = empty_like(x)
    stats = torch.empty(2 * rows, dtype=x.dtype)
    ctype, fwd, _ = _KERNELS[x.dtype]
    ps = _cast(ctype, stats.data_ptr())
    st = fwd(_cast(ctype, x.data_ptr()),
             _NULL if weight is None else _cast(ctype, weight.data_ptr()),
             _NULL if bias is None else _cast(ctype, bias.data_ptr()),
             _cast(ctype, y.data_ptr()), ps, ps + rows, rows, cols, eps, int(simplified),
             get_num_threads())
    if st:
        check_status(st, op)
    return y, x, weight, stats


def ln_backward(dy, x, weight, stats, ndim: int, simplified: bool, need_w: bool,
                need_b: bool, op: str):
    """``(dx, dweight, dbias)`` of ``ln_forward`` (LayerNormalizationGrad in one pass;
    dweight / dbias in the normalized shape, None where not needed); ``x``, ``weight``,
    ``stats`` as ``ln_forward`` returned them."""
    cols = x.shape[-1] if ndim == 1 else x.shape[x.dim() - ndim:].numel()
    rows = stats.numel() // 2
    if not dy.is_contiguous():
        dy = dy.contiguous()
    dx = empty_like(x)
    dw = torch.empty(cols, dtype=x.dtype) if need_w else None
    db = torch.empty(cols, dtype=x.dtype) if need_b else None
    ctype, _, bwd = _KERNELS[x.dtype]
    ps = _cast(ctype, stats.data_ptr())
    st = bwd(_cast(ctype, dy.data_ptr()), _cast(ctype, x.data_ptr()),
             _NULL if weight is None else _cast(ctype, weight.data_ptr()), _NULL,
             _NULL if simplified else ps, ps + rows, _cast(ctype, dx.data_ptr()),
             _NULL if dw is None else _cast(ctype, dw.data_ptr()),
             _NULL if db is None else _cast(ctype, db.data_ptr()), rows, cols,
             1 if simplified else 0, get_num_threads())
    if st:
        check_status(st, op)
    if ndim != 1:
        shp = x.shape[x.dim() - ndim:]
        dw = None if dw is None else dw.view(shp)
        db = None if db is None else db.view(shp)
    return dx, dw, db


class _LayerNorm(torch.autograd.Function):
    """The arguments were checked by the caller (once per signature): ``ln_forward`` /
    ``ln_backward``. The call's Python is kept short (``select`` times the whole call, and
    a 64x64 LayerNorm's kernel is a few microseconds): pointers are cast once per tensor
    with the dtype's pointer type, mean and inv_std share one tensor ([2, rows]), the
    per-call metadata is one tuple."""

    @staticmethod
    def forward(ctx, x, weight, bias, ndim: int, eps: float, simplified: bool, op: str):
        y, x, weight, stats = ln_forward(x, weight, bias, ndim, eps, simplified, op)
        ctx.save_for_backward(x, weight, stats)
        ctx.meta = (ndim, simplified, op, bias is not None)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, stats = ctx.saved_tensors
        ndim, simplified, op, has_bias = ctx.meta
        need = ctx.needs_input_grad
        dx, dw, db = ln_backward(dy, x, weight, stats, ndim, simplified,
                                 weight is not None and need[1], has_bias and need[2], op)
        return dx, dw, db, None, None, None, None


#: autograd.Function.apply without its Python wrapper (functorch unwrapping, default-
#: argument binding: ~35 us of a 2048x256 call with the interpreter out of cache); the
#: wrapper still runs under functorch transforms (vmap, grad), where it is needed
_apply = super(torch.autograd.Function, _LayerNorm).apply
_functorch_active = torch._C._are_functorch_transforms_active


def _run(*args):
    return (_LayerNorm.apply if _functorch_active() else _apply)(*args)

_CHECKED = SignatureCache()


def checked_dims(op: str, input, normalized_shape, weight, bias, eps) -> int:
    """The number of normalized dims, after the argument checks (run once per signature:
    tensor kinds and shapes, ``normalized_shape``, ``eps``)."""
    shp = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    key = checked_signature(op, input, weight, bias, eps, *shp) \
        if isinstance(shp, (tuple, list, torch.Size)) else None
    if key in _CHECKED:
        return len(shp)
    shp = _shape(op, input, normalized_shape)
    _param(op, "weight", weight, shp)
    _param(op, "bias", bias, shp)
    float_check(op, "input", input)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            float_check(op, name, t)
            same_dtype(op, "input", input, name, t)
    e = float_attr(op, "eps", eps)
    if not e >= 0:
        raise ValueError(f"{op}: eps must be >= 0, got {e}")
    _CHECKED.add(key)
    return len(shp)


def layer_norm(input: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """Like ``torch.nn.functional.layer_norm``; backward is ORT's LayerNormalizationGrad
    (one fused pass for dX, dweight and dbias)."""
    op = "layer_norm"
    nd = checked_dims(op, input, normalized_shape, weight, bias, eps)
    return _run(input, weight, bias, nd, float(eps), False, op)


def rms_norm(input: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
             eps: float | None = None) -> torch.Tensor:
    """Like ``torch.nn.functional.rms_norm`` (``eps=None``: ``torch.finfo(input.dtype).eps``);
    ORT SimplifiedLayerNormalization(Grad), float32 and float64."""
    op = "rms_norm"
    if eps is None:
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"{op}: input must be a torch.Tensor, got {type(input).__name__}")
        eps = torch.finfo(input.dtype).eps if input.dtype.is_floating_point else 0.0
    nd = checked_dims(op, input, normalized_shape, weight, None, eps)
    return _run(input, weight, None, nd, float(eps), True, op)
