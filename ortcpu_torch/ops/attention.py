"""Fused attention for ``scaled_dot_product_attention``: one autograd node for
``softmax(q·kᵀ·scale + mask)·v`` whose forward is two strided batched GEMMs around the
masked, scaled softmax kernel (``native/src/attention_train.inc``: the scale, the mask
and the softmax in one pass over the scores) and whose backward is four GEMMs around
that kernel's gradient (SoftmaxGrad, zero where masked, times the scale, in one pass).
Q, K and V are read in place where BLAS can (the head-split, transposed views attention
code makes); the only tensor saved besides them is the attention weights P.

The mask reaches the kernel as uint8 rows (1 = masked) that repeat every ``mask_rows``
rows of the flattened ``[rows, S]`` scores: the causal mask is one cached ``[L, S]``
block (with grouped heads, the stacked query blocks repeat it), a boolean mask without
batch dims is its own ``[L, S]`` block, and a boolean mask with batch dims is expanded
to the scores' shape. An additive float mask is added to the scaled scores in place
(the kernel then scales by 1); its gradient is not computed (``attn_mask`` that
requires a gradient takes the unfused path)."""

from __future__ import annotations

import functools
import math

import torch

from .._native.arena import reshaped
from ..kernels import activations as KA
from ..kernels import gemm as KG
from .activations import once_differentiable


@functools.lru_cache(maxsize=16)
def causal_mask(L: int, S: int) -> torch.Tensor:
    """``[L, S]`` uint8, 1 where key j lies after query i (torch's top-left causal mask;
    cached per shape, read-only)."""
    return torch.ones(L, S, dtype=torch.bool).triu_(1).to(torch.uint8)


def _t(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-2, -1)


class _Attention(torch.autograd.Function):
    """``q`` [..., L, E], ``k`` [..., S, E], ``v`` [..., S, Ev] with equal batch dims;
    ``mask``: None or contiguous uint8 rows (1 = masked) repeating every ``mask_rows``
    rows of the scores; ``add``: None or an additive float mask broadcast to the
    scores (then ``mask`` is None). Arguments checked by the caller."""

    @staticmethod
    def forward(ctx, query, k, v, mask, mask_rows: int, add, scale: float, rep: int = 1):
        q = query
        if rep > 1:  # grouped heads: the `rep` query heads of one key head stacked along L
            *bdims, heads, L, E = query.shape
            q = query.reshape(*bdims, heads // rep, rep * L, E)
        scores = KG.bmm_strided("scaled_dot_product_attention", q, _t(k))
        kscale = scale
        if add is not None:
            scores.mul_(scale).add_(add)
            kscale = 1.0
        p = KA.masked_softmax_core("scaled_dot_product_attention", scores, mask, mask_rows,
                                   kscale, float("-inf"))
        del scores
        out = KG.bmm_strided("scaled_dot_product_attention", p, v)
        ctx.save_for_backward(q, k, v, p)
        ctx.mask, ctx.mask_rows, ctx.scale = mask, mask_rows, scale
        ctx.query_shape = query.shape if rep > 1 else None
        if rep > 1:
            out = reshaped(out, (*query.shape[:-1], out.shape[-1]))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, p = ctx.saved_tensors
        op = "scaled_dot_product_attention"
        dq = dk = dv = None
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        if ctx.query_shape is not None:
            dout = dout.reshape(*q.shape[:-1], dout.shape[-1])
        if need_v:
            dv = KG.bmm_strided(op, _t(p), dout)
        if need_q or need_k:
            dp = KG.bmm_strided(op, dout, _t(v))
            ds = KA.masked_softmax_grad_core(op, dp, p, ctx.mask, ctx.mask_rows, ctx.scale)
            del dp
            if need_q:
                dq = KG.bmm_strided(op, ds, k)
                if ctx.query_shape is not None:
                    dq = dq.view(ctx.query_shape)
            if need_k:
                dk = KG.bmm_strided(op, _t(ds), q)
        return dq, dk, dv, None, None, None, None, None


def fused_attention(query, key, value, scale, is_causal: bool, attn_mask):
    """``softmax(q·kᵀ·scale + mask)·v`` as one node, or None where the unfused path must
    run (a mask that needs a gradient, one that does not broadcast to the scores, a
    dtype mix)."""
    L, S = query.shape[-2], key.shape[-2]
    if query.dtype != key.dtype or key.dtype != value.dtype or \
            query.shape[:-2] != key.shape[:-2] or key.shape[:-2] != value.shape[:-2] or \
            query.shape[-1] != key.shape[-1] or value.shape[-2] != S:
        return None
    mask = add = None
    mask_rows = 1
    if is_causal:
        mask, mask_rows = causal_mask(L, S), L
    elif attn_mask is not None:
        scores_shape = (*query.shape[:-1], S)
        try:
            if torch.broadcast_shapes(attn_mask.shape, scores_shape) != scores_shape:
                return None
        except RuntimeError:
            return None
        if attn_mask.dtype == torch.bool:
            if attn_mask.shape[-2:].numel() == attn_mask.numel():  # no batch dims
                mask = (~attn_mask).reshape(attn_mask.shape[-2:]).expand(L, S)
                mask_rows = L
            else:
                mask = (~attn_mask).expand(scores_shape)
                mask_rows = math.prod(scores_shape[:-1])
            mask = mask.contiguous().view(torch.uint8)
        elif attn_mask.dtype == query.dtype and not attn_mask.requires_grad:
            add = attn_mask
        else:
            return None
    return _Attention.apply(query, key, value, mask, mask_rows, add, float(scale))


def grouped(query, key, value, scale, is_causal: bool, rep: int):
    """Grouped-query attention without copies of key and value: the queries of the
    ``rep`` heads sharing a key/value head stacked along L (one GEMM per key head); the
    causal mask repeats per stacked block. None where the unfused path must run."""
    if query.dtype != key.dtype or key.dtype != value.dtype or \
            query.shape[:-3] != key.shape[:-3] or key.shape[:-2] != value.shape[:-2] or \
            query.shape[-1] != key.shape[-1]:
        return None
    L, S = query.shape[-2], key.shape[-2]
    mask, mask_rows = (causal_mask(L, S), L) if is_causal else (None, 1)
    return _Attention.apply(query, key, value, mask, mask_rows, None, float(scale), rep)
