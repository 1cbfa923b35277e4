"""ortcpu_torch: ONNX Runtime's CPU training kernels, re-implemented in C, for PyTorch.

- ``ortcpu_torch.kernels``: the registry, keyed by ORT op name;
- ``ortcpu_torch.ops`` / ``ortcpu_torch.nn``: autograd functions and torch.nn modules.

One-line wrapping of an existing model and training loop: ``ortcpu_torch.wrap(model)``,
``optimize(model, optimizer)``, ``unwrap``, ``report``, ``kernels_enabled``.
"""

from . import kernels, nn, ops, optim  # noqa: E402  (after the extension is loaded)
from ._native import (
    KernelError,
    empty_cache,
    get_num_threads,
    memory_stats,
    set_cache_limit,
    set_num_threads,
)

__version__ = "0.1.0"

__all__ = [
    "KernelError",
    "empty_cache",
    "get_num_threads",
    "memory_stats",
    "set_cache_limit",
    "set_num_threads",
    "kernels",
    "nn",
    "ops",
    "optim",
]

# one-line wrapping (kept in a block of its own: other families add to the lists above)
from ._wrap import (  # noqa: E402
    FallbackError,
    FallbackWarning,
    kernels_enabled,
    optimize,
    report,
    unwrap,
    wrap,
)

__all__ += ["FallbackError", "FallbackWarning", "kernels_enabled", "optimize", "report",
            "unwrap", "wrap"]

# the ONNX graph executor with onnxruntime's session API
from .graph import InferenceSession  # noqa: E402

__all__ += ["InferenceSession"]

# graph-wide training (kept in a block of its own)
from .graph.ortmodule import ORTModule  # noqa: E402

__all__ += ["ORTModule"]
