"""Loader for the cffi extension, plus the tensor bridge and the arena.

``torch`` is imported before the extension so both share torch's bundled
OpenMP runtime (same soname ``libgomp.so.1``): one thread pool, not two
fighting over the cores. OpenBLAS comes from the installed ``scipy_openblas32``
wheel and is loaded globally first, so the extension's BLAS symbols resolve
without a build-time library path.

OpenBLAS picks its kernels at load time: ``OPENBLAS_CORETYPE`` if set, else its own CPU
detection. Our OpenBLAS copy is private (scipy-openblas32, loaded here), so by default it
detects the CPU whatever ``OPENBLAS_CORETYPE`` says: a machine-wide
``OPENBLAS_CORETYPE=Haswell`` (with ``OPENBLAS_L2_SIZE``, the workaround for an OpenBLAS
0.3.34 bug on AMD Zen 4/5 that only forced pre-AVX-512 core types hit) would hold an
AVX-512 CPU on AVX2 kernels at about half the GEMM speed (README, "OpenBLAS core type").
``ORTCPU_OPENBLAS_CORETYPE`` (set before importing ortcpu_torch) overrides that: ``env``
honours ``OPENBLAS_CORETYPE``, any other value but ``auto`` names the core (e.g.
``Haswell``). :func:`openblas_core` says which core was picked.
"""

import ctypes
import os

import torch  # noqa: F401  (must precede the extension: shared OpenMP runtime)


def _load_openblas() -> ctypes.CDLL:
    # importing scipy_openblas32 already loads the library (RTLD_GLOBAL); the core type has
    # to be in the environment by then, and only for that moment
    override = os.environ.get("ORTCPU_OPENBLAS_CORETYPE", "auto").strip()
    saved = os.environ.get("OPENBLAS_CORETYPE")
    if override.lower() == "auto":
        os.environ.pop("OPENBLAS_CORETYPE", None)
    elif override.lower() != "env":
        os.environ["OPENBLAS_CORETYPE"] = override
    try:
        import scipy_openblas32

        lib_name = f"lib{scipy_openblas32.get_library()}.so"
        return ctypes.CDLL(os.path.join(scipy_openblas32.get_lib_dir(), lib_name),
                           mode=ctypes.RTLD_GLOBAL)
    finally:
        if saved is None:
            os.environ.pop("OPENBLAS_CORETYPE", None)
        else:
            os.environ["OPENBLAS_CORETYPE"] = saved


_OPENBLAS = _load_openblas()


def openblas_core() -> str:
    """The core type whose kernels our OpenBLAS copy runs (e.g. ``"Cooperlake"``,
    ``"Haswell"``), or ``""`` if this OpenBLAS build cannot say."""
    fn = getattr(_OPENBLAS, "scipy_openblas_get_corename", None)
    if fn is None:
        return ""
    fn.restype = ctypes.c_char_p
    return (fn() or b"").decode().strip()


from .loader import ffi, lib  # noqa: E402  (the build for this CPU, ORTCPU_ISA)

# One thread pool: OpenBLAS single-threaded, parallelism from our OpenMP threads (gemm.h).
lib.ortcpu_blas_set_num_threads(1)
from .blas import configure_from_environment  # noqa: E402

configure_from_environment()  # MKL from torch's libtorch_cpu.so where it has one (blas.py)
from .arena import empty, empty_cache, empty_like, memory_stats, set_cache_limit  # noqa: E402
from .bridge import (  # noqa: E402
    KernelError,
    check_status,
    get_num_threads,
    native_fn,
    ptr,
    set_num_threads,
)

__all__ = [
    "openblas_core",
    "ffi",
    "lib",
    "KernelError",
    "check_status",
    "get_num_threads",
    "set_num_threads",
    "ptr",
    "native_fn",
    "empty",
    "empty_like",
    "empty_cache",
    "memory_stats",
    "set_cache_limit",
]
