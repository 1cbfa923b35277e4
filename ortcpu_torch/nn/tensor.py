"""``torch.nn.Embedding`` drop-in: forward Gather, backward ORT's GatherGrad."""

from __future__ import annotations

import torch

from .. import ops


class Embedding(torch.nn.Module):
    """Drop-in for ``torch.nn.Embedding`` (same constructor, ``weight`` parameter,
    ``padding_idx`` row initialised to zero and never receiving gradient). ``max_norm``,
    ``scale_grad_by_freq`` and ``sparse`` raise ValueError."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0,
                 scale_grad_by_freq: bool = False, sparse: bool = False,
                 _weight: torch.Tensor | None = None, _freeze: bool = False, device=None,
                 dtype=None) -> None:
        super().__init__()
        if max_norm is not None:
            raise ValueError("Embedding: max_norm is not supported by ortcpu_torch")
        if scale_grad_by_freq or sparse:
            raise ValueError("Embedding: scale_grad_by_freq and sparse are not supported")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError("Embedding: padding_idx must be within num_embeddings")
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        if _weight is None:
            self.weight = torch.nn.Parameter(
                torch.empty((num_embeddings, embedding_dim), dtype=dtype),
                requires_grad=not _freeze)
            self.reset_parameters()
        else:
            if list(_weight.shape) != [num_embeddings, embedding_dim]:
                raise ValueError("Embedding: _weight shape does not match num_embeddings, "
                                 "embedding_dim")
            self.weight = torch.nn.Parameter(_weight, requires_grad=not _freeze)

    def reset_parameters(self) -> None:
        torch.nn.init.normal_(self.weight)
        if self.padding_idx is not None:
            with torch.no_grad():
                self.weight[self.padding_idx].fill_(0)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.embedding(input, self.weight, self.padding_idx)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, **kwargs):
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx=padding_idx, _weight=embeddings, _freeze=freeze,
                   **kwargs)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s
