"""Tensor -> pointer bridge, status codes and thread settings."""

from __future__ import annotations

import torch

from .loader import ffi, lib


class KernelError(RuntimeError):
    """A native kernel reported a failure (the message names kernel and reason)."""


def check_status(status: int, kernel: str) -> None:
    """Raise ``KernelError`` for a non-zero native status."""
    if status != 0:
        name = ffi.string(lib.ortcpu_status_name(status)).decode()
        msg = ffi.string(lib.ortcpu_last_error()).decode()
        raise KernelError(f"{kernel}: {name}: {msg}")


_FLOAT_P, _DOUBLE_P = ffi.typeof("float *"), ffi.typeof("double *")
_F32, _F64, _NULL, _cast = torch.float32, torch.float64, ffi.NULL, ffi.cast


def ptr(t: torch.Tensor | None):
    """A typed C pointer to a contiguous CPU tensor's data (NULL for ``None``)."""
    # on every native call: identity tests and resolved C types, not a dict keyed by dtype
    # (about 0.1 us of 0.5 a call)
    if t is None:
        return _NULL
    dt = t.dtype
    if dt is _F32:
        return _cast(_FLOAT_P, t.data_ptr())
    if dt is _F64:
        return _cast(_DOUBLE_P, t.data_ptr())
    raise KeyError(dt)


_num_threads: int | None = None


def set_num_threads(n: int) -> None:
    """Threads each native call may use; ``None`` follows ``torch.get_num_threads()``."""
    global _num_threads
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise ValueError(f"num_threads must be a positive int or None, got {n!r}")
    _num_threads = n


def get_num_threads() -> int:
    """Threads each native call uses (default: ``torch.get_num_threads()``)."""
    return _num_threads if _num_threads is not None else torch.get_num_threads()


_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_FN_CACHE: dict = {}


def native_fn(name: str, dtype: torch.dtype):
    """The dtype-specific entry point ``ortcpu_<name>_<f32|f64>``."""
    key = (name, dtype)
    fn = _FN_CACHE.get(key)
    if fn is None:
        fn = _FN_CACHE[key] = getattr(lib, f"ortcpu_{name}_{_SUFFIX[dtype]}")
    return fn
