"""Softmax cross-entropy losses (spec §11): SoftmaxCrossEntropyLoss (+Grad, +Internal,
+InternalGrad), SoftmaxCrossEntropy (+Grad, dense labels), SparseSoftmaxCrossEntropy
(+Grad).

One native forward/backward pair serves all of them (and ``ops.cross_entropy``): logits
viewed as [N, C, D] (classes on the middle axis), sparse int labels with class weights /
ignore_index / label smoothing, or dense labels. Every label is range-checked before any
logit is read with it (in Python, with a message naming the label; natively again).

Where ORT 1.19.2 is wrong (spec §19) the documented math is implemented instead:
SoftmaxCrossEntropy / SparseSoftmaxCrossEntropy with ``reduction="none"`` return the
per-sample loss (ORT: a scalar), their gradients take a per-sample dY; log_prob is optional
(ORT segfaults without it); int32 labels work everywhere.
"""

from __future__ import annotations

import math

import torch

from .._native import empty, ffi, native_fn, ptr
from ._checks import (
    check_status,
    float_input,
    fmt_shape,
    get_num_threads,
    int_attr,
    needs_flags,
    same_dtype,
    same_shape,
    select_outputs,
)
from ._registry import register

REDUCTIONS = ("none", "sum", "mean")
_ONNX_DTYPES = {1: torch.float32, 11: torch.float64}


def _reduction(op: str, reduction) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    return reduction


def layout(op: str, x: torch.Tensor, class_axis: int, name: str = "scores"):
    """(n, c, d, sample_shape) of logits with classes on ``class_axis`` (1 or -1)."""
    if class_axis == 1:
        if x.dim() < 2:
            raise ValueError(f"{op}: {name} must have shape [N, C, d1...], got {fmt_shape(x)}")
        n, c, d = x.shape[0], x.shape[1], math.prod(x.shape[2:])
        return n, c, d, (x.shape[0], *x.shape[2:])
    if x.dim() < 1:
        raise ValueError(f"{op}: {name} must have rank >= 1, got shape ()")
    c = x.shape[-1]
    return math.prod(x.shape[:-1]), c, 1, tuple(x.shape[:-1])


def labels_input(op: str, name: str, label, sample_shape, c: int,
                 ignore_index: int | None) -> torch.Tensor:
    """int64 contiguous labels of ``sample_shape``, every value in [0, c) or ignore_index."""
    if not isinstance(label, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(label).__name__}")
    if label.device.type != "cpu":
        raise TypeError(f"{op}: {name} must be a CPU tensor, got device {label.device}")
    if label.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{op}: {name} must be int64 or int32, got "
                        f"{str(label.dtype).replace('torch.', '')}")
    if tuple(label.shape) != tuple(sample_shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(sample_shape)}, got "
                         f"{fmt_shape(label)}")
    lab = label.to(torch.int64).contiguous()
    if lab.numel():
        lo, hi = torch.aminmax(lab)  # the common case in one pass: every label in range
        if int(lo) >= 0 and int(hi) < c:
            return lab
    bad = (lab < 0) | (lab >= c)
    if ignore_index is not None:
        bad &= lab != ignore_index
    if lab.numel() and bool(bad.any()):
        flat = int(bad.view(-1).nonzero()[0, 0])
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), lab.shape)) \
            if lab.dim() else ()
        value = int(lab.view(-1)[flat])
        ig = f" and is not ignore_index ({ignore_index})" if ignore_index is not None else ""
        raise ValueError(f"{op}: {name} has label {value} at index {idx}, out of range "
                         f"[0, {c}){ig}")
    return lab


def _i64(t):
    return ffi.NULL if t is None else ffi.cast("int64_t *", t.data_ptr())


# An ignore_index no valid label can equal (labels are range-checked): "nothing ignored".
_NO_IGNORE = -(2**63)


