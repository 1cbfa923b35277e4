"""Arena-backed torch tensors.

Large outputs come from the native caching arena: blocks whose pages were
already touched, so a kernel writing a 32 MB output does not pay ~8000 page
faults. Each block is wrapped as an ordinary torch tensor (through a NumPy view
of a cffi buffer); when torch frees the last reference, the block goes back to
the arena, not to the OS. Small tensors use ``torch.empty`` (glibc recycles
those well and the wrapper would cost more than it saves).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .loader import ffi, lib

#: tensors at least this large come from the arena
ARENA_MIN_BYTES = 1 << 18

_NP_DTYPES = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}


def empty(shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor, arena-backed when large."""
    numel = math.prod(shape)
    nbytes = numel * dtype.itemsize
    if nbytes < ARENA_MIN_BYTES:
        # sizes as separate ints: about half the cost of parsing one shape tuple (measured)
        return torch.empty(*shape, dtype=dtype) if len(shape) else torch.empty((), dtype=dtype)
    np_dtype = _NP_DTYPES.get(dtype)
    if np_dtype is None:
        return torch.empty(shape, dtype=dtype)
    shape = tuple(int(s) for s in shape)
    raw = lib.ortcpu_arena_alloc(nbytes)
    if raw == ffi.NULL:
        raise MemoryError(f"ortcpu_torch arena: cannot allocate {nbytes} bytes")
    block = ffi.gc(raw, lib.ortcpu_arena_free, size=nbytes)
    arr = np.frombuffer(ffi.buffer(block, nbytes), dtype=np_dtype, count=numel)
    # shaped in NumPy, not with Tensor.view: an autograd.Function output that is a view
    # (even of a tensor made inside forward) cannot be modified in place by the user
    return torch.from_numpy(arr.reshape(shape))


def reshaped(t: torch.Tensor, shape) -> torch.Tensor:
    """The contiguous tensor ``t`` with a new shape, as a tensor of its own over the same
    memory rather than a view of ``t``: what an ``autograd.Function`` returns, since
    autograd refuses in-place ops on a Function output that is a view."""
    shape = tuple(int(s) for s in shape)
    if tuple(t.shape) == shape and t._base is None:
        return t
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return restrided(t, shape, tuple(reversed(strides)))


def restrided(t: torch.Tensor, shape, strides) -> torch.Tensor:
    """A tensor of its own (not a view, see ``reshaped``) over ``t``'s memory from its
    offset, with ``shape`` and ``strides``."""
    out = torch.empty(0, dtype=t.dtype)
    return out.set_(t.untyped_storage(), t.storage_offset(), shape, strides)


def empty_like(t: torch.Tensor) -> torch.Tensor:
    """``empty(t.shape, t.dtype)``."""
    return empty(t.shape, t.dtype)


def empty_cache() -> None:
    """Return every cached (unused) arena block to the OS."""
    lib.ortcpu_arena_empty_cache()


def set_cache_limit(max_cached_bytes: int) -> None:
    """Cap the bytes the arena keeps cached; blocks freed beyond it go to the OS."""
    if max_cached_bytes < 0:
        raise ValueError(f"max_cached_bytes must be >= 0, got {max_cached_bytes}")
    lib.ortcpu_arena_set_limit(max_cached_bytes)


def memory_stats() -> dict:
    """Arena counters: bytes in use / cached / peak, cache hits and misses, limit."""
    s = ffi.new("int64_t[6]")
    lib.ortcpu_arena_stats(s)
    keys = ("in_use_bytes", "cached_bytes", "hits", "misses", "peak_bytes", "limit_bytes")
    return dict(zip(keys, (int(v) for v in s), strict=True))
