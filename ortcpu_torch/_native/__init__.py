"""Loader for the cffi extension, plus the tensor bridge and the arena.

``torch`` is imported before the extension so both share torch's bundled
OpenMP runtime (same soname ``libgomp.so.1``): one thread pool, not two
fighting over the cores. OpenBLAS comes from the installed ``scipy_openblas32``
wheel and is loaded globally first, so the extension's BLAS symbols resolve
without a build-time library path.

OpenBLAS picks its kernels at load time: ``OPENBLAS_CORETYPE`` if set, else its own CPU
detection. ``ORTCPU_OPENBLAS_CORETYPE`` overrides that for our private OpenBLAS copy only
(set it before importing ortcpu_torch): ``auto`` ignores ``OPENBLAS_CORETYPE`` and lets
OpenBLAS detect the CPU, any other value names the core (e.g. ``SkylakeX``). Where a
machine-wide ``OPENBLAS_CORETYPE=Haswell`` holds an AVX-512 CPU on AVX2 kernels, sgemm runs
at about half the speed it could (README, "OpenBLAS core type"; that setting, with
``OPENBLAS_L2_SIZE``, is also the workaround for an OpenBLAS 0.3.34 bug on AMD Zen 4/5).
"""

import ctypes
import os

import torch  # noqa: F401  (must precede the extension: shared OpenMP runtime)


def _load_openblas() -> None:
    # importing scipy_openblas32 already loads the library (RTLD_GLOBAL); the override has
    # to be in the environment by then, and only for that moment
    override = os.environ.get("ORTCPU_OPENBLAS_CORETYPE")
    saved = os.environ.get("OPENBLAS_CORETYPE")
    if override and override.lower() == "auto":
        os.environ.pop("OPENBLAS_CORETYPE", None)
    elif override:
        os.environ["OPENBLAS_CORETYPE"] = override
    try:
        import scipy_openblas32

        lib_name = f"lib{scipy_openblas32.get_library()}.so"
        ctypes.CDLL(os.path.join(scipy_openblas32.get_lib_dir(), lib_name),
                    mode=ctypes.RTLD_GLOBAL)
    finally:
        if override:
            if saved is None:
                os.environ.pop("OPENBLAS_CORETYPE", None)
            else:
                os.environ["OPENBLAS_CORETYPE"] = saved


_load_openblas()

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