def sce_forward(op: str, x, label, *, dense=None, weight=None, sample_weight=None,
                ignore_index=None, smoothing: float = 0.0, want_loss=False,
                want_log_prob=False, want_lse=False, class_axis=1):
    """Run the native forward. Returns dict: loss (per sample, sample_shape), log_prob,
    lse (per sample, flat), total (Σ loss), wsum (Σ weights of non-ignored samples)."""
    n, c, d, sshape = layout(op, x, class_axis)
    ig = _NO_IGNORE if ignore_index is None else ignore_index
    loss = empty(sshape, x.dtype) if want_loss else None
    lp = empty(x.shape, x.dtype) if want_log_prob else None
    lse = torch.empty(n * d, dtype=x.dtype) if want_lse else None
    tot = ffi.new("double[2]")
    st = native_fn("sce_forward", x.dtype)(
        ptr(x), _i64(label), ptr(dense), ptr(weight), ptr(sample_weight), ptr(loss), ptr(lp),
        ptr(lse), tot, n, c, d, ig, float(smoothing), get_num_threads(),
    )
    check_status(st, op)
    return {"loss": loss, "log_prob": lp, "lse": lse, "total": tot[0], "wsum": tot[1]}


def sce_forward_grad(op: str, x, label, *, dense=None, weight=None, ignore_index=None,
                     smoothing: float = 0.0, mean: bool = True, want_loss=False,
                     class_axis=1):
    """The forward and, in the same pass, d(total or mean loss)/d(logits) for an upstream
    gradient of 1. Returns the dict of :func:`sce_forward` (no log_prob) plus dx."""
    n, c, d, sshape = layout(op, x, class_axis)
    ig = _NO_IGNORE if ignore_index is None else ignore_index
    loss = empty(sshape, x.dtype) if want_loss else None
    lse = torch.empty(n * d, dtype=x.dtype)
    dx = empty(x.shape, x.dtype)
    tot = ffi.new("double[2]")
    st = native_fn("sce_forward_grad", x.dtype)(
        ptr(x), _i64(label), ptr(dense), ptr(weight), ffi.NULL, ptr(loss), ptr(lse), ptr(dx),
        tot, n, c, d, ig, float(smoothing), 1 if mean else 0, get_num_threads(),
    )
    check_status(st, op)
    return {"loss": loss, "lse": lse, "dx": dx, "total": tot[0], "wsum": tot[1]}


def sce_backward(op: str, src, label, *, shift=None, dense=None, weight=None,
                 sample_weight=None, dy=None, dy_scale: float = 1.0, add=None,
                 ignore_index=None, smoothing: float = 0.0, class_axis=1):
    """d_logits = (exp(src - shift) - target)·g (see ortcpu.h)."""
    n, c, d, _ = layout(op, src, class_axis)
    ig = _NO_IGNORE if ignore_index is None else ignore_index
    dx = empty(src.shape, src.dtype)
    st = native_fn("sce_backward", src.dtype)(
        ptr(src), ptr(shift), _i64(label), ptr(dense), ptr(weight), ptr(sample_weight),
        ptr(dy), float(dy_scale), ptr(add), ptr(dx), n, c, d, ig, float(smoothing),
        get_num_threads(),
    )
    check_status(st, op)
    return dx


def _class_weight(op: str, name: str, w, x: torch.Tensor, c: int):
    if w is None:
        return None
    w = float_input(op, name, w)
    same_dtype(op, "scores", x, name, w)
    if w.dim() != 1 or w.numel() != c:
        raise ValueError(f"{op}: {name} must have shape ({c},), got {fmt_shape(w)}")
    return w


def _reduce_ort(x: torch.Tensor, r: dict, reduction: str, sshape):
    if reduction == "none":
        return r["loss"].view(sshape)
    total = r["total"]
    if reduction == "mean" and r["wsum"] != 0:
        total = total / r["wsum"]
    return torch.tensor(total, dtype=x.dtype)


