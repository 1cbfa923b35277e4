"""Autograd function for softmax cross-entropy with ``torch.nn.functional.cross_entropy``'s
signature (ORT SoftmaxCrossEntropyLoss(+Grad) semantics, plus label smoothing natively).

The forward keeps only one number per sample (max + log Σ exp); no [N, C] log-probabilities
are written or read. When the loss is a scalar (mean/sum) and the input needs a gradient, the
forward also writes d(loss)/d(input) for dy = 1 in the same pass over the logits (each row's
exponentials are kept in the gradient buffer and rescaled once the row's sum is known), and
the backward only scales it by dy: one pass over the logits per training step instead of
two. A second backward through the same graph (retain_graph) reruns that same fused pass on
the saved logits, so every backward returns bit-identical gradients (the backward is
reentrant: gradcheck's ``nondet_tol=0`` holds). A non-finite dy rebuilds the probabilities
from the saved logits and lse, as the "none" reduction always does.
"""

from __future__ import annotations

import math

import torch

from .._native import KernelError
from .._native.arena import reshaped
from ..kernels import loss as K
from ..kernels._checks import SignatureCache, checked_signature
from .activations import once_differentiable


def _fused_pass(x, target, dense, weight, ignore_index: int, smoothing: float,
                reduction: str) -> dict:
    """Loss and d(loss)/d(x) for dy = 1 in one pass (``sce_forward_grad``); the forward
    and a repeated backward both call it, so their gradients are bit-identical."""
    if dense is not None:
        return K.sce_forward_grad("cross_entropy", x, None, dense=dense,
                                  mean=reduction == "mean")
    return K.sce_forward_grad("cross_entropy", x, target, weight=weight,
                              ignore_index=ignore_index, smoothing=smoothing,
                              mean=reduction == "mean")


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, target, weight, ignore_index: int, reduction: str, smoothing: float,
                unbatched: bool):
        op = "cross_entropy"
        dense = target.is_floating_point()
        # With a scalar loss whose input needs a gradient, the gradient for dy = 1 is
        # written in the forward pass (one pass over the logits instead of two); the
        # backward returns it (scaled by dy), or recomputes when called a second time.
        fused = ctx.needs_input_grad[0] and reduction != "none"
        ctx.dx = None
        if dense:
            lab = target
            if weight is not None:
                lab = lab * weight.view((-1,) + (1,) * (x.dim() - 2))
            if smoothing:
                c = x.shape[1]
                lab = lab * (1.0 - smoothing) + smoothing / c * (
                    weight.view((-1,) + (1,) * (x.dim() - 2)) if weight is not None else 1.0)
            lab = lab.contiguous()
            if fused:
                r = _fused_pass(x, None, lab, None, ignore_index, smoothing, reduction)
                ctx.dx = r["dx"]
            else:
                r = K.sce_forward(op, x, None, dense=lab, want_loss=reduction == "none",
                                  want_lse=True)
            n, c, d, sshape = K.layout(op, x, 1)
            wsum = float(n * d)
            ctx.save_for_backward(x, lab, r["lse"])
        else:
            if fused:
                r = _fused_pass(x, target, None, weight, ignore_index, smoothing, reduction)
                ctx.dx = r["dx"]
            else:
                r = K.sce_forward(op, x, target, weight=weight, ignore_index=ignore_index,
                                  smoothing=smoothing, want_loss=reduction == "none",
                                  want_lse=True)
            wsum = r["wsum"]
            ctx.save_for_backward(x, target, r["lse"], weight)
        ctx.dense, ctx.wsum, ctx.reduction, ctx.smoothing = dense, wsum, reduction, smoothing
        ctx.ignore_index, ctx.fused = ignore_index, fused
        if reduction == "none":
            out = r["loss"]
            return reshaped(out, out.shape[1:]) if unbatched else out
        total = r["total"]
        if reduction == "mean":
            # torch: 0/0 = NaN when every target is ignored (ORT's registry op returns 0)
            total = total / wsum if wsum != 0 else float("nan")
        return torch.scalar_tensor(total, dtype=x.dtype)  # (torch.tensor: 2x the cost)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        op = "cross_entropy"
        if ctx.fused and math.isfinite(gv := float(dy)):
            dx, ctx.dx = ctx.dx, None
            if dx is None:  # a second backward: the same pass again, bit for bit
                if ctx.dense:
                    x, lab, _ = ctx.saved_tensors
                    dx = _fused_pass(x, None, lab, None, ctx.ignore_index, 0.0,
                                     ctx.reduction)["dx"]
                else:
                    x, target, _, weight = ctx.saved_tensors
                    dx = _fused_pass(x, target, None, weight, ctx.ignore_index,
                                     ctx.smoothing, ctx.reduction)["dx"]
            return (dx if gv == 1.0 else dx.mul_(gv)), None, None, None, None, None, None
        ctx.dx = None
        if ctx.reduction == "none":
            dyt, g = dy.contiguous(), 1.0
        else:
            dyt, g = None, float(dy)
            if ctx.reduction == "mean":
                g = g / ctx.wsum if ctx.wsum != 0 else float("nan")
        if ctx.dense:
            x, lab, lse = ctx.saved_tensors
            dx = K.sce_backward(op, x, None, shift=lse, dense=lab, dy=dyt, dy_scale=g)
        else:
            x, target, lse, weight = ctx.saved_tensors
            dx = K.sce_backward(op, x, target, shift=lse, weight=weight, dy=dyt, dy_scale=g,
                                ignore_index=ctx.ignore_index, smoothing=ctx.smoothing)
        return dx, None, None, None, None, None, None


