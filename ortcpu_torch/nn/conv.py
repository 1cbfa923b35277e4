"""``torch.nn``-compatible convolution modules: subclasses of ``torch.nn.Conv1d/2d/3d``
(same constructor arguments, initialisation, attributes and state_dict keys) whose
forward runs the ``Conv`` / ``ConvGrad`` kernels. Only ``padding_mode='zeros'`` runs;
other modes raise ValueError at construction."""

from __future__ import annotations

import torch

from .. import ops


def _check_mode(cls: str, padding_mode: str) -> None:
    if padding_mode != "zeros":
        raise ValueError(f"{cls}: only padding_mode='zeros' is supported by ortcpu_torch, got "
                         f"{padding_mode!r}")


class Conv1d(torch.nn.Conv1d):
    """Drop-in for ``torch.nn.Conv1d`` (padding_mode 'zeros')."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _check_mode("Conv1d", self.padding_mode)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.conv1d(input, self.weight, self.bias, self.stride, self.padding,
                          self.dilation, self.groups)


class Conv2d(torch.nn.Conv2d):
    """Drop-in for ``torch.nn.Conv2d`` (padding_mode 'zeros')."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _check_mode("Conv2d", self.padding_mode)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.conv2d(input, self.weight, self.bias, self.stride, self.padding,
                          self.dilation, self.groups)


class Conv3d(torch.nn.Conv3d):
    """Drop-in for ``torch.nn.Conv3d`` (padding_mode 'zeros')."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _check_mode("Conv3d", self.padding_mode)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.conv3d(input, self.weight, self.bias, self.stride, self.padding,
                          self.dilation, self.groups)
