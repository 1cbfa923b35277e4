"""``ortcpu::attention`` / ``attention_backward``: ``scaled_dot_product_attention`` as our
fused attention (``ops/attention.py``: two strided batched GEMMs around the masked,
scaled softmax kernel; four GEMMs around its gradient) inside a compiled graph.
Registered by importing ``ops.library``; same conventions (fake shapes, an autograd
formula, fresh outputs).

``attention(query, key, value, attn_mask?, is_causal, scale, rep) -> (out, p)``: ``rep``
> 1 is grouped-query attention (``rep`` query heads per key/value head, no mask); ``p``
(the attention weights, as the GEMMs read the queries: grouped heads stacked along L) is
what the backward reads besides the operands. Callers pass operands ``fusable`` /
``grouped_fusable`` accepts; the masks are rebuilt from ``attn_mask``/``is_causal`` in
the backward op (the causal one is cached), not carried as graph values.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor
from torch.library import register_fake

from .attention import attention_backward as _backward
from .attention import attention_forward, mask_operands, stacked_queries
from .library import TRACED, _autograd, _grads, _nothing, _op, _qualified


def _scores_shape(query, key, rep):
    return (*stacked_queries(query, rep).shape[:-1], key.shape[-2])


@_op("attention")
def attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None,
              is_causal: bool, scale: float, rep: int) -> tuple[Tensor, Tensor]:
    """(out, p) of ``softmax(query·keyᵀ·scale + mask)·value``."""
    mask, rows, add = mask_operands(query, key, is_causal, attn_mask)
    out, _q, p = attention_forward(query, key, value, mask, rows, add, scale, rep)
    return out, p


@register_fake(_qualified("attention"))
def _(query, key, value, attn_mask, is_causal, scale, rep):
    TRACED["attention"] += 1
    return (query.new_empty((*query.shape[:-1], value.shape[-1])),
            query.new_empty(_scores_shape(query, key, rep)))


@_op("attention_backward")
def attention_backward(dout: Tensor, query: Tensor, key: Tensor, value: Tensor, p: Tensor,
                       attn_mask: Tensor | None, is_causal: bool, scale: float, rep: int,
                       mask: Sequence[bool]) -> tuple[Tensor, Tensor, Tensor]:
    """(dquery, dkey, dvalue); the ones ``mask`` does not ask for are empty."""
    rows_mask, rows, _add = mask_operands(query, key, is_causal, attn_mask)
    q = stacked_queries(query, rep)
    g = _backward(dout.contiguous(), q, key, value, p, rows_mask, rows, scale,
                  query.shape if rep > 1 else None, tuple(mask))
    return tuple(t if t is not None else _nothing(query) for t in g)


@register_fake(_qualified("attention_backward"))
def _(dout, query, key, value, p, attn_mask, is_causal, scale, rep, mask):
    return tuple(t.new_empty(t.shape) if m else _nothing(query)
                 for t, m in zip((query, key, value), mask, strict=True))


def _setup(ctx, inputs, output):
    query, key, value, attn_mask, is_causal, scale, rep = inputs
    ctx.save_for_backward(query, key, value, output[1], attn_mask)
    ctx.args = (is_causal, scale, rep)


def _bwd(ctx, dout, _dp):
    query, key, value, p, attn_mask = ctx.saved_tensors
    mask = list(ctx.needs_input_grad[:3])
    g = attention_backward(dout, query, key, value, p, attn_mask, *ctx.args, mask)
    return (*_grads(mask, *g), None, None, None, None)


_autograd(attention, _bwd, setup_context=_setup)
