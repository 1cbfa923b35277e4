"""A ``torch.ao.quantization.FakeQuantize``-style module on ORT's FakeQuant kernels."""

from __future__ import annotations

import torch
from torch.ao.quantization.observer import MovingAverageMinMaxObserver

from .. import ops


class FakeQuantize(torch.nn.Module):
    """Per-tensor affine fake quantization for quantization-aware training, shaped like
    ``torch.ao.quantization.FakeQuantize``: an observer (default torch's
    ``MovingAverageMinMaxObserver``) tracks the input range and sets the ``scale`` and
    ``zero_point`` buffers; the forward is ORT's FakeQuant and the backward its
    straight-through FakeQuantGrad. ``enable_fake_quant`` / ``enable_observer`` (and the
    ``disable_`` forms) toggle the two stages as in torch."""

    def __init__(self, observer=MovingAverageMinMaxObserver, quant_min: int = 0,
                 quant_max: int = 255, **observer_kwargs) -> None:
        super().__init__()
        if quant_min >= quant_max:
            raise ValueError(f"FakeQuantize: quant_min ({quant_min}) must be < quant_max "
                             f"({quant_max})")
        self.quant_min, self.quant_max = quant_min, quant_max
        observer_kwargs.setdefault("quant_min", quant_min)
        observer_kwargs.setdefault("quant_max", quant_max)
        if "dtype" not in observer_kwargs:
            observer_kwargs["dtype"] = torch.qint8 if quant_min < 0 else torch.quint8
        self.activation_post_process = observer(**observer_kwargs)
        self.register_buffer("fake_quant_enabled", torch.tensor([1], dtype=torch.uint8))
        self.register_buffer("observer_enabled", torch.tensor([1], dtype=torch.uint8))
        self.register_buffer("scale", torch.tensor([1.0], dtype=torch.float))
        self.register_buffer("zero_point", torch.tensor([0], dtype=torch.int))

    def enable_fake_quant(self, enabled: bool = True):
        self.fake_quant_enabled[0] = 1 if enabled else 0
        return self

    def disable_fake_quant(self):
        return self.enable_fake_quant(False)

    def enable_observer(self, enabled: bool = True):
        self.observer_enabled[0] = 1 if enabled else 0
        return self

    def disable_observer(self):
        return self.enable_observer(False)

    def calculate_qparams(self):
        return self.activation_post_process.calculate_qparams()

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        if self.observer_enabled[0] == 1:
            self.activation_post_process(X.detach())
            scale, zp = self.calculate_qparams()
            if self.scale.shape != scale.shape:
                self.scale.resize_(scale.shape)
                self.zero_point.resize_(zp.shape)
            self.scale.copy_(scale)
            self.zero_point.copy_(zp)
        if self.fake_quant_enabled[0] == 1:
            X = ops.fake_quantize(X, float(self.scale[0]), int(self.zero_point[0]),
                                  self.quant_min, self.quant_max)
        return X

    def extra_repr(self) -> str:
        return (f"fake_quant_enabled={self.fake_quant_enabled}, observer_enabled="
                f"{self.observer_enabled}, quant_min={self.quant_min}, "
                f"quant_max={self.quant_max}, scale={self.scale}, zero_point={self.zero_point}")
