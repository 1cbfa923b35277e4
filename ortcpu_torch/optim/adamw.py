"""AdamW on native multi-tensor kernels (ORT's AdamWOptimizer, spec §12.4)."""

from __future__ import annotations

from ._adam_base import AdamBase
from ._base import torch_flags


class AdamW(AdamBase):
    r"""Drop-in for ``torch.optim.AdamW``: same defaults, results, param groups and state
    dict (``step``, ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``).

    Per parameter, with :math:`g` the gradient (negated if ``maximize``, multiplied by the
    clip coefficient when ``max_grad_norm`` is set) and :math:`t` the step:

    ``mode="torch"`` (ORT adam_mode 0):

    .. math::
        w &\leftarrow w\,(1 - \eta\lambda) \\
        m &\leftarrow \beta_1 m + (1-\beta_1) g,\quad v \leftarrow \beta_2 v + (1-\beta_2) g^2 \\
        \hat v &= \max(\hat v, v) \text{ if amsgrad else } v \\
        w &\leftarrow w - \frac{\eta}{1-\beta_1^t}\,
              \frac{m}{\sqrt{\hat v}/\sqrt{1-\beta_2^t} + \epsilon}

    ``mode="hf"`` (HuggingFace, ORT adam_mode 1): :math:`w \leftarrow w - \eta
    \frac{\sqrt{1-\beta_2^t}}{1-\beta_1^t} \frac{m}{\sqrt{\hat v}+\epsilon}`, then
    :math:`w \leftarrow w - \eta\lambda w`; ``correct_bias=False`` drops both corrections.

    Extras beyond torch's signature:

    - ``max_grad_norm``: clip by the global L2 norm of all gradients inside ``step()``
      (coefficient ``min(max_norm / (norm + 1e-6), 1)``, as ``clip_grad_norm_``) without
      rewriting the gradients: one read of the gradients for the norm, and the update
      applies the coefficient as it reads them. ``p.grad`` is left unclipped; the norm
      before clipping is kept in ``last_grad_norm``.
    - ``master_weights``: float16/bfloat16 parameters are updated in float32 on a float32
      master copy (``state["master_param"]``) and rounded back; without it such
      parameters raise ``TypeError``.
    - ``foreach``/``fused`` are accepted and ignored (every step is one fused native call
      per group); ``capturable``/``differentiable`` must stay False.

    One native call updates each parameter group (per dtype and step value).
    """

    _name = "AdamW"
    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *,
                 amsgrad=False, maximize=False, mode="torch", correct_bias=True,
                 max_grad_norm=None, master_weights=False, foreach=None,
                 capturable=False, differentiable=False, fused=None):
        torch_flags(self._name, foreach, capturable, differentiable, fused)
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize, mode,
                         correct_bias, max_grad_norm, master_weights)
