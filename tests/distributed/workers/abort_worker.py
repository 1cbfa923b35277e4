"""Rank 1 raises while rank 0 blocks in recv(1): ``python -m mpi4py`` must abort the
whole job (non-zero exit) promptly instead of leaving rank 0 hanging."""

import ortcpu_torch.distributed as dist

if dist.rank() == 1:
    raise RuntimeError("deliberate failure on rank 1")
dist.recv(1)  # never satisfied
