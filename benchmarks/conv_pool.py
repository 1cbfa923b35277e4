"""Conv / pooling (issue 5): ortcpu_torch vs PyTorch eager (oneDNN), float32, forward +
backward including dX, as users run it (autograd, fresh outputs each call).

    python -m benchmarks.conv_pool [--threads 2] [--reps 15] [--blas-compare] [--cpu-time]

Ours and torch alternate call by call; each time is the median over ``--reps`` rounds
after warm-up; ratio = torch / ours. The load average and the CPU share other processes
took during the run are printed: on a shared 2-core machine they decide whether the
numbers mean anything. ``--blas-compare`` also times the conv cases with the *other*
thread decision (our threads 1, OpenBLAS threads N) to document the choice in gemm.h.
``--cpu-time`` (implies 1 thread) times with ``time.thread_time()`` instead of the wall
clock: the CPU time of the calling thread, which other processes on a loaded machine
disturb much less than wall time; it compares the work each side does, not its scaling.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

import ortcpu_torch
from ortcpu_torch import ops
from ortcpu_torch._native import lib

TARGETS = {"conv2d N32 C64->64 28x28 k3": 1.0, "conv2d N64 C3->32 32x32 k3": 1.0,
           "max_pool2d 2x2 32x64x56x56": 3.0, "avg_pool2d 2x2 32x64x56x56": 2.0}


def _cpu_busy():
    with open("/proc/stat") as f:
        v = [int(t) for t in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)


def _self_cpu():
    t = os.times()
    return t.user + t.system


def cases():
    out = []
    for name, (n, c, m, h) in (("conv2d N32 C64->64 28x28 k3", (32, 64, 64, 28)),
                               ("conv2d N64 C3->32 32x32 k3", (64, 3, 32, 32))):
        x = torch.randn(n, c, h, h, requires_grad=True)
        w = torch.randn(m, c, 3, 3, requires_grad=True)
        b = torch.randn(m, requires_grad=True)
        g = torch.randn(n, m, h, h)

        def mk(fn, x=x, w=w, b=b, g=g):
            def run():
                x.grad = w.grad = b.grad = None
                fn(x, w, b, stride=1, padding=1).backward(g)
            return run
        out.append((name, mk(F.conv2d), mk(ops.conv2d)))
    x = torch.randn(32, 64, 56, 56, requires_grad=True)
    g = torch.randn(32, 64, 28, 28)
    for name, tf, of in (("max_pool2d 2x2 32x64x56x56", F.max_pool2d, ops.max_pool2d),
                         ("avg_pool2d 2x2 32x64x56x56", F.avg_pool2d, ops.avg_pool2d)):
        def mk(fn, x=x, g=g):
            def run():
                x.grad = None
                fn(x, 2).backward(g)
            return run
        out.append((name, mk(tf), mk(of)))
    return out


def bench(threads: int, reps: int, blas_compare: bool, cpu_time: bool = False) -> None:
    clock = time.thread_time if cpu_time else time.perf_counter
    if cpu_time:
        threads = 1
        print("clock: thread CPU time (1 thread)")
    torch.set_num_threads(threads)
    ortcpu_torch.set_num_threads(threads)
    print(f"threads={threads} reps={reps} loadavg(before)={os.getloadavg()[0]:.2f}")
    busy0, tot0, self0 = *_cpu_busy(), _self_cpu()
    rows = []
    for name, tf, of in cases():
        for _ in range(3):
            tf()
            of()
        tt, to = [], []
        for _ in range(reps):
            t = clock()
            tf()
            tt.append(clock() - t)
            t = clock()
            of()
            to.append(clock() - t)
        tt.sort()
        to.sort()
        mt, mo = tt[reps // 2], to[reps // 2]
        rows.append((name, mt, mo))
        tgt = TARGETS.get(name)
        print(f"{name:32s} torch {mt * 1e3:8.2f} ms  ours {mo * 1e3:8.2f} ms  "
              f"ratio {mt / mo:5.2f}  (min: torch {tt[0] * 1e3:.2f} ours {to[0] * 1e3:.2f} "
              f"ratio {tt[0] / to[0]:.2f})  target >= {tgt}")
        if blas_compare and name.startswith("conv"):
            ortcpu_torch.set_num_threads(1)
            lib.ortcpu_blas_set_num_threads(threads)
            for _ in range(3):
                of()
            tb = []
            for _ in range(reps):
                t = time.perf_counter()
                of()
                tb.append(time.perf_counter() - t)
            tb.sort()
            lib.ortcpu_blas_set_num_threads(1)
            ortcpu_torch.set_num_threads(threads)
            print(f"{'':32s} ours with OpenBLAS threads={threads}, OpenMP 1: "
                  f"{tb[reps // 2] * 1e3:.2f} ms (min {tb[0] * 1e3:.2f})")
    busy1, tot1, self1 = *_cpu_busy(), _self_cpu()
    hz = os.sysconf("SC_CLK_TCK")
    busy = (busy1 - busy0) / hz
    wall = (tot1 - tot0) / hz
    foreign = max(0.0, busy - (self1 - self0))
    print(f"other processes used {foreign / max(wall, 1e-9):.0%} of the machine's CPU time "
          f"during the run; loadavg(after)={os.getloadavg()[0]:.2f}")
    write_markdown(rows, threads, reps, cpu_time, foreign / max(wall, 1e-9))


def write_markdown(rows, threads: int, reps: int, cpu_time: bool, foreign: float) -> None:
    """results/conv_pool[_cpu1].md, included in the README by ``make readme``."""
    clock = "thread CPU time" if cpu_time else "wall clock"
    lines = [
        "<!-- generated by `python -m benchmarks.conv_pool`; do not edit by hand -->",
        f"float32, forward + backward through autograd incl. dX; {threads} thread(s), {clock}, "
        f"median of {reps} alternating calls; torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; other processes used "
        f"{foreign:.0%} of the machine's CPU time.",
        "",
        "| case | torch ms | ours ms | torch ÷ ours | target |",
        "|---|--:|--:|--:|--:|",
    ]
    for name, mt, mo in rows:
        lines.append(f"| {name} | {mt * 1e3:.2f} | {mo * 1e3:.2f} | {mt / mo:.2f}x | "
                     f"≥ {TARGETS.get(name)}x |")
    stem = "conv_pool_cpu1" if cpu_time else "conv_pool"
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", stem + ".md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--blas-compare", action="store_true")
    ap.add_argument("--cpu-time", action="store_true")
    a = ap.parse_args()
    bench(a.threads, a.reps, a.blas_compare, a.cpu_time)
