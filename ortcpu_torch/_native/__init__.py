"""Loader for the cffi extension, plus the tensor bridge and the arena.

``torch`` is imported before the extension so both share torch's bundled
OpenMP runtime (same soname ``libgomp.so.1``): one thread pool, not two
fighting over the cores. OpenBLAS comes from the installed ``scipy_openblas32``
wheel and is loaded globally first, so the extension's BLAS symbols resolve
without a build-time library path.
"""

import ctypes
import os

import scipy_openblas32
import torch  # noqa: F401  (must precede the extension: shared OpenMP runtime)

ctypes.CDLL(
    os.path.join(scipy_openblas32.get_lib_dir(), f"lib{scipy_openblas32.get_library()}.so"),
    mode=ctypes.RTLD_GLOBAL,
)

from ._ortcpu import ffi, lib  # noqa: E402

# One thread pool: OpenBLAS single-threaded, parallelism from our OpenMP threads (gemm.h).
lib.ortcpu_blas_set_num_threads(1)
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
