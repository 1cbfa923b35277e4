"""Functional API: ``torch.autograd.Function``-backed ops with torch's signatures."""

from .activations import bias_gelu, gelu, leaky_relu, log_softmax, quick_gelu, softmax
from .batchnorm import batch_norm
from .dropout import dropout
from .loss import cross_entropy
from .norm import layer_norm, rms_norm

__all__ = ["gelu", "bias_gelu", "quick_gelu", "leaky_relu", "softmax", "log_softmax",
           "layer_norm", "rms_norm", "batch_norm", "cross_entropy", "dropout"]
