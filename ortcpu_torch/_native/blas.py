"""Which BLAS runs the GEMMs: OpenBLAS or the MKL inside torch's x86 wheel.

torch's x86 CPU wheel exports MKL's BLAS from ``libtorch_cpu.so`` (``sgemm_``, ``dgemm_``,
the packed ``cblas_sgemm_pack``/``cblas_sgemm_compute``). When the extension loads, those
entry points are looked up in the library torch has already loaded (no second copy);
OpenBLAS (``scipy-openblas32``) is always there as the fallback.

``ORTCPU_GEMM`` (read when ortcpu_torch is imported) or :func:`set_gemm_backend`:

- ``auto`` (default): the first GEMM of each shape class (dtype, transposes, powers of two
  of m, n and k, threaded or not, packed or not) is timed on both backends with its own
  operands and the fastest way is kept for that class (a few extra GEMMs once per class):
  a multi-threaded GEMM runs as one single-threaded call per thread's slab of C, or, for
  an unpacked class where it measured faster, as one call on MKL's own threads (on an
  Intel Xeon, BERT's 512x512x128: 367 against 476 us in slabs);
- ``openblas``: always OpenBLAS (what a torch build without MKL gets anyway);
- ``mkl``: always MKL (an error if this torch has none), multi-threaded GEMMs as slabs;
- ``mkl_threaded``: always MKL, multi-threaded GEMMs as one call on MKL's own threads
  (one packed copy of the operand each slab would pack; measured 0.89-1.06x the slabs'
  time at the transformer's 2-thread shapes: ``python -m benchmarks.gemm_backends``).
"""

from __future__ import annotations

import os

import torch

from .loader import ffi, lib  # the build this process runs (ORTCPU_ISA)

_NAMES = {"auto": lib.ORTCPU_GEMM_AUTO, "openblas": lib.ORTCPU_GEMM_OPENBLAS,
          "mkl": lib.ORTCPU_GEMM_MKL, "mkl_threaded": lib.ORTCPU_GEMM_MKL_THREADED}


def _torch_cpu_library() -> str:
    return os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")


def bind_mkl(path: str | None = None) -> bool:
    """Bind MKL's GEMM from ``path`` (default: torch's ``libtorch_cpu.so``), a library this
    process has already loaded. False, with OpenBLAS left in charge, if it is not loaded or
    lacks the symbols."""
    return lib.ortcpu_gemm_bind_mkl((path or _torch_cpu_library()).encode()) == 0


def mkl_available() -> dict:
    """What MKL offers here: ``{"gemm": bool, "packed": bool}``."""
    bits = lib.ortcpu_gemm_mkl_available()
    return {"gemm": bool(bits & 1), "packed": bool(bits & 2)}


def set_gemm_backend(name: str) -> None:
    """Select the GEMM backend: ``"auto"``, ``"openblas"``, ``"mkl"`` or ``"mkl_threaded"``
    (see module doc).
    Switching resets auto's per-class decisions."""
    if not isinstance(name, str) or name.lower() not in _NAMES:
        raise ValueError(f"GEMM backend must be one of {sorted(_NAMES)}, got {name!r}")
    st = lib.ortcpu_gemm_set_backend(_NAMES[name.lower()])
    if st:
        raise ValueError(ffi.string(lib.ortcpu_last_error()).decode())
    lib.ortcpu_gemm_auto_reset()


def get_gemm_backend() -> str:
    """The current setting: one of the names ``set_gemm_backend`` takes."""
    code = lib.ortcpu_gemm_get_backend()
    return next(k for k, v in _NAMES.items() if v == code)


def auto_choice(dtype: torch.dtype, m: int, n: int, k: int, *, trans_a: bool = False,
                trans_b: bool = False, threaded: bool = True, packed: bool = False) -> str | None:
    """The backend ``auto`` settled on for a GEMM's shape class (``"openblas"`` or
    ``"mkl"`` in slabs, ``"mkl_threaded"`` on MKL's threads), None if not timed yet."""
    code = lib.ortcpu_gemm_auto_choice(int(dtype == torch.float64), int(packed), int(trans_a),
                                       int(trans_b), m, n, k, int(threaded))
    return {lib.ORTCPU_GEMM_OPENBLAS: "openblas", lib.ORTCPU_GEMM_MKL: "mkl",
            lib.ORTCPU_GEMM_MKL_THREADED: "mkl_threaded"}.get(code)


def configure_from_environment() -> None:
    """Bind MKL if torch has it and apply ``ORTCPU_GEMM`` (called once at load)."""
    bind_mkl()
    name = os.environ.get("ORTCPU_GEMM", "auto").strip() or "auto"
    if name.lower() not in _NAMES:
        raise ValueError(f"ORTCPU_GEMM must be one of {sorted(_NAMES)}, got {name!r}")
    if name.lower() in ("mkl", "mkl_threaded") and not mkl_available()["gemm"]:
        raise ValueError(f"ORTCPU_GEMM={name}, but this torch build exports no MKL GEMM")
    set_gemm_backend(name)
