"""GEMM front ends on OpenBLAS, only the gradients autograd asks for computed:

- ``linear`` (``torch.nn.functional.linear``'s signature; ``addmm`` for the [in, out]
  weight layout of ``torch.addmm`` / Hugging Face's ``Conv1D``) on the Gemm kernel's core
  (``kernels.gemm.gemm``): forward ``Y = X·Wᵀ + b``; backward ``dX = dY·W``, ``dW = dYᵀ·X``
  and ``db`` = the column sums of dY (accumulated in double);
- ``matmul`` (``torch.matmul`` for the shapes attention and MLP code use) on a batched
  GEMM that reads transposed operands in place (``k.transpose(-2, -1)`` is not copied).
"""

from __future__ import annotations

import functools
import math

import torch

from .._native.arena import reshaped
from ..kernels import gemm as KG
from ..kernels import tensor as KT
from ..kernels._checks import (
    SignatureCache,
    bool_arg,
    checked_signature,
    float_attr,
    float_check,
    same_dtype,
)
from .activations import once_differentiable


class _Linear(torch.autograd.Function):
    """``Y = X·Wᵀ + b`` (``w_in_out=False``: W is [out, in], torch.nn.Linear) or
    ``Y = X·W + b`` (``w_in_out=True``: W is [in, out], ``torch.addmm`` / HF Conv1D).
    The arguments were checked by the caller (``_check_operands`` and the shape checks)."""

    @staticmethod
    def forward(ctx, x, weight, bias, w_in_out: bool = False, op: str = "linear"):
        x2 = (x if x.dim() == 2 else x.reshape(x.shape[:-1].numel(), x.shape[-1])).contiguous()
        w = weight.contiguous()
        if bias is not None:
            bias = bias.contiguous()
        y = KG.gemm(x2, w, bias, trans_b=not w_in_out, op=op)
        ctx.save_for_backward(x2, w)
        ctx.x_shape, ctx.has_bias, ctx.w_in_out, ctx.op = x.shape, bias is not None, \
            w_in_out, op
        return y if x.dim() == 2 else reshaped(y, (*x.shape[:-1], y.shape[1]))

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x2, weight = ctx.saved_tensors
        op, t = ctx.op, ctx.w_in_out
        n_out = weight.shape[1] if t else weight.shape[0]
        # dy comes in the output's shape and dtype (autograd casts it): not checked again;
        # made contiguous once, for both GEMMs
        dy2 = (dy if dy.dim() == 2 else dy.reshape(x2.shape[0], n_out)).contiguous()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = KG.gemm(dy2, weight, trans_b=t, op=op)
            if len(ctx.x_shape) != 2:
                dx = dx.view(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            dw = KG.gemm(x2, dy2, trans_a=True, op=op) if t else \
                KG.gemm(dy2, x2, trans_a=True, op=op)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = KT.sum_axis(dy2, 0, op, keepdim=False)
        return dx, dw, db, None, None


def _check_operands(op: str, names: tuple, tensors: tuple) -> None:
    """Dense CPU float tensors of one dtype (``None`` allowed for the last), or a
    TypeError naming the argument."""
    first = None
    for name, t in zip(names, tensors, strict=True):
        if t is None and name == names[-1]:
            continue
        float_check(op, name, t)
        if first is None:
            first = (name, t)
        else:
            same_dtype(op, first[0], first[1], name, t)


_LINEAR_CHECKED = SignatureCache()


def linear(input: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """Like ``torch.nn.functional.linear``: ``input`` [..., in_features], ``weight``
    [out_features, in_features], ``bias`` [out_features] or None; float32 or float64."""
    key = checked_signature(input, weight, bias)
    if key not in _LINEAR_CHECKED:
        _check_linear(input, weight, bias)
        _LINEAR_CHECKED.add(key)
    return _Linear.apply(input, weight, bias)


def _check_linear(input, weight, bias) -> None:
    op = "linear"
    for name, t in (("input", input), ("weight", weight), ("bias", bias)):
        if not isinstance(t, torch.Tensor) and (t is not None or name != "bias"):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if weight.dim() != 2:
        raise ValueError(f"{op}: weight must be 2-D [out_features, in_features], got shape "
                         f"{list(weight.shape)}")
    if input.dim() < 1 or input.shape[-1] != weight.shape[1]:
        raise ValueError(f"{op}: input's last dim must be in_features={weight.shape[1]}, got "
                         f"shape {list(input.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"{op}: bias must have shape [{weight.shape[0]}], got "
                         f"{list(bias.shape)}")
    _check_operands(op, ("input", "weight", "bias"), (input, weight, bias))


def addmm(input: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta=1, alpha=1):
    """Like ``torch.addmm`` with ``beta = alpha = 1`` and ``input`` a bias over the columns
    ([n] or [1, n]): ``mat1 [m, k] · mat2 [k, n] + input``, the GEMM of Hugging Face's
    ``Conv1D``; float32 or float64. Other ``beta``/``alpha`` or a full [m, n] ``input``
    raise ValueError (``wrap`` then runs torch's)."""
    op = "addmm"
    for name, t in (("input", input), ("mat1", mat1), ("mat2", mat2)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if beta != 1 or alpha != 1:
        raise ValueError(f"{op}: only beta=1 and alpha=1 are implemented, got beta={beta!r}, "
                         f"alpha={alpha!r}")
    if mat1.dim() != 2 or mat2.dim() != 2 or mat1.shape[1] != mat2.shape[0]:
        raise ValueError(f"{op}: mat1 [m, k] and mat2 [k, n] expected, got "
                         f"{list(mat1.shape)} and {list(mat2.shape)}")
    n = mat2.shape[1]
    if tuple(input.shape) not in ((n,), (1, n)):
        raise ValueError(f"{op}: input must be a bias of shape [{n}] or [1, {n}], got "
                         f"{list(input.shape)}")
    _check_operands(op, ("mat1", "mat2", "input"), (mat1, mat2, input))
    return _Linear.apply(mat1, mat2, input.reshape(n), True, op)


_FLOATS = (torch.float32, torch.float64)


def _base(t: torch.Tensor, batch: int) -> tuple[torch.Tensor, bool]:
    """``(b, transposed)`` with ``b`` a contiguous ``[batch, *, *]`` tensor such that
    op(b[i]) is matrix i of ``t``; a transposed view of contiguous data is not copied."""
    r, c = t.shape[-2], t.shape[-1]
    if t.is_contiguous():
        return t.reshape(batch, r, c), False
    tt = t.transpose(-2, -1)
    if tt.is_contiguous():
        return tt.reshape(batch, c, r), True
    return t.contiguous().reshape(batch, r, c), False


class _BatchedMatMul(torch.autograd.Function):
    """``a [..., m, k] @ b [..., k, n]`` with equal batch dims, each operand read in place
    where BLAS can (the head-split and transposed views attention code passes: no copies),
    forward and backward (``dA = dY·Bᵀ``, ``dB = Aᵀ·dY`` on views of the saved operands)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return KG.bmm_strided("matmul", a, b)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        a, b = ctx.saved_tensors
        da = db = None
        if ctx.needs_input_grad[0]:
            da = KG.bmm_strided("matmul", dy, b.transpose(-2, -1))
        if ctx.needs_input_grad[1]:
            db = KG.bmm_strided("matmul", a.transpose(-2, -1), dy)
        return da, db


class _MatMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        if b.dim() == 2:  # [..., m, k] @ [k, n]: one GEMM over the flattened rows
            a3, ta = _base(a, 1) if a.dim() == 2 else (
                a.reshape(1, a.shape[:-1].numel(), a.shape[-1]), False)
            b3, tb = _base(b, 1)
        else:
            batch = a.shape[:-2].numel()
            (a3, ta), (b3, tb) = _base(a, batch), _base(b, batch)
        y = KG.bmm("matmul", a3, b3, ta, tb)
        ctx.save_for_backward(a3, b3)
        ctx.ta, ctx.tb, ctx.a_shape, ctx.b_shape = ta, tb, a.shape, b.shape
        return reshaped(y, (*a.shape[:-1], b.shape[-1]))

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        a3, b3 = ctx.saved_tensors
        m = a3.shape[2] if ctx.ta else a3.shape[1]
        dy3 = dy.reshape(a3.shape[0], m, dy.shape[-1]).contiguous()  # once, for both GEMMs
        da = db = None
        if ctx.needs_input_grad[0]:  # dA = dY . Bᵀ
            da = KG.bmm("matmul", dy3, b3, False, not ctx.tb).view(ctx.a_shape)
        if ctx.needs_input_grad[1]:  # dB = Aᵀ . dY
            db = KG.bmm("matmul", a3, dy3, not ctx.ta, False).view(ctx.b_shape)
        return da, db


def matmul(input: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """Like ``torch.matmul`` for ``[..., m, k] @ [k, n]`` and for two tensors of rank >= 3
    with the same batch dims (``[..., m, k] @ [..., k, n]``, attention's ``q @ kᵀ``);
    float32 or float64. Other shapes (1-D operands, broadcast batch dims) raise
    ValueError — ``wrap`` then runs torch's matmul."""
    op = "matmul"
    for name, t in (("input", input), ("other", other)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if input.dim() < 2 or other.dim() < 2 or (other.dim() > 2 and (
            input.dim() != other.dim() or input.shape[:-2] != other.shape[:-2])):
        raise ValueError(f"{op}: shapes {list(input.shape)} and {list(other.shape)} are not "
                         f"implemented (needs [..., m, k] @ [k, n] or equal batch dims)")
    if input.shape[-1] != other.shape[-2]:
        raise ValueError(f"{op}: inner dims differ: {list(input.shape)} @ {list(other.shape)}")
    if other.dim() > 2 and input.dtype == other.dtype and input.dtype in _FLOATS:
        return _BatchedMatMul.apply(input, other)
    return _MatMul.apply(input, other)


def _causal_bias(L: int, S: int, dtype: torch.dtype, blocks: int = 1) -> torch.Tensor:
    """[blocks * L, S] additive mask of a causal (top-left aligned) attention, ``blocks``
    times the [L, S] one: -inf where j > i, else 0 (torch's math attention adds the same).
    Added in place, it costs no backward pass (a masked_fill's backward is a full pass over
    the scores). Masks up to ``_CACHED_BIAS_ELEMENTS`` are cached per shape (not rebuilt
    per call; read-only by convention); larger ones are built per call."""
    if blocks * L * S <= _CACHED_BIAS_ELEMENTS:
        return _cached_causal_bias(L, S, dtype, blocks)
    return _build_causal_bias(L, S, dtype, blocks)


_CACHED_BIAS_ELEMENTS = 1 << 22  # 16 MB in float32; at most 16 such masks are kept


def _build_causal_bias(L: int, S: int, dtype: torch.dtype, blocks: int) -> torch.Tensor:
    bias = torch.zeros(L, S, dtype=dtype).masked_fill_(
        torch.ones(L, S, dtype=torch.bool).triu_(1), float("-inf"))
    return bias.repeat(blocks, 1) if blocks > 1 else bias


_cached_causal_bias = functools.lru_cache(maxsize=16)(_build_causal_bias)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """Like ``torch.nn.functional.scaled_dot_product_attention`` for [..., L, E] query and
    [..., S, E] key / [..., S, Ev] value, as our GEMMs around our softmax:
    ``softmax(q·kᵀ·scale + mask)·v`` (``scale`` default 1/sqrt(E); ``is_causal``: the
    upper triangle masked; ``attn_mask`` boolean (True = attend) or additive float,
    broadcast to [..., L, S]; ``dropout_p`` applied to the attention weights with our
    dropout; ``enable_gqa``: each group of query heads (dim -3) attends to its key/value
    head, without copies of key and value unless a mask is given). The causal mask is a
    cached additive bias and the scale multiplies the query (no fused kernel yet), so on
    small shapes torch's fused CPU attention can be faster: ``wrap``'s select decides."""
    op = "scaled_dot_product_attention"
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"{op}: {name} must be a tensor of rank >= 2")
    is_causal = bool_arg(op, "is_causal", is_causal)
    enable_gqa = bool_arg(op, "enable_gqa", enable_gqa)
    dropout_p = float_attr(op, "dropout_p", dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{op}: dropout_p must be in [0, 1), got {dropout_p}")
    if scale is not None:
        scale = float_attr(op, "scale", scale)
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"{op}: attn_mask must be a tensor or None, got "
                        f"{type(attn_mask).__name__}")
    if is_causal and attn_mask is not None:
        raise ValueError(f"{op}: attn_mask and is_causal cannot both be set")
    if enable_gqa and query.dim() >= 3 and key.dim() >= 3 and \
            key.shape[-3] != query.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        if rep * key.shape[-3] != query.shape[-3]:
            raise ValueError(f"{op}: query heads {query.shape[-3]} are not a multiple of key "
                             f"heads {key.shape[-3]}")
        if attn_mask is None and dropout_p == 0.0:
            from .attention import grouped

            out = grouped(query, key, value, _scale(query, scale), is_causal, rep)
            if out is not None:
                return out
        if attn_mask is None:
            # the queries of the `rep` heads that share a key/value head, stacked along L
            # (head h reads key head h // rep): one GEMM per key head, no copies of key
            # and value; the causal mask repeats per stacked block of L rows
            *bdims, heads, L, _ = query.shape
            out = _attention(query.reshape(*bdims, key.shape[-3], rep * L, query.shape[-1]),
                             key, value, scale, is_causal, rep, None, dropout_p, op)
            return out.reshape(*bdims, heads, L, out.shape[-1])
        key = key.repeat_interleave(rep, dim=-3)
        value = value.repeat_interleave(rep, dim=-3)
    return _attention(query, key, value, scale, is_causal, 1, attn_mask, dropout_p, op)


def _scale(query, scale) -> float:
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)


def _attention(query, key, value, scale, is_causal: bool, blocks: int, attn_mask,
               dropout_p: float, op: str):
    """softmax(q·kᵀ·scale + mask)·v on checked arguments; with ``blocks`` > 1 the rows of
    q are ``blocks`` stacked blocks of the same queries' positions (grouped heads), each
    masked causally on its own."""
    from .activations import softmax
    from .dropout import dropout

    if query.shape[:-2] != key.shape[:-2] or key.shape[:-2] != value.shape[:-2]:
        raise ValueError(f"{op}: batch dims differ: {list(query.shape)}, {list(key.shape)}, "
                         f"{list(value.shape)} (broadcast batch dims are not implemented)")
    s = _scale(query, scale)
    if dropout_p == 0.0 and blocks == 1:
        from .attention import fused_attention

        out = fused_attention(query, key, value, s, is_causal, attn_mask)
        if out is not None:
            return out
    # the scale on the query, the smaller operand: its backward pass reads [.., L, E],
    # not the [.., L, S] scores
    scores = matmul(query * s, key.transpose(-2, -1))
    L, S = scores.shape[-2], scores.shape[-1]
    if attn_mask is not None:
        try:
            torch.broadcast_shapes(attn_mask.shape, scores.shape)
        except RuntimeError:
            raise ValueError(f"{op}: attn_mask of shape {list(attn_mask.shape)} does not "
                             f"broadcast to the scores' {list(scores.shape)}") from None
    if is_causal:
        # in place on our GEMM's fresh output (its backward does not read it)
        scores = scores.add_(_causal_bias(L // blocks, S, scores.dtype, blocks))
    elif attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    p = softmax(scores, -1)
    if dropout_p > 0.0:
        p = dropout(p, dropout_p, True)
    return matmul(p, value)
