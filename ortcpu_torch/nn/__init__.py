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
from .quant import FakeQuantize
from .rnn import GRU, LSTM
from .tensor import Embedding

__all__ = ["GELU", "LeakyReLU", "Softmax", "LogSoftmax", "LayerNorm", "RMSNorm", "BatchNorm1d",
           "BatchNorm2d", "BatchNorm3d", "CrossEntropyLoss", "Dropout"]
__all__ += ["Embedding", "FakeQuantize", "LSTM", "GRU"]
