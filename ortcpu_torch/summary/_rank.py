"""Which process writes summaries: rank 0 only, by default.

The rank comes from a pluggable source (``set_rank_source``). The default source asks
``torch.distributed`` when it is initialized, else the launchers' environment variables
(``RANK``, ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``, ``PMIX_RANK``), else 0.
"""

from __future__ import annotations

import os
from collections.abc import Callable

_ENV_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


def default_rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # pragma: no cover - a broken backend must not stop logging
        pass
    for name in _ENV_VARS:
        v = os.environ.get(name)
        if v is not None and v.strip().lstrip("-").isdigit():
            return int(v)
    return 0


_source: Callable[[], int] = default_rank


def set_rank_source(fn: Callable[[], int] | None) -> None:
    """Use ``fn()`` (returning this process's rank) from now on; ``None`` restores the
    default source. The MPI layer installs its communicator's rank here."""
    global _source
    if fn is not None and not callable(fn):
        raise TypeError(f"rank source must be callable or None, got {type(fn).__name__}")
    _source = default_rank if fn is None else fn


def get_rank() -> int:
    """This process's rank according to the current source."""
    r = _source()
    if isinstance(r, bool) or not isinstance(r, int):
        raise TypeError(f"the rank source returned {r!r}, expected an int")
    return r
