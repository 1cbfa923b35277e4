"""Autograd functions for the activation kernels.

Each ``torch.autograd.Function`` runs the forward kernel and, in backward, the
matching ORT gradient kernel. Double backward is not supported and says so.
"""

from __future__ import annotations

import functools

import torch

from .. import _native
from ..kernels import activations as K
from ..kernels._checks import SignatureCache, bool_arg, checked_signature, float_check
from ._layout import from_order, in_order, storage_order


def once_differentiable(backward):
    """Like ``torch.autograd.function.once_differentiable``, but under
    ``create_graph=True`` the gradients *always* carry a node that raises when
    differentiated. torch's decorator only adds it when the incoming gradient requires
    grad, so e.g. a gradient penalty ``autograd.grad(y.sum(), x, create_graph=True)``
    would otherwise treat the gradient as a constant and silently drop its contribution."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if not torch.is_grad_enabled():  # the usual backward (no create_graph): as is
            return backward(ctx, *grads)
        with torch.no_grad():
            outputs = backward(ctx, *grads)
        err = torch._C._functions.DelayedError(
            b"ortcpu_torch.ops: double backward is not supported (the backward is an ONNX "
            b"Runtime gradient kernel, differentiable once)",
            len(outputs),
        )

        def fake_requires_grad(t):
            if t is not None:
                t = t.detach()
                t.requires_grad = True
            return t

        return err(*[fake_requires_grad(t) for t in outputs])

    return wrapper


_APPROX = {"none": 0, "tanh": 1}


def _approximate(op: str, approximate: str) -> int:
    try:
        return _APPROX[approximate]
    except (KeyError, TypeError):
        raise ValueError(
            f"{op}: approximate must be 'none' or 'tanh', got {approximate!r}"
        ) from None


class _Gelu(torch.autograd.Function):
    """gelu(x + bias) on arguments ``_gelu`` checked."""

    @staticmethod
    def forward(ctx, x, bias, approximate: int, op: str):
        # without a bias (along the last axis) the kernel is elementwise: it runs on x's
        # memory in x's own order
        order = storage_order(x) if bias is None else None
        x = in_order(x, order)
        if bias is not None:
            bias = bias.contiguous()
        y = K.gelu_forward_core(op, x, bias, approximate)
        ctx.save_for_backward(x, bias)
        ctx.approximate, ctx.op, ctx.order = approximate, op, order
        return from_order(y, order)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, bias = ctx.saved_tensors
        # (autograd hands dy in the output's shape and dtype: nothing to check)
        dy = in_order(dy, ctx.order)
        need_dbias = bias is not None and ctx.needs_input_grad[1]
        dx, dbias = K.gelu_backward_core(ctx.op, dy, x, bias, ctx.approximate, need_dbias)
        return from_order(dx, ctx.order), dbias, None, None


_GELU_CHECKED = SignatureCache()


def _gelu(op: str, input, bias, approximate) -> torch.Tensor:
    key = checked_signature(op, input, bias, approximate)
    if key not in _GELU_CHECKED:
        _approximate(op, approximate)
        x = float_check(op, "input", input)
        if bias is not None:
            K._bias_input(op, x, bias, "bias", "input")
        _GELU_CHECKED.add(key)
    return _Gelu.apply(input, bias, _APPROX[approximate], op)


def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU like ``torch.nn.functional.gelu``; backward is ORT's GeluGrad / FastGeluGrad."""
    return _gelu("gelu", input, None, approximate)


