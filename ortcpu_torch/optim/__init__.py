"""Optimizers on ONNX Runtime's optimizer kernels, as drop-in ``torch.optim`` classes.

``AdamW``, ``Adam``, ``SGD`` are ``torch.optim.Optimizer`` subclasses with torch's
arguments, defaults, results and state-dict keys; ``SGDv2`` is ORT's SGDOptimizerV2.
Every step is one native multi-tensor call per parameter group; ``max_grad_norm=``
fuses global-norm clipping into the step. ``clip_grad_norm_`` mirrors
``torch.nn.utils.clip_grad_norm_``. Learning-rate schedulers from ``torch.optim``
work unchanged (hyper-parameters are re-read from ``param_groups`` at every step).
``from_torch(opt)`` turns an existing torch AdamW/Adam/SGD into ours, state included.
"""

from .adam import Adam
from .adamw import AdamW
from .clip_grad import clip_grad_norm_
from .convert import from_torch
from .sgd import SGD
from .sgdv2 import SGDv2

__all__ = ["AdamW", "Adam", "SGD", "SGDv2", "clip_grad_norm_", "from_torch"]
