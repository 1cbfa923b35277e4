"""``torch.nn``-compatible modules backed by ortcpu_torch kernels."""

from .activations import GELU, LeakyReLU, LogSoftmax, Softmax
from .quant import FakeQuantize
from .rnn import GRU, LSTM
from .tensor import Embedding

__all__ = ["GELU", "LeakyReLU", "Softmax", "LogSoftmax"]
__all__ += ["Embedding", "FakeQuantize", "LSTM", "GRU"]
