"""``torch.nn``-compatible modules backed by ortcpu_torch kernels."""

from .activations import (
    GELU,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    LeakyReLU,
    LogSoftmax,
    ReLU,
    ReLU6,
    SiLU,
    Softmax,
)
from .conv import Conv1d, Conv2d, Conv3d
from .linear import Linear
from .norm import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    CrossEntropyLoss,
    Dropout,
    LayerNorm,
    RMSNorm,
)
from .pool import (
    AdaptiveAvgPool2d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
)
from .quant import FakeQuantize
from .rnn import GRU, LSTM
from .tensor import Embedding

__all__ = ["GELU", "SiLU", "ReLU", "LeakyReLU", "Softmax", "LogSoftmax"]
__all__ += ["Hardsigmoid", "Hardswish", "Hardtanh", "ReLU6"]
__all__ += ["LayerNorm", "RMSNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
            "CrossEntropyLoss", "Dropout"]
__all__ += ["Conv1d", "Conv2d", "Conv3d", "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d",
            "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool2d"]
__all__ += ["Linear"]
__all__ += ["Embedding", "FakeQuantize", "LSTM", "GRU"]
