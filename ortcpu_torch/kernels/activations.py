"""Activation kernels (spec §2, §3, §17.1): GELU family, ReLU, Sigmoid, Tanh,
LeakyReLU, QuickGELU, HardSigmoid, HardSwish, hardtanh (ReLU6), Softmax / LogSoftmax and
their gradients.

float32 and float64 everywhere (ORT 1.19.2 runs most of these in float32 only).
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
    normalize_axis,
    same_dtype,
    same_shape,
)
from ._registry import register

_ACT = {"Relu": 0, "Sigmoid": 1, "Tanh": 2, "QuickGelu": 3, "LeakyRelu": 4}


# ---- GELU family: one native pair serves all seven ORT ops ---------------------


def _bias_input(op: str, x: torch.Tensor, bias, name: str = "B", x_name: str = "X"):
    if bias is None:
        return None
    bias = float_input(op, name, bias)
    same_dtype(op, x_name, x, name, bias)
    if x.dim() < 1:
        raise ValueError(
            f"{op}: {x_name} must have rank >= 1 when a bias is given, got shape ()"
        )
    if bias.dim() != 1 or bias.numel() != x.shape[-1]:
        raise ValueError(
            f"{op}: {name} must be 1-D with {x_name}.shape[-1]={x.shape[-1]} elements, "
            f"got shape {fmt_shape(bias)}"
        )
    return bias


def _rows_cols(x: torch.Tensor) -> tuple[int, int]:
    cols = x.shape[-1] if x.dim() >= 1 else 1
    return (x.numel() // cols if cols else 0), cols


def gelu_forward(op: str, x, bias=None, approximate: int = 0,
                 names: tuple[str, str] = ("X", "B")) -> torch.Tensor:
    """y = gelu(x + bias); approximate 0 = erf, 1 = tanh. ``names`` are the caller's
    argument names for x and bias, used in error messages."""
    x = float_input(op, names[0], x)
    bias = _bias_input(op, x, bias, names[1], names[0])
    return gelu_forward_core(op, x, bias, approximate)


def gelu_forward_core(op: str, x: torch.Tensor, bias, approximate: int) -> torch.Tensor:
    """gelu_forward on checked arguments: ``x`` contiguous float, ``bias`` None or
    contiguous 1-D of x.shape[-1] elements and x's dtype."""
    y = empty_like(x)
    rows, cols = _rows_cols(x)
    st = native_fn("gelu_forward", x.dtype)(
        ptr(x), ptr(bias), ptr(y), rows, cols, approximate, get_num_threads()
    )
    check_status(st, op)
    return y


def gelu_backward(op: str, dy, x, bias=None, approximate: int = 0, need_dbias: bool = False):
    """(dx, dbias) of gelu(x + bias); dbias (sum of dx over all but the last axis)
    is computed in the same pass when ``need_dbias``, else None."""
    dy = float_input(op, "dY", dy)
    x = float_input(op, "X", x)
    same_dtype(op, "dY", dy, "X", x)
    same_shape(op, "dY", dy, "X", x)
    bias = _bias_input(op, x, bias)
    return gelu_backward_core(op, dy, x, bias, approximate, need_dbias)


def gelu_backward_core(op: str, dy: torch.Tensor, x: torch.Tensor, bias, approximate: int,
                       need_dbias: bool):
    """gelu_backward on checked arguments: ``dy`` and ``x`` contiguous, same shape and
    dtype; ``bias`` as in ``gelu_forward_core``."""
    dx = empty_like(x)
    rows, cols = _rows_cols(x)
    dbias = torch.empty(cols, dtype=x.dtype) if (need_dbias and bias is not None) else None
    st = native_fn("gelu_backward", x.dtype)(
        ptr(dy), ptr(x), ptr(bias), ptr(dx), ptr(dbias), rows, cols, approximate,
        get_num_threads(),
    )
    check_status(st, op)
    return dx, dbias


@register
def Gelu(X):
    """com.microsoft Gelu: ``Y = 0.5·X·(1 + erf(X/√2))``. Inputs: X. Output: Y."""
    return gelu_forward("Gelu", X)


@register
def FastGelu(X, bias=None):
    """com.microsoft FastGelu: tanh-approximated GELU of ``X + bias``.
    Inputs: X, optional bias (1-D, X.shape[-1]). Output: Y."""
    return gelu_forward("FastGelu", X, bias, approximate=1, names=("X", "bias"))


