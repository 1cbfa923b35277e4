"""``torch.nn``-compatible modules backed by ortcpu_torch kernels."""

from .activations import GELU, LeakyReLU, LogSoftmax, Softmax

__all__ = ["GELU", "LeakyReLU", "Softmax", "LogSoftmax"]
