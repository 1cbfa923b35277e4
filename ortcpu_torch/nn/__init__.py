"""``torch.nn``-compatible modules backed by ortcpu_torch kernels."""

from .activations import GELU, LeakyReLU, LogSoftmax, Softmax
from .norm import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    CrossEntropyLoss,
    Dropout,
    LayerNorm,
    RMSNorm,
)

__all__ = ["GELU", "LeakyReLU", "Softmax", "LogSoftmax", "LayerNorm", "RMSNorm", "BatchNorm1d",
           "BatchNorm2d", "BatchNorm3d", "CrossEntropyLoss", "Dropout"]
