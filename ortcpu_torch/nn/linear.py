"""``torch.nn.Linear`` drop-in whose forward runs ``ops.linear`` (the ``Gemm`` kernel)."""

from __future__ import annotations

import torch

from .. import ops


class Linear(torch.nn.Linear):
    """Drop-in for ``torch.nn.Linear`` (same constructor, initialisation, state_dict keys)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.linear(input, self.weight, self.bias)
