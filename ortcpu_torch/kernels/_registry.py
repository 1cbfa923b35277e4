"""The op registry: ONNX Runtime op name -> callable."""

from __future__ import annotations

from collections.abc import Callable

_OPS: dict[str, Callable] = {}


def register(fn: Callable) -> Callable:
    """Register ``fn`` under its ``__name__`` (the ORT op name)."""
    if fn.__name__ in _OPS:
        raise RuntimeError(f"kernel {fn.__name__} registered twice")
    _OPS[fn.__name__] = fn
    return fn


def names() -> list[str]:
    """Sorted names of every implemented op."""
    return sorted(_OPS)


def get(name: str) -> Callable:
    """The registry callable for ORT op ``name``."""
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(
            f"ortcpu_torch has no kernel {name!r}; implemented: {', '.join(names())}"
        ) from None
