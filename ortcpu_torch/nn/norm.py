"""``torch.nn``-compatible normalization, loss and dropout modules on ortcpu_torch kernels.

Each subclasses the torch module it replaces: same constructor arguments, attributes,
parameters, buffers (``running_mean``, ``running_var``, ``num_batches_tracked``) and
state_dict keys, so checkpoints load across and ``isinstance`` checks still pass; only
``forward`` runs on ORT's kernels.
"""

from __future__ import annotations

import torch

from .. import ops


class LayerNorm(torch.nn.LayerNorm):
    """Drop-in for ``torch.nn.LayerNorm(normalized_shape, eps, elementwise_affine, bias)``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.RMSNorm):
    """Drop-in for ``torch.nn.RMSNorm(normalized_shape, eps=None, elementwise_affine)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.normalized_shape, self.weight, self.eps)


class _BatchNormMixin:
    """torch's _BatchNorm.forward bookkeeping (momentum / cumulative average,
    num_batches_tracked), with the kernels of ``ops.batch_norm``.

    ``unbiased_running_var`` (attribute, default True as in torch): set False for ORT's
    BatchNormInternal rule (biased batch variance in the running estimate)."""

    unbiased_running_var = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"{type(self).__name__}: input must be a torch.Tensor, got "
                            f"{type(input).__name__}")
        self._check_input_dim(input)
        momentum = 0.0 if self.momentum is None else self.momentum
        counted = self.training and self.track_running_stats and \
            self.num_batches_tracked is not None
        if counted:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked)
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        try:
            return ops.batch_norm(
                input,
                self.running_mean if track else None,
                self.running_var if track else None,
                self.weight, self.bias, use_batch, momentum, self.eps,
                unbiased_running_var=self.unbiased_running_var,
            )
        except BaseException:
            if counted:  # the call did not happen (and wrap's fallback to torch counts it)
                self.num_batches_tracked.sub_(1)
            raise


class BatchNorm1d(_BatchNormMixin, torch.nn.BatchNorm1d):
    """Drop-in for ``torch.nn.BatchNorm1d`` ([N, C] or [N, C, L])."""


class BatchNorm2d(_BatchNormMixin, torch.nn.BatchNorm2d):
    """Drop-in for ``torch.nn.BatchNorm2d`` ([N, C, H, W])."""


class BatchNorm3d(_BatchNormMixin, torch.nn.BatchNorm3d):
    """Drop-in for ``torch.nn.BatchNorm3d`` ([N, C, D, H, W])."""


class CrossEntropyLoss(torch.nn.CrossEntropyLoss):
    """Drop-in for ``torch.nn.CrossEntropyLoss(weight, size_average, ignore_index, reduce,
    reduction, label_smoothing)``."""

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ops.cross_entropy(input, target, self.weight, self.ignore_index, self.reduction,
                                 self.label_smoothing)


class Dropout(torch.nn.Dropout):
    """Drop-in for ``torch.nn.Dropout(p, inplace)``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.dropout(input, self.p, self.training, self.inplace)
