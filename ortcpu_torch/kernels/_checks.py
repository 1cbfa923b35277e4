"""Argument validation shared by every kernel family.

Every check runs before any output is allocated or any native code runs, and
raises TypeError/ValueError naming the op, the argument and what was expected.
Inputs are never written; a non-contiguous input is copied, never misread.
"""

from __future__ import annotations

import torch

from .._native import check_status, get_num_threads

FLOATS = (torch.float32, torch.float64)

__all__ = [
    "FLOATS",
    "cpu_tensor",
    "float_input",
    "same_shape",
    "same_dtype",
    "normalize_axis",
    "fmt_shape",
    "check_status",
    "get_num_threads",
    "select_outputs",
    "checked_signature",
    "SignatureCache",
]


def fmt_shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ("," if t.dim() == 1 else "") + ")"


def float_attr(op: str, name: str, value) -> float:
    """A float attribute (an int is accepted, a bool is not), or a TypeError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: {name} must be a float, got {type(value).__name__}")
    return float(value)


def bool_arg(op: str, name: str, value) -> bool:
    """A flag argument: a bool, an int or a one-element tensor, else a TypeError naming it
    (``if value`` on a bigger tensor would raise torch's unnamed RuntimeError)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"{op}: {name} must be a bool, got a tensor of shape "
                            f"{fmt_shape(value)}")
        return bool(value.item())
    if not isinstance(value, (bool, int)):
        raise TypeError(f"{op}: {name} must be a bool, got {type(value).__name__}")
    return bool(value)


def int_attr(op: str, name: str, value, allowed=None) -> int:
    """An int attribute (a one-element integer tensor is accepted, a bool is not), or a
    TypeError naming it; ``allowed`` restricts the values (ValueError)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype.is_floating_point or value.dtype == torch.bool:
            raise TypeError(f"{op}: {name} must be an integer scalar, got {value.dtype} "
                            f"{fmt_shape(value)}")
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__}")
    if allowed is not None and value not in allowed:
        raise ValueError(f"{op}: {name} must be one of {sorted(allowed)}, got {value}")
    return value


def cpu_tensor(op: str, name: str, t) -> torch.Tensor:
    """``t`` itself if it is a dense CPU torch.Tensor, else a TypeError naming it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise TypeError(f"{op}: {name} must be a CPU tensor, got device {t.device}")
    if t.layout != torch.strided:
        raise TypeError(f"{op}: {name} must be a dense (strided) tensor, got {t.layout}")
    return t


def float_check(op: str, name: str, t, dtypes=FLOATS, min_rank: int = 0) -> torch.Tensor:
    """``t`` itself if it is a CPU tensor of one of ``dtypes`` with rank >= ``min_rank``
    (any strides), else a clear error."""
    t = cpu_tensor(op, name, t)
    if t.dtype not in dtypes:
        allowed = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{op}: {name} must be {allowed}, got {str(t.dtype).replace('torch.', '')}")
    if t.dim() < min_rank:
        raise ValueError(f"{op}: {name} must have rank >= {min_rank}, got shape {fmt_shape(t)}")
    return t


def float_input(op: str, name: str, t, dtypes=FLOATS, min_rank: int = 0) -> torch.Tensor:
    """``t`` as a contiguous CPU tensor of one of ``dtypes``, or a clear error."""
    t = float_check(op, name, t, dtypes, min_rank)
    return t if t.is_contiguous() else t.contiguous()


def same_shape(op: str, a_name: str, a: torch.Tensor, b_name: str, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{op}: {b_name} must have the shape of {a_name} {fmt_shape(a)}, got {fmt_shape(b)}"
        )


def same_dtype(op: str, a_name: str, a: torch.Tensor, b_name: str, b: torch.Tensor) -> None:
    if a.dtype != b.dtype:
        raise TypeError(
            f"{op}: {b_name} must have the dtype of {a_name} ({a.dtype}), got {b.dtype}"
        )


def normalize_axis(op: str, axis: int, rank: int, name: str = "axis") -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{op}: {name} must be an int, got {type(axis).__name__}")
    r = max(rank, 1)
    if not -r <= axis < r:
        raise ValueError(f"{op}: {name} must be in [{-r}, {r - 1}] for rank {rank}, got {axis}")
    return axis % r


def needs_flags(op: str, needs, count: int) -> tuple[bool, ...]:
    """The registry's ``needs=`` (None: every output; else one bool per output, a 1-D
    tensor accepted) as ``count`` bools, or a TypeError / ValueError naming it."""
    if needs is None:
        return (True,) * count
    if isinstance(needs, torch.Tensor):
        if needs.dim() != 1:
            raise TypeError(f"{op}: needs must be a sequence of {count} bools, got a tensor "
                            f"of shape {fmt_shape(needs)}")
        needs = needs.tolist()
    if not isinstance(needs, (list, tuple)):
        raise TypeError(f"{op}: needs must be a sequence of {count} bools, got "
                        f"{type(needs).__name__}")
    if len(needs) != count:
        raise ValueError(f"{op}: needs must have {count} entries, got {len(needs)}")
    for v in needs:
        if not isinstance(v, (bool, int, float)):
            raise TypeError(f"{op}: needs entries must be bools, got {type(v).__name__}")
    return tuple(bool(v) for v in needs)


def select_outputs(op: str, outputs: tuple, needs) -> tuple:
    """Apply the registry's ``needs=`` convention to a tuple of outputs."""
    if needs is None:
        return outputs
    flags = needs_flags(op, needs, len(outputs))
    return tuple(o if n else None for o, n in zip(outputs, flags, strict=True))


# ---- checking a signature once ------------------------------------------------------------

_SCALARS = frozenset((int, float, bool, str, type(None)))


def checked_signature(*args):
    """A hashable key of everything an op's argument checks look at: per tensor its type,
    device kind, layout, dtype and shape; per scalar (int, float, bool, str, None) its type
    and value. ``None`` when an argument is anything else (its checks then run on every
    call). Strides are not in it: the ops make inputs contiguous on every call. A tensor
    resized in place has a new shape, hence a new key, and is checked again."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append((type(a), a.is_cpu, a.layout, a.dtype, a.shape))
        elif type(a) in _SCALARS:
            key.append((type(a), a))
        else:
            return None
    return tuple(key)


class SignatureCache:
    """The ``checked_signature`` keys whose checks one op has passed: the per-call argument
    checks of the front ends run once per new signature (the per-call cost of the checks
    is what small tensors pay most for). Bounded: cleared when ``limit`` keys are held."""

    __slots__ = ("_seen", "limit")

    def __init__(self, limit: int = 4096):
        self._seen: set = set()
        self.limit = limit

    def __contains__(self, key) -> bool:
        return key is not None and key in self._seen

    def add(self, key) -> None:
        if key is None:
            return
        if len(self._seen) >= self.limit:
            self._seen.clear()
        self._seen.add(key)
