"""Autograd functions for the tensor kernels: ``embedding`` (Gather forward, GatherGrad
backward)."""

from __future__ import annotations

import torch

from ..kernels import tensor as K
from ..kernels._checks import bool_arg
from .activations import once_differentiable


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, indices, weight, padding_idx):
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
        dw = K.GatherGrad(list(ctx.shape), indices, dy.contiguous(), axis=0)
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
    _check_rows(input, n)
    return _Embedding.apply(input, weight, padding_idx)


def _check_rows(indices: torch.Tensor, n: int) -> None:
    """IndexError naming the first index outside [0, n) and its position (torch:
    "index out of range in self"); dtype errors are left to Gather."""
    if indices.numel() == 0 or indices.dtype not in (torch.int32, torch.int64):
        return
    bad = (indices < 0) | (indices >= n)
    if bool(bad.any()):
        flat = int(torch.nonzero(bad.reshape(-1))[0, 0])
        pos = tuple(int(p) for p in torch.unravel_index(torch.tensor(flat), indices.shape)) \
            if indices.dim() else ()
        raise IndexError(
            f"embedding: input holds index {int(indices.reshape(-1)[flat])} at position "
            f"{pos}, out of range for num_embeddings {n} (valid: [0, {n - 1}]; negative "
            f"indices do not wrap, as in torch.nn.functional.embedding)")