def bias_gelu(input: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``gelu(input + bias)`` fused (ORT BiasGelu / FastGelu with bias); ``bias`` is 1-D along
    the last axis. Backward computes d(input) and d(bias) in one pass."""
    return _gelu("bias_gelu", input, bias, approximate)


class _Pointwise(torch.autograd.Function):
    """QuickGelu / LeakyRelu / Relu: backward consumes the forward input X."""

    @staticmethod
    def forward(ctx, x, op: str, alpha: float):
        ctx.order = order = storage_order(float_check(op, "input", x))
        x = in_order(x, order)
        y = K.act_forward(op, x, alpha)
        ctx.save_for_backward(x)
        ctx.op, ctx.alpha = op, alpha
        return from_order(y, order)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        # LeakyReluGrad tests its second input > 0; given X (not Y) that is torch's rule
        # for every alpha, including alpha <= 0 where ORT's Y-based test would differ.
        dx = K.act_backward(ctx.op + "Grad", ctx.op, in_order(dy, ctx.order), x, "X", ctx.alpha)
        return from_order(dx, ctx.order), None, None


def quick_gelu(input: torch.Tensor, alpha: float = 1.702) -> torch.Tensor:
    """``input * sigmoid(alpha * input)`` (ORT QuickGelu)."""
    return _Pointwise.apply(input, "QuickGelu", K.float_attr("quick_gelu", "alpha", alpha))


def silu(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """``input * sigmoid(input)`` like ``torch.nn.functional.silu`` (ORT QuickGelu with
    alpha 1; backward QuickGeluGrad). ``inplace=True`` is not implemented (the backward
    needs the input): ValueError, so ``wrap`` runs torch's."""
    if bool_arg("silu", "inplace", inplace):
        raise ValueError("silu: inplace=True is not implemented by ortcpu_torch (its backward "
                         "needs the overwritten input)")
    return _Pointwise.apply(input, "QuickGelu", 1.0)


class _ReluInplace(torch.autograd.Function):
    """In-place ReLU: the result overwrites the input (marked dirty); the backward's mask
    Y > 0 is X > 0, so ReluGrad reads the output."""

    @staticmethod
    def forward(ctx, x):
        ctx.order = _act_inplace(x, "relu", "Relu", 0.0)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        o = ctx.order
        return from_order(K.act_backward("ReluGrad", "Relu", in_order(dy, o), in_order(y, o),
                                         "Y"), o)


def _act_inplace(x, name: str, op: str, alpha: float):
    """``op`` computed from ``x`` and written into it, in x's own memory order (returned)."""
    order = storage_order(float_check(name, "input", x))
    xv = in_order(x, order)  # x itself or a view of it, or a contiguous copy
    (xv if order is not None else x).copy_(K.act_forward(op, xv, alpha))
    return order


def relu(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """Like ``torch.nn.functional.relu`` (ONNX Relu, backward ReluGrad; NaN propagates);
    ``inplace`` writes the result into ``input`` and returns it."""
    if not bool_arg("relu", "inplace", inplace):
        return _Pointwise.apply(input, "Relu", 0.0)
    _check_inplace_leaf(input)
    return _ReluInplace.apply(input)


def _check_inplace_leaf(input) -> None:
    if isinstance(input, torch.Tensor) and input.requires_grad and input.is_leaf \
            and torch.is_grad_enabled():
        # checked before anything is written, as torch does
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place "
                           "operation.")


class _LeakyReluInplace(torch.autograd.Function):
    """In-place LeakyRelu: the result is written into the input, which is marked dirty.
    Backward sees only the output Y (ORT's LeakyReluGrad convention), which has the sign
    of X only for a non-negative slope: torch has the same restriction."""

    @staticmethod
    def forward(ctx, x, alpha: float):
        ctx.order = _act_inplace(x, "LeakyRelu", "LeakyRelu", alpha)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        ctx.alpha = alpha
        return x

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        if ctx.alpha < 0:
            raise RuntimeError(
                "leaky_relu: in-place backward needs negative_slope >= 0 (the input was "
                f"overwritten), got {ctx.alpha}; use inplace=False"
            )
        (y,) = ctx.saved_tensors
        o = ctx.order
        return from_order(K.act_backward("LeakyReluGrad", "LeakyRelu", in_order(dy, o),
                                         in_order(y, o), "Y", ctx.alpha), o), None


def leaky_relu(input: torch.Tensor, negative_slope: float = 0.01, inplace: bool = False):
    """Like ``torch.nn.functional.leaky_relu``; ``inplace`` writes the result into ``input``
    and returns it."""
    slope = K.float_attr("leaky_relu", "negative_slope", negative_slope)
    if not bool_arg("leaky_relu", "inplace", inplace):
        return _Pointwise.apply(input, "LeakyRelu", slope)
    _check_inplace_leaf(input)
    return _LeakyReluInplace.apply(input, slope)


class _Hard(torch.autograd.Function):
    """HardSigmoid / HardSwish / hardtanh (``kind``, parameters a, b): backward consumes
    the forward input X (internal native gradient: ONNX Runtime has no grad op)."""

    @staticmethod
    def forward(ctx, x, kind: str, a: float, b: float, op: str):
        ctx.order = order = storage_order(float_check(op, "input", x))
        x = in_order(x, order)
        y = K.hard_forward(op, kind, x, a, b)
        ctx.save_for_backward(x)
        ctx.kind, ctx.a, ctx.b, ctx.op = kind, a, b, op
        return from_order(y, order)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dx = K.hard_backward(ctx.op, ctx.kind, in_order(dy, ctx.order), x, ctx.a, ctx.b)
        return from_order(dx, ctx.order), None, None, None, None


class _HardInplace(_Hard):
    """In-place HardSigmoid / HardSwish / hardtanh: the result overwrites the input (marked
    dirty). hardtanh's mask ``min < X < max`` is ``min < Y < max``, so its backward (the
    inherited one) reads the output; HardSigmoid / HardSwish keep a copy of X, as torch
    does."""

    @staticmethod
    def forward(ctx, x, kind: str, a: float, b: float, op: str):
        xc = K.float_input(op, "input", x)
        if kind == "hardtanh":
            x.copy_(K.hard_forward(op, kind, xc, a, b))
            saved = x
        else:
            saved = _native.empty_like(xc).copy_(xc)
            if x.is_contiguous():
                K.hard_forward(op, kind, saved, a, b, out=x)
            else:
                x.copy_(K.hard_forward(op, kind, saved, a, b))
        ctx.mark_dirty(x)
        ctx.save_for_backward(saved)
        ctx.kind, ctx.a, ctx.b, ctx.op, ctx.order = kind, a, b, op, None
        return x


def _hard(op: str, kind: str, input, a: float, b: float, inplace) -> torch.Tensor:
    if not bool_arg(op, "inplace", inplace):
        return _Hard.apply(input, kind, a, b, op)
    _check_inplace_leaf(input)
    return _HardInplace.apply(input, kind, a, b, op)


def hardsigmoid(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """Like ``torch.nn.functional.hardsigmoid``: ``clamp(x/6 + 1/2, 0, 1)`` (ONNX
    HardSigmoid with alpha 1/6, beta 1/2); gradient 1/6 strictly inside (-3, 3), as
    torch's. ``inplace`` writes the result into ``input`` and returns it."""
    return _hard("hardsigmoid", "HardSigmoid", input, *K.HARD_SWISH_AB, inplace)


def hardswish(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """Like ``torch.nn.functional.hardswish``: ``x·clamp(x/6 + 1/2, 0, 1)`` (ONNX
    HardSwish); gradient 0 up to -3, ``x/3 + 1/2`` inside (-3, 3), 1 from 3 on, as
    torch's.
    ``inplace`` writes the result into ``input`` and returns it."""
    return _hard("hardswish", "HardSwish", input, *K.HARD_SWISH_AB, inplace)


def hardtanh(input: torch.Tensor, min_val: float = -1.0, max_val: float = 1.0,
             inplace: bool = False) -> torch.Tensor:
    """Like ``torch.nn.functional.hardtanh``: ``clamp(x, min_val, max_val)`` (NaN
    propagates); gradient passes strictly between the bounds. ``inplace`` writes the
    result into ``input`` and returns it."""
    lo = K.float_attr("hardtanh", "min_val", min_val)
    hi = K.float_attr("hardtanh", "max_val", max_val)
    if lo > hi:
        raise ValueError("hardtanh: min_val cannot be greater than max_val, got "
                         f"{lo} > {hi}")
    return _hard("hardtanh", "hardtanh", input, lo, hi, inplace)


def relu6(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """Like ``torch.nn.functional.relu6``: ``hardtanh(x, 0, 6)``."""
    return _hard("relu6", "hardtanh", input, 0.0, 6.0, inplace)


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim: int, log: bool, op: str):
        y = K.softmax_forward(op, x, dim, log)
        ctx.save_for_backward(y)
        ctx.dim, ctx.log, ctx.op = dim, log, op
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return K.softmax_backward(ctx.op, dy, y, ctx.dim, ctx.log, False), None, None, None


def _softmax_input(op: str, input: torch.Tensor, dtype):
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{op}: input must be a torch.Tensor, got {type(input).__name__}")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"{op}: dtype must be a torch.dtype or None, got "
                        f"{type(dtype).__name__}")
    return input.to(dtype) if dtype is not None else input


def softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Softmax along ``dim`` (ORT Softmax-13 / SoftmaxGrad_13)."""
    return _Softmax.apply(_softmax_input("softmax", input, dtype), dim, False, "softmax")


def log_softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Log-softmax along ``dim`` (ORT LogSoftmax-13 / LogSoftmaxGrad_13)."""
    return _Softmax.apply(_softmax_input("log_softmax", input, dtype), dim, True,
                          "log_softmax")
