"""Run as one process, or under ``mpiexec -n N python -m mpi4py``: train the digits
model of examples/ddp_digits.py (global batch split over the ranks) with DataParallel in
each overlap mode, the modes interleaved block by block so machine noise hits all of
them alike. Prints one JSON line on rank 0: per mode, the median samples/s over blocks
and the median allreduce time left after backward (ms/step).

    python benchmarks/_ddp_worker.py MODEL GLOBAL_BATCH BUCKET_MB BLOCKS STEPS THREADS
"""

import copy
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import ortcpu_torch
import ortcpu_torch.distributed as dist

spec = importlib.util.spec_from_file_location(
    "ddp_digits", Path(__file__).resolve().parents[1] / "examples" / "ddp_digits.py")
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)

model_name, gbatch, bucket_mb, blocks, steps, threads = sys.argv[1:7]
gbatch, bucket_mb, blocks, steps, threads = (int(gbatch), float(bucket_mb), int(blocks),
                                             int(steps), int(threads))
torch.set_num_threads(threads)
ortcpu_torch.set_num_threads(threads)
rank, world = dist.rank(), dist.world_size()
local = gbatch // world
(xs, ys), _ = ex.load_data(0)
torch.manual_seed(0)


def deep():
    """Six 1024-wide tanh layers: 5.3 M params in many buckets, backward long enough for
    early buckets' allreduce to run while later layers' gradients are computed."""
    layers = [torch.nn.Linear(64, 1024), torch.nn.Tanh()]
    for _ in range(5):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.Tanh()]
    layers += [torch.nn.Linear(1024, 10), torch.nn.LogSoftmax(1)]
    return torch.nn.Sequential(*layers)


base = {"cnn": ex.CNN, "mlp": ex.MLP, "mlp2048": lambda: ex.MLP(hidden=2048),
        "deep": deep}[model_name]()
modes = ["poll", "thread", False] if world > 1 else [False]
runs = {}
for m in modes:
    model = dist.DataParallel(copy.deepcopy(base), bucket_mb=bucket_mb, overlap=m)
    runs[m] = (model, torch.optim.SGD(model.parameters(), lr=0.01))
g = torch.Generator().manual_seed(0)


def step(model, opt):
    idx = torch.randint(0, len(xs), (gbatch,), generator=g)[rank * local : (rank + 1) * local]
    loss = F.nll_loss(model(xs[idx]), ys[idx])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


for m in modes:  # warm-up
    for _ in range(5):
        step(*runs[m])
rate = {m: [] for m in modes}
wait = {m: [] for m in modes}
for _ in range(blocks):
    for m in modes:
        model, opt = runs[m]
        w0 = model.stats["wait_s"]
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            step(model, opt)
        dist.barrier()
        dt = time.perf_counter() - t0
        rate[m].append(steps * gbatch / dt)
        wait[m].append((model.stats["wait_s"] - w0) / steps * 1e3)
if rank == 0:
    nparams = sum(p.numel() for p in base.parameters())
    print(json.dumps({
        "model": model_name, "params": nparams, "world": world, "threads": threads,
        "bucket_mb": bucket_mb,
        "buckets": len(runs[modes[0]][0]._buckets),
        "samples_s": {str(m): round(statistics.median(v), 1) for m, v in rate.items()},
        "wait_ms": {str(m): round(statistics.median(v), 3) for m, v in wait.items()},
    }), flush=True)
