"""Shared machinery for the native optimizers: a ``torch.optim.Optimizer`` subclass that
gathers each parameter group into flat lists of tensors for one multi-tensor native call,
handles fp16/bf16 parameters through fp32 master weights, and fuses gradient clipping
into the update (the norm pass reads the gradients once; the update pass applies the
clip coefficient as it reads them, so the gradients themselves are left unclipped).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable

import numpy as np
import torch
from torch.optim import Optimizer

from ..kernels.grad_control import norm_multi
from ..kernels.optim import count_steps

NATIVE = (torch.float32, torch.float64)
HALF = (torch.float16, torch.bfloat16)


def _lr_value(lr) -> float:
    return float(lr.item()) if isinstance(lr, torch.Tensor) else float(lr)


def check_lr(lr) -> None:
    if isinstance(lr, torch.Tensor):
        if lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        lr_v = lr.item()
    else:
        lr_v = lr
    if not 0.0 <= lr_v:
        raise ValueError(f"Invalid learning rate: {lr}")


def torch_flags(name: str, foreach, capturable, differentiable, fused) -> None:
    """torch.optim's implementation switches, accepted so that a swap needs no edits:
    ``foreach``/``fused`` choose how torch loops (ours is always one fused native call per
    group); ``capturable`` (CUDA graphs) and ``differentiable`` (autograd through the
    step) are not supported and say so."""
    if capturable:
        raise ValueError(f"{name}: capturable=True (CUDA graph capture) is not supported "
                         "on CPU")
    if differentiable:
        raise ValueError(f"{name}: differentiable=True is not supported (the update runs "
                         "in native code, outside autograd)")
    for flag, v in (("foreach", foreach), ("fused", fused)):
        if v is not None and not isinstance(v, bool):
            raise TypeError(f"{name}: {flag} must be a bool or None, got {type(v).__name__}")


def clip_coef(total_norm: float, max_norm: float, dtype: torch.dtype = torch.float32) -> float:
    """torch's clip coefficient, in the norm's dtype: min(max_norm / (total + 1e-6), 1);
    NaN stays NaN."""
    f = np.float64 if dtype == torch.float64 else np.float32
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        coef = f(max_norm) / (f(total_norm) + f(1e-6))
    return float(coef) if (coef != coef or coef < 1.0) else 1.0


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: the elements fill storage [offset, offset + numel) in
    some dimension order (contiguous, channels_last, transposed ...)."""
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.shape, strict=True) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


def _same_layout(p: torch.Tensor, ts) -> bool:
    return all(t.stride() == p.stride() and t.dtype in NATIVE for t in ts)


