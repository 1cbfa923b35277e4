"""Swap an existing torch optimizer for ours, keeping its groups and state."""

from __future__ import annotations

import torch

from .adam import Adam
from .adamw import AdamW
from .sgd import SGD

_IMPL_KEYS = ("foreach", "fused", "capturable", "differentiable", "decoupled_weight_decay")


def from_torch(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The ``ortcpu_torch.optim`` equivalent of a ``torch.optim.AdamW`` / ``Adam`` / ``SGD``
    (our own optimizers are returned unchanged): the same parameter groups and
    hyper-parameters, and its state (steps, moments, momentum buffers) loaded through
    ``load_state_dict``, so training continues where it was. Hooks registered on the
    torch optimizer are not carried over. Other optimizer classes raise ``TypeError``."""
    if isinstance(optimizer, (AdamW, Adam, SGD)):
        return optimizer
    kind = type(optimizer)
    if kind is torch.optim.AdamW or (kind is torch.optim.Adam and any(
            g.get("decoupled_weight_decay", False) for g in optimizer.param_groups)):
        cls = AdamW
    elif kind is torch.optim.Adam:
        cls = Adam
    elif kind is torch.optim.SGD:
        cls = SGD
    else:
        raise TypeError(f"from_torch: no native equivalent of {kind.__module__}."
                        f"{kind.__qualname__} (supported: torch.optim.AdamW, Adam, SGD)")
    groups = [{k: v for k, v in g.items() if k not in _IMPL_KEYS}
              for g in optimizer.param_groups]
    ours = cls(groups, lr=groups[0]["lr"]) if cls is SGD else cls(groups)
    ours.load_state_dict(optimizer.state_dict())
    return ours
