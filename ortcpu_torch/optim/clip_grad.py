"""clip_grad_norm_ on native multi-tensor kernels."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from ..kernels.grad_control import norm_multi, scale_multi
from ._base import NATIVE, clip_coef


def clip_grad_norm_(parameters: torch.Tensor | Iterable[torch.Tensor], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach=None) -> torch.Tensor:
    """Drop-in for ``torch.nn.utils.clip_grad_norm_``: scale every gradient **in place** by
    ``min(max_norm / (total_norm + 1e-6), 1)`` where ``total_norm`` is the ``norm_type``
    norm of all gradients together (``inf``: the largest absolute value). Returns the total
    norm before clipping (a float32 0-d tensor, or the gradients' dtype if all are
    float64). One native pass reads the gradients for the norm, one rescales them.
    ``foreach`` is accepted for signature compatibility and ignored."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    max_norm = float(max_norm)
    norm_type = float(norm_type)
    if not norm_type > 0:
        raise ValueError(f"clip_grad_norm_: norm_type must be > 0, got {norm_type}")
    if not grads:
        return torch.tensor(0.0)
    dtypes = {g.dtype for g in grads}
    out_dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    work, writeback = [], []
    for g in grads:
        if g.is_sparse:
            raise RuntimeError("clip_grad_norm_: sparse gradients are not supported")
        if g.dtype in NATIVE and g.is_contiguous():
            work.append(g)
        else:
            w = g.to(torch.float32 if g.dtype not in NATIVE else g.dtype).contiguous()
            work.append(w)
            writeback.append((g, w))
    by_dtype: dict = {}
    for w in work:
        by_dtype.setdefault(w.dtype, []).append(w)
    parts = [norm_multi(ws, norm_type, "clip_grad_norm_") for ws in by_dtype.values()]
    if math.isinf(norm_type):
        total = max(parts) if not any(math.isnan(x) for x in parts) else math.nan
    else:
        s = sum(parts)
        total = s ** (1.0 / norm_type) if norm_type != 2.0 else math.sqrt(s)
    total_t = torch.tensor(total, dtype=out_dtype)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is "
            "non-finite, so it cannot be clipped. To disable this error and scale the "
            "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")
    coef = clip_coef(float(total_t), max_norm, out_dtype)
    if coef != 1.0:
        for ws in by_dtype.values():
            scale_multi(ws, ws, coef, "clip_grad_norm_")
        for g, w in writeback:
            g.copy_(w)
    return total_t