def _scale_ort(op, dY, x, reduction, wsum, sshape):
    """(dy tensor per sample or None, scalar scale) for the ORT gradient rules."""
    if reduction == "none":
        dy = float_input(op, "dY", dY)
        same_dtype(op, "log_prob", x, "dY", dy)
        if tuple(dy.shape) != tuple(sshape):
            raise ValueError(f"{op}: dY must have shape {tuple(sshape)} for reduction 'none', "
                             f"got {fmt_shape(dy)}")
        return dy, 1.0
    dy = float_input(op, "dY", dY)
    if dy.numel() != 1:
        raise ValueError(f"{op}: dY must be a scalar for reduction {reduction!r}, got "
                         f"{fmt_shape(dy)}")
    g = float(dy.item())
    if reduction == "mean" and wsum != 0:
        g /= wsum
    return None, g


def _label_wsum(lab: torch.Tensor, weight, ignore_index, sample_weight=None) -> float:
    """Σ over non-ignored samples of the class weight (count without weights)."""
    keep = lab != ignore_index if ignore_index is not None else torch.ones_like(lab, dtype=bool)
    if weight is not None:
        w = weight.double()[lab.clamp(0, weight.numel() - 1)] * keep
    else:
        w = keep.double()
    if sample_weight is not None:
        w = w * sample_weight.double().view(w.shape)
    return float(w.sum())


# ---- ONNX SoftmaxCrossEntropyLoss and ORT's Internal variants ----------------------------


def _sce_loss(op, scores, labels, weights, reduction, ignore_index, needs, n_out=2):
    reduction = _reduction(op, reduction)
    x = float_input(op, "scores", scores)
    n, c, d, sshape = layout(op, x, 1)
    ig = -1 if ignore_index is None else int_attr(op, "ignore_index", ignore_index)
    lab = labels_input(op, "labels", labels, sshape, c, ig)
    w = _class_weight(op, "weights", weights, x, c)
    want_lp = needs_flags(op, needs, 2)[1]
    r = sce_forward(op, x, lab, weight=w, ignore_index=ig, want_loss=reduction == "none",
                    want_log_prob=want_lp)
    return select_outputs(op, (_reduce_ort(x, r, reduction, sshape), r["log_prob"]), needs)


@register
def SoftmaxCrossEntropyLoss(scores, labels, weights=None, *, reduction: str = "mean",
                            ignore_index=None, needs=None):
    """SoftmaxCrossEntropyLoss (ONNX-13): scores [N, C] or [N, C, d1...], labels (int32/int64)
    [N, d1...], optional class weights [C]. Outputs: output (per-sample for "none", else a
    scalar), log_prob. ``ignore_index`` absent means -1 (ORT); mean over all-ignored
    labels is 0 (ORT). Out-of-range labels raise ValueError naming the label."""
    return _sce_loss("SoftmaxCrossEntropyLoss", scores, labels, weights, reduction,
                     ignore_index, needs)


def _out_dtype(op, output_type, x):
    if output_type is None:
        return x
    if output_type not in _ONNX_DTYPES:
        raise ValueError(f"{op}: output_type must be 1 (float) or 11 (double), got "
                         f"{output_type!r}")
    if isinstance(x, torch.Tensor) and x.dtype in _ONNX_DTYPES.values():
        return x.to(_ONNX_DTYPES[output_type])
    return x


@register
def SoftmaxCrossEntropyLossInternal(scores, labels, weights=None, ignore_index=None, *,
                                    reduction: str = "mean", output_type=None, needs=None):
    """com.microsoft SoftmaxCrossEntropyLossInternal: SoftmaxCrossEntropyLoss with
    ignore_index as an optional int64 scalar *input* (absent: -1) and ``output_type``
    (ONNX dtype of the outputs; the computation runs in that type). Outputs: output,
    log_prob."""
    op = "SoftmaxCrossEntropyLossInternal"
    x = _out_dtype(op, output_type, float_input(op, "scores", scores))
    w = _out_dtype(op, output_type, weights)
    return _sce_loss(op, x, labels, w, reduction, ignore_index, needs)


