"""``torch.nn``-compatible activation modules running on ortcpu_torch kernels."""

from __future__ import annotations

import torch

from .. import ops


class GELU(torch.nn.Module):
    """Drop-in for ``torch.nn.GELU(approximate='none'|'tanh')``."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class LeakyReLU(torch.nn.Module):
    """Drop-in for ``torch.nn.LeakyReLU(negative_slope=0.01, inplace=False)``."""

    def __init__(self, negative_slope: float = 1e-2, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class SiLU(torch.nn.Module):
    """Drop-in for ``torch.nn.SiLU(inplace=False)`` (ORT QuickGelu with alpha 1);
    ``inplace=True`` raises ValueError in forward (``wrap`` runs torch's instead)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.silu(input, self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class ReLU(torch.nn.Module):
    """Drop-in for ``torch.nn.ReLU(inplace=False)``."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.relu(input, self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class _InplaceActivation(torch.nn.Module):
    """An activation module whose only argument is torch's ``inplace`` flag (not shown in
    its repr, as torch's Hardswish / Hardsigmoid do not)."""

    _fn = None

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return type(self)._fn(input, self.inplace)


class Hardsigmoid(_InplaceActivation):
    """Drop-in for ``torch.nn.Hardsigmoid(inplace=False)`` (ONNX HardSigmoid, 1/6, 1/2)."""

    _fn = staticmethod(ops.hardsigmoid)


class Hardswish(_InplaceActivation):
    """Drop-in for ``torch.nn.Hardswish(inplace=False)`` (ONNX HardSwish)."""

    _fn = staticmethod(ops.hardswish)


class Hardtanh(torch.nn.Module):
    """Drop-in for ``torch.nn.Hardtanh(min_val=-1.0, max_val=1.0, inplace=False)``."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0,
                 inplace: bool = False) -> None:
        super().__init__()
        if min_val > max_val:
            raise ValueError(f"Hardtanh: min_val {min_val} is greater than max_val {max_val}")
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}" + \
            (", inplace=True" if self.inplace else "")


class ReLU6(Hardtanh):
    """Drop-in for ``torch.nn.ReLU6(inplace=False)``: ``Hardtanh(0, 6)``, as torch's."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(0.0, 6.0, inplace)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.relu6(input, self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


def _legacy_softmax_dim(ndim: int) -> int:
    # torch.nn.Softmax(dim=None) picks this dim (and warns); kept for drop-in behaviour
    return 0 if ndim in (0, 1, 3) else 1


class _SoftmaxBase(torch.nn.Module):
    _fn = None

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def __setstate__(self, state):
        super().__setstate__(state)
        if not hasattr(self, "dim"):
            self.dim = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        dim = self.dim if self.dim is not None else _legacy_softmax_dim(input.dim())
        return type(self)._fn(input, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmax(_SoftmaxBase):
    """Drop-in for ``torch.nn.Softmax(dim=None)``."""

    _fn = staticmethod(ops.softmax)


class LogSoftmax(_SoftmaxBase):
    """Drop-in for ``torch.nn.LogSoftmax(dim=None)``."""

    _fn = staticmethod(ops.log_softmax)
