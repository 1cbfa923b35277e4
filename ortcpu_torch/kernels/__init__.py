"""The kernel registry, keyed by ONNX Runtime op name.

``kernels.GeluGrad(dY, X)``: torch tensors in ORT's input order, ORT attributes as
keywords (schema defaults), results in ORT's output order (one tensor, or a tuple).
See DESIGN.md, "Registry call convention". ``names()`` lists the ops, ``get(name)``
returns one.
"""

from . import (  # noqa: F401  (each module registers its ops)
    activations,
    batchnorm,
    comm,
    conv,
    dropout,
    gemm,
    grad_control,
    loss,
    norm,
    optim,
    pool,
    quant,
    rnn,
    summary,
    tensor,
)
from ._registry import _OPS, get, names, register

globals().update(_OPS)

__all__ = ["get", "names", "register", *_OPS]