def _sce_loss_grad(op, dY, log_prob, label, weight, reduction, ignore_index, bias=None):
    reduction = _reduction(op, reduction)
    lp = float_input(op, "log_prob", log_prob)
    n, c, d, sshape = layout(op, lp, 1, "log_prob")
    ig = -1 if ignore_index is None else int_attr(op, "ignore_index", ignore_index)
    lab = labels_input(op, "label", label, sshape, c, ig)
    w = _class_weight(op, "weight", weight, lp, c)
    wsum = _label_wsum(lab, w, ig) if reduction == "mean" else 0.0
    dy, g = _scale_ort(op, dY, lp, reduction, wsum, sshape)
    if bias is not None:
        bias = float_input(op, "bias", bias)
        same_dtype(op, "log_prob", lp, "bias", bias)
        same_shape(op, "log_prob", lp, "bias", bias)
    return sce_backward(op, lp, lab, weight=w, dy=dy, dy_scale=g, add=bias, ignore_index=ig)


@register
def SoftmaxCrossEntropyLossGrad(dY, log_prob, label, weight=None, *, reduction: str = "mean",
                                ignore_index=None):
    """com.microsoft SoftmaxCrossEntropyLossGrad: ``d_logits = (exp(log_prob) - onehot)·g``
    (0 for ignored samples). Inputs: dY (scalar, or label-shaped for "none"), log_prob,
    label, optional weight [C]. Output: d_logits."""
    return _sce_loss_grad("SoftmaxCrossEntropyLossGrad", dY, log_prob, label, weight,
                          reduction, ignore_index)


@register
def SoftmaxCrossEntropyLossInternalGrad(dY, log_prob, label, weight=None, ignore_index=None,
                                        bias=None, *, reduction: str = "mean",
                                        output_type=None):
    """com.microsoft SoftmaxCrossEntropyLossInternalGrad: SoftmaxCrossEntropyLossGrad with
    ignore_index as an optional int64 scalar input and an optional ``bias`` added to
    d_logits. Output: d_logits (dtype ``output_type`` when given)."""
    op = "SoftmaxCrossEntropyLossInternalGrad"
    lp = _out_dtype(op, output_type, float_input(op, "log_prob", log_prob))
    dy = _out_dtype(op, output_type, dY)
    w = _out_dtype(op, output_type, weight)
    b = _out_dtype(op, output_type, bias)
    return _sce_loss_grad(op, dy, lp, label, w, reduction, ignore_index, b)


# ---- com.microsoft SoftmaxCrossEntropy (dense labels) ------------------------------------


def _with_dense_label(op: str, name: str, t, label):
    """``t`` ([..., C] scores or log-probabilities) and its dense ``label`` of the same
    shape and dtype: (t, label, rows, row shape)."""
    t = float_input(op, name, t)
    lab = float_input(op, "label", label)
    same_dtype(op, name, t, "label", lab)
    same_shape(op, name, t, "label", lab)
    n, _, _, sshape = layout(op, t, -1, name)
    return t, lab, n, sshape


@register
def SoftmaxCrossEntropy(logits, label, *, reduction: str = "mean", needs=None):
    """com.microsoft SoftmaxCrossEntropy: dense (one-hot / soft) labels of the logits' shape
    [..., C]. ``loss_i = -Σ_c label·log_prob``; mean divides by the number of rows.
    Outputs: Y, log_prob. ``reduction="none"`` returns the per-row loss (ORT 1.19.2
    returns ``+Σ`` as a scalar, a bug)."""
    op = "SoftmaxCrossEntropy"
    reduction = _reduction(op, reduction)
    x, lab, n, sshape = _with_dense_label(op, "logits", logits, label)
    want_lp = needs_flags(op, needs, 2)[1]
    r = sce_forward(op, x, None, dense=lab, want_loss=reduction == "none",
                    want_log_prob=want_lp, class_axis=-1)
    if reduction == "none":
        y = r["loss"].view(sshape)
    else:
        y = torch.tensor(r["total"] / (n if reduction == "mean" and n else 1), dtype=x.dtype)
    return select_outputs(op, (y, r["log_prob"]), needs)