_CE_CHECKED = SignatureCache()


def cross_entropy(input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                  ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> torch.Tensor:
    """Like ``torch.nn.functional.cross_entropy`` (class-index or class-probability targets,
    [C], [N, C] or [N, C, d1...] input, class weights, ignore_index, reductions, label
    smoothing). The mean over an all-ignored batch is NaN, as in torch."""
    key = checked_signature(input, target, weight, ignore_index, reduction, label_smoothing)
    if key in _CE_CHECKED:
        # checked before with this signature; the labels' range is checked natively (before
        # any logit is read with them), and a failure re-runs the checks for their message
        x, t, w = input.contiguous(), target.contiguous(), weight
        if w is not None:
            w = w.contiguous()
        unbatched = x.dim() == 1
        if unbatched:
            x, t = x.unsqueeze(0), t.unsqueeze(0)
        if not t.is_floating_point() and t.dtype is not torch.int64:
            t = t.to(torch.int64)
        try:
            return _CrossEntropy.apply(x, t, w, int(ignore_index), reduction,
                                       float(label_smoothing), unbatched and reduction == "none")
        except KernelError:
            _checked_ce_args(input, target, weight, ignore_index, reduction, label_smoothing)
            raise
    x, t, w, unbatched = _checked_ce_args(input, target, weight, ignore_index, reduction,
                                          label_smoothing)
    _CE_CHECKED.add(key)
    return _CrossEntropy.apply(x, t, w, int(ignore_index), reduction, float(label_smoothing),
                               unbatched and reduction == "none")


def _checked_ce_args(input, target, weight, ignore_index, reduction, label_smoothing):
    """(logits [N, C, ...], target, weight, unbatched) after every check of
    ``cross_entropy``'s arguments, labels range-checked."""
    op = "cross_entropy"
    K._reduction(op, reduction)
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
            or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be a float in [0, 1], got "
                         f"{label_smoothing!r}")
    x = K.float_input(op, "input", input)
    unbatched = x.dim() == 1
    if unbatched:
        x = x.unsqueeze(0)
        if isinstance(target, torch.Tensor):
            target = target.unsqueeze(0)
    n, c, d, sshape = K.layout(op, x, 1, "input")
    w = K._class_weight(op, "weight", weight, x, c)
    if isinstance(target, torch.Tensor) and target.is_floating_point():
        t = K.float_input(op, "target", target)
        K.same_dtype(op, "input", x, "target", t)
        K.same_shape(op, "input", x, "target", t)
    else:
        ig = K.int_attr(op, "ignore_index", ignore_index)
        t = K.labels_input(op, "target", target, sshape, c, ig)
    return x, t, w, unbatched
