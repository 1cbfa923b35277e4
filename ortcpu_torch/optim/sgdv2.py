"""SGDv2: ORT's SGDOptimizerV2 (plain w -= lr·g) as a torch optimizer."""

from __future__ import annotations

from ._base import check_lr
from .sgd import SGD


class SGDv2(SGD):
    r"""ONNX Runtime's ``SGDOptimizerV2``: :math:`w \leftarrow w - \eta g` for every
    parameter, no momentum or weight decay; one native call per parameter group.
    ``max_grad_norm`` and ``master_weights`` as in :class:`SGD`."""

    _name = "SGDv2"

    def __init__(self, params, lr=1e-3, *, max_grad_norm=None, master_weights=False):
        check_lr(lr)
        super().__init__(params, lr=lr, max_grad_norm=max_grad_norm,
                         master_weights=master_weights)
