"""One-line wrapping of an existing model: ``ortcpu_torch.wrap(model)``.

Two mechanisms, both table-driven (``tables``): **module swap** (``swap``: a supported
``torch.nn`` module is replaced by its ``ortcpu_torch.nn`` counterpart sharing the same
Parameter and buffer objects, falling back to the original per call) and **functional
routing** (``routing``: while the root's ``forward`` runs, ``F.gelu``,
``torch.softmax``, ... go to ``ortcpu_torch.ops``; a TorchFunctionMode counts what stays
on torch on the first forward of each input signature, ``census`` runs the later ones
without that tax). ``detect`` finds modules outside ``torch.nn`` whose forward is one of our kernels
written as a formula (tanh-GELU, SiLU, RMSNorm) and checks them numerically; ``select``
decides per input signature which side runs (default: the faster, measured once);
``policy`` holds the fallback rules and the per-wrap state, ``report`` prints it,
``timing`` measures the two sides, ``optimizer`` converts torch optimizers for
``optimize()``; ``api`` is ``wrap`` / ``unwrap`` / ``optimize``.
"""

from .api import optimize, unwrap, wrap
from .policy import FallbackError, FallbackWarning
from .report import Report, report
from .routing import kernels_enabled

__all__ = ["FallbackError", "FallbackWarning", "Report", "kernels_enabled", "optimize",
           "report", "unwrap", "wrap"]
