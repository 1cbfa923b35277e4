"""Multi-tensor plumbing for the optimizer and gradient-control kernels: a group of
tensors becomes one array of data pointers plus one array of element counts, so a
single native call walks the whole group (see native/src/multi_tensor.h)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._native import ffi
from ._checks import FLOATS, cpu_tensor, fmt_shape

_PTR_ARRAY = {torch.float32: "float *[]", torch.float64: "double *[]"}


def ptr_array(tensors: Sequence[torch.Tensor | None], dtype: torch.dtype):
    """A C array of typed data pointers (NULL for ``None``)."""
    ct = "float *" if dtype == torch.float32 else "double *"
    return ffi.new(_PTR_ARRAY[dtype],
                   [ffi.NULL if t is None else ffi.cast(ct, t.data_ptr()) for t in tensors])


def size_array(tensors: Sequence[torch.Tensor]):
    """A C array of the tensors' element counts."""
    return ffi.new("int64_t[]", [t.numel() for t in tensors])


def tensor_seq(op: str, name: str, seq, dtypes=FLOATS, *, allow_empty: bool = False,
               writable: bool = False) -> list[torch.Tensor]:
    """Validate a sequence input: a list/tuple of dense CPU tensors of one float dtype.
    ``writable`` tensors are updated in place, so they must already be contiguous
    (a copy would silently drop the update)."""
    if isinstance(seq, torch.Tensor) or not isinstance(seq, (list, tuple)):
        raise TypeError(f"{op}: {name} must be a list of tensors, got {type(seq).__name__}")
    if not seq and not allow_empty:
        raise ValueError(f"{op}: {name} must not be empty")
    out = []
    dtype = None
    for i, t in enumerate(seq):
        t = cpu_tensor(op, f"{name}[{i}]", t)
        if t.dtype not in dtypes:
            allowed = " or ".join(str(d).replace("torch.", "") for d in dtypes)
            raise TypeError(f"{op}: {name}[{i}] must be {allowed}, got "
                            f"{str(t.dtype).replace('torch.', '')}")
        if dtype is None:
            dtype = t.dtype
        elif t.dtype != dtype:
            raise TypeError(f"{op}: {name}[{i}] has dtype {t.dtype}, but {name}[0] has {dtype}")
        if not t.is_contiguous():
            if writable:
                raise ValueError(f"{op}: {name}[{i}] is updated in place and must be "
                                 f"contiguous, got strides {t.stride()}")
            t = t.contiguous()
        out.append(t)
    return out


def same_shapes(op: str, a_name: str, a: list, b_name: str, b: list) -> None:
    """Two sequences with the same count, pairwise shapes and dtype."""
    if len(a) != len(b):
        raise ValueError(f"{op}: {b_name} must have {len(a)} tensors like {a_name}, "
                         f"got {len(b)}")
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x.shape != y.shape:
            raise ValueError(f"{op}: {b_name}[{i}] must have the shape of {a_name}[{i}] "
                             f"{fmt_shape(x)}, got {fmt_shape(y)}")
        if x.dtype != y.dtype:
            raise TypeError(f"{op}: {b_name}[{i}] must have the dtype of {a_name}[{i}] "
                            f"({x.dtype}), got {y.dtype}")


def distinct(op: str, groups: dict[str, list]) -> None:
    """Tensors updated in place must not share memory across roles (weights and
    moments, say): the native loop reads and writes them in one pass."""
    seen: dict[int, str] = {}
    for name, ts in groups.items():
        for i, t in enumerate(ts):
            if t is None or t.numel() == 0:
                continue
            key = t.data_ptr()
            if key in seen:
                raise ValueError(f"{op}: {name}[{i}] shares memory with {seen[key]}")
            seen[key] = f"{name}[{i}]"


def scalar_value(op: str, name: str, t, kinds=(torch.float32, torch.float64)) -> float:
    """The value of a one-element tensor input (ORT reads the first element)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in kinds:
        allowed = " or ".join(str(d).replace("torch.", "") for d in kinds)
        raise TypeError(f"{op}: {name} must be {allowed}, got "
                        f"{str(t.dtype).replace('torch.', '')}")
    if t.numel() != 1:
        raise ValueError(f"{op}: {name} must have exactly one element, got shape {fmt_shape(t)}")
    return t.reshape(()).item()


def bool_flag(op: str, name: str, t) -> bool:
    """An optional bool control input (``None``: true)."""
    if t is None:
        return True
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a bool tensor, got {type(t).__name__}")
    if t.dtype != torch.bool:
        raise TypeError(f"{op}: {name} must be a bool tensor, got {t.dtype}")
    if t.numel() != 1:
        raise ValueError(f"{op}: {name} must have exactly one element, got shape {fmt_shape(t)}")
    return bool(t.reshape(()).item())
