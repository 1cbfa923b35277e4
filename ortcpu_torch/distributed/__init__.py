"""Distributed training over MPI (mpi4py), launched with ``mpiexec``.

    mpiexec -n 2 python -m mpi4py train.py        # one process per rank

- ``rank()``, ``world_size()``, ``barrier()``;
- point-to-point: ``send``/``recv`` (autograd-aware, for pipeline parallelism),
  ``isend``/``irecv`` (waitable requests);
- collectives: ``broadcast_(t, root=0)``, ``allreduce_(t, op="sum"|"mean"|...)``;
- ``DataParallel(model, bucket_mb=25)``: gradients averaged across ranks by bucketed
  allreduce overlapped with backward;
- ``is_main_process()``: rank 0 (what the TensorBoard writer checks before writing).

Install the extra for multi-process runs: ``pip install ortcpu-torch[mpi]``. Without
mpi4py, or in a process not started by ``mpiexec``, the world is one process of rank 0
and everything still works (collectives are no-ops).
"""

from __future__ import annotations

from ._mpi import INSTALL_HINT, Request, rank, world_size
from .collectives import allreduce_, barrier, broadcast_
from .data_parallel import DataParallel
from .p2p import irecv, isend, recv, send

__all__ = [
    "INSTALL_HINT",
    "DataParallel",
    "Request",
    "allreduce_",
    "available",
    "barrier",
    "broadcast_",
    "irecv",
    "is_main_process",
    "isend",
    "rank",
    "recv",
    "send",
    "world_size",
]


def available() -> bool:
    """True when mpi4py (and an MPI library) can be imported."""
    from . import _mpi

    return _mpi.mpi() is not None


def is_main_process() -> bool:
    """True on rank 0 (and in a single process): the rank that writes logs/checkpoints."""
    return rank() == 0