@register
def SoftmaxCrossEntropyGrad(dY, log_prob, label, *, reduction: str = "mean"):
    """com.microsoft SoftmaxCrossEntropyGrad: ``d_logits = (exp(log_prob) - label)·dY``
    (÷ rows for mean; per-row dY for "none", which ORT 1.19.2 gets wrong). Labels that do
    not sum to 1 per row get the exact gradient ``exp(log_prob)·Σlabel - label`` (ORT
    assumes Σlabel = 1)."""
    op = "SoftmaxCrossEntropyGrad"
    reduction = _reduction(op, reduction)
    lp, lab, n, sshape = _with_dense_label(op, "log_prob", log_prob, label)
    dy, g = _scale_ort(op, dY, lp, reduction, 0.0, sshape)
    if reduction == "mean" and n:
        g /= n
    return sce_backward(op, lp, None, dense=lab, dy=dy, dy_scale=g, class_axis=-1)


# ---- SparseSoftmaxCrossEntropy (default domain, ORT training) ----------------------------


def _sample_weight(op, weight, x, sshape):
    if weight is None:
        return None
    w = float_input(op, "weight", weight)
    same_dtype(op, "logits", x, "weight", w)
    if tuple(w.shape) != tuple(sshape):
        raise ValueError(f"{op}: weight must have the label's shape {tuple(sshape)}, got "
                         f"{fmt_shape(w)}")
    return w


@register
def SparseSoftmaxCrossEntropy(logits, label, weight=None, *, reduction: str = "mean",
                              needs=None):
    """SparseSoftmaxCrossEntropy (ORT training, default domain): logits [..., C], labels
    [...] (int64 or int32), optional per-sample weight. ``ℓ_i = -w_i·log_prob[i, label_i]``;
    mean divides by Σw (or the count). Outputs: Y, log_prob. ``reduction="none"`` returns
    the per-sample loss (ORT 1.19.2 returns the sum)."""
    op = "SparseSoftmaxCrossEntropy"
    reduction = _reduction(op, reduction)
    x = float_input(op, "logits", logits)
    n, c, d, sshape = layout(op, x, -1, "logits")
    lab = labels_input(op, "label", label, sshape, c, None)
    sw = _sample_weight(op, weight, x, sshape)
    want_lp = needs_flags(op, needs, 2)[1]
    r = sce_forward(op, x, lab, sample_weight=sw, want_loss=reduction == "none",
                    want_log_prob=want_lp, class_axis=-1)
    return select_outputs(op, (_reduce_ort(x, r, reduction, sshape), r["log_prob"]), needs)


@register
def SparseSoftmaxCrossEntropyGrad(dY, log_prob, label, weight=None, *,
                                  reduction: str = "mean"):
    """SparseSoftmaxCrossEntropyGrad: ``d = (exp(log_prob) - onehot(label))·s_i`` with
    ``s_i = dY·w_i/Σw`` (mean) or ``dY·w_i`` (sum); per-sample dY for "none"."""
    op = "SparseSoftmaxCrossEntropyGrad"
    reduction = _reduction(op, reduction)
    lp = float_input(op, "log_prob", log_prob)
    n, c, d, sshape = layout(op, lp, -1, "log_prob")
    lab = labels_input(op, "label", label, sshape, c, None)
    sw = _sample_weight(op, weight, lp, sshape)
    wsum = (float(sw.double().sum()) if sw is not None else float(n)) \
        if reduction == "mean" else 0.0
    dy, g = _scale_ort(op, dY, lp, reduction, wsum, sshape)
    return sce_backward(op, lp, lab, sample_weight=sw, dy=dy, dy_scale=g, class_axis=-1)