@register
def BiasGelu(A, B):
    """com.microsoft BiasGelu: ``Gelu(A + B)``, B 1-D along the last axis. Output: C."""
    return gelu_forward("BiasGelu", A, B, names=("A", "B"))


@register
def GeluGrad(dY, X):
    """com.microsoft GeluGrad: dX of exact GELU. Inputs: dY, X (forward input). Output: dX."""
    return gelu_backward("GeluGrad", dY, X)[0]


@register
def FastGeluGrad(dY, X):
    """com.microsoft FastGeluGrad: dX of tanh-GELU. Inputs: dY, X. Output: dX."""
    return gelu_backward("FastGeluGrad", dY, X, approximate=1)[0]


@register
def BiasGeluGrad_dX(dY, X, B):
    """com.microsoft BiasGeluGrad_dX: GeluGrad at X + B. Inputs: dY, X, B (1-D). Output: dX."""
    return gelu_backward("BiasGeluGrad_dX", dY, X, B)[0]


@register
def BiasFastGeluGrad_dX(dY, X, B):
    """com.microsoft BiasFastGeluGrad_dX: FastGeluGrad at X + B. Inputs: dY, X, B. Output: dX."""
    return gelu_backward("BiasFastGeluGrad_dX", dY, X, B, approximate=1)[0]


# ---- pointwise activations ------------------------------------------------------


def act_forward(op: str, x, alpha: float = 0.0) -> torch.Tensor:
    x = float_input(op, "X", x)
    y = empty_like(x)
    st = native_fn("act_forward", x.dtype)(
        _ACT[op], ptr(x), ptr(y), x.numel(), alpha, get_num_threads()
    )
    check_status(st, op)
    return y


def act_backward(op: str, fwd: str, dy, xy, xy_name: str, alpha: float = 0.0) -> torch.Tensor:
    dy = float_input(op, "dY", dy)
    xy = float_input(op, xy_name, xy)
    same_dtype(op, "dY", dy, xy_name, xy)
    same_shape(op, "dY", dy, xy_name, xy)
    dx = empty_like(dy)
    st = native_fn("act_backward", dy.dtype)(
        _ACT[fwd], ptr(dy), ptr(xy), ptr(dx), dy.numel(), alpha, get_num_threads()
    )
    check_status(st, op)
    return dx


@register
def Relu(X):
    """ONNX Relu: ``max(X, 0)`` (NaN propagates). Output: Y."""
    return act_forward("Relu", X)


@register
def Sigmoid(X):
    """ONNX Sigmoid: ``1/(1+exp(-X))``. Output: Y."""
    return act_forward("Sigmoid", X)


@register
def Tanh(X):
    """ONNX Tanh. Output: Y."""
    return act_forward("Tanh", X)


@register
def QuickGelu(X, alpha=1.702):
    """com.microsoft QuickGelu: ``X·σ(alpha·X)``. Attribute alpha (1.702). Output: Y."""
    return act_forward("QuickGelu", X, float_attr("QuickGelu", "alpha", alpha))


@register
def LeakyRelu(X, alpha=0.01):
    """ONNX LeakyRelu: ``X if X > 0 else alpha·X``. Attribute alpha (0.01). Output: Y."""
    return act_forward("LeakyRelu", X, float_attr("LeakyRelu", "alpha", alpha))


@register
def ReluGrad(dY, X):
    """com.microsoft ReluGrad: ``dY where X > 0 else 0``. Inputs: dY, X. Output: dX."""
    return act_backward("ReluGrad", "Relu", dY, X, "X")


@register
def SigmoidGrad(dY, Y):
    """com.microsoft SigmoidGrad: ``dY·Y·(1-Y)``; Y is the forward *output*. Output: dX."""
    return act_backward("SigmoidGrad", "Sigmoid", dY, Y, "Y")


@register
def TanhGrad(dY, Y):
    """com.microsoft TanhGrad: ``dY·(1-Y²)``; Y is the forward *output*. Output: dX."""
    return act_backward("TanhGrad", "Tanh", dY, Y, "Y")


@register
def QuickGeluGrad(dY, X, alpha=1.702):
    """com.microsoft QuickGeluGrad: ``dY·s·(1 + alpha·X·(1-s))``, s = σ(alpha·X).
    Inputs: dY, X (forward input). Attribute alpha (1.702). Output: dX."""
    a = float_attr("QuickGeluGrad", "alpha", alpha)
    return act_backward("QuickGeluGrad", "QuickGelu", dY, X, "X", a)


