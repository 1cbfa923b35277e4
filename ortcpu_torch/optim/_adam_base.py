"""The Adam family's shared constructor checks, state and update (AdamW and Adam)."""

from __future__ import annotations

import torch

from ..kernels.optim import ADAM_HF, ADAM_L2, ADAM_TORCH, adam_multi
from ._base import NativeOptimizer, _lr_value, check_lr


class AdamBase(NativeOptimizer):
    _decoupled = True
    _has_step = True

    def __init__(self, params, lr, betas, eps, weight_decay, amsgrad, maximize, mode,
                 correct_bias, max_grad_norm, master_weights):
        check_lr(lr)
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"Invalid betas: {betas!r} (expected a pair)")
        betas = tuple(float(b.item()) if isinstance(b, torch.Tensor) else float(b)
                      for b in betas)
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if mode not in ("torch", "hf"):
            raise ValueError(f"Invalid mode: {mode!r} (expected 'torch' or 'hf')")
        if mode == "torch" and not correct_bias:
            raise ValueError("correct_bias=False needs mode='hf' (as ORT: adam_mode 0 always "
                             "corrects the bias)")
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"Invalid max_grad_norm: {max_grad_norm} (must be > 0 or None)")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize, foreach=None, capturable=False,
                        differentiable=False, fused=None,
                        decoupled_weight_decay=self._decoupled, mode=mode,
                        correct_bias=correct_bias, max_grad_norm=max_grad_norm,
                        master_weights=master_weights)
        super().__init__(params, defaults)

    def _state_keys(self, group):
        return ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group["amsgrad"] else [])

    def _init_state(self, p, state, group):
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        if p.dtype in (torch.float16, torch.bfloat16):
            ref = state["master_param"] = p.detach().to(torch.float32).contiguous()
        else:
            ref = p
        state["exp_avg"] = torch.zeros_like(ref, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(ref, memory_format=torch.preserve_format)
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = torch.zeros_like(ref, memory_format=torch.preserve_format)

    def _update(self, group, params, grads, states, grad_scale, step):
        beta1, beta2 = (float(b) for b in group["betas"])
        if self._decoupled:
            mode = ADAM_TORCH if group.get("mode", "torch") == "torch" else ADAM_HF
        else:
            mode = ADAM_L2
        if group.get("correct_bias", True):
            bc1, bc2 = 1.0 - beta1 ** step, 1.0 - beta2 ** step
        else:
            bc1 = bc2 = 1.0
        lr = group["lr"]
        wd = float(group["weight_decay"])
        if isinstance(lr, torch.Tensor):
            # torch keeps a tensor lr as a tensor: lr/bc1 and 1 - lr*wd are rounded in
            # its dtype (float32) before they reach the update
            step_size = float((lr / bc1).item())
            decay = float((1 - lr * wd).item())
        else:
            step_size, decay = None, None
        adam_multi(params, grads, states[0], states[1],
                   states[2] if group["amsgrad"] else None,
                   step_size=step_size, decay=decay,
                   lr=_lr_value(group["lr"]), beta1=beta1, beta2=beta2, eps=float(group["eps"]),
                   weight_decay=float(group["weight_decay"]), bc1=bc1, bc2=bc2, mode=mode,
                   maximize=bool(group["maximize"]), grad_scale=grad_scale, op=self._name)
