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


_OP = "scaled_dot_product_attention"


def _t(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-2, -1)


def stacked_queries(query, rep: int):
    """``query`` as the GEMMs read it: with grouped heads (``rep`` > 1) the ``rep`` query
    heads of one key/value head stacked along L (a view), else ``query`` itself."""
    if rep == 1:
        return query
    *bdims, heads, L, E = query.shape
    return query.reshape(*bdims, heads // rep, rep * L, E)


def attention_forward(query, k, v, mask, mask_rows: int, add, scale: float, rep: int = 1):
    """``(out, q, p)``: the attention output in ``query``'s head layout, the query as the
    GEMMs read it (``stacked_queries``) and the attention weights P; the arguments as
    ``_Attention`` takes them."""
    q = stacked_queries(query, rep)
    scores = KG.bmm_strided(_OP, q, _t(k))
    kscale = scale
    if add is not None:
        scores.mul_(scale).add_(add)
        kscale = 1.0
    p = KA.masked_softmax_core(_OP, scores, mask, mask_rows, kscale, float("-inf"))
    del scores
    out = KG.bmm_strided(_OP, p, v)
    if rep > 1:
        out = reshaped(out, (*query.shape[:-1], out.shape[-1]))
    return out, q, p


def attention_backward(dout, q, k, v, p, mask, mask_rows: int, scale: float, query_shape,
                       need):
    """``(dq, dk, dv)`` of ``attention_forward`` (None where ``need`` says no); ``q`` as
    the forward returned it, ``query_shape`` the caller's query shape when heads were
    grouped, else None."""
    dq = dk = dv = None
    need_q, need_k, need_v = need
    if query_shape is not None:
        dout = dout.reshape(*q.shape[:-1], dout.shape[-1])
    if need_v:
        dv = KG.bmm_strided(_OP, _t(p), dout)
    if need_q or need_k:
        dp = KG.bmm_strided(_OP, dout, _t(v))
        ds = KA.masked_softmax_grad_core(_OP, dp, p, mask, mask_rows, scale)
        del dp
        if need_q:
            dq = KG.bmm_strided(_OP, ds, k)
            if query_shape is not None:
                dq = dq.view(query_shape)
        if need_k:
            dk = KG.bmm_strided(_OP, _t(ds), q)
    return dq, dk, dv


class _Attention(torch.autograd.Function):
    """``q`` [..., L, E], ``k`` [..., S, E], ``v`` [..., S, Ev] with equal batch dims;
    ``mask``: None or contiguous uint8 rows (1 = masked) repeating every ``mask_rows``
    rows of the scores; ``add``: None or an additive float mask broadcast to the
    scores (then ``mask`` is None). Arguments checked by the caller."""

    @staticmethod
    def forward(ctx, query, k, v, mask, mask_rows: int, add, scale: float, rep: int = 1):
        out, q, p = attention_forward(query, k, v, mask, mask_rows, add, scale, rep)
        ctx.save_for_backward(q, k, v, p)
        ctx.mask, ctx.mask_rows, ctx.scale = mask, mask_rows, scale
        ctx.query_shape = query.shape if rep > 1 else None
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, p = ctx.saved_tensors
        dq, dk, dv = attention_backward(dout, q, k, v, p, ctx.mask, ctx.mask_rows, ctx.scale,
                                        ctx.query_shape, ctx.needs_input_grad[:3])
        return dq, dk, dv, None, None, None, None, None


def fusable(query, key, value, attn_mask) -> bool:
    """Whether one fused node takes these operands: one dtype, equal batch dims, and a
    mask that needs no gradient and broadcasts to the scores (boolean, or additive in the
    queries' dtype)."""
    S = key.shape[-2]
    if query.dtype != key.dtype or key.dtype != value.dtype or \
            query.shape[:-2] != key.shape[:-2] or key.shape[:-2] != value.shape[:-2] or \
            query.shape[-1] != key.shape[-1] or value.shape[-2] != S:
        return False
    if attn_mask is None:
        return True
    scores_shape = (*query.shape[:-1], S)
    try:
        if torch.broadcast_shapes(attn_mask.shape, scores_shape) != scores_shape:
            return False
    except RuntimeError:
        return False
    return attn_mask.dtype == torch.bool or \
        (attn_mask.dtype == query.dtype and not attn_mask.requires_grad)


def mask_operands(query, key, is_causal: bool, attn_mask):
    """``(mask, mask_rows, add)`` of ``_Attention`` for operands ``fusable`` takes."""
    L, S = query.shape[-2], key.shape[-2]
    if is_causal:
        return causal_mask(L, S), L, None
    if attn_mask is None:
        return None, 1, None
    if attn_mask.dtype != torch.bool:
        return None, 1, attn_mask
    if attn_mask.shape[-2:].numel() == attn_mask.numel():  # no batch dims
        mask = (~attn_mask).reshape(attn_mask.shape[-2:]).expand(L, S)
        rows = L
    else:
        scores_shape = (*query.shape[:-1], S)
        mask = (~attn_mask).expand(scores_shape)
        rows = math.prod(scores_shape[:-1])
    return mask.contiguous().view(torch.uint8), rows, None


def fused_attention(query, key, value, scale, is_causal: bool, attn_mask):
    """``softmax(q·kᵀ·scale + mask)·v`` as one node, or None where the unfused path must
    run (``fusable``)."""
    if not fusable(query, key, value, attn_mask):
        return None
    mask, mask_rows, add = mask_operands(query, key, is_causal, attn_mask)
    return _Attention.apply(query, key, value, mask, mask_rows, add, float(scale))


def grouped_fusable(query, key, value) -> bool:
    """Whether ``grouped`` takes these operands (one dtype, equal batch dims above the
    heads)."""
    return query.dtype == key.dtype == value.dtype and \
        query.shape[:-3] == key.shape[:-3] and key.shape[:-2] == value.shape[:-2] and \
        query.shape[-1] == key.shape[-1]


def grouped(query, key, value, scale, is_causal: bool, rep: int):
    """Grouped-query attention without copies of key and value: the queries of the
    ``rep`` heads sharing a key/value head stacked along L (one GEMM per key head); the
    causal mask repeats per stacked block. None where the unfused path must run."""
    if not grouped_fusable(query, key, value):
        return None
    mask, mask_rows, _ = mask_operands(query, key, is_causal, None)
    return _Attention.apply(query, key, value, mask, mask_rows, None, float(scale), rep)
