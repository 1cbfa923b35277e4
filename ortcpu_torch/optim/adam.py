"""Adam (L2 weight decay) on native multi-tensor kernels."""

from __future__ import annotations

from ._adam_base import AdamBase
from ._base import torch_flags


class Adam(AdamBase):
    r"""Drop-in for ``torch.optim.Adam``: same defaults, results and state dict.

    Weight decay is L2 (added to the gradient), not decoupled:

    .. math::
        g &\leftarrow g + \lambda w \\
        m &\leftarrow \beta_1 m + (1-\beta_1) g,\quad v \leftarrow \beta_2 v + (1-\beta_2) g^2 \\
        w &\leftarrow w - \frac{\eta}{1-\beta_1^t}\,
              \frac{m}{\sqrt{\hat v}/\sqrt{1-\beta_2^t} + \epsilon}

    with :math:`\hat v` the running max of :math:`v` when ``amsgrad``. ``max_grad_norm``
    and ``master_weights`` as in :class:`AdamW`.
    """

    _name = "Adam"
    _decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, *,
                 amsgrad=False, maximize=False, max_grad_norm=None, master_weights=False,
                 foreach=None, capturable=False, differentiable=False, fused=None):
        torch_flags(self._name, foreach, capturable, differentiable, fused)
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize, "torch",
                         True, max_grad_norm, master_weights)
