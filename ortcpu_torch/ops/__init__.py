"""Functional API: ``torch.autograd.Function``-backed ops with torch's signatures."""

from .activations import bias_gelu, gelu, leaky_relu, log_softmax, quick_gelu, softmax
from .batchnorm import batch_norm
from .dropout import dropout
from .loss import cross_entropy
from .norm import layer_norm, rms_norm
from .quant import fake_quantize
from .rnn import gru_direction, lstm_direction
from .tensor import embedding

__all__ = ["gelu", "bias_gelu", "quick_gelu", "leaky_relu", "softmax", "log_softmax",
           "layer_norm", "rms_norm", "batch_norm", "cross_entropy", "dropout"]
__all__ += ["embedding", "fake_quantize", "lstm_direction", "gru_direction"]
