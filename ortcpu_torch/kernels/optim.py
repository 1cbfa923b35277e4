"""Optimizer kernels (spec §12): AdamWOptimizer, AdamOptimizer (legacy), SGDOptimizerV2,
SGDOptimizer (legacy).

All of them update their inputs **in place**, as ONNX Runtime does: the weights, the
moments and (legacy ops) the gradients passed in are written, and the returned sequences
are those same tensors. float32 and float64 (ORT 1.19.2: float32 only).

``adam_multi`` and ``sgd_multi`` are the multi-tensor entry points the
``ortcpu_torch.optim`` optimizers call: one native call per parameter group.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .._native import ffi, lib, native_fn
from ._checks import check_status, get_num_threads, needs_flags, select_outputs
from ._multi import (
    bool_flag,
    distinct,
    ptr_array,
    same_shapes,
    scalar_value,
    size_array,
    tensor_seq,
)
from ._registry import register

ADAM_TORCH, ADAM_HF, ADAM_L2, ADAM_LEGACY = 0, 1, 2, 3


# ---- multi-tensor entry points (no validation beyond what indexing needs) ---------


def adam_multi(weights, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs=None, deltas=None, *,
               lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
               bc1: float, bc2: float, mode: int = ADAM_TORCH, maximize: bool = False,
               grad_scale: float = 1.0, step_size: float | None = None,
               decay: float | None = None, op: str = "adam_multi") -> None:
    """One Adam-family update of a group of contiguous tensors of one dtype, in place.
    ``bc1``/``bc2`` are the bias corrections 1 - beta^t (1.0 when off); ``mode`` is
    ADAM_TORCH (AdamW), ADAM_HF, ADAM_L2 (Adam) or ADAM_LEGACY (see ortcpu.h).
    ``step_size`` (default lr/bc1) and ``decay`` (default 1 - lr*wd) override the derived
    values in the TORCH and L2 modes."""
    n = len(weights)
    if n == 0:
        return
    dt = weights[0].dtype
    st = native_fn("adam_multi", dt)(
        ptr_array(weights, dt), ptr_array(grads, dt), ptr_array(exp_avgs, dt),
        ptr_array(exp_avg_sqs, dt),
        ptr_array(max_exp_avg_sqs, dt) if max_exp_avg_sqs is not None else _null(),
        ptr_array(deltas, dt) if deltas is not None else _null(),
        size_array(weights), n, float(lr), float(beta1), float(beta2), float(eps),
        float(weight_decay), float(bc1), float(bc2),
        float(lr / bc1 if step_size is None and bc1 != 0 else
              (step_size if step_size is not None else math.inf)),
        float(1.0 - lr * weight_decay if decay is None else decay), int(mode), int(bool(maximize)),
        float(grad_scale), get_num_threads())
    check_status(st, op)


def sgd_multi(weights, grads, bufs=None, deltas=None, init=None, *, lr: float,
              momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
              nesterov: bool = False, maximize: bool = False, grad_scale: float = 1.0,
              op: str = "sgd_multi") -> None:
    """One SGD update of a group of contiguous tensors of one dtype, in place.
    ``bufs``: momentum buffers (needed when momentum != 0); ``init[i]`` true means
    buffer i is initialised from the gradient (torch's first step)."""
    n = len(weights)
    if n == 0:
        return
    dt = weights[0].dtype
    st = native_fn("sgd_multi", dt)(
        ptr_array(weights, dt), ptr_array(grads, dt),
        ptr_array(bufs, dt) if bufs is not None else _null(),
        ptr_array(deltas, dt) if deltas is not None else _null(),
        ffi.new("uint8_t[]", [1 if b else 0 for b in init]) if init is not None else _null(),
        size_array(weights), n, float(lr), float(momentum), float(dampening),
        float(weight_decay), int(bool(nesterov)), int(bool(maximize)), float(grad_scale),
        get_num_threads())
    check_status(st, op)


def count_steps(steps: list) -> list[float]:
    """Add 1 to each float32 0-d step tensor (torch's optimizer state ``step``) and return
    the new values: one native call instead of one torch op per parameter. Tensors that
    are not float32 CPU scalars (say, a checkpoint's float64 steps) go through torch."""
    fast = [s.dtype == torch.float32 and s.numel() == 1 and s.device.type == "cpu"
            for s in steps]
    if not all(fast):
        for s in steps:
            s.add_(1)
        return [float(s.item()) for s in steps]
    n = len(steps)
    out = ffi.new("double[]", n)
    st = lib.ortcpu_count_steps(ffi.new("float *[]", [ffi.cast("float *", s.data_ptr())
                                                      for s in steps]), n, out)
    check_status(st, "count_steps")
    return list(out)


def _null():
    return ffi.NULL


def _f32(x: float) -> float:
    return float(np.float32(x))


def _attr_float(op: str, name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{op}: {name} must be a float, got {type(v).__name__}")
    return float(v)


def _attr_int(op: str, name: str, v, allowed) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{op}: {name} must be an int, got {type(v).__name__}")
    if v not in allowed:
        raise ValueError(f"{op}: {name} must be one of {sorted(allowed)}, got {v}")
    return v


# ---- registry ops ---------------------------------------------------------------------


@register
def AdamWOptimizer(lr, step, weights, gradients, momentums_1, momentums_2, update_signal=None,
                   *, alpha: float = 0.9, beta: float = 0.999, epsilon: float = 1e-8,
                   weight_decay: float = 0.01, correct_bias: int = 1, adam_mode: int = 0,
                   needs=None):
    """AdamW over sequences of tensors, **in place** (weights and both moments are written).

    adam_mode 0 is torch.optim.AdamW (decay the old weight by lr·wd, ε outside the
    bias-corrected sqrt); adam_mode 1 is HuggingFace's (lr·sqrt(1-β^t)/(1-α^t), ε on the
    raw sqrt, decay the new weight). ``step`` is the 1-based step, used as given.
    Returns (updated_flag (bool, shape of step), weights, momentums_1, momentums_2); with
    update_signal false nothing changes and the flag is false.
    """
    op = "AdamWOptimizer"
    lr_v = scalar_value(op, "lr", lr)
    if not isinstance(step, torch.Tensor) or step.dtype != torch.int64 or step.numel() != 1:
        raise TypeError(f"{op}: step must be a one-element int64 tensor, got "
                        f"{getattr(step, 'dtype', type(step).__name__)}")
    t = int(step.reshape(()).item())
    w = tensor_seq(op, "weights", weights, writable=True)
    g = tensor_seq(op, "gradients", gradients)
    m1 = tensor_seq(op, "momentums_1", momentums_1, writable=True)
    m2 = tensor_seq(op, "momentums_2", momentums_2, writable=True)
    same_shapes(op, "weights", w, "gradients", g)
    same_shapes(op, "weights", w, "momentums_1", m1)
    same_shapes(op, "weights", w, "momentums_2", m2)
    distinct(op, {"weights": w, "momentums_1": m1, "momentums_2": m2})
    go = bool_flag(op, "update_signal", update_signal)
    a = _attr_float(op, "alpha", alpha)
    b = _attr_float(op, "beta", beta)
    eps = _attr_float(op, "epsilon", epsilon)
    wd = _attr_float(op, "weight_decay", weight_decay)
    cb = _attr_int(op, "correct_bias", correct_bias, {0, 1})
    mode = _attr_int(op, "adam_mode", adam_mode, {0, 1})
    if mode == 0 and cb == 0:
        raise ValueError(f"{op}: adam_mode 0 (torch AdamW) requires correct_bias=1")
    flag = torch.tensor(go, dtype=torch.bool).reshape(step.shape)
    if go:
        if cb:
            # ORT: pow in double of the float32 betas, corrections stored as float32
            bc1 = _f32(1.0 - math.pow(_f32(a), t)) if t != 0 else 0.0
            bc2 = _f32(1.0 - math.pow(_f32(b), t)) if t != 0 else 0.0
        else:
            bc1 = bc2 = 1.0
        # step 0 with bias correction divides by zero (bc1 = 0): NaN weights, as in ORT
        adam_multi(w, g, m1, m2, lr=lr_v, beta1=a, beta2=b, eps=eps, weight_decay=wd,
                   bc1=bc1, bc2=bc2, mode=ADAM_TORCH if mode == 0 else ADAM_HF, op=op)
    return select_outputs(op, (flag, list(weights), list(momentums_1), list(momentums_2)),
                          needs)


@register
def SGDOptimizerV2(lr, weights, gradients, update_signal=None, *, needs=None):
    """SGD over sequences, **in place**: ``w ← w - lr·g`` for every tensor when
    update_signal is absent or true. Returns (update_completed (bool, shape of lr),
    updated_weights (the same tensors))."""
    op = "SGDOptimizerV2"
    lr_v = scalar_value(op, "lr", lr)
    w = tensor_seq(op, "weights", weights, writable=True)
    g = tensor_seq(op, "gradients", gradients)
    same_shapes(op, "weights", w, "gradients", g)
    go = bool_flag(op, "update_signal", update_signal)
    if go:
        sgd_multi(w, g, lr=lr_v, op=op)
    flag = torch.tensor(go, dtype=torch.bool).reshape(lr.shape)
    return select_outputs(op, (flag, list(weights)), needs)


@register
def SGDOptimizer(ETA, W, G, *, needs=None):
    """Legacy single-tensor SGD, **in place**: NW = W - η·G written into W and
    NG = -η·G (the applied update, not the gradient) written into G when requested.
    Returns (NW, NG)."""
    op = "SGDOptimizer"
    eta = scalar_value(op, "ETA", ETA)
    (w,) = tensor_seq(op, "W", [W], writable=True)
    (g,) = tensor_seq(op, "G", [G], writable=True)
    same_shapes(op, "W", [w], "G", [g])
    distinct(op, {"W": [w], "G": [g]})
    want = needs_flags(op, needs, 2)
    sgd_multi([w], [g], deltas=[g] if want[1] else None, lr=eta, op=op)
    return select_outputs(op, (W, G), needs)


@register
def AdamOptimizer(R, T, weights, gradients, moment_1, moment_2, mixed_precision_weights=None,
                  loss_scale=None, global_gradient_norm=None, update_signal=None, *,
                  alpha: float = 0.9, beta: float = 0.999, lambda_: float = 0.0,
                  epsilon: float = 1e-8, max_norm_clip: float = 1.0,
                  do_bias_correction: int = 1, weight_decay_mode: int = 0, needs=None):
    """Legacy single-tensor Adam with ORT's CPU semantics, **in place** (weights, moments,
    and the gradients, which receive the applied update): update = (m1/a_c)/(sqrt(m2/b_c)+ε)
    + λ·W, W -= R·update, new_T = T + 1; no bias correction when T = 0. Like ORT's CPU
    kernel it ignores mixed_precision_weights, loss_scale, global_gradient_norm,
    update_signal, max_norm_clip and weight_decay_mode. Returns (new_T, new_moment_1,
    new_moment_2, new_weights, new_gradients, new_mixed_precision_weights=None)."""
    op = "AdamOptimizer"
    r = scalar_value(op, "R", R)
    if not isinstance(T, torch.Tensor) or T.dtype != torch.int64 or T.numel() != 1:
        raise TypeError(f"{op}: T must be a one-element int64 tensor")
    t = int(T.reshape(()).item())
    (w,) = tensor_seq(op, "weights", [weights], writable=True)
    (g,) = tensor_seq(op, "gradients", [gradients], writable=True)
    (m1,) = tensor_seq(op, "moment_1", [moment_1], writable=True)
    (m2,) = tensor_seq(op, "moment_2", [moment_2], writable=True)
    for name, x in (("gradients", g), ("moment_1", m1), ("moment_2", m2)):
        same_shapes(op, "weights", [w], name, [x])
    distinct(op, {"weights": [w], "gradients": [g], "moment_1": [m1], "moment_2": [m2]})
    a = _attr_float(op, "alpha", alpha)
    b = _attr_float(op, "beta", beta)
    lam = _attr_float(op, "lambda", lambda_)
    eps = _attr_float(op, "epsilon", epsilon)
    if do_bias_correction and t > 0:
        bc1 = _f32(1.0 - math.pow(_f32(a), t))
        bc2 = _f32(1.0 - math.pow(_f32(b), t))
    else:
        bc1 = bc2 = 1.0
    want = needs_flags(op, needs, 6)
    adam_multi([w], [g], [m1], [m2], deltas=[g] if want[4] else None, lr=r, beta1=a,
               beta2=b, eps=eps, weight_decay=lam, bc1=bc1, bc2=bc2, mode=ADAM_LEGACY, op=op)
    new_t = (T + 1).to(torch.int64)
    return select_outputs(op, (new_t, moment_1, moment_2, weights, gradients, None), needs)
