"""Autograd functions for the tensor kernels: ``embedding`` (Gather forward, GatherGrad
backward)."""

from __future__ import annotations

import torch

from .._native import empty, ffi, native_fn
from ..kernels import tensor as K
from ..kernels._checks import bool_arg, check_status, get_num_threads
from .activations import once_differentiable


def _fp(t: torch.Tensor):
    return ffi.cast("float *" if t.dtype == torch.float32 else "double *", t.data_ptr())


class _Embedding(torch.autograd.Function):
    """Rows of ``weight`` picked by ``indices`` (contiguous int64, range-checked by the
    caller); float weights call the row gather / scatter-add kernels directly, other
    dtypes take the registry's Gather."""

    @staticmethod
    def forward(ctx, indices, weight, padding_idx):
        if weight.dtype in (torch.float32, torch.float64):
            w = weight if weight.is_contiguous() else weight.contiguous()
            n, d = w.shape
            y = empty((*indices.shape, d), w.dtype)
            st = native_fn("gather_rows", w.dtype)(
                _fp(w), ffi.cast("int64_t *", indices.data_ptr()), _fp(y), 1, n,
                indices.numel(), d, get_num_threads())
            check_status(st, "embedding")
        else:
            y = K.Gather(weight, indices, axis=0)
        ctx.save_for_backward(indices)
        ctx.shape = tuple(weight.shape)
        ctx.padding_idx = padding_idx
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (indices,) = ctx.saved_tensors
        if not ctx.needs_input_grad[1]:
            return None, None, None
        dy = dy if dy.is_contiguous() else dy.contiguous()
        n, d = ctx.shape
        dw = empty((n, d), dy.dtype)
        st = native_fn("scatter_add_rows", dy.dtype)(
            _fp(dy), ffi.cast("int64_t *", indices.data_ptr()), _fp(dw), 1, n,
            indices.numel(), d, get_num_threads())
        check_status(st, "embedding")
        if ctx.padding_idx is not None:
            dw[ctx.padding_idx].zero_()
        return None, dw, None


def embedding(input: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None,
              max_norm: float | None = None, norm_type: float = 2.0,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> torch.Tensor:
    """Like ``torch.nn.functional.embedding``: rows of ``weight`` picked by ``input``
    (int32/int64). An index outside ``[0, num_embeddings)``, negative ones included, raises
    IndexError naming it, as torch does (the registry's ONNX ``Gather`` wraps negative
    indices; this torch-signature front end does not). Backward is ORT's
    GatherGrad (repeated indices accumulate); row ``padding_idx`` gets no gradient.
    ``max_norm``, ``scale_grad_by_freq`` and ``sparse`` are not supported (ValueError)."""
    if max_norm is not None:
        raise ValueError("embedding: max_norm is not supported by ortcpu_torch (it renormalises "
                         "weight in place); use torch.nn.functional.embedding")
    if bool_arg("embedding", "scale_grad_by_freq", scale_grad_by_freq):
        raise ValueError("embedding: scale_grad_by_freq is not supported")
    if bool_arg("embedding", "sparse", sparse):
        raise ValueError("embedding: sparse gradients are not supported")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError("embedding: weight must be a 2-D tensor [num_embeddings, embedding_dim]")
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"embedding: input must be a torch.Tensor, got {type(input).__name__}")
    n = weight.shape[0]
    if padding_idx is not None:
        if isinstance(padding_idx, bool) or not isinstance(padding_idx, int) \
                or not -n <= padding_idx < n:
            raise ValueError(f"embedding: padding_idx must be an int in [{-n}, {n - 1}], "
                             f"got {padding_idx!r}")
        padding_idx %= n
    if input.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"embedding: input must be int32 or int64 indices, got "
                        f"{str(input.dtype).replace('torch.', '')}")
    if input.device.type != "cpu" or weight.device.type != "cpu":
        raise TypeError("embedding: input and weight must be CPU tensors")
    if weight.dtype.is_complex or weight.element_size() not in (4, 8) or \
            weight.layout is not torch.strided:
        raise TypeError(f"embedding: weight dtype {weight.dtype} is not supported "
                        "(float32/float64 or another 4- or 8-byte type)")
    idx = input.to(torch.int64).contiguous()
    _check_rows(idx, n)
    return _Embedding.apply(idx, weight, padding_idx)


def _check_rows(indices: torch.Tensor, n: int) -> None:
    """IndexError naming the first index outside [0, n) and its position (torch:
    "index out of range in self"). One min/max pass in the common, valid case."""
    if indices.numel() == 0:
        return
    lo, hi = torch.aminmax(indices)
    if int(lo) < 0 or int(hi) >= n:
        bad = (indices < 0) | (indices >= n)
        flat = int(torch.nonzero(bad.reshape(-1))[0, 0])
        pos = tuple(int(p) for p in torch.unravel_index(torch.tensor(flat), indices.shape)) \
            if indices.dim() else ()
        raise IndexError(
            f"embedding: input holds index {int(indices.reshape(-1)[flat])} at position "
            f"{pos}, out of range for num_embeddings {n} (valid: [0, {n - 1}]; negative "
            f"indices do not wrap, as in torch.nn.functional.embedding)")
