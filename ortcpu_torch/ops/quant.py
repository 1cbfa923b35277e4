"""Autograd function for fake quantization (ORT FakeQuant / FakeQuantGrad)."""

from __future__ import annotations

import torch

from ..kernels import quant as K
from .activations import once_differentiable


class _FakeQuant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, zero_point, quant_min, quant_max):
        y, mask = K.FakeQuant(x, scale, zero_point, quant_min=quant_min, quant_max=quant_max)
        ctx.save_for_backward(mask)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (mask,) = ctx.saved_tensors
        return K.FakeQuantGrad(dy.contiguous(), mask), None, None, None, None


def fake_quantize(input: torch.Tensor, scale, zero_point, quant_min: int = 0,
                  quant_max: int = 255) -> torch.Tensor:
    """Per-tensor affine fake quantization, like ``torch.fake_quantize_per_tensor_affine``
    (same arguments; ``scale``/``zero_point`` are numbers or 1-element tensors).
    Forward is ORT's FakeQuant (``x / scale`` rounded half to even; torch multiplies by a
    float32 ``1/scale`` instead, which can differ at exact rounding ties), backward the
    straight-through FakeQuantGrad. No gradient flows to scale or zero_point."""
    if isinstance(zero_point, torch.Tensor):
        zero_point = float(zero_point.reshape(-1)[0]) if zero_point.numel() == 1 else zero_point
    if isinstance(scale, torch.Tensor) and scale.numel() == 1:
        scale = float(scale.reshape(-1)[0])
    return _FakeQuant.apply(input, scale, zero_point, quant_min, quant_max)
