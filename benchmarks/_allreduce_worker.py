"""Run under ``mpiexec -n 2 python -m mpi4py``: time ``dist.allreduce_`` against a raw
mpi4py ``Allreduce(IN_PLACE)`` on the same 64 MB float32 buffer, alternating call by
call; each sample is the slowest rank's time for one call (after a barrier). Prints one
JSON line on rank 0."""

import json
import statistics
import sys
import time

import torch
from mpi4py import MPI

import ortcpu_torch.distributed as dist

nbytes = int(sys.argv[1]) if len(sys.argv) > 1 else 64 << 20
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
comm = MPI.COMM_WORLD
t = torch.zeros(nbytes // 4)  # zeros: repeated sums stay finite and normal
arr = t.numpy()  # the same memory


def timed(fn):
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    return comm.allreduce(dt, op=MPI.MAX)


sides = {
    "raw_mpi4py": lambda: comm.Allreduce(MPI.IN_PLACE, arr, op=MPI.SUM),
    "allreduce_sum": lambda: dist.allreduce_(t, "sum"),
    "allreduce_mean": lambda: dist.allreduce_(t, "mean"),
}
samples = {k: [] for k in sides}
for i in range(reps + 3):
    for k, fn in sides.items():
        s = timed(fn)
        if i >= 3:
            samples[k].append(s)
if comm.Get_rank() == 0:
    med = {k: statistics.median(v) for k, v in samples.items()}
    out = {"bytes": nbytes, "reps": reps, "ranks": comm.Get_size(),
           "median_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
           "GB_per_s": {k: round(nbytes / v / 1e9, 3) for k, v in med.items()},
           "ratio_vs_raw": {k: round(med["raw_mpi4py"] / v, 3) for k, v in med.items()}}
    print(json.dumps(out), flush=True)