@register
def LeakyReluGrad(dY, Y, alpha=0.01):
    """com.microsoft LeakyReluGrad: ``dY if Y > 0 else alpha·dY``; Y is the forward
    *output*. Attribute alpha (0.01). Output: dX."""
    a = float_attr("LeakyReluGrad", "alpha", alpha)
    return act_backward("LeakyReluGrad", "LeakyRelu", dY, Y, "Y", a)


# ---- piecewise-linear activations (HardSigmoid, HardSwish, hardtanh / ReLU6) ----------

_HARD = {"HardSigmoid": 0, "HardSwish": 1, "hardtanh": 2}
#: HardSwish's fixed line (ONNX: alpha 1/6, beta 1/2, as torch's hardswish)
HARD_SWISH_AB = (1.0 / 6.0, 0.5)


def hard_forward(op: str, kind: str, x, a: float, b: float, out=None) -> torch.Tensor:
    """``kind`` (a ``_HARD`` key) of ``x`` with parameters (a, b): HardSigmoid
    ``clamp(a·x + b, 0, 1)``, HardSwish ``x·clamp(a·x + b, 0, 1)``, hardtanh
    ``clamp(x, a, b)``. ``out``: a contiguous tensor like ``x`` (not overlapping it) to
    write into instead of a new one. ``op`` names the caller in errors."""
    x = float_input(op, "X", x)
    y = empty_like(x) if out is None else out
    st = native_fn("hard_act_forward", x.dtype)(
        _HARD[kind], ptr(x), ptr(y), x.numel(), a, b, get_num_threads()
    )
    check_status(st, op)
    return y


def hard_backward(op: str, kind: str, dy, x, a: float, b: float) -> torch.Tensor:
    """dX of ``hard_forward(kind)`` from dY and the forward input X, with torch's slopes
    at the kinks (see ``ortcpu_hard_act_backward`` in ortcpu.h). ONNX Runtime has no
    gradient op for these: the autograd functions call this directly."""
    dy = float_input(op, "dY", dy)
    x = float_input(op, "X", x)
    same_dtype(op, "dY", dy, "X", x)
    same_shape(op, "dY", dy, "X", x)
    dx = empty_like(dy)
    st = native_fn("hard_act_backward", dy.dtype)(
        _HARD[kind], ptr(dy), ptr(x), ptr(dx), dy.numel(), a, b, get_num_threads()
    )
    check_status(st, op)
    return dx


@register
def HardSigmoid(X, alpha=0.2, beta=0.5):
    """ONNX HardSigmoid: ``max(0, min(1, alpha·X + beta))`` (NaN propagates).
    Attributes alpha (0.2), beta (0.5). Output: Y."""
    a = float_attr("HardSigmoid", "alpha", alpha)
    return hard_forward("HardSigmoid", "HardSigmoid", X, a,
                        float_attr("HardSigmoid", "beta", beta))


@register
def HardSwish(X):
    """ONNX HardSwish: ``X·max(0, min(1, X/6 + 1/2))``; 0 for X <= -3 (also at -inf),
    X for X >= 3. Output: Y."""
    return hard_forward("HardSwish", "HardSwish", X, *HARD_SWISH_AB)


# ---- softmax ----------------------------------------------------------------------


def _softmax_view(op: str, t: torch.Tensor, axis: int, coerce_2d: bool) -> tuple[int, int, int]:
    """(outer, dim, inner) for reducing over ``axis`` (opset-13 style), or over
    all of ``dims[axis:]`` when ``coerce_2d`` (opset < 13)."""
    a = normalize_axis(op, axis, t.dim())
    shape = list(t.shape) or [1]
    outer = math.prod(shape[:a])
    if coerce_2d:
        return outer, math.prod(shape[a:]), 1
    return outer, shape[a], math.prod(shape[a + 1 :])


def softmax_forward(op: str, x, axis: int, log: bool, coerce_2d: bool = False) -> torch.Tensor:
    x = float_input(op, "input", x)
    outer, dim, inner = _softmax_view(op, x, axis, coerce_2d)
    y = empty_like(x)
    st = native_fn("softmax_forward", x.dtype)(
        ptr(x), ptr(y), outer, dim, inner, int(log), get_num_threads()
    )
    check_status(st, op)
    return y


