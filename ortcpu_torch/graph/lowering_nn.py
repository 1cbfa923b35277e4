"""Layers kept high-level by the capture's decomposition table, and their core-ATen forms.

Each emits the ONNX op whose ONNX Runtime gradient exists (Gemm/MatMul, Conv, MaxPool,
LayerNormalization with Mean/InvStdDev, training BatchNormalization, Gather,
SoftmaxCrossEntropyLoss), so the gradient builder can use ORT's fused gradient kernels.

Dropout: the keep mask comes from torch's generator, not from an ONNX Dropout's own RNG, so
``torch.manual_seed`` reproduces a run bit for bit. Each training-mode dropout becomes a graph
input ``dropout_mask_<k>`` holding ``bernoulli(1 - p) / (1 - p)`` (what eager torch multiplies
by on CPU) and the output is ``Mul(x, mask)``; :class:`DropoutMask` records how to make it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from onnx import helper

from .lowering import TORCH_TO_ONNX, Lowering, LoweringError, lowers, node_location

aten = torch.ops.aten


@dataclass(frozen=True)
class DropoutMask:
    """A graph input holding a scaled dropout keep mask: ``bernoulli(1-p) / (1-p)``."""

    name: str
    shape: tuple[int, ...]
    p: float
    dtype: torch.dtype
    where: str  # module path and source line of the dropout
    stride: tuple[int, ...] | None = None  # the dropout input's strides in eager torch

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        """The mask as eager torch draws it on CPU (same generator calls, same values).

        Eager dropout draws into ``empty_like(input)``, which keeps the input's memory
        layout: a transposed input gets its mask in transposed memory order, so the mask is
        drawn with the input's strides and made contiguous for the graph."""
        keep = 1.0 - self.p
        if self.stride is not None:
            noise = torch.empty_strided(self.shape, self.stride, dtype=self.dtype)
        else:
            noise = torch.empty(self.shape, dtype=self.dtype)
        if keep == 0:
            return noise.zero_().contiguous()
        return noise.bernoulli_(keep, generator=generator).div_(keep).contiguous()


def _dense_stride(meta) -> tuple[int, ...] | None:
    """The strides of a non-overlapping, dense, non-contiguous tensor (else None)."""
    if not isinstance(meta, torch.Tensor) or meta.is_contiguous():
        return None
    stride = tuple(int(s) for s in meta.stride())
    dims = sorted((st, int(sz)) for st, sz in zip(stride, meta.shape, strict=True) if sz > 1)
    expect = 1
    for st, sz in dims:
        if st != expect:
            return None
        expect *= sz
    return stride


def dropout_mask_input(ctx: Lowering, shape, p: float, dtype: torch.dtype,
                       like=None) -> str:
    """Declare a new dropout-mask graph input for the current node; returns its name.
    ``like``: the fx value being dropped (its strides decide eager torch's draw order)."""
    if not all(isinstance(s, int) for s in shape):
        raise LoweringError("dropout on a tensor with symbolic shape (capture with static "
                            "shapes: the mask is drawn by torch before the run)")
    name = ctx.fresh(f"dropout_mask_{len(ctx.dropout_masks)}")
    ctx.extra_inputs.append(helper.make_tensor_value_info(name, TORCH_TO_ONNX[dtype],
                                                          list(shape)))
    ctx.dropout_masks.append(DropoutMask(name, tuple(int(s) for s in shape), float(p), dtype,
                                         node_location(ctx.current),
                                         _dense_stride(ctx.meta(like))))
    return name


@lowers(aten.native_dropout.default)
def _native_dropout(ctx, node, a):
    x = a["input"]
    p, train = float(a["p"]), a["train"]
    if not train or p == 0:
        return ctx.op("Identity", [ctx.v(x)]), None
    mask = dropout_mask_input(ctx, ctx.shape(x), p, ctx.dtype(x), like=x)
    y = ctx.op("Mul", [ctx.v(x), mask])
    return y, ctx.op("Greater", [mask, ctx.const(0, ctx.dtype(x))])


