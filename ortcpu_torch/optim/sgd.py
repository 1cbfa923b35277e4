"""SGD (with momentum, dampening, Nesterov, weight decay) on native multi-tensor kernels."""

from __future__ import annotations

import torch

from ..kernels.optim import sgd_multi
from ._base import NativeOptimizer, _lr_value, check_lr, torch_flags


class SGD(NativeOptimizer):
    r"""Drop-in for ``torch.optim.SGD``: same arguments, results and state dict
    (``momentum_buffer``).

    .. math::
        g &\leftarrow \pm g + \lambda w \\
        b &\leftarrow g \text{ (first step)},\quad
            b \leftarrow \mu b + (1-\tau) g \text{ (later)} \\
        g &\leftarrow g + \mu b \text{ if nesterov else } b \\
        w &\leftarrow w - \eta g

    (the momentum lines only when :math:`\mu \neq 0`). ``max_grad_norm`` fuses global-norm
    clipping into the update and ``master_weights`` updates float16/bfloat16 parameters
    through float32 master copies, as in :class:`AdamW`. Unlike torch 2.13's fused CPU
    SGD, float16/bfloat16 parameters are never silently left un-updated.
    """

    _name = "SGD"

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0,
                 nesterov=False, *, maximize=False, max_grad_norm=None, master_weights=False,
                 foreach=None, differentiable=False, fused=None):
        torch_flags(self._name, foreach, False, differentiable, fused)
        check_lr(lr)
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"Invalid max_grad_norm: {max_grad_norm} (must be > 0 or None)")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize,
                        foreach=None, differentiable=False, fused=None,
                        max_grad_norm=max_grad_norm, master_weights=master_weights)
        super().__init__(params, defaults)

    def _state_keys(self, group):
        return ["momentum_buffer"] if group["momentum"] != 0 else []

    def _init_state(self, p, state, group):
        if p.dtype in (torch.float16, torch.bfloat16):
            state["master_param"] = p.detach().to(torch.float32).contiguous()

    def _gather(self, group):
        # the momentum buffer appears at the first step (torch: a copy of the gradient);
        # allocate it here and let the kernel initialise it from the gradient
        self._fresh = set()
        if group["momentum"] != 0:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not (p.dtype in (torch.float32, torch.float64) or (
                        p.dtype in (torch.float16, torch.bfloat16)
                        and group.get("master_weights", False))):
                    continue  # refused by the base class, before any state is written
                state = self.state[p]
                if state.get("momentum_buffer") is None:
                    if p.dtype in (torch.float16, torch.bfloat16) and group.get(
                            "master_weights", False):
                        if "master_param" not in state:
                            self._init_state(p, state, group)
                        ref = state["master_param"]
                    else:
                        ref = p
                    state["momentum_buffer"] = torch.empty_like(
                        ref, memory_format=torch.preserve_format)
                    self._fresh.add(id(state["momentum_buffer"]))
        return super()._gather(group)

    def _update(self, group, params, grads, states, grad_scale, step):
        momentum = float(group["momentum"])
        bufs = states[0] if momentum != 0 else None
        init = [id(b) in self._fresh for b in bufs] if bufs is not None else None
        sgd_multi(params, grads, bufs, init=init, lr=_lr_value(group["lr"]),
                  momentum=momentum, dampening=float(group["dampening"]),
                  weight_decay=float(group["weight_decay"]), nesterov=bool(group["nesterov"]),
                  maximize=bool(group["maximize"]), grad_scale=grad_scale, op=self._name)
