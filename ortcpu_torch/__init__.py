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
from .wrap import (  # noqa: E402
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

_LAZY = {"InferenceSession": ".graph", "ORTModule": ".graph.ortmodule"}
__all__ += list(_LAZY)


def __getattr__(name):
    # the graph front end (onnxruntime's session API, ORTModule) is imported on first use:
    # it needs onnx and torch.export, which the kernels and wrap do not
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'ortcpu_torch' has no attribute {name!r}")
