"""Functional API: ``torch.autograd.Function``-backed ops with torch's signatures."""

from .activations import (
    bias_gelu,
    gelu,
    hardsigmoid,
    hardswish,
    hardtanh,
    leaky_relu,
    log_softmax,
    quick_gelu,
    relu,
    relu6,
    silu,
    softmax,
)
from .batchnorm import batch_norm
from .conv import conv1d, conv2d, conv3d
from .dropout import dropout
from .linear import addmm, linear, matmul, scaled_dot_product_attention
from .loss import cross_entropy
from .norm import layer_norm, rms_norm
from .pool import (
    adaptive_avg_pool2d,
    avg_pool1d,
    avg_pool2d,
    avg_pool3d,
    global_avg_pool,
    global_max_pool,
    max_pool1d,
    max_pool2d,
    max_pool3d,
)
from .quant import fake_quantize
from .rnn import gru_direction, lstm_direction
from .tensor import embedding

__all__ = ["gelu", "bias_gelu", "quick_gelu", "silu", "relu", "leaky_relu", "softmax",
           "log_softmax"]
__all__ += ["hardsigmoid", "hardswish", "hardtanh", "relu6"]
__all__ += ["layer_norm", "rms_norm", "batch_norm", "cross_entropy", "dropout"]
__all__ += ["conv1d", "conv2d", "conv3d", "max_pool1d", "max_pool2d", "max_pool3d",
            "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool2d",
            "global_avg_pool", "global_max_pool"]
__all__ += ["linear", "addmm", "matmul", "scaled_dot_product_attention"]
__all__ += ["embedding", "fake_quantize", "lstm_direction", "gru_direction"]
