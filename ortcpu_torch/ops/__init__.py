"""Functional API: ``torch.autograd.Function``-backed ops with torch's signatures."""

from .activations import bias_gelu, gelu, leaky_relu, log_softmax, quick_gelu, softmax

__all__ = ["gelu", "bias_gelu", "quick_gelu", "leaky_relu", "softmax", "log_softmax"]