# ---- linear algebra layers ---------------------------------------------------------
@lowers(aten.linear.default)
def _linear(ctx, node, a):
    x, w, b = a["input"], a["weight"], a["bias"]
    if ctx.rank(x) == 2:
        ins = [ctx.v(x), ctx.v(w)] + ([ctx.v(b)] if b is not None else [])
        return ctx.op("Gemm", ins, transB=1)
    y = ctx.op("MatMul", [ctx.v(x), ctx.op("Transpose", [ctx.v(w)], perm=[1, 0])])
    return ctx.op("Add", [y, ctx.v(b)]) if b is not None else y


def _spatial(ctx, x, n_spatial):
    """Unbatched conv/pool input gets a batch dim; returns (value, squeeze_after)."""
    if ctx.rank(x) == n_spatial + 1:
        return ctx.op("Unsqueeze", [ctx.v(x), ctx.ints([0])]), True
    return ctx.v(x), False


def _unbatch(ctx, y, squeeze):
    return ctx.op("Squeeze", [y, ctx.ints([0])]) if squeeze else y


def _rep(v, n):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * n if len(v) == 1 else v


def _conv(ctx, node, x, w, b, stride, padding, dilation, groups, transposed=False,
          output_padding=None):
    n = ctx.rank(w) - 2
    xv, squeeze = _spatial(ctx, x, n)
    stride, dilation = _rep(stride, n), _rep(dilation, n)
    kernel = [int(k) for k in ctx.shape(w)[2:]]
    if isinstance(padding, str):
        if padding == "valid":
            pads = [0] * (2 * n)
        else:  # 'same': total = dilation*(k-1), extra on the end (torch's choice)
            tot = [d * (k - 1) for d, k in zip(dilation, kernel, strict=True)]
            pads = [t // 2 for t in tot] + [t - t // 2 for t in tot]
    else:
        p = _rep(padding, n)
        pads = p + p
    ins = [xv, ctx.v(w)] + ([ctx.v(b)] if b is not None else [])
    if transposed:
        y = ctx.op("ConvTranspose", ins, strides=stride, pads=pads, dilations=dilation,
                   group=int(groups), kernel_shape=kernel,
                   output_padding=_rep(output_padding or 0, n))
    else:
        y = ctx.op("Conv", ins, strides=stride, pads=pads, dilations=dilation,
                   group=int(groups), kernel_shape=kernel)
    return _unbatch(ctx, y, squeeze)


@lowers(aten.conv1d.default, aten.conv2d.default, aten.conv3d.default, aten.conv1d.padding,
        aten.conv2d.padding, aten.conv3d.padding)
def _convnd(ctx, node, a):
    return _conv(ctx, node, a["input"], a["weight"], a["bias"], a["stride"], a["padding"],
                 a["dilation"], a["groups"])


@lowers(aten.convolution.default)
def _convolution(ctx, node, a):
    return _conv(ctx, node, a["input"], a["weight"], a["bias"], a["stride"], a["padding"],
                 a["dilation"], a["groups"], a["transposed"], a["output_padding"])


@lowers(aten.max_pool1d.default, aten.max_pool2d.default, aten.max_pool3d.default,
        aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def _max_pool(ctx, node, a):
    x = a["self"]
    n = {aten.max_pool1d.default: 1, aten.max_pool3d.default: 3,
         aten.max_pool3d_with_indices.default: 3}.get(node.target, 2)
    kernel = _rep(a["kernel_size"], n)
    stride = _rep(a["stride"], n) if a["stride"] else kernel
    pad = _rep(a["padding"], n)
    xv, squeeze = _spatial(ctx, x, n)
    y = ctx.op("MaxPool", [xv], kernel_shape=kernel, strides=stride, pads=pad + pad,
               dilations=_rep(a["dilation"], n), ceil_mode=int(a["ceil_mode"]))
    y = _unbatch(ctx, y, squeeze)
    if "with_indices" in str(node.target):
        return y, None  # torch's per-plane indices differ from ONNX's; nothing may use them
    return y


@lowers(aten.avg_pool1d.default, aten.avg_pool2d.default, aten.avg_pool3d.default)
def _avg_pool(ctx, node, a):
    x = a["self"]
    n = {aten.avg_pool1d.default: 1, aten.avg_pool3d.default: 3}.get(node.target, 2)
    if a.get("divisor_override") is not None:
        raise LoweringError("avg_pool with divisor_override is not supported")
    kernel = _rep(a["kernel_size"], n)
    stride = _rep(a["stride"], n) if a["stride"] else kernel
    pad = _rep(a["padding"], n)
    xv, squeeze = _spatial(ctx, x, n)
    y = ctx.op("AveragePool", [xv], kernel_shape=kernel, strides=stride, pads=pad + pad,
               ceil_mode=int(a["ceil_mode"]), count_include_pad=int(a["count_include_pad"]))
    return _unbatch(ctx, y, squeeze)


@lowers(aten.adaptive_avg_pool1d.default, aten.adaptive_avg_pool2d.default,
        aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool3d.default,
        aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool(ctx, node, a):
    x = a["self"]
    out = _rep(a["output_size"], 1)
    n = len(out) if len(out) > 1 else {aten.adaptive_avg_pool1d.default: 1}.get(node.target, 2)
    out = _rep(out, n)
    spatial = ctx.shape(x)[-n:]
    xv, squeeze = _spatial(ctx, x, n)
    if all(o == 1 for o in out):
        y = ctx.op("GlobalAveragePool", [xv])
    elif all(isinstance(s, int) and s % o == 0 for s, o in zip(spatial, out, strict=True)):
        k = [s // o for s, o in zip(spatial, out, strict=True)]
        y = ctx.op("AveragePool", [xv], kernel_shape=k, strides=k)
    else:
        raise LoweringError("adaptive_avg_pool with an output size that does not divide the "
                            "input size")
    return _unbatch(ctx, y, squeeze)


# ---- normalization -----------------------------------------------------------------
def _ones(ctx, shape, dt, value=1.0, shared=True):
    return ctx.const(torch.full(tuple(int(s) for s in shape), value, dtype=dt), shared=shared)


@lowers(aten.layer_norm.default, aten.native_layer_norm.default)
def _layer_norm(ctx, node, a):
    """LayerNormalization with its Mean and InvStdDev outputs (LayerNormalizationGrad's)."""
    x, ns = a["input"], list(a["normalized_shape"])
    dt = ctx.dtype(x)
    w = ctx.v(a["weight"]) if a["weight"] is not None else _ones(ctx, ns, dt)
    # a zero bias when there is none: ORT's LayerNormalizationGrad builder reads input 2
    b = ctx.v(a["bias"]) if a["bias"] is not None else _ones(ctx, ns, dt, 0.0)
    y, mean, inv_std = ctx.op("LayerNormalization", [ctx.v(x), w, b], n_out=3, axis=-len(ns),
                              epsilon=float(a["eps"]))
    if node.target is aten.layer_norm.default:
        return y
    return y, mean, inv_std


@lowers(aten.native_group_norm.default)
def _group_norm(ctx, node, a):
    """[N, C, *] viewed as [N, G, C/G·*], InstanceNormalization over the last axis (unit
    scale, zero bias), back to x's shape, then the per-channel affine. Mean and rstd (the
    ATen op's outputs 1, 2) are backward-only in torch and not produced."""
    x = a["input"]
    rank, g = ctx.rank(x), int(a["group"])
    dt = ctx.dtype(x)
    xv = ctx.v(x)
    grouped = ctx.op("Reshape", [xv, ctx.ints([0, g, -1])])
    y = ctx.op("InstanceNormalization", [grouped, _ones(ctx, [g], dt), _ones(ctx, [g], dt, 0.0)],
               epsilon=float(a["eps"]))
    y = ctx.op("Reshape", [y, ctx.op("Shape", [xv])])
    per_channel = ctx.ints([-1] + [1] * (rank - 2))
    if a["weight"] is not None:
        y = ctx.op("Mul", [y, ctx.op("Reshape", [ctx.v(a["weight"]), per_channel])])
    if a["bias"] is not None:
        y = ctx.op("Add", [y, ctx.op("Reshape", [ctx.v(a["bias"]), per_channel])])
    return y, None, None


def _bn_affine(ctx, a, c, dt):
    w = ctx.v(a["weight"]) if a["weight"] is not None else _ones(ctx, [c], dt)
    b = ctx.v(a["bias"]) if a["bias"] is not None else _ones(ctx, [c], dt, 0.0)
    return w, b


def _channels(ctx, x):
    c = ctx.shape(x)[1]
    if not isinstance(c, int):
        raise LoweringError("batch norm with a symbolic channel count")
    return c


def _placeholder_stats(ctx, c, dt):
    """Running-stat inputs for a training BatchNormalization whose momentum is 0.

    With momentum=0 their values do not affect the node's outputs, so the buffers themselves
    are not passed: onnxruntime writes the running outputs into these inputs in place
    (measured), which would corrupt the buffers read by the update, and its constant-sharing
    pass merges equal initializers, so each node's placeholders hold values of their own.
    """
    ctx.bn_count += 1
    k = ctx.bn_count
    return [_ones(ctx, [c], dt, -1000.5 - k, shared=False),
            _ones(ctx, [c], dt, 1000.5 + k, shared=False)]


@lowers(aten._native_batch_norm_legit_functional.default)
def _bn_train(ctx, node, a):
    """Training BatchNormalization, and torch's running-stat update written out.

    ONNX's training BatchNormalization updates the running variance with the *biased* batch
    variance; torch uses the unbiased one. With ``momentum=0`` its running outputs are the
    batch mean and biased variance, from which torch's rule is a few ops on C-element vectors:
    ``rm' = (1-m) rm + m mean``, ``rv' = (1-m) rv + m var n/(n-1)``.
    """
    x = a["input"]
    dt = ctx.dtype(x)
    c = _channels(ctx, x)
    w, b = _bn_affine(ctx, a, c, dt)
    rm, rv = ctx.v(a["running_mean"]), ctx.v(a["running_var"])
    m, eps = float(a["momentum"]), float(a["eps"])
    stats = _placeholder_stats(ctx, c, dt)
    y, bmean, bvar = ctx.op("BatchNormalization", [ctx.v(x), w, b, *stats], n_out=3,
                            epsilon=eps, momentum=0.0, training_mode=1)
    if not a["training"]:
        raise LoweringError("functional batch norm with training=False")
    n = _per_channel_count(ctx, x, c, dt)
    corr = ctx.op("Div", [n, ctx.op("Sub", [n, ctx.const(1.0, dt)])])
    keep = ctx.const(1.0 - m, dt)
    new_rm = ctx.op("Add", [ctx.op("Mul", [rm, keep]),
                            ctx.op("Mul", [bmean, ctx.const(m, dt)])])
    new_rv = ctx.op("Add", [ctx.op("Mul", [rv, keep]),
                            ctx.op("Mul", [bvar, ctx.op("Mul", [corr, ctx.const(m, dt)])])])
    return y, None, None, new_rm, new_rv


def _per_channel_count(ctx, x, c, dt):
    shape = ctx.shape(x)
    if all(isinstance(s, int) for s in shape):
        return ctx.const(math.prod(shape) / c, dt)
    size = ctx.op("Cast", [ctx.op("Size", [ctx.v(x)])], to=TORCH_TO_ONNX[dt])
    return ctx.op("Div", [size, ctx.const(float(c), dt)])


@lowers(aten._native_batch_norm_legit.no_stats)
def _bn_train_no_stats(ctx, node, a):
    x = a["input"]
    dt = ctx.dtype(x)
    c = _channels(ctx, x)
    w, b = _bn_affine(ctx, a, c, dt)
    stats = _placeholder_stats(ctx, c, dt)
    y, _, _ = ctx.op("BatchNormalization", [ctx.v(x), w, b, *stats], n_out=3,
                     epsilon=float(a["eps"]), momentum=0.0, training_mode=1)
    return y, None, None


@lowers(aten._native_batch_norm_legit_no_training.default)
def _bn_eval(ctx, node, a):
    x = a["input"]
    dt = ctx.dtype(x)
    w, b = _bn_affine(ctx, a, _channels(ctx, x), dt)
    y = ctx.op("BatchNormalization", [ctx.v(x), w, b, ctx.v(a["running_mean"]),
                                      ctx.v(a["running_var"])], epsilon=float(a["eps"]))
    return y, None, None


# ---- embedding, losses, attention ----------------------------------------------------
@lowers(aten.embedding.default)
def _embedding(ctx, node, a):
    """Gather(weight, indices). With ``padding_idx`` in a training graph, the padding
    positions read a gradient-free copy of the weight, so (as in torch) the padding row gets
    no gradient while the forward values stay exact."""
    if a["scale_grad_by_freq"]:
        raise LoweringError("embedding with scale_grad_by_freq is not supported")
    w, idx = a["weight"], ctx.tensor(a["indices"], torch.int64)
    out = ctx.op("Gather", [ctx.v(w), idx], axis=0)
    pad = a["padding_idx"]
    if not ctx.train or pad is None or pad < 0:
        return out
    frozen = ctx.op("Gather", [ctx.detached(w), idx], axis=0)
    is_pad = ctx.op("Unsqueeze", [ctx.op("Equal", [idx, ctx.const(pad, torch.int64)]),
                                  ctx.ints([-1])])
    return ctx.op("Where", [is_pad, frozen, out])


_REDUCTION = {0: "none", 1: "mean", 2: "sum"}


@lowers(aten.cross_entropy_loss.default)
def _cross_entropy(ctx, node, a):
    """SoftmaxCrossEntropyLoss for class-index targets; label smoothing adds the smoothing
    term from a LogSoftmax (so SCE's own gradient stays the one for its loss output);
    probability targets are -sum(w * t * log_softmax(x)) written out."""
    x, t, w = a["self"], a["target"], a["weight"]
    red = _REDUCTION[a["reduction"]]
    eps = float(a["label_smoothing"])
    dt = ctx.dtype(x)
    xv = ctx.v(x)
    unbatched = ctx.rank(x) == 1
    if unbatched:
        xv = ctx.op("Unsqueeze", [xv, ctx.ints([0])])
    c = ctx.shape(x)[0 if unbatched else 1]
    if not isinstance(c, int):
        raise LoweringError("cross entropy with a symbolic class count")
    if ctx.dtype(t).is_floating_point:
        tv = ctx.v(t)
        if unbatched:
            tv = ctx.op("Unsqueeze", [tv, ctx.ints([0])])
        return _ce_probabilities(ctx, xv, tv, w, red, eps, c, dt, unbatched)
    tv = ctx.tensor(t, torch.int64)
    if unbatched:
        tv = ctx.op("Unsqueeze", [tv, ctx.ints([0])])
    ins = [xv, tv] + ([ctx.v(w)] if w is not None else [])
    ignore = int(a["ignore_index"])
    # log_prob is an output too: SoftmaxCrossEntropyLossGrad reads it
    loss, _ = ctx.op("SoftmaxCrossEntropyLoss", ins, n_out=2, reduction=red,
                     ignore_index=ignore)
    if eps > 0:
        loss = ctx.op("Add", [ctx.op("Mul", [loss, ctx.const(1.0 - eps, dt)]),
                              _ce_smoothing(ctx, xv, tv, w, red, eps, c, dt, ignore)])
    if unbatched and red == "none":
        loss = ctx.op("Squeeze", [loss, ctx.ints([0])])
    return loss


def _class_weight_bcast(ctx, w, rank):
    """Class weights reshaped to broadcast along axis 1 of a rank-``rank`` input."""
    return ctx.op("Reshape", [ctx.v(w), ctx.ints([1, -1] + [1] * (rank - 2))])


def _ce_smoothing(ctx, xv, tv, w, red, eps, c, dt, ignore):
    rank = ctx.rank(ctx.current.args[0]) if ctx.rank(ctx.current.args[0]) > 1 else 2
    logp = ctx.op("LogSoftmax", [xv], axis=1)
    if w is not None:
        logp = ctx.op("Mul", [logp, _class_weight_bcast(ctx, w, rank)])
    smooth = ctx.op("Neg", [ctx.op("ReduceSum", [logp, ctx.ints([1])], keepdims=0)])
    ignored = ctx.op("Equal", [tv, ctx.const(ignore, torch.int64)])
    smooth = ctx.op("Where", [ignored, ctx.const(0.0, dt), smooth])
    if red == "sum":
        smooth = ctx.op("ReduceSum", [smooth], keepdims=0)
    elif red == "mean":
        total = ctx.op("ReduceSum", [smooth], keepdims=0)
        if w is not None:  # normalized by the summed weights of the non-ignored targets
            safe_t = ctx.op("Where", [ignored, ctx.const(0, torch.int64), tv])
            tw = ctx.op("Gather", [ctx.v(w), safe_t], axis=0)
            tw = ctx.op("Where", [ignored, ctx.const(0.0, dt), tw])
            denom = ctx.op("ReduceSum", [tw], keepdims=0)
        else:
            kept = ctx.op("Cast", [ctx.op("Not", [ignored])], to=TORCH_TO_ONNX[dt])
            denom = ctx.op("ReduceSum", [kept], keepdims=0)
        smooth = ctx.op("Div", [total, denom])
    return ctx.op("Mul", [smooth, ctx.const(eps / c, dt)])


def _ce_probabilities(ctx, xv, tv, w, red, eps, c, dt, unbatched):
    rank = max(ctx.rank(ctx.current.args[0]), 2)
    if eps > 0:
        tv = ctx.op("Add", [ctx.op("Mul", [tv, ctx.const(1.0 - eps, dt)]),
                            ctx.const(eps / c, dt)])
    prod = ctx.op("Mul", [ctx.op("LogSoftmax", [xv], axis=1), tv])
    if w is not None:
        prod = ctx.op("Mul", [prod, _class_weight_bcast(ctx, w, rank)])
    per = ctx.op("Neg", [ctx.op("ReduceSum", [prod, ctx.ints([1])], keepdims=0)])
    if red == "none":
        return ctx.op("Squeeze", [per, ctx.ints([0])]) if unbatched else per
    if red == "sum":
        return ctx.op("ReduceSum", [per], keepdims=0)
    return ctx.op("ReduceMean", [per], keepdims=0)


@lowers(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default,
        aten.nll_loss.default, aten.nll_loss_nd.default)
def _nll_loss(ctx, node, a):
    x, t, w = a["self"], a["target"], a["weight"]
    ins = [ctx.v(x), ctx.tensor(t, torch.int64)] + ([ctx.v(w)] if w is not None else [])
    loss = ctx.op("NegativeLogLikelihoodLoss", ins, reduction=_REDUCTION[a["reduction"]],
                  ignore_index=int(a["ignore_index"]))
    if node.target in (aten.nll_loss.default, aten.nll_loss_nd.default):
        return loss
    return loss, None  # total_weight: nothing may use it


@lowers(aten.scaled_dot_product_attention.default)
def _sdpa(ctx, node, a):
    """softmax(q k^T * scale + mask) v, written out; training dropout uses a torch mask."""
    q, k, v = a["query"], a["key"], a["value"]
    if a.get("enable_gqa"):
        raise LoweringError("scaled_dot_product_attention with enable_gqa is not supported")
    dt = ctx.dtype(q)
    e = ctx.shape(q)[-1]
    rank = ctx.rank(k)
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(e)
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    kt = ctx.op("Transpose", [ctx.v(k)], perm=perm)
    s = ctx.op("Mul", [ctx.op("MatMul", [ctx.v(q), kt]), ctx.const(scale, dt)])
    neg_inf = ctx.const(float("-inf"), dt)
    if a["is_causal"]:
        ql, kl = ctx.shape(q)[-2], ctx.shape(k)[-2]
        if not (isinstance(ql, int) and isinstance(kl, int)):
            raise LoweringError("causal attention with symbolic sequence lengths")
        causal = ctx.const(torch.ones(ql, kl, dtype=torch.bool).tril())
        s = ctx.op("Where", [causal, s, neg_inf])
    mask = a["attn_mask"]
    if mask is not None:
        if ctx.dtype(mask) == torch.bool:
            s = ctx.op("Where", [ctx.v(mask), s, neg_inf])
        else:
            s = ctx.op("Add", [s, ctx.tensor(mask, dt)])
    p = ctx.op("Softmax", [s], axis=-1)
    drop = float(a["dropout_p"])
    if drop > 0 and ctx.train:
        scores_shape = torch.broadcast_shapes(tuple(ctx.shape(q)[:-1]) + (ctx.shape(k)[-2],))
        p = ctx.op("Mul", [p, dropout_mask_input(ctx, scores_shape, drop, dt)])
    return ctx.op("MatMul", [p, ctx.v(v)])

