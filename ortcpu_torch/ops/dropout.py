"""Autograd function for dropout (ORT Dropout / DropoutGrad). The mask's seed is drawn from
torch's RNG (global, or ``generator``); the backward applies exactly the forward's mask."""

from __future__ import annotations

import torch

from ..kernels import dropout as K
from ..kernels._checks import bool_arg, float_check
from ._layout import from_order, in_order, storage_order
from .activations import once_differentiable


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p: float, seed: int, inplace: bool = False):
        ctx.order = order = storage_order(x)  # the mask is drawn in x's memory order
        xv = in_order(x, order)
        y, mask = K.dropout_forward("dropout", xv, p, seed)
        if inplace:
            (xv if order is not None else x).copy_(y)
            ctx.mark_dirty(x)
            y = x
        else:
            y = from_order(y, order)
        ctx.save_for_backward(mask)
        ctx.scale = 1.0 / (1.0 - p) if p < 1.0 else 0.0
        mask = from_order(mask, order)
        ctx.mark_non_differentiable(mask)
        return y, mask

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, _dmask):
        (mask,) = ctx.saved_tensors
        dy = in_order(float_check("dropout", "grad_output", dy), ctx.order)
        return from_order(K.dropout_backward("dropout", dy, mask, ctx.scale), ctx.order), \
            None, None, None


def dropout_with_mask(input: torch.Tensor, p: float = 0.5, training: bool = True,
                      inplace: bool = False, *, generator: torch.Generator | None = None):
    """(output, mask) of :func:`dropout`; mask is None when nothing is dropped."""
    op = "dropout"
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{op}: dropout probability has to be between 0 and 1, but got {p}")
    K.float_input(op, "input", input)
    inplace = bool_arg(op, "inplace", inplace)
    if not bool_arg(op, "training", training) or p == 0.0:
        return input, None
    seed = K.draw_seed(generator)
    return _Dropout.apply(input, float(p), seed, inplace)


def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False,
            *, generator: torch.Generator | None = None) -> torch.Tensor:
    """Like ``torch.nn.functional.dropout`` (zeros with probability p, survivors scaled by
    1/(1-p); identity when not training or p = 0; all zeros at p = 1; ``inplace`` writes
    into ``input``). Randomness: a seed drawn from torch's RNG, so ``torch.manual_seed``
    (or ``generator=``) reproduces masks; the backward applies the forward's mask."""
    return dropout_with_mask(input, p, training, inplace, generator=generator)[0]