def softmax_backward(op: str, dy, y, axis: int, log: bool, coerce_2d: bool,
                     y_name: str = "Y") -> torch.Tensor:
    dy = float_input(op, "dY", dy)
    y = float_input(op, y_name, y)
    same_dtype(op, "dY", dy, y_name, y)
    same_shape(op, "dY", dy, y_name, y)
    outer, dim, inner = _softmax_view(op, y, axis, coerce_2d)
    dx = empty_like(y)
    st = native_fn("softmax_backward", y.dtype)(
        ptr(dy), ptr(y), ptr(dx), outer, dim, inner, int(log), get_num_threads()
    )
    check_status(st, op)
    return dx


def uint8_ptr(mask) -> object:
    """A uint8 tensor's data as ``uint8_t *`` for the native call (None: NULL)."""
    return ffi.NULL if mask is None else ffi.cast("uint8_t *", mask.data_ptr())


def masked_softmax_core(op: str, x: torch.Tensor, mask, mask_rows: int, scale: float,
                        fill: float, masked_when: int = 1) -> torch.Tensor:
    """Softmax over the last axis of ``x * scale`` with ``fill`` where the uint8 ``mask``
    (rows repeating every ``mask_rows`` rows of ``x``; None: nothing masked) equals
    ``masked_when``. Contiguous float inputs, checked by the caller (the fused attention
    node and the graph's MaskedScaledSoftmax)."""
    y = torch.empty_like(x)
    n = x.shape[-1]
    if y.numel():
        st = native_fn("masked_softmax_forward", x.dtype)(
            ptr(x), uint8_ptr(mask), ptr(y), x.numel() // n, n, mask_rows, scale, fill,
            masked_when, get_num_threads())
        check_status(st, op)
    return y


def masked_softmax_grad_core(op: str, dy: torch.Tensor, y: torch.Tensor, mask,
                             mask_rows: int, scale: float,
                             masked_when: int = 1) -> torch.Tensor:
    """dX of ``masked_softmax_core`` from dY and its output Y: scale * SoftmaxGrad, 0 where
    masked. Contiguous inputs of one shape and dtype, checked by the caller."""
    dx = torch.empty_like(y)
    n = y.shape[-1]
    if dx.numel():
        st = native_fn("masked_softmax_backward", y.dtype)(
            ptr(dy), ptr(y), uint8_ptr(mask), ptr(dx), y.numel() // n, n, mask_rows, scale,
            masked_when, get_num_threads())
        check_status(st, op)
    return dx


@register
def Softmax(input, axis=-1):
    """ONNX Softmax (opset 13): along one axis. Attribute axis (-1). Output: output."""
    return softmax_forward("Softmax", input, axis, log=False)


@register
def LogSoftmax(input, axis=-1):
    """ONNX LogSoftmax (opset 13): along one axis. Attribute axis (-1). Output: output."""
    return softmax_forward("LogSoftmax", input, axis, log=True)


@register
def SoftmaxGrad_13(dY, Y, axis=-1):
    """com.microsoft SoftmaxGrad_13: ``Y·(dY - Σ dY·Y)`` along ``axis`` (-1);
    Y is the softmax output. Output: dX."""
    return softmax_backward("SoftmaxGrad_13", dY, Y, axis, log=False, coerce_2d=False)


@register
def LogSoftmaxGrad_13(dY, X, axis=-1):
    """com.microsoft LogSoftmaxGrad_13: ``dY - exp(X)·Σ dY`` along ``axis`` (-1);
    the second input (named X by the schema) is the log-softmax output. Output: dX."""
    return softmax_backward("LogSoftmaxGrad_13", dY, X, axis, log=True, coerce_2d=False,
                            y_name="X")


@register
def SoftmaxGrad(dY, Y, axis=1):
    """com.microsoft SoftmaxGrad (forward opset < 13): as SoftmaxGrad_13 but the input is
    coerced to 2-D ``[∏dims[:axis], ∏dims[axis:]]``. Attribute axis (1). Output: dX."""
    return softmax_backward("SoftmaxGrad", dY, Y, axis, log=False, coerce_2d=True)


@register
def LogSoftmaxGrad(dY, X, axis=1):
    """com.microsoft LogSoftmaxGrad (forward opset < 13): 2-D coercion as SoftmaxGrad;
    X is the log-softmax output. Attribute axis (1). Output: dX."""
    return softmax_backward("LogSoftmaxGrad", dY, X, axis, log=True, coerce_2d=True, y_name="X")
