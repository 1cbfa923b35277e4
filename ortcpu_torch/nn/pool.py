"""``torch.nn``-compatible pooling modules: subclasses of torch's MaxPool1d/2d/3d,
AvgPool1d/2d/3d and AdaptiveAvgPool2d (same constructor arguments and attributes) whose
forward runs ortcpu_torch's MaxPool / AveragePool / GlobalAveragePool kernels."""

from __future__ import annotations

import torch

from .. import ops


class MaxPool1d(torch.nn.MaxPool1d):
    """Drop-in for ``torch.nn.MaxPool1d``."""

    def forward(self, input):
        return ops.max_pool1d(input, self.kernel_size, self.stride, self.padding,
                              self.dilation, self.ceil_mode, self.return_indices)


class MaxPool2d(torch.nn.MaxPool2d):
    """Drop-in for ``torch.nn.MaxPool2d``."""

    def forward(self, input):
        return ops.max_pool2d(input, self.kernel_size, self.stride, self.padding,
                              self.dilation, self.ceil_mode, self.return_indices)


class MaxPool3d(torch.nn.MaxPool3d):
    """Drop-in for ``torch.nn.MaxPool3d``."""

    def forward(self, input):
        return ops.max_pool3d(input, self.kernel_size, self.stride, self.padding,
                              self.dilation, self.ceil_mode, self.return_indices)


class AvgPool1d(torch.nn.AvgPool1d):
    """Drop-in for ``torch.nn.AvgPool1d``."""

    def forward(self, input):
        return ops.avg_pool1d(input, self.kernel_size, self.stride, self.padding,
                              self.ceil_mode, self.count_include_pad)


class AvgPool2d(torch.nn.AvgPool2d):
    """Drop-in for ``torch.nn.AvgPool2d``."""

    def forward(self, input):
        return ops.avg_pool2d(input, self.kernel_size, self.stride, self.padding,
                              self.ceil_mode, self.count_include_pad, self.divisor_override)


class AvgPool3d(torch.nn.AvgPool3d):
    """Drop-in for ``torch.nn.AvgPool3d``."""

    def forward(self, input):
        return ops.avg_pool3d(input, self.kernel_size, self.stride, self.padding,
                              self.ceil_mode, self.count_include_pad, self.divisor_override)


class AdaptiveAvgPool2d(torch.nn.AdaptiveAvgPool2d):
    """Drop-in for ``torch.nn.AdaptiveAvgPool2d`` with output size 1 / (1, 1) (global
    average pooling); other output sizes raise ValueError at construction."""

    def __init__(self, output_size) -> None:
        super().__init__(output_size)
        ok = output_size == 1 or (isinstance(output_size, (tuple, list)) and
                                  len(output_size) == 2 and all(v == 1 for v in output_size))
        if not ok:
            raise ValueError(f"AdaptiveAvgPool2d: only output_size 1 or (1, 1) is supported, "
                             f"got {output_size!r}")

    def forward(self, input):
        return ops.adaptive_avg_pool2d(input, self.output_size)