class NativeOptimizer(Optimizer, metaclass=abc.ABCMeta):
    """Base class: subclasses define ``_init_state(p, state, group)``,
    ``_state_keys(group)`` (the per-parameter state tensors the kernel updates, in order)
    and ``_update(group, params, grads, states, grad_scale)``."""

    def __init__(self, params, defaults: dict):
        super().__init__(params, defaults)

    def __setstate__(self, state):
        # load_state_dict replaces every group by the saved one: a checkpoint written by
        # torch's optimizer lacks our own keys, so they come back from the defaults here
        super().__setstate__(state)
        for group in self.param_groups:
            for k, v in self.defaults.items():
                group.setdefault(k, v)

    # -- to be provided by subclasses ---------------------------------------------------
    _name = "Optimizer"
    _has_step = False  # per-parameter state["step"] counters (the Adam family)

    @abc.abstractmethod
    def _init_state(self, p, state, group):
        """Create ``state`` for parameter ``p`` (moment buffers, step counter)."""

    @abc.abstractmethod
    def _state_keys(self, group) -> list[str]:
        """Names of the per-parameter state tensors the update reads and writes."""

    @abc.abstractmethod
    def _update(self, group, params, grads, states, grad_scale, steps):
        """One native multi-tensor step over a parameter group."""

    # -- machinery ----------------------------------------------------------------------

    def _check_param(self, p, g, group) -> None:
        """Why a parameter cannot be updated (raises), called off the fast path."""
        if g.is_sparse or g.layout != torch.strided:
            raise RuntimeError(f"{self._name} does not support sparse gradients")
        if p.is_complex() or not p.is_floating_point():
            raise TypeError(f"{self._name}: parameters must be float32, float64, float16 "
                            f"or bfloat16, got {p.dtype}")
        if p.device.type != "cpu" or g.device.type != "cpu":
            raise TypeError(f"{self._name}: parameters must be CPU tensors, got {p.device}")
        if p.dtype in HALF and not group.get("master_weights", False):
            raise TypeError(
                f"{self._name}: {p.dtype} parameters need master_weights=True (the update "
                "runs in float32 on a float32 master copy kept in the optimizer state); "
                "without it they are refused rather than silently not updated")
        if p.dtype not in NATIVE and p.dtype not in HALF:
            raise TypeError(f"{self._name}: unsupported parameter dtype {p.dtype}")

    def _gather(self, group):
        """(buckets, writebacks) for the group's parameters that have a gradient. A bucket,
        keyed by (dtype, step), holds (params, grads, [state lists], states): tensors of
        one float dtype laid out alike, for one native call. Parameters the kernel cannot
        update in place (fp16/bf16 master weights, mismatched layouts) get float32 /
        contiguous stand-ins, copied back afterwards (``writebacks``)."""
        keys = self._state_keys(group)
        state_of = self.state
        entries = []
        for p in group["params"]:
            g = p.grad
            if g is None:
                continue
            dt = p.dtype
            if not (dt in NATIVE and g.dtype == dt and g.layout == torch.strided
                    and p.is_cpu):
                self._check_param(p, g, group)
            state = state_of[p]
            if not state and (keys or dt not in NATIVE or self._has_step):
                self._init_state(p, state, group)
            entries.append((p, g, state))
        # the step counters: one foreach op and one read-back for the whole group
        if self._has_step:
            values = iter(count_steps([st["step"] for _, _, st in entries]))
        buckets: dict = {}
        writebacks = []
        for p, g, state in entries:
            step = next(values) if self._has_step else 0.0
            sts = [state[k] for k in keys] if keys else []
            if p.dtype in HALF:
                target = state["master_param"]
                gg = g.to(torch.float32)
                if not gg.is_contiguous():
                    gg = gg.contiguous()
                writebacks.append((p, target))
            elif p.is_contiguous() and g.is_contiguous() and (
                    not sts or all([t.is_contiguous() for t in sts])):
                target, gg = p, g
            elif _dense(p) and _same_layout(p, [g, *sts]):
                target, gg = p, g  # same dense layout everywhere: elementwise is layout-free
            else:
                target = p.detach().contiguous()
                gg = g.contiguous()
                cs = [t.contiguous() for t in sts]
                writebacks.extend((s, c) for s, c in zip(sts, cs, strict=True) if c is not s)
                if target is not p:
                    writebacks.append((p, target))
                sts = cs
            if gg.dtype != target.dtype:
                gg = gg.to(target.dtype)
            b = buckets.get((target.dtype, step))
            if b is None:
                b = buckets[(target.dtype, step)] = ([], [], [[] for _ in keys], [])
            b[0].append(target)
            b[1].append(gg)
            for lst, t in zip(b[2], sts, strict=True):
                lst.append(t)
            b[3].append(state)
        return buckets, writebacks

    def _global_grad_norm(self) -> tuple[float, torch.dtype]:
        """L2 norm of every gradient of every group, reading each gradient once, and the
        dtype torch's clip_grad_norm_ would give it."""
        by_dtype: dict = {}
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if not (p.dtype in NATIVE and g.dtype == p.dtype and g.layout == torch.strided
                        and p.is_cpu):
                    self._check_param(p, g, group)  # raises for what the update refuses
                if g.dtype not in NATIVE:
                    g = g.to(torch.float32)
                if not g.is_contiguous():
                    g = g.contiguous()
                by_dtype.setdefault(g.dtype, []).append(g)
        dtype = torch.float64 if set(by_dtype) == {torch.float64} else torch.float32
        total = math.sqrt(sum(norm_multi(gs, 2.0, "max_grad_norm") for gs in by_dtype.values()))
        return total, dtype

    @torch.no_grad()
    def step(self, closure: Callable | None = None):
        """One optimization step over every parameter group (one native call per group
        and dtype). ``closure`` re-evaluates the model and returns the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = 1.0
        max_norm = self.defaults.get("max_grad_norm")
        if max_norm is not None:
            total, dtype = self._global_grad_norm()
            self.last_grad_norm = torch.tensor(total, dtype=dtype)
            grad_scale = clip_coef(float(self.last_grad_norm), max_norm, dtype)
        for group in self.param_groups:
            buckets, writebacks = self._gather(group)
            for (_dtype, step), (params, grads, states, _st) in buckets.items():
                self._update(group, params, grads, states, grad_scale, step)
            for dst, src in writebacks:
                dst.copy_(src)
        return loss
