"""Distributed training over MPI (mpi4py), launched with ``mpiexec``.

    mpiexec -n 2 python -m mpi4py train.py        # one process per rank

- ``rank()``, ``world_size()``, ``barrier()``;
- point-to-point: ``send``/``recv`` (autograd-aware, for pipeline parallelism),
  ``isend``/``irecv`` (waitable requests);
- collectives: ``broadcast_(t, root=0)``, ``allreduce_(t, op="sum"|"mean"|...)``;
- ``DataParallel(model, bucket_mb=25)``: gradients averaged across ranks by bucketed
  allreduce overlapped with backward;
- ``is_main_process()``: rank 0.

Importing this package installs ``summary_rank`` as ``ortcpu_torch.summary``'s rank
source, so ``SummaryWriter`` writes on MPI_COMM_WORLD rank 0 only.

Install the extra for multi-process runs: ``pip install ortcpu-torch[mpi]``. Without
mpi4py, or in a process not started by ``mpiexec``, the world is one process of rank 0
and everything still works (collectives are no-ops).
"""

from __future__ import annotations

import sys

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
    "summary_rank",
    "world_size",
]


def available() -> bool:
    """True when mpi4py (and an MPI library) can be imported."""
    from . import _mpi

    return _mpi.mpi() is not None


def is_main_process() -> bool:
    """True on rank 0 (and in a single process): the rank that writes logs/checkpoints."""
    return rank() == 0


def summary_rank() -> int:
    """The rank source for ``ortcpu_torch.summary``: the MPI_COMM_WORLD rank once MPI is
    initialized with more than one process (``python -m mpi4py`` initializes it at
    start-up), else the summary module's default source (torch.distributed, or launcher
    environment variables such as MPICH's ``PMI_RANK`` or torchrun's ``RANK``). It never
    initializes MPI itself, so a plain single process that creates a ``SummaryWriter``
    does not start MPI."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        if MPI.COMM_WORLD.Get_size() > 1:
            return MPI.COMM_WORLD.Get_rank()
    from ..summary._rank import default_rank

    return default_rank()


def _install_summary_rank_source() -> None:
    from ..summary import set_rank_source

    set_rank_source(summary_rank)


_install_summary_rank_source()
